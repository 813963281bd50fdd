"""deepscalelm: ``x <- lambda x + beta f(x)`` with ``lambda^2 + beta^2 = 1`` and ``beta^2 =
k / N`` (Kedia et al., ICML 2024; docs/fixes.md), N the number of blocks, k = 2 by default.
The paper also states weight variances for its own stack; they are not applied here (the
model keeps its initialisation; only the residual scaling, the method's core, is). Both
multipliers are constants: the stream's moves onto the branches by the norm's scale
invariance and both act as constant gates on the output projections (:mod:`.residual`).

Theory: residual multiplier ``lambda`` and branch gate ``beta`` on both branches.
"""

from __future__ import annotations

import math

from ...spec import SpecError
from . import residual
from .base import Method, Param, register


@register
class DeepScaleLM(Method):
    name = "deepscalelm"
    params = (Param("k", "beta^2 = k / N", 2.0, lo=0.0, hi=1e4),)

    def validate(self, ctx, params):
        if params["k"] >= ctx.depth:
            raise SpecError("deepscalelm.k", f"must be below the depth {ctx.depth} (beta^2 = "
                                             "k / N < 1)")

    def apply(self, model, parts, params, ctx, effect):
        b = math.sqrt(params["k"] / ctx.depth)
        lam = math.sqrt(1.0 - b * b)
        residual.apply(parts, ctx, effect, self.name, lam_attn=lam, lam_mlp=lam,
                       gate_attn=b, gate_mlp=b)
        return [f"x <- {lam:.4g} x + {b:.4g} f(x) on both branches"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=False)
