"""skipinit: every branch multiplied by a trainable scalar that starts small, ``x <- x +
alpha f(x)`` with ``alpha = 1/sqrt(2L)`` by default (De & Smith, NeurIPS 2020: "0 or a small
constant below 1/sqrt(number of residual branches)"; ``skipinit.alpha=0`` gives the zero
start). The model's norms stay. The scalars are parameters ``sigprop_gate`` on the branch
output projections, restored by sigprop's loader.

Theory: each branch's output variance times ``alpha^2`` (:class:`.base.Effect` gates).
"""

from __future__ import annotations

import math

from . import residual
from .base import Method, Param, register


@register
class SkipInit(Method):
    name = "skipinit"
    params = (Param("alpha", "the branches' scalar at init (default 1/sqrt(2 L))",
                    lambda ctx: 1.0 / math.sqrt(2 * ctx.depth), lo=0.0, hi=10.0),)

    def apply(self, model, parts, params, ctx, effect):
        residual.apply(parts, ctx, effect, self.name, gate_attn=params["alpha"],
                       gate_mlp=params["alpha"], trainable=True)
        return [f"branches times a trainable scalar alpha = {params['alpha']:.4g}"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=True)
