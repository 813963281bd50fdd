"""depth-mup: every branch multiplied by ``a / sqrt(L)``, L the number of blocks (Yang et al.
2023, Tensor Programs VI; Bordelon et al., ICLR 2024; docs/fixes.md). Counting both branches
of a block instead (``L = 2 x blocks``) is ``a = 1/sqrt 2``. The multiplier is a constant gate
on the branch output projections, kept out of the weights (:mod:`.residual`): folded in, an
optimiser that normalises its steps, as Adam, would move those weights at a different
relative rate than the separate multiplier does. Depth-muP's learning-rate scaling is a
training setting, not part of the model.

Theory: each branch's output variance times ``a^2 / L``.
"""

from __future__ import annotations

import math

from . import residual
from .base import Method, Param, register


@register
class DepthMuP(Method):
    name = "depth-mup"
    params = (Param("a", "branch multiplier a / sqrt(L) (L = blocks)", 1.0, lo=0.0, hi=100.0),)

    def apply(self, model, parts, params, ctx, effect):
        g = params["a"] / math.sqrt(ctx.depth)
        residual.apply(parts, ctx, effect, self.name, gate_attn=g, gate_mlp=g)
        return [f"branches x {g:.4g} (a / sqrt({ctx.depth})), a constant gate on their output "
                "projections"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=False)
