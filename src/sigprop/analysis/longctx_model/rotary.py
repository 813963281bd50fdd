"""The model's rotary embedding at any position: the rotary module whose output reproduces
the (cos, sin) a layer received in the reference pass, evaluated by its own forward at the
true positions (its ``rope_scaling`` applies: llama3, yarn, linear, ...; kinds whose
frequencies depend on the context length, such as ``dynamic``, are flagged so that each
length gets a pass of its own)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


def rotary_modules(model) -> list:
    """Modules of ``model`` carrying RoPE frequencies (an ``inv_freq`` tensor)."""
    return [m for m in model.modules()
            if torch.is_tensor(getattr(m, "inv_freq", None)) and m.inv_freq.ndim == 1]


def rope_table(rot, n_max: int | None = None, layer_type: str | None = None):
    """``positions -> (cos, sin)`` float64 from the model's rotary module ``rot`` (its own
    forward, so its ``rope_scaling`` kind applies; float32 angles as in the model). Modules
    whose frequencies depend on the context length (dynamic NTK, longrope) see the position
    ``n_max - 1`` in every call, as in a forward pass over ``n_max`` tokens."""

    def fn(pos: torch.Tensor):
        p = torch.as_tensor(pos, dtype=torch.long).reshape(-1)
        extra = n_max is not None
        if extra:
            p = torch.cat([p, torch.tensor([n_max - 1])])
        dev = rot.inv_freq.device
        x = torch.zeros(1, dtype=torch.float32, device=dev)
        kw = {"layer_type": layer_type} if layer_type is not None else {}
        cos, sin = rot(x, p[None].to(dev), **kw)
        cos, sin = cos[0].double().cpu(), sin[0].double().cpu()
        return (cos[:-1], sin[:-1]) if extra else (cos, sin)

    return fn


@dataclass(frozen=True, kw_only=True)
class RopeMatch:
    """The rotary module a layer uses: ``table(n)`` gives its (cos, sin) for a context of
    ``n`` positions, ``inv_freq`` its frequencies, ``dims`` the rotated width, ``gain`` the
    norm of its (cos, sin) pair and ``length_dependent`` whether the frequencies change with
    the context length (dynamic, longrope)."""

    table: Callable
    inv_freq: np.ndarray
    dims: int
    gain: float
    length_dependent: bool


def match_rope(fit_pos, rotaries, T: int, long_T: int) -> RopeMatch | None:
    """The rotary module (and layer type) whose output at positions 0..T-1 equals the
    (cos, sin) a layer received, or None."""
    cos0, sin0 = fit_pos
    pos = torch.arange(T)
    for rot in rotaries:
        types = [None]
        cfg = getattr(rot, "config", None)
        lt = getattr(cfg, "layer_types", None)
        if isinstance(lt, list | tuple) and isinstance(rot.inv_freq, torch.Tensor):
            if "layer_type" in inspect.signature(rot.forward).parameters:
                types += sorted({t for t in lt if isinstance(t, str)})
        for t in types:
            try:
                c, s = rope_table(rot, layer_type=t)(pos)
            except Exception:  # noqa: BLE001 - a module that does not take this call
                continue
            if c.shape != cos0.shape:
                continue
            tol = 1e-4 * max(1.0, float(cos0.abs().max()))
            if float((c - cos0).abs().max()) > tol or float((s - sin0).abs().max()) > tol:
                continue
            # frequencies that change with the context length (dynamic, longrope)
            c1, _ = rope_table(rot, n_max=long_T, layer_type=t)(torch.tensor([1, T - 1]))
            c0, _ = rope_table(rot, n_max=T, layer_type=t)(torch.tensor([1, T - 1]))
            dep = float((c1 - c0).abs().max()) > 1e-7
            gain = float(torch.sqrt(c[0, 0] ** 2 + s[0, 0] ** 2))
            inv = rot.inv_freq.detach().double().cpu().numpy().copy()
            return RopeMatch(table=lambda n, rot=rot, t=t: rope_table(rot, n_max=n,
                                                                      layer_type=t),
                             inv_freq=inv, dims=int(c.shape[-1]), gain=gain,
                             length_dependent=dep)
    return None
