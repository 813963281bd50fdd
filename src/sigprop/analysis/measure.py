"""``sigprop.measure``: S initialisations x B sequences through the torch model built from an
``ArchSpec``, with the theory laid beside the measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..spec import ArchSpec
from .predict import finite_or_none, spec_with
from .result import Result

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Comparison(Result):
    """Theory and measurement of one spec: ``trajectory`` holds both sources (``measured``
    with standard errors over seeds x sequences), ``max_abs_error`` the largest per-layer gap
    per observable, ``verdict`` / ``alpha_crit`` the theory's at the measured input cosine
    ``rho0``."""

    spec: ArchSpec
    trajectory: pd.DataFrame
    verdict: str
    alpha_crit: float | None
    rho0: float
    max_abs_error: dict[str, float]
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        cos = self.max_abs_error.get("cos")
        gap = "" if cos is None else f", max |theory - measured| cos {cos:.3g}"
        return (f"Comparison: {self.info.get('seeds')} seeds x {self.info.get('sequences')} "
                f"sequences, theory verdict {self.verdict}{gap}")


def measure(spec: ArchSpec | None = None, *, seeds: int = 4, sequences: int = 2,
            input: str = "rho", rho0: float | None = None, seed: int = 0,
            float64: bool = False, grads: bool = False, asymptotic: bool = False,
            methods: str | list[str] | None = None,
            method_params: dict[str, dict[str, Any]] | None = None,
            **fields: Any) -> Comparison:
    """Measure ``spec`` (default BERT-base at HF init; keyword ``fields`` override it) on
    ``seeds`` initialisations x ``sequences`` inputs (``input``: rho | isometric | text) and
    put the theory beside it, taken at ``rho0`` or else at the measured input cosine.
    ``methods``: registered fixes applied to the stack first (``sigprop fix --list``;
    :func:`sigprop.models.methods.stack.fix_spec`), with ``method_params`` as
    ``{method: {name: value}}`` (the form ``fix`` takes); the
    result's ``spec`` is the fixed one and ``info["methods"]`` says what changed."""
    import pandas as pd
    import torch

    from ..measurement.engine import compare
    from ..measurement.engine import measure as run
    from ..theory import depth, diagram

    spec = spec_with(spec, fields)
    fx = None
    if methods is not None:
        from ..models.methods.stack import fix_spec

        fx = fix_spec(spec, methods, method_params, seed=seed, rho0=rho0)
        spec = fx.spec
    m = run(spec, seeds=seeds, sequences=sequences, input=input,
            rho0=spec.rho0 if rho0 is None else rho0, seed=seed,
            dtype=torch.float64 if float64 else torch.float32, grads=grads,
            build=None if fx is None else fx.build)
    given = spec.rho0 if rho0 is None else rho0
    r0 = float(given) if given is not None else min(max(m.rho0, 0.0), 1.0)
    theory = depth.propagate(spec, rho0=r0, asymptotic=asymptotic)
    return Comparison(
        spec=spec, trajectory=pd.concat([theory, m.trajectory], ignore_index=True),
        verdict=depth.verdict(spec, theory, rho0=r0, asymptotic=asymptotic),
        alpha_crit=finite_or_none(diagram.alpha_crit(spec, rho0=r0, asymptotic=asymptotic)[0]),
        rho0=r0, max_abs_error=compare(theory, m.trajectory), seconds=m.seconds,
        info={**m.info, **({"methods": fx.to_dict()} if fx is not None else {})})
