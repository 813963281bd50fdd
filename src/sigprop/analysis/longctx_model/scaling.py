"""Step 5, the recommendation: length scalings (logit multipliers ``m(n)`` of the number of
visible keys) and the smallest one that keeps every layer's predicted entropy in its band.

A scaling is a :class:`Scaling`; the search (:func:`recommend`) tries the model as it is, the
n-dependent kinds, SSMax multiples of log-n and constant temperatures, predicts each with
:func:`.theory.layer_theory` and returns a :class:`Recommendation`, which the engine completes
once the recommended scaling has been streamed (``holds_measured``, ``fix_command``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...spec import SpecError, score_multiplier
from .capture import LayerFit
from .theory import LayerMoments, layer_theory

#: the scalings a run can stream or predict (docs/theory.md §3.2)
KINDS = ("none", "sqrt-log-n", "log-n", "qwen", "sqrt-qwen", "ssmax", "yarn", "tau")
#: ``--compare`` without a list: every kind at its default parameter
COMPARE_ALL = ("none", "sqrt-log-n", "log-n", "qwen", "sqrt-qwen")
#: the kinds whose parameter is a reference length (default: the training length)
_LENGTH_PARAM = ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen")


@dataclass(frozen=True)
class Scaling:
    """A logit multiplier ``m(n)`` of the number ``n`` of visible keys
    (:func:`sigprop.spec.score_multiplier`), ``label`` as it appears in the ``scaling`` column."""

    kind: str
    param: float | None = None
    label: str = ""

    def mult(self, n) -> np.ndarray:
        return score_multiplier(self.kind, np.asarray(n, dtype=np.float64), self.param)


def _label(kind: str, param: float | None, train_len: int) -> str:
    if kind == "none" or (kind in _LENGTH_PARAM and (param is None or param == train_len)):
        return kind
    return f"{kind}({param:.4g})"


def parse_scaling(text: str, train_len: int) -> Scaling:
    """``kind`` or ``kind:param`` (``log-n``, ``sqrt-log-n``, ``qwen``, ``sqrt-qwen``: param is
    the reference length, default the training length; ``ssmax``: s, default
    ``1 / log(train_len)``; ``yarn``: extension factor s >= 1; ``tau``: temperature)."""
    kind, _, raw = text.strip().partition(":")
    if kind not in KINDS:
        raise SpecError("scalings", f"each must be one of {', '.join(KINDS)}, optionally "
                                    f"kind:param (got {text!r})")
    param: float | None = None
    if raw:
        try:
            param = float(raw)
        except ValueError:
            raise SpecError("scalings", f"{text!r}: the parameter must be a number") from None
        if not math.isfinite(param) or param <= 0:
            raise SpecError("scalings", f"{text!r}: the parameter must be a positive number")
        if kind in _LENGTH_PARAM and param <= 1:
            raise SpecError("scalings", f"{text!r}: the reference length must be > 1")
        if kind == "yarn" and param < 1:
            raise SpecError("scalings", f"{text!r}: the yarn factor must be >= 1")
    if param is None:
        param = {"log-n": train_len, "sqrt-log-n": train_len, "qwen": train_len,
                 "sqrt-qwen": train_len,
                 "ssmax": 1.0 / math.log(train_len), "yarn": 1.0, "tau": 1.0,
                 "none": None}[kind]
    param = None if param is None else float(param)
    return Scaling(kind, param, _label(kind, param, train_len))


def own_scaling(config, train_len: int) -> Scaling:
    """The multiplier a ``sigprop fix`` recorded in the config (else ``none``): the model as
    it is."""
    rec = getattr(config, "sigprop_fix", None)
    kind = (rec.get("scaling") if isinstance(rec, dict) else None) or "none"
    if kind == "none":
        return Scaling("none", None, "none")
    param = rec.get("scaling_param")
    param = float(param) if param is not None else None
    return Scaling(kind, param, _label(kind, param, train_len) if param is not None else kind)


def _candidates(own: Scaling, train_len: int) -> list[tuple[Scaling, Scaling, float]]:
    """``(candidate, base scaling, constant factor)``: the candidate's multiplier is the base's
    times the factor. Order = preference on ties: the model as it is, the n-dependent kinds,
    SSMax multiples of log-n, temperatures."""
    out = [(own, own, 1.0)]
    for kind in ("sqrt-qwen", "qwen", "sqrt-log-n", "log-n"):
        s = parse_scaling(kind, train_len)
        out.append((s, s, 1.0))
    logn = parse_scaling("log-n", train_len)
    for c in np.geomspace(0.5, 2.0, 25):
        if abs(c - 1.0) > 1e-9:
            s_param = float(c / math.log(train_len))
            out.append((Scaling("ssmax", s_param, _label("ssmax", s_param, train_len)), logn,
                        float(c)))
    for t in np.geomspace(0.25, 4.0, 49):
        if abs(t - 1.0) > 1e-9 and own.kind == "none":
            out.append((Scaling("tau", float(t), _label("tau", float(t), train_len)), own,
                        float(t)))
    return out


def change_size(s: Scaling, own: Scaling, lengths: Sequence[int]) -> float:
    """How large a change is: the largest |log| ratio of its multiplier to the model's own over
    the lengths from training to target."""
    n = np.asarray(lengths, dtype=np.float64)
    return float(np.max(np.abs(np.log(s.mult(n) / own.mult(n)))))


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The scaling :func:`recommend` picks and why. ``holds_measured`` and ``fix_command`` are
    None until the engine has streamed it (:meth:`measured`); :meth:`to_dict` is the
    ``recommendation`` object of the JSON."""

    scaling: Scaling
    #: largest |log| ratio of its multiplier to the model's own (training to longest length)
    size: float
    #: worst predicted |entropy - band centre| over layers and lengths
    predicted_worst_deviation: float
    holds_predicted: bool
    reason: str
    #: how many candidates the search tried
    tried: int
    holds_measured: bool | None = None
    fix_command: str | None = None

    def measured(self, holds: bool, model_name: str, own: Scaling) -> Recommendation:
        """This recommendation once streamed: whether every layer stayed in band, and the
        ``sigprop fix`` command that applies it (``no change needed`` for the model as it
        is)."""
        s = self.scaling
        if s.kind == own.kind and s.param == own.param:
            command = "no change needed"
        else:
            command = f"sigprop fix {model_name} --out FIXED --scaling {s.kind}"
            if s.param is not None:
                command += f" --scaling-param {s.param:.6g}"
        return replace(self, holds_measured=holds, fix_command=command)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``scaling`` (kind), ``scaling_param``, ``label``, the search's
        fields and, once measured, ``holds_measured`` and ``fix_command``."""
        out = {"scaling": self.scaling.kind, "scaling_param": self.scaling.param,
               "label": self.scaling.label, "size": self.size,
               "predicted_worst_deviation": self.predicted_worst_deviation,
               "holds_predicted": self.holds_predicted, "reason": self.reason,
               "tried": self.tried}
        if self.fix_command is not None:
            out.update(holds_measured=self.holds_measured, fix_command=self.fix_command)
        return out


def recommend(moms: list[LayerMoments], fits: list[LayerFit], own: Scaling, train_len: int,
              lengths: Sequence[int], band: float,
              bands: dict[int, tuple[float, float]] | None = None) -> Recommendation:
    """The smallest change keeping every layer's predicted entropy within ``band`` of its
    predicted entropy at ``train_len`` (the model as it is) at every length from ``train_len``
    to the longest: candidates of :func:`_candidates`, theory of :func:`layer_theory`.
    ``bands``: given bands per layer (their middle and half-width replace those)."""
    span = sorted({t for t in lengths if t >= train_len} | {train_len})
    cands = _candidates(own, train_len)
    bases: dict[str, tuple[Scaling, list[int]]] = {}
    for i, (_, base, _) in enumerate(cands):
        bases.setdefault(base.label, (base, []))[1].append(i)
    dev = np.zeros(len(cands))  # worst |entropy - centre| over layers and lengths
    for f, mom in zip(fits, moms, strict=True):
        centre = float(layer_theory(mom, train_len, own.mult, causal=f.causal,
                                    window=f.window, d_head=f.head_dim)["entropy"])
        width = band
        if bands and f.index in bands:
            lo, hi = bands[f.index]
            centre, width = 0.5 * (lo + hi), 0.5 * (hi - lo)
        for base, idx in bases.values():
            factors = np.array([cands[i][2] for i in idx])
            for T in span:
                th = layer_theory(mom, T, base.mult, causal=f.causal, window=f.window,
                                  d_head=f.head_dim, extra=factors)
                dev[idx] = np.maximum(dev[idx], np.abs(th["entropy"] - centre) - width + band)
    sizes = np.array([change_size(c[0], own, span) for c in cands])
    ok = dev <= band
    if ok.any():
        pick = int(np.flatnonzero(ok)[np.argmin(sizes[ok])])
        reason = (f"smallest change keeping every layer's predicted entropy within +/-{band:g} "
                  f"of its value at the training length {train_len} up to {max(span)}")
    else:
        pick = int(np.argmin(dev))
        reason = (f"no candidate keeps every layer within +/-{band:g}; this one comes closest "
                  f"(worst predicted deviation {dev[pick]:.3f})")
    return Recommendation(scaling=cands[pick][0], size=float(sizes[pick]),
                          predicted_worst_deviation=float(dev[pick]),
                          holds_predicted=bool(ok[pick]), reason=reason,
                          tried=int(len(cands)))
