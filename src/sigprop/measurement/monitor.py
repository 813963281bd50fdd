"""Training-time monitor (docs/monitor.md): every K steps, measure the docs/theory.md §1
observables on one held batch and say when a layer crosses into rank or entropy collapse.

    mon = Monitor(model, batch, every=50)       # or sigprop.monitor(model, batch, every=50)
    for step in range(steps):
        ...                                      # the user's own training step
        mon(step)                                # measures only when step % 50 == 0

A measurement runs the held batch through :class:`~.probe.Probe` (per-layer ``cos``, ``q``,
``stable_rank``; per-layer and per-head ``ipr``, ``ipr_cross``, ``entropy``, ``wmax``) and,
with ``grads=True``, takes the Q/K/V weight gradients of the same forward pass with
:func:`~.gradients.qkv_grad_norms` (``torch.autograd.grad``: the training run's ``.grad`` is
never touched). The model is in eval mode during the measurement (no dropout) and goes back
to the mode it was in. Models the probe cannot hook (sigprop's own seed-sliced training
model) pass ``measure=``, a function returning their rows; everything after the measurement
(the ``step`` column, the scalars, the collapse check, the warning, the sinks) is shared.

Each measurement gives three things: the tidy Trajectory rows with a ``step`` column (the
per-head rows carry ``head``), a flat dict of scalars for loggers (:func:`scalar_names`) and
the collapse events. Collapse, as :func:`sigprop.analysis.diagnose` judges a measurement:
rank collapse when the head-averaged mean token cosine ``cos >= rho_max`` at a layer > 0;
entropy collapse when a layer's head-averaged *normalised* attention entropy (row entropy over
``log`` of the row's key count, so 1 is uniform and 0 one-hot, causal rows included) falls
below ``entropy_min``. Every collapsed (step, layer, kind) is kept in ``events``; the first of
each kind raises one :class:`CollapseWarning` (``warnings.warn``: the library never prints).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from .. import trajectory as _traj
from .gradients import MLMReadoutLoss, grads_to_trajectory, qkv_grad_norms
from .probe import Probe, find_blocks, first_tensor, to_trajectory

__all__ = ["CollapseEvent", "CollapseWarning", "ModelOrReadoutLoss", "Monitor", "find_collapse",
           "monitor", "probe_rows", "scalar_names"]

RHO_MAX = 0.9
ENTROPY_MIN = 0.5
KINDS = ("rank_collapse", "entropy_collapse")

#: a sink receives every measurement: ``sink(step, frame, scalars)``
Sink = Callable[[int, pd.DataFrame, dict], Any]


class CollapseWarning(UserWarning):
    """A monitored layer crossed into rank or entropy collapse; ``.event`` is the
    :class:`CollapseEvent` (step, layer, kind, value, threshold)."""

    event: CollapseEvent | None = None


@dataclass(frozen=True)
class CollapseEvent:
    """One layer in collapse at one measuring step. ``kind``: ``rank_collapse`` (``value`` is
    the layer's cos, ``threshold`` rho_max) or ``entropy_collapse`` (``value`` the
    head-averaged normalised entropy, ``threshold`` entropy_min). ``group``: the values of
    the monitor's ``group_by`` columns for this row (e.g. ``{"beta": 8.0}``)."""

    step: int
    layer: int
    kind: str
    value: float
    threshold: float
    group: dict = field(default_factory=dict)

    def message(self) -> str:
        where = "".join(f", {k}={_fmt(v)}" for k, v in self.group.items())
        if self.kind == "rank_collapse":
            what = (f"rank collapse at step {self.step}: layer {self.layer}{where} has mean "
                    f"token cosine {self.value:.4g} >= rho_max {self.threshold:g} (the tokens' "
                    f"representations are nearly parallel)")
        else:
            what = (f"entropy collapse at step {self.step}: layer {self.layer}{where} has "
                    f"head-averaged normalised attention entropy {self.value:.4g} < "
                    f"entropy_min {self.threshold:g} (attention frozen onto few tokens)")
        return what


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


# ---- the held batch and the default loss ------------------------------------------------
def _to_device(batch, device):
    """The batch (dict / tuple / list / tensor) with every tensor on ``device``."""
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _forward(model: nn.Module, batch):
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


class ModelOrReadoutLoss:
    """The loss a measurement differentiates: the model's own ``output.loss`` when it
    returns one (HF models given ``labels`` in the batch), else :class:`MLMReadoutLoss` (a
    fixed random readout, seeded) of the output's hidden states (``last_hidden_state``, the
    first tensor of a tuple) or, for a head model without labels, of its ``logits``."""

    def __init__(self, seed: int = 0):
        self.readout = MLMReadoutLoss(seed=seed)

    def __call__(self, output) -> torch.Tensor:
        loss = getattr(output, "loss", None)
        if torch.is_tensor(loss) and loss.ndim == 0:
            return loss
        h = first_tensor(output)
        if h is None:
            h = getattr(output, "logits", None)
        if h is None:
            raise ValueError("cannot find hidden states or logits in the model output; "
                             "give Monitor(loss_fn=...)")
        return self.readout(h)


# ---- scalars -----------------------------------------------------------------------------
_SKIP = {"layer", "observable", "source", "value", "stderr", "step", "head", "weight"}


def scalar_names(frame: pd.DataFrame, group_by: Sequence[str] = ()) -> dict[str, float]:
    """The flat ``{name: value}`` dict loggers get from one measurement's rows.

    ``sigprop/<observable>/layer_<LL>`` for a layer's value (head-averaged for attention
    statistics), ``.../head_<h>`` for one head, ``sigprop/grad_q|grad_k|grad_v/layer_<LL>``
    for the squared gradient norms of W_Q / W_K / W_V, ``sigprop/loss`` for the held batch's
    loss, and the two numbers the collapse check reads: ``sigprop/cos/max`` (largest cos at a
    layer > 0) and ``sigprop/entropy/min`` (smallest head-averaged entropy). ``LL`` is the
    layer zero-padded to two digits (three past 99 layers), so names sort by depth. With
    ``group_by`` columns each name ends with ``/<column>_<value>``. Non-finite values are left
    out (a logger's chart would break on them)."""
    out: dict[str, float] = {}
    if frame.empty:
        return out
    width = max(2, len(str(int(frame["layer"].max()))))
    cols = list(frame.columns)
    has_head, has_weight = "head" in cols, "weight" in cols
    groups = [c for c in group_by if c in cols]
    summary: dict[str, float] = {}
    for rec in frame.to_dict("records"):
        v = rec["value"]
        if v is None or not math.isfinite(v):
            continue
        obs, layer = rec["observable"], int(rec["layer"])
        head = rec["head"] if has_head else None
        head = None if head is None or (isinstance(head, float) and math.isnan(head)) else head
        suffix = "".join(f"/{c}_{_fmt(rec[c])}" for c in groups)
        if obs == "loss":
            out[f"sigprop/loss{suffix}"] = float(v)
            continue
        if obs in ("grad_qk", "grad_v") and has_weight and isinstance(rec["weight"], str):
            obs = f"grad_{rec['weight']}"
        name = f"sigprop/{obs}/layer_{layer:0{width}d}"
        if head is not None:
            name += f"/head_{int(head)}"
        out[name + suffix] = float(v)
        if head is None and obs == "cos" and layer > 0:
            key = f"sigprop/cos/max{suffix}"
            summary[key] = max(summary.get(key, -math.inf), float(v))
        elif head is None and obs == "entropy":
            key = f"sigprop/entropy/min{suffix}"
            summary[key] = min(summary.get(key, math.inf), float(v))
    out.update(summary)
    return out


def find_collapse(frame: pd.DataFrame, step: int, rho_max: float = RHO_MAX,
                  entropy_min: float = ENTROPY_MIN,
                  group_by: Sequence[str] = ()) -> list[CollapseEvent]:
    """The collapse events in one measurement's rows (head-averaged rows only; NaN values
    are never a collapse): every layer > 0 whose ``cos >= rho_max`` and every layer whose
    ``entropy < entropy_min``, in row order."""
    if frame.empty:
        return []
    sel = frame["observable"].isin(("cos", "entropy"))
    if "head" in frame.columns:
        sel &= frame["head"].isna()
    groups = [c for c in group_by if c in frame.columns]
    events = []
    for rec in frame[sel].to_dict("records"):
        v, layer = rec["value"], int(rec["layer"])
        if v is None or not math.isfinite(v):
            continue
        grp = {c: _traj.clean(rec[c]) for c in groups}
        if rec["observable"] == "cos" and layer > 0 and v >= rho_max:
            events.append(CollapseEvent(step, layer, "rank_collapse", float(v), rho_max, grp))
        elif rec["observable"] == "entropy" and v < entropy_min:
            events.append(CollapseEvent(step, layer, "entropy_collapse", float(v),
                                        entropy_min, grp))
    return events


# ---- the measurement -----------------------------------------------------------------------
def probe_rows(model: nn.Module, batch, *, grads: bool = True, per_head: bool = True,
               loss_fn: Callable | None = None, probe_kwargs: Mapping | None = None
               ) -> pd.DataFrame:
    """One measurement of ``model`` on ``batch`` (the caller sets eval mode): the Probe's rows
    (mean ± stderr over the batch's sequences; per-head rows with ``head`` when
    ``per_head``) and, with ``grads``, the ``grad_qk`` / ``grad_v`` rows of
    :func:`~.gradients.grads_to_trajectory` and a ``loss`` row (held-batch loss, at the last
    layer). With ``grads`` the probe and the gradients share one forward pass (the probe's
    statistics are computed under no_grad inside its hooks); without, the forward runs under
    no_grad."""
    with Probe(model, **{"keep_hidden": False, **dict(probe_kwargs or {})}) as p:
        if grads:
            g = qkv_grad_norms(model, batch, loss_fn, layers=(probe_kwargs or {}).get("layers"),
                               eval_mode=False)
        else:
            with torch.no_grad():
                _forward(model, batch)
    records = to_trajectory(p, per_head=per_head).to_dict("records")
    if grads:
        records += grads_to_trajectory(g).to_dict("records")
        records.append(dict(layer=len(g["q"]), observable="loss", source="measured",
                            value=g["loss"], stderr=math.nan))
    return _traj.make(records)


class Monitor:
    """Measure ``model`` on a held ``batch`` every ``every`` steps (module docstring).

    ``batch``: a dict (``model(**batch)``), a tuple (``model(*batch)``) or a tensor, moved
    to the model's device once. ``loss_fn``: maps the model output to the scalar whose Q/K/V
    gradients are measured; default :class:`ModelOrReadoutLoss` (``output.loss`` when the
    batch has labels, else a seeded random readout). ``grads=False`` skips the gradients
    (one no_grad forward per measurement instead of a forward and a backward).
    ``per_head``: per-head attention rows and scalars. ``rho_max`` / ``entropy_min``: the
    collapse thresholds. ``sinks``: callables ``sink(step, frame, scalars)`` called after
    every measurement (a logger, the results store). ``measure``: ``measure(model, batch) ->
    DataFrame`` of Trajectory rows, for models the probe cannot hook. ``warn``: raise a
    :class:`CollapseWarning` for the first event of each kind. ``group_by``: columns that tell
    rows of one layer apart besides ``head`` (e.g. ``beta``), named in scalars and events.
    ``keep``: keep every measured frame (:meth:`trajectory`). ``seed``: the default loss's
    readout. ``probe_kwargs``: passed to :class:`~.probe.Probe` (``layers``, ``attention``,
    ``causal`` ...).

    Attributes after measuring: ``events`` (every :class:`CollapseEvent`), ``scalars`` (the
    last measurement's dict), ``steps`` (the measured steps), ``warned`` (kinds warned).
    """

    def __init__(self, model: nn.Module, batch, *, every: int = 50,
                 loss_fn: Callable | None = None, grads: bool = True, per_head: bool = True,
                 rho_max: float = RHO_MAX, entropy_min: float = ENTROPY_MIN,
                 sinks: Sequence[Sink] = (), measure: Callable | None = None, warn: bool = True,
                 group_by: Sequence[str] = (), keep: bool = True, seed: int = 0,
                 probe_kwargs: Mapping | None = None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"every must be a non-negative integer (got {every!r}; "
                             f"0 measures only when forced)")
        if not 0.0 < rho_max <= 1.0:
            raise ValueError(f"rho_max must be in (0, 1] (got {rho_max})")
        if not 0.0 <= entropy_min <= 1.0:
            raise ValueError(f"entropy_min must be in [0, 1] (got {entropy_min})")
        self.model, self.every = model, every
        self.rho_max, self.entropy_min = float(rho_max), float(entropy_min)
        self.sinks, self.warn, self.keep = list(sinks), warn, keep
        self.group_by = tuple(group_by)
        param = next(model.parameters(), None)
        self.batch = batch if param is None else _to_device(batch, param.device)
        if measure is None:
            pk = dict(probe_kwargs or {})
            if pk.get("layers") is None:
                find_blocks(model)  # fail now, not at the first measuring step
            lf = ModelOrReadoutLoss(seed) if loss_fn is None else loss_fn

            def measure(m, b):
                return probe_rows(m, b, grads=grads, per_head=per_head, loss_fn=lf,
                                  probe_kwargs=pk)
        self._measure = measure
        self.events: list[CollapseEvent] = []
        self.warned: set[str] = set()
        self.scalars: dict[str, float] = {}
        self.steps: list[int] = []
        self._frames: list[pd.DataFrame] = []

    def due(self, step: int) -> bool:
        """Whether ``step`` is a measuring step (a multiple of ``every``; never for 0)."""
        return self.every > 0 and step % self.every == 0

    def __call__(self, step: int, *, force: bool = False) -> pd.DataFrame | None:
        """Measure at ``step`` if it is due (or ``force``): the step's rows, else None."""
        if not (force or self.due(step)):
            return None
        return self.measure(step)

    def measure(self, step: int) -> pd.DataFrame:
        """Measure now (eval mode, restored after) and :meth:`record` the rows."""
        was_training = self.model.training
        self.model.eval()
        try:
            frame = self._measure(self.model, self.batch)
        finally:
            self.model.train(was_training)
        return self.record(step, frame)

    def record(self, step: int, frame: pd.DataFrame) -> pd.DataFrame:
        """Everything after a measurement: the ``step`` column, the scalars, the collapse
        events (a warning for the first of each kind), the sinks. Returns the rows."""
        step = int(step)
        frame = frame.copy()
        frame["step"] = step
        self.scalars = scalar_names(frame, self.group_by)
        events = find_collapse(frame, step, self.rho_max, self.entropy_min, self.group_by)
        self.events.extend(events)
        for ev in events:
            if ev.kind not in self.warned:
                self.warned.add(ev.kind)
                if self.warn:
                    w = CollapseWarning(ev.message())
                    w.event = ev
                    warnings.warn(w, stacklevel=4)
        self.steps.append(step)
        if self.keep:
            self._frames.append(frame)
        for sink in self.sinks:
            sink(step, frame, self.scalars)
        return frame

    def trajectory(self) -> pd.DataFrame:
        """Every kept measurement's rows, in step order of measuring (``keep=True``)."""
        if not self._frames:
            return _traj.make([])
        return pd.concat(self._frames, ignore_index=True)

    def first(self, kind: str) -> CollapseEvent | None:
        """The first event of ``kind`` (``rank_collapse`` / ``entropy_collapse``), if any."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (got {kind!r})")
        return next((e for e in self.events if e.kind == kind), None)


def monitor(model: nn.Module, batch, every: int = 50, **options) -> Monitor:
    """The plain hook for a custom training loop: ``mon = monitor(model, batch, every=50)``,
    then ``mon(step)`` after each optimiser step (it measures when ``step % every == 0``).
    ``options``: as :class:`Monitor`."""
    return Monitor(model, batch, every=every, **options)
