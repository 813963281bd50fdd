"""TinyStories from the HuggingFace hub, used only when a hub is reachable (gg25's corpus).

Nothing here touches the network unless asked for ``tinystories``; even then ``HF_HUB_OFFLINE``
/ ``HF_DATASETS_OFFLINE`` are honoured and a short connection check runs first, so an offline
machine gets one clear :class:`~sigprop.data.text.CorpusError` line instead of a long retry
loop. ``datasets`` is an optional dependency (``pip install 'sigprop[hub]'``).
"""

from __future__ import annotations

import os

from .text import CorpusError

TINYSTORIES = "roneneldan/TinyStories"
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> tuple[bool, str]:
    """``(ok, why_not)``: offline variables unset and an HTTPS connection to the hub opens."""
    for var in _OFFLINE_VARS:
        if _truthy(os.environ.get(var)):
            return False, f"{var} is set"
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        with socket.create_connection((host or "huggingface.co", 443), timeout=timeout):
            return True, ""
    except OSError as err:
        return False, f"cannot reach {host} ({err.strerror or type(err).__name__})"


def load_tinystories(n_documents: int, split: str = "train", timeout: float = 3.0) -> list[str]:
    """The first ``n_documents`` stories of TinyStories' ``split`` (streamed, not downloaded
    whole). Raises :class:`CorpusError` with one line when the hub or ``datasets`` is missing."""
    try:
        import datasets
    except ImportError:
        raise CorpusError("tinystories needs the optional 'datasets' package: "
                          "pip install 'sigprop[hub]' (or use --data builtin / a local "
                          "folder)") from None
    ok, why = hub_reachable(timeout)
    if not ok:
        raise CorpusError(f"tinystories: the HuggingFace hub is not reachable ({why}); use "
                          "--data builtin or a local copy (--data PATH)")
    try:
        ds = datasets.load_dataset(TINYSTORIES, split=split, streaming=True)
        out = []
        for row in ds:
            text = " ".join(str(row.get("text", "")).split())
            if text:
                out.append(text)
            if len(out) >= n_documents:
                break
    except Exception as err:  # datasets / hub raise many connection error types
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CorpusError(f"tinystories: loading {TINYSTORIES} failed ({first})") from None
    if not out:
        raise CorpusError(f"tinystories: {TINYSTORIES} returned no text")
    return out
