"""``sigprop fix``: diagnose a model, patch the HuggingFace model built from it with the
chosen fixes, write it and re-diagnose the written folder, so the "after" is measured."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..spec import ArchSpec, SpecError
from .diagnose import diagnose
from .diagnosis import Diagnosis
from .forward import model_folder
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

    from ..models.fixes import FixReport


@dataclass
class FixResult(Result):
    """``before`` and ``after`` diagnoses (after = the written folder, reloaded and
    re-measured), the ``report`` of what was changed, the folder ``out``."""

    before: Diagnosis
    report: FixReport
    after: Diagnosis
    out: str

    @property
    def trajectory(self) -> pd.DataFrame:  # both diagnoses, tagged
        import pandas as pd

        return pd.concat([self.before.trajectory.assign(model="before"),
                          self.after.trajectory.assign(model="after")], ignore_index=True)

    @property
    def spec(self) -> ArchSpec:
        return self.after.spec

    def summary(self) -> str:
        return (f"FixResult: {self.before.verdict} -> {self.after.verdict} "
                f"({', '.join(self.report.changes)}); written to {self.out}")

    def plot(self, path: str | None = None, *, ax=None):
        """The fixed model's depth curves (see :meth:`Diagnosis.plot`; ``ax`` as there)."""
        return self.after.plot(path, ax=ax)


#: the old keywords of :func:`fix` and the registered method each became
OLD_KEYWORDS = {"beta": "beta", "alpha_attn": "alpha", "centred": "centred",
                "scaling": "length-scaling", "scaling_param": "length-scaling"}


def fix(model: str, out, *, methods: str | list[str] | None = None,
        params: dict[str, dict[str, Any]] | None = None, seq_len: int | None = None,
        seeds: int = 2, sequences: int = 2, device: str = "cpu", seed: int = 0,
        on_stage: Callable[[str], None] | None = None, beta: float | None = None,
        alpha_attn: float | str | None = None, centred: bool = False,
        scaling: str | None = None, scaling_param: float | None = None) -> FixResult:
    """``sigprop fix``: diagnose ``model`` (preset, path or config), apply the registered
    ``methods`` (:mod:`sigprop.models.methods`, names or ``"a,b"``; ``params``:
    ``{method: {name: value}}``) to the HF model built from it (its folder's weights if it
    has them, else its init under ``seed``), write config + safetensors to ``out`` and
    re-diagnose ``out`` from disk, so the "after" is measured, not asserted.

    The old keywords still work for a release, each with a FutureWarning naming its method
    (:func:`sigprop.models.methods.from_keywords`): ``beta=b`` is ``methods="beta",
    params={"beta": {"beta": b}}``; ``alpha_attn="auto"`` is ``"alpha"`` (a number:
    ``{"alpha": {"alpha": a}}``); ``centred=True`` is ``"centred"``; ``scaling=k,
    scaling_param=p`` is ``"length-scaling"`` with ``{"kind": k, "param": p}``. They come
    before ``methods``. ``methods=[]`` (or only ``scaling="none"``) writes the model as it
    is."""
    from ..models import methods as M

    old = {k: v for k, v in (("beta", beta), ("alpha_attn", alpha_attn),
                             ("scaling", scaling), ("scaling_param", scaling_param))
           if v is not None}
    if centred:
        old["centred"] = True
    names, given = M.from_keywords(beta=beta, alpha_attn=alpha_attn, centred=centred,
                                   scaling=scaling, scaling_param=scaling_param)
    for key, value in old.items():
        warnings.warn(f"fix({key}={value!r}) is deprecated: use the registered method "
                      f"{OLD_KEYWORDS[key]!r} (methods={names!r}, params={given!r})",
                      FutureWarning, stacklevel=2)
    if methods:
        names += M.parse_methods(methods if isinstance(methods, str) else ",".join(methods))
    if params and not methods:
        raise SpecError("param", "needs --method")
    given.update(M.method_params(params, names, caller="fix"))
    if not names and methods is None and not old:  # ``methods=[]``: the model as it is
        raise SpecError("method", "give a method (or --beta, --alpha-attn, --centred, "
                                  "--scaling)")
    if len(set(names)) != len(names):
        raise SpecError("method", f"a method is named twice in {','.join(names)}")
    return _apply_and_measure(model, Path(out).expanduser(), names, given, seq_len=seq_len,
                              seeds=seeds, sequences=sequences, device=device, seed=seed,
                              stage=on_stage or (lambda _s: None))


def _check_early(spec: ArchSpec, names: list[str], given: dict[str, dict[str, Any]]) -> None:
    """Bad fix options fail here, on the config's spec, before minutes of measuring: every
    method's parameters, and sigprop's own methods on the spec together (a second length
    scaling, alpha on a model without LayerNorm). Alpha's ``auto`` default runs the theory
    on the measured spec: it is checked when applied."""
    from ..models import fixes as hf_fix
    from ..models import methods as M

    ctx, keywords = M.Context(spec=spec), {}
    for n in names:
        if n != "alpha" or "alpha" in given.get(n, {}):
            p = M.get(n).resolve(ctx, given.get(n))
            keywords.update(M.get(n).keywords(p) if M.is_spec_field(n) else {})
    hf_fix.resolve(spec, **keywords)


def _apply_and_measure(model: str, outp: Path, names: list[str],
                       given: dict[str, dict[str, Any]], *, seq_len, seeds, sequences, device,
                       seed, stage) -> FixResult:
    """:func:`fix`'s work once its request is the registry's: check, diagnose, apply,
    write, re-diagnose."""
    from .. import models as hf
    from ..models import fixes as hf_fix
    from ..models import loading as hf_loading
    from ..models import methods as M
    from ..theory import depth

    folder = model_folder(model)
    if outp.exists() and not outp.is_dir():
        raise SpecError("out", f"{outp} exists and is not a folder")
    if folder is not None and outp.resolve() == folder.resolve():
        raise SpecError("out", "must differ from the model folder (it would be overwritten)")
    config = hf.load_config(model)
    _check_early(hf.spec_from_config(config, seq_len), names, given)
    stage("diagnosing the model as it is")
    before = diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences, device=device,
                      seed=seed)
    stage("applying the fix")
    m = hf.model_at_init(config, seed=seed, attn_implementation="sdpa")
    if folder is not None:
        hf.load_local_weights(m, folder)
    rep = M.apply_methods(m, names, given, M.context_for(m, before.spec, before.rho0,
                                                         before.embed_q))
    predicted = {k: {"final_cos": float(depth.final_cos(s, rho0=before.rho0)),
                     "verdict": depth.verdict(s, rho0=before.rho0)} if s is not None else
                 {"final_cos": None, "verdict": "measured only"}
                 for k, s in (("before", before.spec), ("after", rep.after))}
    report = hf_fix.FixReport(before.spec, rep.after if rep.after is not None else before.spec,
                              dict(m.config.sigprop_fix),
                              rep.changes or ["nothing to change"], predicted,
                              methods=rep.applied, measured_only=list(rep.effect.measured_only))
    stage(f"writing {outp}")
    outp.mkdir(parents=True, exist_ok=True)
    hf_loading.save_quietly(m, outp)
    del m
    stage("re-diagnosing the written model")
    after = diagnose(str(outp), seq_len=before.spec.seq_len, seeds=seeds, sequences=sequences,
                     device=device, seed=seed)
    return FixResult(before=before, report=report, after=after, out=str(outp))
