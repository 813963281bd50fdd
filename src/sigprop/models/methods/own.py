"""sigprop's own fixes as registered methods (docs/fixes.md): ``beta`` (Q/K rescaled into the
REM's trainable window, gg25), ``alpha`` (the attention skip strength, ``auto`` = the
smallest that keeps the predicted final cosine below the rank-collapse threshold), ``centred``
(``A - 11^T/n``, mindthegap) and ``length-scaling`` (clpr25's log-n and its relatives,
noci22's tau).

Each sets one field of the model's spec (score scale, ``alpha_attn``, attention map, length
scaling), and the chosen ones act *together*, through one call of
:func:`sigprop.models.fixes.apply_fix` (:func:`apply_together`): their order among
themselves is the spec's (:data:`TOGETHER_ORDER`: the scaling and the centring, then beta,
effective at ``T`` with the scaling, then alpha, whose ``auto`` default sees the new beta), and
config.json's ``sigprop_fix`` records them once, in the keys a plain ``from_pretrained`` with
the sigprop attention function reads. :func:`from_keywords` names the methods of the old
keywords of ``sigprop.fix`` (``beta=``, ``alpha_attn=``, ``centred=``, ``scaling=``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...spec import SCALINGS, SpecError, check_float
from .base import Method, Param, get, register

#: the order one :func:`~sigprop.models.fixes.apply_fix` call realises the methods in
#: (:func:`sigprop.models.fixes.resolve`)
TOGETHER_ORDER = ("length-scaling", "centred", "beta", "alpha")


def _beta_default(ctx) -> float:
    from ...theory import rem

    return 0.5 * float(rem.beta_c(ctx.rho0))


def _alpha_default(ctx) -> float:
    from ..fixes import auto_alpha

    return auto_alpha(ctx.spec, ctx.rho0)


class SpecField(Method):
    """A method that sets a field of the spec: :meth:`keywords` are its
    :func:`~sigprop.models.fixes.apply_fix` arguments. It is applied with the other chosen
    ones by :func:`apply_together` (through :func:`~sigprop.models.methods.apply_methods`),
    whose report's spec is the theory's spec after them, so it records no
    :class:`~.base.Effect`.

    ``fields``: which ``apply_fix`` argument each of its parameters sets; ``fixed``: the
    arguments it sets to a constant."""

    fields: dict[str, str] = {}
    fixed: dict[str, Any] = {}

    def keywords(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**self.fixed, **{kw: params[p] for kw, p in self.fields.items()}}


def is_spec_field(name: str) -> bool:
    """True for the methods :func:`apply_together` applies (sigprop's own)."""
    return isinstance(get(name), SpecField)


def resolve_together(ctx, names: list[str], given: dict[str, dict[str, Any]]
                     ) -> dict[str, dict[str, Any]]:
    """Each method's parameters, resolved in :data:`TOGETHER_ORDER`, each on the spec after
    the ones before it (alpha's ``auto`` default on the spec with the new beta and scaling,
    as ``apply_fix(alpha_attn="auto")``)."""
    from ..fixes import resolve

    kw: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(names, key=TOGETHER_ORDER.index):
        m = get(name)
        step = replace(ctx, spec=resolve(ctx.spec, rho0=ctx.rho0, **kw)) if kw else ctx
        out[name] = m.resolve(step, given.get(name))
        kw.update(m.keywords(out[name]))
    return out


def apply_together(model, chosen: list[tuple[SpecField, dict[str, Any]]], ctx):
    """One :func:`~sigprop.models.fixes.apply_fix` call for the ``(method, params)`` pairs
    on the model whose per-layer spec ``ctx`` holds; returns its
    :class:`~sigprop.models.fixes.FixReport` (``after``: the spec with the new fields,
    ``changes``: one line per change)."""
    from ..fixes import apply_fix

    kw: dict[str, Any] = {}
    for m, p in chosen:
        kw.update(m.keywords(p))
    return apply_fix(model, seq_len=ctx.seq_len, rho0=ctx.rho0,
                     spec=ctx.spec if ctx.spec.layers is not None else None, **kw)


def from_keywords(*, beta: float | None = None, alpha_attn: float | str | None = None,
                  centred: bool = False, scaling: str | None = None,
                  scaling_param: float | None = None
                  ) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The registered methods and parameters that do what the old keywords of
    ``sigprop.fix`` did (``--beta``, ``--alpha-attn``, ``--centred``, ``--scaling``,
    ``--scaling-param``): ``beta=b`` is ``beta`` with ``beta.beta=b``, ``alpha_attn="auto"``
    is ``alpha`` at its default, a number its ``alpha.alpha``, ``centred=True`` is
    ``centred``, ``scaling=k`` is ``length-scaling`` with ``kind=k`` and ``param`` the
    ``scaling_param`` (None: the kind's own default, as before); ``scaling="none"`` is no
    method. Values are checked under the keywords' names."""
    names: list[str] = []
    params: dict[str, dict[str, Any]] = {}
    if beta is not None:
        check_float("beta", beta, 0.0, 1e4, lo_open=True)
        names.append("beta")
        params["beta"] = {"beta": float(beta)}
    if alpha_attn is not None:
        names.append("alpha")
        if alpha_attn != "auto":
            check_float("alpha_attn", alpha_attn, 0.0, 1e4, lo_open=True)
            params["alpha"] = {"alpha": float(alpha_attn)}
    if centred:
        names.append("centred")
    if scaling is not None and scaling not in SCALINGS:
        raise SpecError("scaling", f"must be one of {', '.join(SCALINGS)} (got {scaling!r})")
    if scaling is not None and scaling != "none":
        names.append("length-scaling")
        params["length-scaling"] = {"kind": scaling, "param": scaling_param}
    return names, params


@register
class Beta(SpecField):
    name = "beta"
    params = (Param("beta", "gg25 beta after the fix (default beta_c(rho0) / 2)",
                    _beta_default, lo=1e-6, hi=1e4),)
    fields = {"beta": "beta"}


@register
class Alpha(SpecField):
    name = "alpha"
    params = (Param("alpha", "attention skip strength (default: auto, the smallest keeping "
                    "the predicted final cos 0.1 below rho_max)", _alpha_default,
                    lo=1e-6, hi=1e4),)
    fields = {"alpha_attn": "alpha"}


@register
class Centred(SpecField):
    name = "centred"
    fixed = {"centred": True}


@register
class LengthScaling(SpecField):
    name = "length-scaling"
    params = (Param("kind", "the scaling", "log-n",
                    choices=tuple(k for k in SCALINGS if k != "none")),
              Param("param", "its parameter (reference length, default T; tau for tau; "
                    "None: the kind's own default, sigprop.spec.score_multiplier)",
                    lambda ctx: float(ctx.seq_len), lo=1e-6, hi=2.0**30, optional=True))

    fields = {"scaling": "kind", "scaling_param": "param"}
