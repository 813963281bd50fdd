"""layerscale: every branch multiplied channel by channel by a trainable vector filled with a
small ``eps``, ``x <- x + diag(lambda) f(x)`` (Touvron et al., ICCV 2021, CaiT). ``eps`` by
depth as the paper states it: 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 beyond (their code's
class default is 1e-4; their registered 24-layer models use 1e-5, the 36- and 48-layer ones
1e-6). The vectors are parameters ``sigprop_gate`` on the branch output projections,
restored by sigprop's loader.

Theory: each branch's output variance times ``eps^2`` (all channels equal at init).
"""

from __future__ import annotations

from . import residual
from .base import Method, Param, register


def _eps(ctx) -> float:
    return 0.1 if ctx.depth <= 18 else 1e-5 if ctx.depth <= 24 else 1e-6


@register
class LayerScale(Method):
    name = "layerscale"
    params = (Param("eps", "every channel's scale at init (default by depth: 0.1 / 1e-5 / "
                    "1e-6 up to 18 / 24 / more layers)", _eps, lo=0.0, hi=10.0),)

    def apply(self, model, parts, params, ctx, effect):
        residual.apply(parts, ctx, effect, self.name, gate_attn=params["eps"],
                       gate_mlp=params["eps"], trainable=True, channels=True)
        return [f"branches times a trainable per-channel scale filled with "
                f"{params['eps']:.3g}"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=True, channels=True)
