"""admin: ``x <- LN(omega x + f(x))`` with one constant ``omega`` for every branch, from the
number ``n`` of residual branches (``2 x blocks``), as in the authors' package (admin-torch's
default, "O(log n)" output change): ``omega = sqrt((n + 1) / ln(n + 1) - 1)`` (Liu et al.,
EMNLP 2020; docs/fixes.md). Their original recipe profiles a per-branch omega from the
stream's variance on one batch; the closed form is the package's. ``omega`` is moved onto the
branches by LayerNorm's scale invariance (:mod:`.residual`), as a constant gate ``1/omega`` on
the output projections (a forward-pass change: recorded and restored by sigprop's loader;
folded into the weights it would train differently).

Theory: the residual multiplier ``omega`` on both branches.
"""

from __future__ import annotations

import math

from . import residual
from .base import Method, Param, register


def omega(ctx) -> float:
    n = 2 * ctx.depth
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


@register
class Admin(Method):
    name = "admin"
    params = (Param("omega", "residual multiplier (default sqrt((n+1)/ln(n+1) - 1), n = 2L)",
                    omega, lo=1e-3, hi=1e3),)

    def apply(self, model, parts, params, ctx, effect):
        w = params["omega"]
        residual.apply(parts, ctx, effect, self.name, lam_attn=w, lam_mlp=w)
        return [f"residual x omega = {w:.4g} (moved onto the branches by the norm's scale "
                "invariance)"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=False)
