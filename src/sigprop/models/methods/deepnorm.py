"""deepnorm: ``x <- LN(alpha x + f(x))`` with W_V, W_O and the MLP weights divided by
``1/beta`` at init (Wang et al. 2022, DeepNet; docs/fixes.md), the constants by depth as in
the authors' code (microsoft/torchscale): encoder-only of N layers ``alpha = (2N)^1/4``,
``beta = (8N)^-1/4``; decoder-only of M layers ``(2M)^1/4``, ``(8M)^-1/4``; in an
encoder-decoder model the encoder ``0.81 (N^4 M)^1/16``, ``0.87 (N^4 M)^-1/16`` and the
decoder ``(3M)^1/4``, ``(12M)^-1/4``. As in that code the model's own initialisation is
divided (weights and biases; Q, K and the embeddings untouched). ``alpha`` multiplies the
stream; LayerNorm's scale invariance moves it onto the branches (:mod:`.residual`) as a
constant gate on the output projections, recorded and restored by sigprop's loader (beta,
an initialisation, is in the weights).

Theory: per-layer V, O and MLP variances times ``beta^2`` and the residual multiplier
``alpha`` (:func:`.base.theory_spec`).
"""

from __future__ import annotations

from . import residual
from .base import Method, Param, register
from .parts import scale_value_and_mlp


def constants(ctx) -> tuple[float, float]:
    """(alpha, beta) for the stack in ``ctx`` (module docstring)."""
    if ctx.decoder_depth and ctx.encoder_depth:
        N, M = ctx.encoder_depth, ctx.decoder_depth
        if ctx.causal:
            return (3.0 * M) ** 0.25, (12.0 * M) ** -0.25
        return 0.81 * (N**4 * M) ** (1 / 16), 0.87 * (N**4 * M) ** (-1 / 16)
    L = ctx.depth
    return (2.0 * L) ** 0.25, (8.0 * L) ** -0.25


@register
class DeepNorm(Method):
    name = "deepnorm"
    params = (Param("alpha", "residual multiplier (default by depth)",
                    lambda ctx: constants(ctx)[0], lo=1e-3, hi=1e3),
              Param("beta", "scale of W_V, W_O and the MLP weights (default by depth)",
                    lambda ctx: constants(ctx)[1], lo=0.0, hi=10.0))

    def apply(self, model, parts, params, ctx, effect):
        a, b = params["alpha"], params["beta"]
        scale_value_and_mlp(parts, b, effect)
        residual.apply(parts, ctx, effect, self.name, lam_attn=a, lam_mlp=a)
        return [f"W_V, W_O, MLP x beta = {b:.4g}", f"residual x alpha = {a:.4g} (moved onto "
                "the branches by the norm's scale invariance)"]

    def restore(self, model, parts, params):
        residual.restore(parts, self.name, trainable=False)
