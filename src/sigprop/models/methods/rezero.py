"""rezero: every branch multiplied by a trainable scalar that starts at 0, ``x <- x + a f(x)``,
and the block's norms removed (Bachlechner et al., UAI 2021; docs/fixes.md). The authors'
code shares one scalar between a layer's attention and MLP branches; here each branch has its
own (both 0 at init, so the model at init is the same). ``norms=keep`` keeps the model's
norms. The scalars are parameters ``sigprop_gate`` on the branch output projections, restored
by sigprop's loader; removed norms are recorded and removed again on reload.

Theory: every block is the identity at init (branch variance times 0), so the final cosine
is the input's; without norms the stack is the T -> inf / finite-T map with ``norm=none``.
"""

from __future__ import annotations

from . import residual
from .base import Method, Param, register
from .tfixup import remove_norms


@register
class ReZero(Method):
    name = "rezero"
    params = (Param("a", "the branches' scalar at init", 0.0, lo=0.0, hi=10.0),
              Param("norms", "remove (as the authors) or keep the block norms", "remove",
                    choices=("remove", "keep")))

    def apply(self, model, parts, params, ctx, effect):
        lines = []
        if params["norms"] == "remove":
            lines.append(remove_norms(parts, effect))
        residual.apply(parts, ctx, effect, self.name, gate_attn=params["a"],
                       gate_mlp=params["a"], trainable=True)
        return lines + [f"branches times a trainable scalar a = {params['a']:.4g}"]

    def restore(self, model, parts, params):
        if params["norms"] == "remove":
            remove_norms(parts, None)
        residual.restore(parts, self.name, trainable=True)
