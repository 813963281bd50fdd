"""Diagnosing trained weights with one set of numbers (docs/theory.md §2.10).

The theory's score scale is read from the weights under the input law of an initialised
model (isotropic tokens of one cosine, unit norms). Trained weights on real text break that
law: queries and keys align with each other and with the tokens, so the score scale the
weights imply can be ten times off the one the attention actually has (a 6-layer BERT:
0.60 from the weights, 2.92 measured). On trained weights every number the verdict, the
failing heads and the advice read therefore comes from the **measured scores** on the
model's own inputs:

* per head, ``beta = sigma_s / sqrt(log T)`` with ``sigma_s`` the measured logit RMS, and
  ``beta_c`` of the measured input cosine of its layer (:func:`head_scales`);
* ``derived`` is the theory's derived table of the spec rescaled to the measured beta
  (:meth:`ArchSpec.with_beta`), so ``derived.beta`` *is* the measured beta, with the
  weights' value beside it (``beta_weights``) and their ratio (:func:`measured_derived`);
* the theory trajectory is kept as the at-init reference of these weights, and each layer
  says whether it still describes the measurement (``theory``: ``describes`` when the final
  cosine gap is within :data:`GAP_DESCRIBES`) or is only a reference (:func:`theory_gaps`).

The verdict on trained weights (:func:`verdict_trained`) reads the heads' roles
(:mod:`sigprop.analysis.anatomy`): heads that are sharp on the first token, a special token
or a position are sharp by design; a layer is entropy-collapsed when most of its heads are
``collapsed`` (near-zero entropy on content keys with no such reason). Rank collapse is read
as at init, on the measured cosine of real text.

The advice (:func:`recommend_trained`) names the content heads above beta_c with a factor
each on W_Q and W_K (:func:`risky_heads`, :func:`rescale_factors`); the diagnosis applies it
and measures its effect with one more probe draw (:mod:`sigprop.analysis.advice_effect`,
:class:`TrainedAdvice` ``measured``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..spec import ArchSpec
from .recommend import ENTROPY_MIN, Recommendation, length_scaling

#: a layer whose final-cosine gap (measured - theory) stays within this still has its theory
#: describing the trained weights; beyond it the theory is an at-init reference only (the
#: at-init agreement of the theory with simulation is ~0.03 on the mean of two seeds)
GAP_DESCRIBES = 0.05

#: a layer is entropy-collapsed on trained weights when at least this fraction of its heads is
#: ``collapsed`` (a single collapsed head among sink and positional heads is a failing head,
#: not a failing layer)
COLLAPSED_SHARE = 0.5


def head_scales(heads, meas, seq_len: int):
    """Per (layer, head), from the measured scores: ``sigma_s``, ``beta = sigma_s / sqrt(log
    T)``, the measured input cosine ``rho_in`` of the layer (the cosine at the layer below),
    ``beta_c(rho_in)`` and ``beta_over_beta_c``. A DataFrame (empty without measured
    ``sigma_s``)."""
    import pandas as pd

    from ..theory import rem

    sig = heads[(heads.observable == "sigma_s") & (heads.source == "measured")]
    if not len(sig):
        return pd.DataFrame(columns=["layer", "head", "sigma_s", "beta", "rho_in", "beta_c",
                                     "beta_over_beta_c"])
    cos = meas[meas.observable == "cos"].set_index("layer")["value"]
    out = sig[["layer", "head"]].astype(int).copy()
    out["sigma_s"] = sig["value"].to_numpy(dtype=float)
    out["beta"] = out["sigma_s"] / math.sqrt(math.log(seq_len))
    out["rho_in"] = np.clip([float(cos.get(int(x) - 1, np.nan)) for x in out["layer"]], 0, 1)
    out["beta_c"] = np.asarray(rem.beta_c(out["rho_in"].to_numpy()), dtype=float)
    out["beta_over_beta_c"] = out["beta"] / out["beta_c"]
    return out.reset_index(drop=True)


def measured_derived(spec: ArchSpec, rho0: float, scales) -> dict:
    """``derived`` on trained weights: the theory's derived table at the measured beta (RMS
    over every measured head, the aggregate the weights' beta uses), with ``beta_weights``
    (from the weights), ``beta_measured`` (the same number as ``beta``) and
    ``beta_measured_over_weights``. Without measured scores: the weights' table (and no
    ``beta_weights`` key: the caller can tell)."""
    weights = spec.derived(rho0)
    if not len(scales) or not np.isfinite(scales["beta"]).any():
        return weights
    beta = float(np.sqrt(np.nanmean(np.square(scales["beta"].to_numpy()))))
    out = spec.with_beta(beta).derived(rho0)
    bw = weights["beta"]
    out.update(beta_measured=beta, beta_weights=bw,
               sigma_s_weights=weights["sigma_s"],
               beta_measured_over_weights=beta / bw if bw > 0 else None)
    return out


def theory_gaps(layer_rows: list[dict], traj, scales) -> list[dict]:
    """The per-block table on trained weights: each row gains the measured ``beta_measured``
    (RMS over its heads), the measured input cosine ``rho_in_measured``, ``beta_c_measured``
    of it, ``beta_over_beta_c_measured``, ``heads_over_measured``, the gap of
    the measured cosine at its output from the theory's (``theory_gap_cos``) and ``theory``:
    ``describes`` (gap within :data:`GAP_DESCRIBES`) or ``at-init reference``."""
    cos = traj[traj.observable == "cos"]
    th = cos[cos.source == "theory"].groupby("layer")["value"].first()
    ms = cos[cos.source == "measured"].groupby("layer")["value"].first()
    out = []
    for row in layer_rows:
        r = dict(row)
        h = scales[scales.layer == r["layer"]] if len(scales) else scales
        if len(h):
            b = float(np.sqrt(np.mean(np.square(h["beta"].to_numpy()))))
            bc = float(h["beta_c"].iloc[0])
            r.update(beta_measured=b, rho_in_measured=float(h["rho_in"].iloc[0]),
                     beta_c_measured=bc, beta_over_beta_c_measured=b / bc,
                     heads_over_measured=[int(x) for x in h[h.beta_over_beta_c > 1]["head"]])
        gap = float(ms.get(r["layer"], np.nan) - th.get(r["layer"], np.nan))
        r["theory_gap_cos"] = gap if np.isfinite(gap) else None
        r["theory"] = "describes" if np.isfinite(gap) and abs(gap) <= GAP_DESCRIBES \
            else "at-init reference"
        out.append(r)
    return out


def trained_note(derived: dict, layer_rows: list[dict]) -> str:
    """One line for the notes: where beta comes from and how far the theory is."""
    if "beta_weights" not in derived:
        return ("trained weights: no measured scores (q / k not captured); beta from the "
                "weights under the at-init input law")
    ref = [r["layer"] for r in layer_rows if r.get("theory") == "at-init reference"]
    gaps = [abs(r["theory_gap_cos"]) for r in layer_rows if r.get("theory_gap_cos") is not None]
    where = ("the theory describes every layer" if not ref else
             f"the theory is an at-init reference at {len(ref)} of {len(layer_rows)} layers "
             f"(largest cos gap {max(gaps):.3g})")
    return (f"trained weights: beta {derived['beta']:.3g} from the measured scores (the "
            f"weights under the at-init input law give {derived['beta_weights']:.3g}, ratio "
            f"{derived['beta_measured_over_weights']:.3g}); verdict and advice read the "
            f"measured numbers; {where}")


def verdict_trained(spec: ArchSpec, meas, heads, roles) -> tuple[str, int | None, list[int]]:
    """``(verdict, first failing layer, failing heads)`` on trained weights: entropy collapse
    where at least :data:`COLLAPSED_SHARE` of a layer's heads are ``collapsed``
    (:func:`sigprop.analysis.anatomy.head_roles`; without roles, the at-init rule on the
    head-averaged entropy, its heads below :data:`ENTROPY_MIN` failing); else rank collapse
    where the measured cosine reaches ``rho_max``; else trainable."""
    if spec.attention != "uniform":
        if roles is not None and len(roles):
            for layer, g in roles.groupby("layer"):
                bad = g[g.role == "collapsed"]
                if len(bad) and len(bad) >= COLLAPSED_SHARE * len(g):
                    return "entropy_collapse", int(layer), sorted(int(x) for x in bad["head"])
        else:
            ent = meas[meas.observable == "entropy"].set_index("layer")["value"]
            low = [int(layer) for layer, v in ent.items() if v < ENTROPY_MIN]
            if low:
                h = heads[(heads.layer == low[0]) & (heads.observable == "entropy")]
                return "entropy_collapse", low[0], sorted(
                    int(x) for x in h[h.value < ENTROPY_MIN]["head"])
    cos = meas[meas.observable == "cos"].set_index("layer")["value"]
    high = [int(layer) for layer, v in cos.items() if layer > 0 and v >= spec.rho_max]
    if high:
        return "rank_collapse", high[0], []
    return "trainable", None, []


@dataclass(frozen=True, kw_only=True)
class TrainedAdvice(Recommendation):
    """A :class:`Recommendation` on trained weights, with its measured effect where one was
    measured (``measured``: for the score-scale advice ``heads``, per rescaled head its factor,
    beta / beta_c before, after and ``predicted_after``, entropy before and after, and ``how``;
    for the length scaling ``predicted_only`` and ``how``; JSON-safe). Written last by
    :meth:`Recommendation.to_dict`, left out where None."""

    measured: dict | None = None


def recommend_trained(spec: ArchSpec, derived: dict, scales, roles=None
                      ) -> list[Recommendation]:
    """Advice for trained weights, from the measured scores (never an init std): the score
    scale of the heads at risk for continued training (measured beta above beta_c and not a
    sink, positional or selective head, sharp by design: QK-norm, a temperature, or
    rescaling their W_Q, W_K, one factor per head) and the length scaling for a longer
    context (measured beta at 16 x T with fixed Q/K and with log-n scaling; predicted
    only: ``sigprop longctx`` measures it). The measured effect of the rescale:
    :func:`sigprop.analysis.diagnose.diagnose` (one more probe draw)."""
    out: list[Recommendation] = [_risky_heads(derived, scales, roles)]
    # the length scaling of the measured beta, by the at-init recommendation's own rule
    ls = length_scaling(spec.with_beta(derived["beta"]), derived["beta_c"], measured=True)
    out.append(TrainedAdvice(**_fields(ls), measured={
        "predicted_only": True,
        "how": f"the entropy at T={ls.seq_len} with and without the scaling needs inputs of "
               f"that length: sigprop longctx measures it (the command in the text)"}))
    return out


def _fields(rec: Recommendation) -> dict:
    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}


def risky_heads(scales, roles=None) -> list[tuple[int, int, float]]:
    """``(layer, head, beta / beta_c)`` of the content heads at risk: measured beta above
    beta_c, sink, positional and selective heads (sharp by design) left out."""
    by_design = set()
    if roles is not None and len(roles):
        sharp = roles[roles.role.isin(("sink", "positional", "selective"))]
        by_design = {(int(a), int(b)) for a, b in zip(sharp["layer"], sharp["head"], strict=True)}
    over = scales[scales.beta_over_beta_c > 1] if len(scales) else scales
    return [(int(a), int(b), float(r)) for a, b, r in
            zip(over["layer"], over["head"], over["beta_over_beta_c"], strict=True)
            if (int(a), int(b)) not in by_design] if len(over) else []


def rescale_factors(risky) -> dict[tuple[int, int], float]:
    """Per head at risk, the factor on its W_Q and W_K that brings its beta to beta_c:
    ``sqrt(beta_c / beta)`` (the scores scale by its square)."""
    return {(a, b): math.sqrt(1.0 / r) for a, b, r in risky}


def _risky_heads(derived: dict, scales, roles) -> TrainedAdvice:
    risky = risky_heads(scales, roles)
    beta, bc = derived["beta"], derived["beta_c"]
    head = (f"measured beta {beta:.3g} (beta_c(rho0) = {bc:.3g}; from the weights under the "
            f"at-init input law: {derived.get('beta_weights', beta):.3g})")
    if not risky:
        return TrainedAdvice(what="score scale", current=beta, limit=bc, text=head + (
            ": no content head above beta_c; nothing to change for continued training"))
    factors = rescale_factors(risky)
    names = ", ".join(f"L{a}.H{b}" for a, b, _ in risky[:8]) + (" ..." if len(risky) > 8
                                                                  else "")
    each = ", ".join(f"L{a}.H{b} {factors[(a, b)]:.3g}" for a, b, _ in risky[:8]) + (
        " ..." if len(risky) > 8 else "")
    worst = max(r for _, _, r in risky)
    return TrainedAdvice(
        what="score scale", current=beta, limit=bc, text=head + (
            f": {len(risky)} content head(s) above beta_c ({names}; up to {worst:.2f} x "
            f"beta_c). For continued training or fine-tuning: QK-norm or a temperature on "
            f"them, or scale each one's W_Q and W_K by sqrt(beta_c / beta) ({each}; beta -> "
            "beta_c), and a lower learning rate on Q/K (sigprop fix --method qk-norm)"))


def with_measured(rec: Recommendation, measured: dict, line: str) -> TrainedAdvice:
    """``rec`` with its measured effect (``measured["line"]``: the console's line under its
    text, which stays as it was)."""
    return TrainedAdvice(**{**_fields(rec), "measured": {**measured, "line": line}})


def roles_of(heads):
    """Each head's role (:func:`sigprop.analysis.anatomy.head_roles`), or None where the
    anatomy was not recorded."""
    from .anatomy import head_roles

    meas = heads[heads.source == "measured"]
    if not len(meas) or "content_entropy" not in set(meas.observable):
        return None
    return head_roles(meas)


def weights_state(loaded: bool, side, notes: list[str]):
    """``(state, InitCheck or None)``: ``init`` for a model this run initialised (``loaded``
    False); else the check against a fresh init beside it (``side``: a
    :class:`~sigprop.analysis.vs_init.BesideInit`; ``trained``, ``mixed`` or ``init``), with
    its notes; a folder or module whose check could not run counts as trained."""
    if not loaded:
        return "init", None
    if side is not None:
        notes += list(side.notes)
    check = None if side is None else side.check
    if check is None:
        return "trained", None
    notes += [f"weights: {n}" for n in check.notes]
    if check.state == "init":
        notes.append("weights: every matrix of the measured blocks matches a fresh init "
                     "within its noise: the at-init theory and verdict apply")
    elif side.structured is False:
        notes.append("weights: the matrices that left the init law were only rescaled (their "
                     "spectrum keeps the init's shape): i.i.d. weights, so the theory read from "
                     "the weights and the at-init verdict apply (docs/theory.md §2.8)")
    return check.state, check
