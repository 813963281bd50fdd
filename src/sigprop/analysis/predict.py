"""``sigprop.predict``: the theory trajectory of an architecture, its verdict and the critical
attention residual strength (docs/theory.md §2.6-2.7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..spec import ArchSpec
from .result import Result

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Prediction(Result):
    """What the theory says about ``spec``: per-layer ``trajectory`` (source ``theory`` or
    ``theory_asymptotic``), ``verdict`` (trainable | rank_collapse | entropy_collapse),
    ``alpha_crit`` (smallest attention residual strength keeping the final cosine below
    ``spec.rho_max``; None in entropy collapse, inf when no strength up to the search ceiling
    is enough) and ``derived`` (the score scale in the five
    papers' terms)."""

    spec: ArchSpec
    trajectory: pd.DataFrame
    verdict: str
    alpha_crit: float | None
    derived: dict[str, float]
    rho0: float

    def summary(self) -> str:
        a = "n/a" if self.alpha_crit is None else f"{self.alpha_crit:.4g}"
        return (f"Prediction: {self.verdict} (L={self.spec.depth}, beta={self.spec.beta_eff:.3g}, "
                f"alpha_crit={a})")


def spec_with(spec: ArchSpec | None, fields: dict[str, Any]) -> ArchSpec:
    base = spec if spec is not None else ArchSpec()
    return base.replace(**fields) if fields else base


def finite_or_none(x: float) -> float | None:
    """``alpha_crit`` as a result field: None where it does not exist (NaN: entropy
    collapse), inf where no residual strength up to the search ceiling suffices."""
    import math

    return None if math.isnan(x) else float(x)


def predict(spec: ArchSpec | None = None, *, rho0: float | None = None,
            asymptotic: bool = False, methods: str | list[str] | None = None,
            method_params: dict[str, dict[str, Any]] | None = None, seed: int = 0,
            **fields: Any) -> Prediction:
    """Theory for ``spec`` (default: BERT-base as HuggingFace initialises it); keyword
    ``fields`` override the spec's (``predict(depth=48, beta=0.5)``). ``rho0``: the input
    cosine (default the spec's, else 0); ``asymptotic``: the T -> infinity limit instead of
    finite T. ``methods``: registered fixes applied to sigprop's stack of the spec first
    (:func:`sigprop.models.methods.stack.fix_spec`), ``method_params`` their parameters as
    ``{method: {name: value}}`` (the form ``fix`` takes); ``seed``: the draw sigma-reparam
    reads.
    Bad values raise :class:`~sigprop.spec.SpecError` naming the field."""
    from ..theory import depth, diagram

    spec = spec_with(spec, fields)
    if methods is not None:
        from ..models.methods.stack import fix_spec

        spec = fix_spec(spec, methods, method_params, seed=seed, rho0=rho0).spec
    r0 = spec.rho_init if rho0 is None else float(rho0)
    traj = depth.propagate(spec, rho0=r0, asymptotic=asymptotic)
    return Prediction(spec=spec, trajectory=traj,
                      verdict=depth.verdict(spec, traj, rho0=r0, asymptotic=asymptotic),
                      alpha_crit=finite_or_none(
                          diagram.alpha_crit(spec, rho0=r0, asymptotic=asymptotic)[0]),
                      derived=spec.derived(r0), rho0=r0)
