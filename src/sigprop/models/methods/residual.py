"""Residual-stream methods' shared patch: a multiplier ``lam`` on the stream and a gate ``g``
on each branch, ``x <- lam x + g f(x)`` (post-LN: inside the norm), applied to any HF block.

The stream multiplier is moved onto the branches by LayerNorm's scale invariance: post-LN
``LN(lam x + g f) = LN(x + (g/lam) f)``; pre-LN ``x`` is carried as ``s x'`` with ``s`` the
running product of the multipliers, so branch ``l`` adds ``(g_l / s_l) f_l(LN x')`` and every
norm downstream (the branches' and the final one) does not see ``s``. The two forms are the
same function of the same weights (up to the norm's epsilon), so they train alike. A stack
without norms takes no stream multiplier (refused).

Where the branch factor lands: a gate ``sigprop_gate`` on the branch's output projection
with a forward hook, recorded in config.json and restored by sigprop's loader. A constant
factor (DeepNorm's alpha, Admin's omega, Depth-muP's 1/sqrt(L), DeepScaleLM's lambda and
beta) is a buffer, a trainable one (ReZero, SkipInit, LayerScale) a parameter. A constant
is not folded into the projection's weights: that computes the same function at init but
trains differently (an optimiser's step on ``W / omega`` is a step ``omega`` times larger,
relative to the weights, than on ``W``; measured on bert-tiny-collapse, 24 post-LN blocks at
lr 2e-3: with Admin's omega folded in, the gradient reaching block 0 fell to 3e-10 of block
23's within 150 steps, with the gate to 1e-4). Blocks that normalise their branch outputs
(Gemma 2, OLMo 2) get the gate after that norm.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...spec import SpecError
from .base import Context, Effect
from .parts import Part, install_gate, need


def branch_factors(ctx: Context, lam_attn, lam_mlp, gate_attn, gate_mlp, method: str
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per block, the factors on the attention and MLP branch outputs that give ``x <- lam x
    + g f(x)`` (module docstring)."""
    L = ctx.depth
    la, lm = (np.broadcast_to(np.asarray(x, dtype=np.float64), (L,)) for x in (lam_attn,
                                                                            lam_mlp))
    ga, gm = (np.broadcast_to(np.asarray(x, dtype=np.float64), (L,)).copy()
              for x in (gate_attn, gate_mlp))
    if np.all(la == 1) and np.all(lm == 1):
        return ga, gm
    if ctx.norm == "post":
        return ga / la, gm / lm
    if ctx.norm == "pre":
        s = np.cumprod(np.stack([la, lm], axis=1).ravel()).reshape(L, 2)
        return ga / s[:, 0], gm / s[:, 1]
    raise SpecError(method, "a multiplier on the residual stream needs LayerNorm to move it "
                            "onto the branches; this model has no norm")


def _gate_modules(p: Part, method: str) -> tuple[nn.Module, nn.Module | None]:
    return need(p, "gate_attn_at", method), p.gate_mlp_at


def apply(parts: list[Part], ctx: Context, effect: Effect, method: str, *, lam_attn=1.0,
          lam_mlp=1.0, gate_attn=1.0, gate_mlp=1.0, trainable: bool = False,
          channels: bool = False) -> list[str]:
    """Patch every block (module docstring) and add the multipliers to ``effect``.
    ``channels``: trainable gates are one per channel (LayerScale), initialised to the
    scalar."""
    fa, fm = branch_factors(ctx, lam_attn, lam_mlp, gate_attn, gate_mlp, method)
    for i, p in enumerate(parts):
        at, mt = _gate_modules(p, method)
        for mod, f in ((at, fa[i]), (mt, fm[i])):
            if mod is None:
                continue
            width = _width(mod) if channels and trainable else None
            init = torch.full((width,), float(f)) if width else torch.tensor(float(f))
            install_gate(mod, init, trainable=trainable)
    effect.scale("gate_attn", gate_attn)
    effect.scale("gate_mlp", gate_mlp)
    effect.scale("lam_attn", lam_attn)
    effect.scale("lam_mlp", lam_mlp)
    return []


def restore(parts: list[Part], method: str, *, trainable: bool,
            channels: bool = False) -> None:
    """Re-install the gates :func:`apply` put on modules (values come from the saved state
    dict)."""
    for p in parts:
        for mod in _gate_modules(p, method):
            if mod is None:
                continue
            width = _width(mod) if channels and trainable else None
            init = torch.ones(width) if width else torch.tensor(1.0)
            install_gate(mod, init, trainable=trainable)


def _width(mod: nn.Module) -> int:
    for name in ("out_features", "nf", "normalized_shape", "hidden_size"):
        v = getattr(mod, name, None)
        if isinstance(v, tuple | list | torch.Size):
            v = v[-1] if len(v) else None
        if isinstance(v, int) and v > 0:
            return v
    w = getattr(mod, "weight", None)
    if w is not None:
        return int(w.shape[0] if w.dim() == 1 else (w.shape[1] if type(mod).__name__ == "Conv1D"
                                                     else w.shape[0]))
    raise SpecError("method", f"{type(mod).__name__}: cannot tell its output width")
