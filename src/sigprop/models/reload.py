"""Reloading a folder written by ``sigprop fix``: :func:`from_pretrained` is
``AutoModel.from_pretrained`` (local, never remote code) with what the config records
restored (docs/fixes.md, "the written folder"). Kept apart from :mod:`.loading`, whose
configs and weights never go through ``from_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..spec import SpecError
from .loading import read_weights

__all__ = ["from_pretrained"]


def from_pretrained(path, **kwargs) -> nn.Module:
    """``AutoModel.from_pretrained(path)`` (local, no remote code) with what ``sigprop fix``
    recorded in its config restored: the sigprop attention function for a runtime fix, and
    the recorded methods' hooks and parameters (:mod:`.methods`: q/k norms, branch gates,
    removed norms), whose saved values are then read from the folder's safetensors."""
    from transformers import AutoConfig, AutoModel

    from . import methods
    from .fixes import ATTN_NAME, needs_runtime, register_attention

    cfg = AutoConfig.from_pretrained(path, trust_remote_code=False)
    if needs_runtime(cfg):
        register_attention()
        kwargs.setdefault("attn_implementation", ATTN_NAME)
    model = AutoModel.from_pretrained(path, config=cfg, trust_remote_code=False, **kwargs)
    if methods.restore_methods(model):
        _load_extra(model, path)
    return model


@torch.no_grad()
def _load_extra(model: nn.Module, path) -> None:
    """Load the tensors the restored methods added (``sigprop_*`` names) from ``path``."""
    _files, raw = read_weights(Path(path))
    own = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    extra = {k for k in own if "sigprop_" in k}
    found = {}
    for key, val in raw.items():
        k = key[len(prefix) + 1:] if prefix and key.startswith(prefix + ".") else key
        if k in extra:
            found[k] = val
    missing = sorted(extra - set(found))
    if missing:
        raise SpecError("weights", f"{path}: the config records sigprop methods but "
                                   f"{missing[0]} is not in its weights")
    model.load_state_dict(found, strict=False)
