"""ln-scaling: LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language
Models"; docs/fixes.md): the output of every pre-LN norm of block ``l`` (1-based) multiplied
by ``1 / sqrt(l)``, so the deep blocks' branches add less to a stream whose variance grows
with depth. ``power`` generalises the exponent (``l^-power``; the paper's 0.5). The factor is
a constant buffer ``sigprop_gate`` on each input norm with a forward hook (not folded into
the norm's gain, which would train differently), recorded in config.json and re-installed
by sigprop's loader. Pre-LN models only: a post-LN norm sits on the stream, not on a branch.

Theory: block ``l``'s branches read a stream of squared norm ``c^2 = l^-2 power`` per
dimension instead of 1. q and k both scale by ``c``, so each head's score std by ``c^2``;
V's and the MLP's first layer's outputs by ``c`` (their biases do not scale: the theory
multiplies the weights' variances, not the biases'). Exact for the mean-field block map.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import Method, Param, register
from .block_norms import input_norms, need_pre_ln
from .parts import install_gate


def factors(depth: int, power: float) -> np.ndarray:
    """Per block, the factor on its input norms' outputs: ``l^-power`` for l = 1..depth."""
    return np.arange(1, depth + 1, dtype=np.float64) ** -float(power)


def _install(parts, params) -> int:
    """A constant gate ``l^-power`` on every input norm of block ``l`` (a restored model at
    init is then right without its saved buffers); the number of norms gated."""
    c = factors(len(parts), params["power"])
    n = 0
    for i, p in enumerate(parts):
        for norm in input_norms(p):
            install_gate(norm, torch.tensor(float(c[i])), trainable=False)
            n += 1
    return n


@register
class LNScaling(Method):
    name = "ln-scaling"
    params = (Param("power", "block l's input norms times l^-power (the paper's 1/sqrt(l): "
                    "0.5)", 0.5, lo=0.0, hi=2.0),)

    def validate(self, ctx, params):
        need_pre_ln(ctx, self.name, "it scales the norm on each branch's input")

    def apply(self, model, parts, params, ctx, effect):
        c = factors(ctx.depth, params["power"])
        effect.scale("qk", c**2)
        effect.scale("v", c)
        effect.scale("mlp_in", c)
        lines = [f"block l's input norms x l^-{params['power']:.3g} (block {ctx.depth}: "
                 f"{c[-1]:.3g})"]
        if parts:
            lines.append(f"{_install(parts, params)} norm outputs scaled (a "
                         "constant buffer per norm)")
        return lines

    def restore(self, model, parts, params):
        _install(parts, params)
