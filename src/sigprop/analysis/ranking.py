"""``sigprop fix MODEL --compare``: :func:`rank_fixes` applies every registered fix
(:mod:`sigprop.models.methods`) to one model, predicts it with the theory, measures it and
ranks them (docs/fixes.md). (Formerly ``sigprop.analysis.compare.compare``, a name that
elsewhere means theory beside measurement: :class:`sigprop.Comparison`.)

For each seed the model is built once (its own init, or its folder's weights); each method
acts on a copy, which is measured as :func:`~.diagnose.diagnose` measures a live module
(built-in text, ``sequences`` sequences of ``seq_len`` tokens). The prediction is the theory
of the baseline's per-layer spec (read from its weights) mapped by the method's effect
(:func:`sigprop.models.methods.theory_spec`); ``None`` for the methods the theory does not
reach (their one-line reason in ``notes``).

The measured verdict is diagnose's (entropy collapse, rank collapse, trainable), with one
more failure the comparison measures: ``input_lost`` where the model would be called
trainable but its last block's output keeps no measurable trace of each token's own input
(:func:`sigprop.measurement.observables.kept` within noise of 0, :func:`kept_floor`). The
tokens stay apart, but the depth has replaced their directions with others
(docs/fixes.md, "Training the fixes").

Ranking rule: measured verdict ``trainable`` first; then, with training, the larger loss
gain; then the lower measured final cosine (further from rank collapse), then the higher
median head entropy. The recommendation is the first row.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..spec import ArchSpec, SpecError
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

    from .diagnosis import Diagnosis


@dataclass
class MethodRow:
    """One method of a :class:`FixRanking`: resolved ``params``, ``predicted`` (cos_final,
    entropy_min: the lowest layer-mean normalised entropy, ipr_max, verdict; None when the
    theory does not reach the method), ``measured`` (cos_final, entropy_min / entropy_median
    over every head of every layer, normalised by log T, ipr_max: the largest layer-mean
    ipr; ``entropy_bound_min`` / ``entropy_bound_centred_min``: the lowest per-head entropy
    floor from the weights, where it applies; ``kept``: :func:`sigprop.measurement.
    observables.kept` from the first block's input to the last block's output; averaged over
    seeds), the measured
    ``verdict``, ``train_gain`` (nats, with training) and ``error`` when the method does
    not apply to this model."""

    method: str
    title: str
    params: dict[str, Any]
    theory: str
    predicted: dict[str, Any] | None
    measured: dict[str, Any]
    verdict: str
    changes: list[str] = field(default_factory=list)
    train_gain: float | None = None
    error: str | None = None
    note: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "title": self.title, "params": self.params,
                "theory": self.theory, "predicted": self.predicted, "measured": self.measured,
                "verdict": self.verdict, "train_gain": self.train_gain, "error": self.error,
                "note": self.note, "changes": self.changes, "seconds": round(self.seconds, 3)}


@dataclass
class FixRanking(Result):
    """``sigprop fix --compare``: the baseline and one :class:`MethodRow` per method, ranked
    (module docstring; formerly ``FixComparison``). Not :class:`sigprop.Comparison`, which
    is ``measure``'s result."""

    model: str
    spec: ArchSpec
    baseline: dict[str, Any]
    rows: list[MethodRow]
    recommendation: dict[str, Any]
    seq_len: int
    seeds: int
    sequences: int
    train_steps: int = 0
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def trajectory(self) -> pd.DataFrame:
        """One row per method (and the baseline): measured and predicted numbers, tidy."""
        import pandas as pd

        out = []
        for name, pred, meas, verdict, gain in (
                [("baseline", self.baseline["predicted"], self.baseline["measured"],
                  self.baseline["verdict"], self.baseline.get("train_gain"))]
                + [(r.method, r.predicted, r.measured, r.verdict, r.train_gain)
                   for r in self.rows]):
            for src, d in (("theory", pred or {}), ("measured", meas or {})):
                for k, v in d.items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        out.append({"method": name, "observable": k, "source": src,
                                    "value": float(v), "verdict": verdict})
            if gain is not None:
                out.append({"method": name, "observable": "train_gain", "source": "measured",
                            "value": float(gain), "verdict": verdict})
        return pd.DataFrame(out)

    def summary(self) -> str:
        rec = self.recommendation
        return (f"FixRanking of {len(self.rows)} fixes on {self.model}: baseline "
                f"{self.baseline['verdict']}; best {rec.get('method')} ({rec.get('verdict')})")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "seq_len": self.seq_len, "seeds": self.seeds,
                "sequences": self.sequences, "train_steps": self.train_steps,
                "baseline": self.baseline, "methods": [r.to_dict() for r in self.rows],
                "recommendation": self.recommendation, "notes": self.notes,
                "ranking": RANKING}

    def plot(self, path: str | None = None, *, ax=None):
        """Final cos and lowest head entropy per method, ranked
        (:func:`sigprop.plotting.fixes.plot_ranking`; ``ax`` as there)."""
        from ..plotting.fixes import plot_ranking

        return plot_ranking(self, path, ax=ax)


RANKING = ("measured verdict trainable first; then the larger loss gain (with --train-steps); "
           "then the lower measured final cos; then the higher median head entropy")


def _measured(d: Diagnosis) -> dict[str, float]:
    t, h = d.trajectory, d.heads
    m = t[t.source == "measured"]
    cos = m[m.observable == "cos"].sort_values("layer")["value"].to_numpy()
    ipr = m[m.observable == "ipr"].groupby("layer")["value"].mean().to_numpy()
    ent = h[h.observable == "entropy"]["value"].to_numpy() if len(h) else np.array([])
    q = m[m.observable == "q"].groupby("layer")["value"].mean().sort_index().to_numpy()
    out = {"cos_final": float(cos[-1]) if cos.size else math.nan,
           "entropy_min": float(ent.min()) if ent.size else math.nan,
           "entropy_median": float(np.median(ent)) if ent.size else math.nan,
           "ipr_max": float(ipr.max()) if ipr.size else math.nan}
    if q.size > 1 and q[0] > 0:  # the stream's mean square at the end over at the input
        out["q_ratio"] = float(q[-1] / q[0])
    for name in ("entropy_bound", "entropy_bound_centred"):  # floors from the weights
        b = h[h.observable == name]["value"].to_numpy() if len(h) else np.array([])
        if b.size:
            out[f"{name}_min"] = float(b.min())
    return out


class _Kept:
    """Hooks on a model's first and last block recording :func:`sigprop.measurement.
    observables.kept` between the first block's input and the last block's output (its last
    application: ALBERT reapplies shared blocks), mean over sequences, during one forward
    pass: ``with _Kept(model, stack) as k: ...`` (``stack``: the block list diagnose
    measures, :func:`~sigprop.analysis.diagnose.model_inputs`), then ``k.value`` (None if
    the shapes differ). The input is the first one of the last output's shape: ``diagnose``
    runs a small forward first to learn the model's inputs."""

    def __init__(self, model, stack: str):
        from ..measurement.probe_sites import blocks_of

        blocks = blocks_of(model, stack)
        self._ends = (blocks[0][1], blocks[-1][1])
        self._x0s: list = []  # diagnose runs a small forward first (its inputs' check)
        self._xl = None
        self._handles: list = []

    def __enter__(self):
        from ..measurement.probe import first_tensor

        def pre(_m, args, kwargs):
            x = first_tensor(list(args) + list(kwargs.values()))
            if x is not None and not any(y.shape == x.shape for y in self._x0s):
                self._x0s.append(x)  # the first application per input shape

        def post(_m, _a, out):
            self._xl = first_tensor(out)

        self._handles = [self._ends[0].register_forward_pre_hook(pre, with_kwargs=True),
                         self._ends[1].register_forward_hook(post)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return False

    @property
    def value(self) -> float | None:
        from ..measurement.observables import kept

        xl = self._xl
        x0 = None if xl is None else next((y for y in self._x0s if y.shape == xl.shape), None)
        if x0 is None or xl is None or x0.ndim < 2:
            return None
        return float(kept(x0.detach().cpu(), xl.detach().cpu()).mean())


def _predicted(spec: ArchSpec, rho0: float, gi=None) -> dict[str, Any]:
    """The theory's row of ``spec``: its final cos (position-resolved from the unfixed
    model's measured input ``gi`` where that theory covers ``spec``,
    :func:`~.model_theory.gram_cos`, else homogeneous), the lowest entropy, the largest ipr
    and its verdict (homogeneous)."""
    from ..theory import depth
    from .model_theory import gram_cos

    tr = depth.propagate(spec, rho0=rho0)
    th = tr[tr.source == "theory"] if "source" in tr.columns else tr
    cos = th[th.observable == "cos"].sort_values("layer")["value"].to_numpy()
    resolved = gram_cos(spec, gi)
    if resolved is not None:
        cos = resolved
    ent = th[th.observable == "entropy"]["value"].to_numpy()
    ipr = th[th.observable == "ipr"]["value"].to_numpy()
    return {"cos_final": float(cos[-1]),
            "entropy_min": float(np.nanmin(ent)) if ent.size else None,
            "ipr_max": float(np.nanmax(ipr)) if ipr.size else None,
            "verdict": depth.verdict(spec, tr, rho0=rho0),
            "cos_theory": "homogeneous" if resolved is None else "position-resolved"}


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in rows[0]}


#: ``input_lost`` where ``|kept|`` is below KEPT_Z / sqrt(d n): the output keeps no
#: measurable trace of the tokens' own input. A token's cosine with an unrelated direction in
#: d dimensions has standard deviation 1/sqrt(d), so the mean of n of them ~1/sqrt(d n);
#: KEPT_Z = 5 leaves one false call in ~10^6 (tests/models/test_compare.py checks the spread).
#: On bert-tiny-collapse at T 64 (d 64, 2 sequences: floor 0.055) the fixes that do not
#: learn measure -0.02 to 0.01, those that learn 0.54-1.00 (docs/fixes.md); on GPT-2 at
#: init (floor 0.008) the baseline keeps 0.14.
KEPT_Z = 5.0


def kept_floor(d: int, n: int) -> float:
    """The ``|kept|`` below which the input counts as lost: ``KEPT_Z / sqrt(d n)`` for the
    mean of ``n`` token cosines in ``d`` dimensions."""
    return KEPT_Z / math.sqrt(max(d, 1) * max(n, 1))


#: ``signal_lost`` where the last block's output has a mean square below SIGNAL_FLOOR times
#: the first block's input's (its RMS 10^4 times smaller): a cosine of such states measures
#: rounding, not geometry. Dynamic Tanh in place of bert-deep-48's 97 post-LN norms shrinks
#: the stream ~4x a norm (tanh(x / 2) ~ x / 2): 7e-32 cos at the last of its 48 blocks.
SIGNAL_FLOOR = 1e-8


def _with_signal(verdict: str, q_ratio: float | None) -> str:
    """``verdict``, or ``signal_lost`` where the measured stream vanished (:data:`SIGNAL_FLOOR`;
    a non-finite ratio too)."""
    if q_ratio is not None and not (math.isfinite(q_ratio) and q_ratio >= SIGNAL_FLOOR):
        return "signal_lost"
    return verdict


def _with_kept(verdict: str, kept: float | None, floor: float) -> str:
    """``verdict`` (diagnose's), or ``input_lost`` where it is trainable and ``|kept|`` is
    measured below ``floor`` (:func:`kept_floor`; a sign flip, kept -1, keeps the input).
    ``kept`` reads alignment: a stack that rotated its stream would read as lost too; at
    init a residual stack carries its stream itself, so what lowers kept is what its
    branches add."""
    if verdict == "trainable" and kept is not None and math.isfinite(kept) and \
            abs(kept) < floor:
        return "input_lost"
    return verdict


def _key(error, verdict: str, train_gain: float | None, measured: dict) -> tuple:
    """The comparison's sort key (:data:`RANKING`) of one row's fields."""
    return (bool(error), verdict != "trainable",
            -(train_gain if train_gain is not None else -math.inf),
            measured.get("cos_final", math.inf), -measured.get("entropy_median", -math.inf))


def _rank_key(r: MethodRow):
    return _key(r.error is not None, r.verdict, r.train_gain, r.measured or {})


def ranked_rows(rows) -> list[dict]:
    """Saved comparison rows (the JSON's ``methods``) in the comparison's order
    (:data:`RANKING`), as :func:`rank_fixes` ranks its own."""
    return sorted(rows, key=lambda r: _key(r.get("error"), r.get("verdict"),
                                           r.get("train_gain"), r.get("measured") or {}))


def rank_fixes(model: Any = "bert-deep-48", methods: str | list[str] = "all",
               params: dict[str, dict[str, Any]] | None = None, *, seq_len: int | None = None,
               seeds: int = 1, sequences: int = 2, device: str = "cpu", seed: int = 0,
               train_steps: int = 0, on_method: Callable[[str], None] | None = None
               ) -> FixRanking:
    """Rank fixes on ``model`` (module docstring). ``methods``: ``"all"``, names or a
    comma-separated string; ``params``: ``{method: {name: value}}`` overrides (``sigprop fix
    --param METHOD.NAME=VALUE``; the strings themselves still work for a release, with a
    FutureWarning); ``train_steps``: with K > 0, each method also trains
    (:mod:`.compare_train`)."""
    from .. import models as hf
    from ..models import methods as M
    from .diagnose import diagnose

    t0 = time.perf_counter()
    names = M.parse_methods(methods if isinstance(methods, str) else ",".join(methods))
    given = M.method_params(params, names, caller="rank_fixes")
    if isinstance(train_steps, bool) or not isinstance(train_steps, int) or \
            not 0 <= train_steps <= 100_000:
        raise SpecError("train_steps", f"must be an integer in [0, 100000] (got "
                                       f"{train_steps!r})")
    stage = on_method or (lambda _s: None)
    stage("baseline")
    base = diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences, device=device,
                    seed=seed, recommendations=False)
    spec, config = base.spec, hf.load_config(model)
    baseline = _baseline(base)
    runs = _Runs(names)
    for s in range(seeds if base.weights == "init" else 1):
        _measure_seed(runs, model, config, base, given, sequences=sequences, device=device,
                      seed=seed + s, stage=stage)
    rows = runs.rows(baseline, spec.d_model, spec.seq_len * sequences)
    if train_steps:
        from .compare_train import train_gains

        stage("training")
        gains, note = train_gains(config, spec, names, given, rows, steps=train_steps,
                                  seed=seed, device=device)
        baseline["train_gain"] = gains.pop("baseline", None)
        for name, g in gains.items():
            rows[name].train_gain = g
        base.notes.append(note)
    ranked = sorted((rows[n] for n in names), key=_rank_key)
    best = ranked[0]
    rec = {"method": best.method, "params": best.params, "verdict": best.verdict,
           "measured": best.measured, "predicted": best.predicted,
           "command": fix_command(model, best.method, best.params)}
    return FixRanking(model=str(model) if not isinstance(model, dict) else "config",
                      spec=spec, baseline=baseline, rows=ranked, recommendation=rec,
                      seq_len=spec.seq_len, seeds=seeds, sequences=sequences,
                      train_steps=train_steps, notes=list(base.notes),
                      seconds=time.perf_counter() - t0)


def _baseline(base: Diagnosis) -> dict[str, Any]:
    """The unfixed model's row: the theory of its per-layer spec (where the diagnosis has
    one), its measured numbers and verdict, a summary of its spec."""
    spec = base.spec
    pred = _predicted(spec, base.rho0, base.gram_input) \
        if base.trajectory.source.eq("theory").any() else None
    return {"predicted": pred, "measured": _measured(base), "verdict": base.verdict,
            "spec": {"depth": spec.depth, "seq_len": spec.seq_len, "norm": spec.norm,
                     "beta": spec.beta_eff, "causal": spec.causal}}


class _Runs:
    """What the seeds measured: per method its rows (the first seed's parameters,
    prediction and changes; an error ends a method), measured numbers and verdicts; the
    baseline's ``kept`` per seed."""

    def __init__(self, names: list[str]):
        self.names = names
        self.first: dict[str, MethodRow] = {}
        self.measured: dict[str, list] = {n: [] for n in names}
        self.verdicts: dict[str, list] = {n: [] for n in names}
        self.kept_base: list[float] = []

    def rows(self, baseline: dict[str, Any], width: int, tokens: int
             ) -> dict[str, MethodRow]:
        """The rows averaged over seeds (the worst verdict), and the baseline's ``kept`` and
        its verdict against the floor of all its seeds' tokens (``tokens``: one seed's)."""
        if self.kept_base:
            baseline["measured"]["kept"] = float(np.mean(self.kept_base))
            baseline["verdict"] = _with_kept(baseline["verdict"], baseline["measured"]["kept"],
                                             kept_floor(width, tokens * len(self.kept_base)))
        baseline["verdict"] = _with_signal(baseline["verdict"],
                                           baseline["measured"].get("q_ratio"))
        for name, r in self.first.items():
            if r.error is None:
                r.measured = _mean(self.measured[name])
                r.verdict = _worst(self.verdicts[name])
        return self.first


def _measure_seed(runs: _Runs, model, config, base: Diagnosis, given, *, sequences: int,
                  device: str, seed: int, stage: Callable[[str], None]) -> None:
    """One seed: the model built once (its init under ``seed``, or its folder's weights),
    its ``kept``, then each method on a copy, measured as :func:`~.diagnose.diagnose`
    measures a live module."""
    import torch

    from .. import models as hf
    from ..models import methods as M
    from ..models.arch import input_kind
    from .forward import forward_once, model_folder, model_inputs

    spec = base.spec
    built = hf.model_at_init(config, seed=seed, attn_implementation="sdpa",
                             vocab_size=_vocab(config, base)).to(device)
    folder = model_folder(model)
    if folder is not None:
        hf.load_local_weights(built, folder)
    ctx = M.context_for(built, spec, base.rho0, base.embed_q)
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    inputs, stack, _ = model_inputs(built, config, input_kind(config), sequences=sequences,
                                    T=spec.seq_len, vocab=_vocab(config, base), seed=seed,
                                    device=device, enc_dec=enc_dec)
    with _Kept(built, stack) as k, torch.no_grad():
        forward_once(built, inputs, enc_dec)
    if k.value is not None:
        runs.kept_base.append(k.value)
    floor = kept_floor(spec.d_model, spec.seq_len * sequences)  # one seed's tokens
    for name in runs.names:
        if name in runs.first and runs.first[name].error is not None:
            continue
        stage(name)
        _measure_method(runs, name, built, ctx, given, stack, floor, base, sequences=sequences,
                        device=device, seed=seed)


def _measure_method(runs: _Runs, name: str, built, ctx, given, stack: str, floor: float,
                    base: Diagnosis, *, sequences: int, device: str, seed: int) -> None:
    """One method on a copy of ``built``: applied, measured, its verdict (with ``kept``);
    the first seed also sets its row (parameters, prediction, changes), or its error."""
    from ..models import methods as M
    from .diagnose import diagnose
    from .recommend import verdict_of

    t1 = time.perf_counter()
    meth, spec = M.get(name), base.spec
    m = copy.deepcopy(built)
    own = next((p for p in meth.params if p.name == "seed"), None)
    if own is not None and "seed" not in given.get(name, {}):
        # its draws follow the model's seed (folded into the parameter's range: a model seed
        # may reach 2^63), so that the seeds average over them too
        folded = seed % (int(own.hi) + 1) if own.hi is not None else seed
        given = {**given, name: {**given.get(name, {}), "seed": float(folded)}}
    try:
        rep = M.apply_methods(m, [name], given, ctx)
    except SpecError as err:
        runs.first[name] = MethodRow(name, meth.title, {}, meth.theory, None, {}, "n/a",
                                     error=str(err))
        return
    with _Kept(m, stack) as k:
        d = diagnose(m, seq_len=spec.seq_len, sequences=sequences, device=device, seed=seed,
                     recommendations=False)
    del m
    meas = _measured(d)
    if k.value is not None:
        meas["kept"] = k.value
    runs.measured[name].append(meas)
    runs.verdicts[name].append(_with_signal(_with_kept(verdict_of(spec, d.trajectory[
        d.trajectory.source == "measured"], d.heads, theory=False)[0], k.value, floor),
        meas.get("q_ratio")))
    if name not in runs.first:
        pred = None if rep.after is None else _predicted(rep.after, base.rho0,
                                                           base.gram_input)
        note = "; ".join(rep.effect.measured_only) or None
        runs.first[name] = MethodRow(name, meth.title, rep.applied[0]["params"], meth.theory,
                                     pred, {}, "", changes=rep.changes, note=note)
    runs.first[name].seconds += time.perf_counter() - t1


def _vocab(config, base) -> int:
    from .forward import vocab_at_init

    return vocab_at_init(config, base.info.vocab_size)


def _worst(verdicts: list[str]) -> str:
    for v in ("signal_lost", "entropy_collapse", "rank_collapse", "input_lost"):
        if v in verdicts:
            return v
    return verdicts[0] if verdicts else "n/a"


def fix_command(model, method: str, params: dict) -> str:
    """The ``sigprop fix`` command line that applies ``method`` at ``params`` to ``model``."""
    ps = " ".join(f"--param {method}.{k}={v:.6g}" if isinstance(v, float) else
                  f"--param {method}.{k}={v}" for k, v in params.items())
    return f"sigprop fix {model} --method {method} {ps} --out DIR".replace("  ", " ")
