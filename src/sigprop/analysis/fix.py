"""``sigprop fix``: diagnose a model, patch the HuggingFace model built from it with the
chosen fixes, write it and re-diagnose the written folder, so the "after" is measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..spec import ArchSpec, SpecError
from .diagnose import Diagnosis, diagnose, model_folder
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

    from ..models.fixes import FixReport


def _save_quietly(model, folder: Path) -> None:
    """``save_pretrained`` without transformers' tqdm bar on stderr (libraries never print);
    the global progress-bar switch is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(folder), safe_serialization=True)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


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

    def plot(self, path: str | None = None):
        """The fixed model's depth curves (see :meth:`Diagnosis.plot`)."""
        return self.after.plot(path)


def fix(model: str, out, *, beta: float | None = None, alpha_attn: float | str | None = None,
        centred: bool = False, scaling: str | None = None, scaling_param: float | None = None,
        methods: str | list[str] | None = None, params: list[str] | None = None,
        seq_len: int | None = None, seeds: int = 2, sequences: int = 2, device: str = "cpu",
        seed: int = 0, on_stage: Callable[[str], None] | None = None) -> FixResult:
    """``sigprop fix``: diagnose ``model`` (preset, path or config), patch the HF model built
    from it (its folder's weights if it has them, else its init under ``seed``) with
    :func:`sigprop.models.fixes.apply_fix` (``beta``: Q/K rescaled to this gg25 beta;
    ``alpha_attn``: attention skip strength or ``"auto"``; ``centred``; ``scaling`` with
    ``scaling_param``) and then the registered ``methods`` (:mod:`sigprop.models.methods`,
    names or ``"a,b"``; ``params``: ``METHOD.NAME=VALUE``), write config + safetensors to
    ``out`` and re-diagnose ``out`` from disk, so the "after" is measured, not asserted."""
    from .. import models as hf
    from ..models import fixes as hf_fix
    from ..models import methods as M
    from ..theory import depth

    stage = on_stage or (lambda _s: None)
    outp, folder = Path(out).expanduser(), model_folder(model)
    if outp.exists() and not outp.is_dir():
        raise SpecError("out", f"{outp} exists and is not a folder")
    if folder is not None and outp.resolve() == folder.resolve():
        raise SpecError("out", "must differ from the model folder (it would be overwritten)")
    config = hf.load_config(model)
    legacy = beta is not None or alpha_attn is not None or centred or scaling is not None
    names = M.parse_methods(methods if isinstance(methods, str) else ",".join(methods)) \
        if methods else []
    given = M.parse_params(params, names) if names else {}
    if params and not names:
        raise SpecError("param", "needs --method")
    if not legacy and not names:
        raise SpecError("method", "give a method (or --beta, --alpha-attn, --centred, "
                                  "--scaling)")
    # bad fix options fail here, before minutes of measuring
    spec0 = hf.spec_from_config(config, seq_len)
    hf_fix.resolve(spec0, beta=beta, alpha_attn=alpha_attn, centred=centred, scaling=scaling,
                   scaling_param=scaling_param)
    for n in names:
        if n != "alpha":  # alpha's default runs the theory: checked when applied
            M.get(n).resolve(M.Context(spec=spec0), given.get(n))
    stage("diagnosing the model as it is")
    before = diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences, device=device,
                      seed=seed)
    stage("applying the fix")
    m = hf.model_at_init(config, seed=seed, attn_implementation="sdpa")
    if folder is not None:
        hf.load_local_weights(m, folder)
    per_layer = before.spec if before.spec.layers is not None else None
    report = None
    if legacy:
        report = hf.apply_fix(m, beta=beta, alpha_attn=alpha_attn, centred=centred,
                              scaling=scaling, scaling_param=scaling_param,
                              seq_len=before.spec.seq_len, rho0=before.rho0, spec=per_layer)
    if names:
        start = report.after if report is not None else before.spec
        mrep = M.apply_methods(m, names, given, M.context_for(m, start, before.rho0,
                                                              before.embed_q))
        after_spec = mrep.after
        pred_after = ({"final_cos": float(depth.final_cos(after_spec, rho0=before.rho0)),
                       "verdict": depth.verdict(after_spec, rho0=before.rho0)}
                      if after_spec is not None else
                      {"final_cos": None, "verdict": "measured only"})
        pred_before = (report.predicted["before"] if report is not None else
                       {"final_cos": float(depth.final_cos(before.spec, rho0=before.rho0)),
                        "verdict": depth.verdict(before.spec, rho0=before.rho0)})
        report = hf_fix.FixReport(
            before.spec, after_spec if after_spec is not None else start,
            dict(m.config.sigprop_fix), (report.changes if report is not None else [])
            + mrep.changes, {"before": pred_before, "after": pred_after},
            methods=mrep.applied, measured_only=list(mrep.effect.measured_only))
    stage(f"writing {outp}")
    outp.mkdir(parents=True, exist_ok=True)
    _save_quietly(m, outp)
    del m
    stage("re-diagnosing the written model")
    after = diagnose(str(outp), seq_len=before.spec.seq_len, seeds=seeds, sequences=sequences,
                     device=device, seed=seed)
    return FixResult(before=before, report=report, after=after, out=str(outp))
