"""The result of :func:`~sigprop.analysis.diagnose.diagnose`: :class:`Diagnosis`, and its JSON
form (:func:`to_json`, the ``sigprop diagnose --format json`` output) with the per-head tables
the reports show (:func:`head_extremes`, :func:`per_head`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..spec import ArchSpec
from ..trajectory import clean
from .model_theory import measured_q0
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

    from ..models.arch import HFInfo


@dataclass
class Diagnosis(Result):
    """A model measured layer by layer with the theory of its ArchSpec beside it:
    ``trajectory`` (theory + measured rows), ``heads`` (per layer and head), ``verdict``, the
    first failing layer and heads, ``recommendations`` with their predicted effect, ``notes``
    on what the theory does not cover."""

    model: str
    spec: ArchSpec
    info: HFInfo
    trajectory: pd.DataFrame
    heads: pd.DataFrame
    derived: dict
    verdict: str
    first_failing_layer: int | None
    failing_heads: list[int]
    recommendations: list[dict]
    rho0: float
    seconds: float
    trained: bool = False
    notes: list[str] = field(default_factory=list)
    seeds: int = 0  # initialisations measured (1 for a folder's trained weights)
    sequences: int = 0  # sequences per initialisation
    seed: int = 0  # first seed
    #: where the measured weights came from: ``"init"`` (the model's own init under ``seed``),
    #: ``"folder"`` (a model folder's weight files) or ``"module"`` (the nn.Module given)
    weights: str = "init"
    #: the measured stack: ``"encoder"`` (every single-stack model) or ``"decoder"``
    stack: str = "encoder"
    #: per block: beta (RMS over heads, from the weights), rho_in, beta_c, their ratio, the
    #: heads above beta_c (docs/theory.md §2.8); empty for a measured-only diagnosis
    layers: list[dict] = field(default_factory=list)
    #: the measured block list's qualified name (``encoder.layer``, ``model.language_model.
    #: layers`` of a composite model ...)
    stack_path: str = ""
    #: ``stack="decoder"``: the decoder blocks' cross-attention statistics (measured rows,
    #: per layer: ipr, ipr_cross, entropy, wmax, sigma_s over the encoder positions), else None
    cross: Any = None
    #: what the model read, in words: real text through its tokenizer, or sigprop's built-in
    #: token ids (the at-init default)
    inputs: str = ""
    #: per head, on trained weights: its role (sink, positional, diffuse, content,
    #: collapsed; :func:`sigprop.analysis.anatomy.head_roles`), None where not measured
    roles: Any = None
    #: ``init``, ``trained`` or ``mixed``: the measured blocks' matrices against a fresh init
    #: of the config (:mod:`sigprop.measurement.weights_init`; ``init`` for a model this run
    #: initialised)
    weights_state: str = "init"
    #: the per-matrix check behind ``weights_state`` (an ``InitCheck``), None when not run
    weights_check: Any = None
    #: with ``vs_init``: the trained and the fresh model side by side (``VsInit``), else None
    vs_init: Any = None
    #: a causal text stack's measured input geometry (:class:`~sigprop.analysis.model_theory.
    #: GramInput`: the first block's token cosine matrices, the RoPE frequencies), from which
    #: its theory cos is position-resolved (docs/theory.md §2.9), and ``sigprop fix --compare``
    #: predicts each fix; None where that theory does not run
    gram_input: Any = None

    @property
    def embed_q(self) -> float | None:
        """The first block's input squared norm per dimension as measured (mean over the
        seeds), None when not measured: the unit of a pre-LN spec's branch variances."""
        return measured_q0(self.trajectory)


def head_extremes(heads) -> list[dict]:
    """Per layer: the heads with the lowest and highest attention entropy."""
    ent = heads[(heads.observable == "entropy") & np.isfinite(heads["value"].astype(float))]
    out = []
    for layer, g in ent.groupby("layer"):
        i, j = g["value"].idxmin(), g["value"].idxmax()
        out.append({"layer": int(layer), "min_entropy_head": int(g.loc[i, "head"]),
                    "min_entropy": float(g.loc[i, "value"]),
                    "max_entropy_head": int(g.loc[j, "head"]),
                    "max_entropy": float(g.loc[j, "value"])})
    return out


def per_head(d: Diagnosis) -> list[dict]:
    """One entry per layer and head: ``sigma_s`` (from the weights), ``beta``,
    ``beta_over_beta_c`` (beta_c of the layer's theory input cosine), the measured
    ``sigma_s_measured``, ``entropy``, ``ipr``, and the entropy floors from the weights
    ``entropy_bound`` / ``entropy_bound_centred`` (None where not available). On trained
    weights also ``beta_measured`` and ``beta_over_beta_c_measured`` (beta_c of the measured
    input cosine) and, where the anatomy was measured, ``role``, ``role_why``, ``max_logit``,
    ``top_key`` (the share of the head's content mass on its most-read key) and, on real
    text, ``copy`` and ``induction`` (mass on earlier copies of the query's token / on the
    key after one)."""
    h = d.heads
    if h is None or not len(h):
        return []
    key = h["observable"] + ":" + h["source"]
    wide = h.assign(key=key).pivot_table(index=["layer", "head"], columns="key",
                                         values="value", aggfunc="first")
    logt = math.sqrt(math.log(d.spec.seq_len))
    bc = {r["layer"]: r["beta_c"] for r in d.layers}
    scales = _measured_scales(d)
    roles = {} if d.roles is None or not len(d.roles) else {
        (int(r.layer), int(r.head)): r for r in d.roles.itertuples()}
    out = []
    for (layer, head), row in wide.iterrows():
        def get(k, row=row):
            v = row.get(k)
            return None if v is None or not np.isfinite(v) else float(v)

        sig = get("sigma_s:weights")
        beta = None if sig is None else sig / logt
        c = bc.get(int(layer))
        out.append({"layer": int(layer), "head": int(head), "sigma_s": sig, "beta": beta,
                    "beta_over_beta_c": None if beta is None or c is None else beta / c,
                    "sigma_s_measured": get("sigma_s:measured"),
                    "entropy": get("entropy:measured"), "ipr": get("ipr:measured"),
                    "entropy_bound": get("entropy_bound:bound"),
                    "entropy_bound_centred": get("entropy_bound_centred:bound")})
        if scales is not None:  # trained weights: the measured numbers the verdict reads
            sc = scales.get((int(layer), int(head)), {})
            out[-1].update(beta_measured=clean(sc.get("beta")),
                           beta_over_beta_c_measured=clean(sc.get("beta_over_beta_c")))
        r = roles.get((int(layer), int(head)))
        if r is not None:
            out[-1].update(role=r.role, role_why=r.why, max_logit=clean(r.max_logit),
                           top_key=clean(getattr(r, "top_key", None)),
                           copy=clean(getattr(r, "copy", None)),
                           induction=clean(getattr(r, "induction", None)))
    return out


def _measured_scales(d: Diagnosis) -> dict | None:
    """Per (layer, head), the measured beta and beta / beta_c the verdict of trained weights
    read (:func:`sigprop.analysis.trained.head_scales`, the one place they are computed); None
    for a diagnosis on the at-init path."""
    from .trained import head_scales

    if not any("beta_c_measured" in r for r in d.layers):
        return None
    traj = d.trajectory
    sc = head_scales(d.heads, traj[traj.source == "measured"], d.spec.seq_len)
    return {(int(a), int(b)): row for a, b, row in
            zip(sc["layer"], sc["head"], sc.to_dict("records"), strict=True)}


def to_json(d: Diagnosis, *, timing: bool = True) -> dict:
    """The diagnosis as the CLI's JSON; ``timing=False`` leaves out the wall-clock
    ``seconds`` (same seed -> byte-identical output)."""
    from .. import trajectory

    out = {"model": d.model, "spec": d.spec.to_dict(), "derived": d.derived,
            "architecture": d.info.to_dict() if hasattr(d.info, "to_dict") else {},
            "rows": trajectory.to_rows(d.trajectory), "heads": head_extremes(d.heads),
            "verdict": d.verdict, "first_failing_layer": d.first_failing_layer,
            "failing_heads": d.failing_heads, "recommendations": d.recommendations,
            "rho0": d.rho0, "trained_weights": d.trained, "notes": d.notes,
            "seeds": d.seeds, "sequences": d.sequences, "seed": d.seed,
            "weights": d.weights, "weights_state": d.weights_state,
            "weights_check": None if d.weights_check is None else d.weights_check.to_dict(),
            "vs_init": None if d.vs_init is None else d.vs_init.to_dict(),
            "inputs": d.inputs, "stack": d.stack,
            "stack_path": d.stack_path,
            "layers": d.layers,
            "cross_attention": [] if d.cross is None else trajectory.to_rows(d.cross),
            "per_head": per_head(d),
            "seconds": d.seconds, "n_layers_measured": int(np.sum(
                (d.trajectory.source == "measured") & (d.trajectory.observable == "ipr")))}
    if not timing:
        del out["seconds"]
    return out
