"""sigprop's own fixes as registered methods (docs/fixes.md): ``beta`` (Q/K rescaled into the
REM's trainable window, gg25), ``alpha`` (the attention skip strength, ``auto`` = the
smallest that keeps the predicted final cosine below the rank-collapse threshold), ``centred``
(``A - 11^T/n``, mindthegap) and ``length-scaling`` (clpr25's log-n and its relatives,
noci22's tau). Each wraps :func:`sigprop.models.fixes.apply_fix`, which records them in
config.json's ``sigprop_fix`` (the keys a plain ``from_pretrained`` of the sigprop attention
function reads)."""

from __future__ import annotations

import numpy as np

from ...spec import SCALINGS
from .base import Method, Param, register


def _beta_default(ctx) -> float:
    from ...theory import rem

    return 0.5 * float(rem.beta_c(ctx.rho0))


def _alpha_default(ctx) -> float:
    from ..fixes import auto_alpha

    return auto_alpha(ctx.spec, ctx.rho0)


def _fix(model, ctx, **kw):
    from ..fixes import apply_fix

    return apply_fix(model, seq_len=ctx.seq_len, rho0=ctx.rho0,
                     spec=ctx.spec if ctx.spec.layers is not None else None, **kw)


@register
class Beta(Method):
    name = "beta"
    title = "beta window"
    cite = "sigprop (gg25's REM phase diagram)"
    acts = "Q/K: score scale"
    theory = "beta"
    params = (Param("beta", "gg25 beta after the fix (default beta_c(rho0) / 2)",
                    _beta_default, lo=1e-6, hi=1e4),)

    def apply(self, model, parts, params, ctx, effect):
        rep = _fix(model, ctx, beta=params["beta"])
        ratio = [float(np.sqrt(np.mean(rep.after.layer_sigma(i + 1) ** 2)
                               / max(np.mean(rep.before.layer_sigma(i + 1) ** 2), 1e-300)))
                 for i in range(ctx.depth)]
        effect.scale("qk", ratio)
        return rep.changes


@register
class Alpha(Method):
    name = "alpha"
    title = "alpha auto"
    cite = "sigprop (gg25 alpha_crit)"
    acts = "residual: attention skip strength"
    theory = "residual"
    params = (Param("alpha", "attention skip strength (default: auto, the smallest keeping "
                    "the predicted final cos 0.1 below rho_max)", _alpha_default,
                    lo=1e-6, hi=1e4),)

    def apply(self, model, parts, params, ctx, effect):
        rep = _fix(model, ctx, alpha_attn=params["alpha"])
        effect.scale("lam_attn", rep.after.alpha_attn / rep.before.alpha_attn)
        return rep.changes


@register
class Centred(Method):
    name = "centred"
    title = "centred attention"
    cite = "sigprop (mindthegap)"
    acts = "attention matrix: A - 11^T/n"
    theory = "attention map"

    def apply(self, model, parts, params, ctx, effect):
        rep = _fix(model, ctx, centred=True)
        effect.attention = "centred"
        return rep.changes


@register
class LengthScaling(Method):
    name = "length-scaling"
    title = "length scaling"
    cite = "sigprop (clpr25 log-n, gg25, noci22 tau)"
    acts = "scores: times s(n) per row's key count"
    theory = "beta"
    params = (Param("kind", "the scaling", "log-n",
                    choices=tuple(k for k in SCALINGS if k != "none")),
              Param("param", "its parameter (reference length; tau for tau)",
                    lambda ctx: float(ctx.seq_len), lo=1e-6, hi=2.0**30))

    def apply(self, model, parts, params, ctx, effect):
        rep = _fix(model, ctx, scaling=params["kind"], scaling_param=params["param"])
        effect.scaling = (params["kind"], params["param"])
        return rep.changes
