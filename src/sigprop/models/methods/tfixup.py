"""tfixup: the blocks' norms removed and W_V, W_O and the MLP weights scaled down with depth
(Huang et al., ICML 2020; docs/fixes.md): ``0.67 N^-1/4`` in an encoder of N layers,
``(9 M)^-1/4`` in a decoder of M layers (here: a causal stack is a decoder). The authors'
code applies the factors to a Xavier initialisation; here they multiply the model's own
(``tfixup.factor`` overrides). Their embedding scaling (``(9 N)^-1/4``) is left out: the
measured stacks start from the model's own (normalised) embeddings. Removed norms are
recorded in config.json and removed again by sigprop's loader.

Theory: the per-layer variances times the squared factor and ``norm=none``.
"""

from __future__ import annotations

from torch import nn

from .base import Effect, Method, Param, register
from .parts import scale_value_and_mlp


def remove_norms(parts, effect: Effect | None) -> str:
    """Replace every norm module inside the blocks by the identity (a model's own q/k norms
    stay); gates that sat on a branch-output norm move to the branch's projection."""
    n = 0
    for p in parts:
        gone = set()
        for parent, attr in p.norms:
            mod = getattr(parent, attr, None)
            if mod is None or isinstance(mod, nn.Identity):
                continue
            gone.add(id(mod))
            setattr(parent, attr, nn.Identity())
            n += 1
        if id(p.gate_attn_at) in gone:
            p.gate_attn_at = p.o
        if id(p.gate_mlp_at) in gone:
            p.gate_mlp_at = p.mlp_out
    if effect is not None:
        effect.norm = "none"
    # no blocks: sigprop's own stack (methods.stack), whose spec alone loses its norms
    return f"{n} norm modules removed from the blocks" if parts else \
        "block norms removed (norm = none)"


def _factor(ctx) -> float:
    if ctx.causal:
        return (9.0 * ctx.depth) ** -0.25
    return 0.67 * ctx.depth ** -0.25


@register
class TFixup(Method):
    name = "tfixup"
    params = (Param("factor", "scale of W_V, W_O and the MLP weights (default 0.67 N^-1/4 "
                    "encoder, (9 M)^-1/4 decoder)", _factor, lo=0.0, hi=10.0),)

    def apply(self, model, parts, params, ctx, effect):
        f = params["factor"]
        line = remove_norms(parts, effect)
        scale_value_and_mlp(parts, f, effect)
        return [line, f"W_V, W_O and the MLP weights x{f:.4g}"]

    def restore(self, model, parts, params):
        remove_norms(parts, None)
