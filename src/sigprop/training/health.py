"""Attention health during training, for any training loop: the in-step telemetry
(:class:`~sigprop.measurement.telemetry.AttentionTelemetry`) of every step, reduced across
data-parallel ranks, turned into scalars for the loggers, events and warnings, an early
warning (:mod:`sigprop.measurement.forecast`) and, optionally, QK-Clip after the optimizer
step (docs/monitor.md).

    health = AttentionHealth(model, qk_clip=100.0)     # or sigprop.attention_health(...)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        loss.backward(); opt.step(); opt.zero_grad()
        scalars = health.after_step(step)               # log them with your logger
    health.events                                        # what happened, step by step

Events (:class:`HealthEvent`, each warned once through :class:`AttentionWarning` unless
``warn=False``): ``non_finite`` (a head's largest logit is NaN or infinite: the run is told,
never stopped), ``forecast`` (a head's largest logit or beta is projected to cross its
threshold within ``horizon`` steps: the step it is expected at), ``crossed`` (it did),
``qk_clip`` (heads rescaled after this step's optimizer step; ``what``: ``max_logit``, or
``logit_bound`` under ``clip_on="bound"``, with the head's bound as ``value``),
``unreadable`` (an attention layer whose q and k the telemetry could not read, and why: told
once per layer; ``head`` -1).
Thresholds: the largest logit ``logit_limit`` (default the QK-Clip threshold, else 100),
beta = sigma_s / sqrt(log n) at ``beta_c`` (default sqrt 2, the REM's freezing point for
independent scores, docs/theory.md §2.1), and optionally a head's entropy falling to
``entropy_floor``.

Data parallel: when ``torch.distributed`` is initialised every rank must call
:meth:`after_step` at the same steps; the per-head statistics are reduced (the maximum of the
largest logit, the mean of the rest) so that QK-Clip rescales every replica identically, and
only rank 0 logs, keeps events and warns.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..measurement.forecast import Trend
from ..measurement.telemetry import STATS, AttentionTelemetry, rows_of
from ..spec import SpecError

__all__ = ["AttentionHealth", "AttentionWarning", "HealthEvent", "beta_of", "reduce_stats"]

#: the REM's freezing point for independent scores (docs/theory.md §2.1)
BETA_C = math.sqrt(2.0)
DEFAULT_LOGIT_LIMIT = 100.0
#: what QK-Clip acts on: the step's forward pass maxima (Kimi K2, Megatron), the step's
#: inputs formed again through the updated weights, or a bound over every input read from the
#: updated weights (:mod:`sigprop.models.methods.qk_bound`)
CLIP_ON = ("step", "updated", "bound")


@dataclass(frozen=True)
class HealthEvent:
    """One thing the health check saw: ``kind`` (``non_finite``, ``forecast``, ``crossed``,
    ``qk_clip``), where (``layer``, ``head``), ``step``, the quantity (``what``: max_logit,
    beta, entropy), its ``value`` and ``threshold``, and for a forecast the projected step
    ``at``."""

    step: int
    layer: int
    head: int
    kind: str
    what: str
    value: float
    threshold: float
    at: float | None = None
    slice: int | None = None  # sigprop's own stack: which stacked initialisation
    note: str | None = None  # ``unreadable``: why the layer could not be read

    def message(self) -> str:
        where = f"layer {self.layer}, head {self.head}" + (
            f", slice {self.slice}" if self.slice is not None else "")
        if self.kind == "unreadable":
            return f"step {self.step}: layer {self.layer}: not read by the telemetry: {self.note}"
        if self.kind == "non_finite":
            return f"step {self.step}: {where}: the largest attention logit is {self.value}"
        if self.kind == "forecast":
            return (f"step {self.step}: {where}: {self.what} {self.value:.4g} is projected to "
                    f"reach {self.threshold:.4g} at step {math.ceil(self.at)} "
                    f"({math.ceil(self.at) - self.step} steps ahead)")
        if self.kind == "crossed":
            return (f"step {self.step}: {where}: {self.what} {self.value:.4g} reached "
                    f"{self.threshold:.4g}")
        what = "logit bound" if self.what == "logit_bound" else "largest logit"
        return (f"step {self.step}: {where}: QK-Clip rescaled its logits by "
                f"{self.threshold / self.value:.4g} ({what} {self.value:.4g} > "
                f"{self.threshold:.4g})")


class AttentionWarning(UserWarning):
    """A health event worth telling (``.event``: the :class:`HealthEvent`)."""

    event: HealthEvent | None = None


def beta_of(st: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per head, gg25's beta = sigma_s / sqrt(log n) of one layer's telemetry (n: the sampled
    rows' mean number of visible keys, at least 2; docs/theory.md §2.1)."""
    return st["sigma_s"] / torch.log(st["keys"].clamp_min(2.0)).sqrt()


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


def reduce_stats(stats: dict[int, dict[str, torch.Tensor]]) -> dict[int, dict[str, torch.Tensor]]:
    """Per-head statistics reduced over the data-parallel ranks (every rank calls it with the
    same layers): the maximum of ``max_logit``, the mean of the others. Without an
    initialised process group: ``stats`` as they are."""
    d = _dist()
    if d is None or not stats:
        return stats
    layers = sorted(stats)
    names = [n for n in STATS if n != "max_logit"]
    mx = torch.stack([stats[i]["max_logit"] for i in layers]).double()
    mean = torch.stack([torch.stack([stats[i][n] for n in names]) for i in layers]).double()
    backend = d.get_backend()
    if backend == "nccl":
        dev = torch.device("cuda", torch.cuda.current_device())
        mx, mean = mx.to(dev), mean.to(dev)
    d.all_reduce(mx, op=d.ReduceOp.MAX)
    d.all_reduce(mean, op=d.ReduceOp.SUM)
    mean = mean / d.get_world_size()
    out = {}
    for j, i in enumerate(layers):
        out[i] = {"max_logit": mx[j].float().cpu()}
        out[i].update({n: mean[j, k].float().cpu() for k, n in enumerate(names)})
    return out


def _reduce_max(now: dict[int, dict[str, torch.Tensor]]) -> dict[int, dict[str, torch.Tensor]]:
    """The per-head maxima of :meth:`AttentionTelemetry.max_logit_now` reduced (max) over the
    data-parallel ranks, so that every replica is clipped alike."""
    d = _dist()
    layers = sorted(now)
    mx = torch.stack([now[i]["max_logit"] for i in layers]).double()
    if d.get_backend() == "nccl":
        mx = mx.to(torch.device("cuda", torch.cuda.current_device()))
    d.all_reduce(mx, op=d.ReduceOp.MAX)
    return {i: {"max_logit": mx[j].float().cpu()} for j, i in enumerate(layers)}


class AttentionHealth:
    """The attention health of a model in training (module docstring).

    ``rows``, ``every``, ``seed``: the telemetry's (sampled rows per call, read every
    ``every``-th step, row sampling seed). ``qk_clip``: the QK-Clip threshold tau (None: no
    clip) and ``clip_alpha`` its split between W_Q and W_K. ``logit_limit``, ``beta_c``,
    ``entropy_floor`` (None: no entropy trend), ``horizon``, ``window``, ``reach`` (project
    a rising quantity only within this factor of its threshold; None: always): the early
    warning, once per episode (again after a projection that did not come true).
    ``clip_on``: the maxima QK-Clip acts on, ``"step"`` (the step's forward pass, as Kimi K2
    and Megatron-LM do: the next step's logits can pass tau by one update's growth) or
    ``"updated"`` (the step's Q/K inputs formed again through the weights after the
    optimizer step, so the clipped weights give at most tau on the batch just seen; one more
    pass of the Q/K projections and the largest logit per layer) or ``"bound"`` (a certified
    clip: per head a bound on ``|logit|`` over every possible input, computed from the
    updated weights and the gain of the norm feeding the attention,
    :mod:`sigprop.models.methods.qk_bound`, is brought to tau, so every batch until the next
    update gives at most tau; the weights are also clipped once at construction, so the first
    forward is covered; a model whose attention input is not a norm's output is refused
    here, one line; scalars ``attention/logit_bound[/L<layer>[.H<head>]]``: the bound of the
    updated weights before the clip).
    ``per_head``: per-head scalars too. ``sinks``: ``sink(step, frame, scalars)`` callables
    (the results store's :func:`sigprop.integrations.hf.store_sink` among them) on every
    measured step. ``reduce``: reduce across data-parallel ranks when a process group is
    initialised."""

    def __init__(self, model: nn.Module, *, rows: int = 16, every: int = 1, seed: int = 0,
                 qk_clip: float | None = None, clip_alpha: float = 0.5,
                 logit_limit: float | None = None, beta_c: float = BETA_C,
                 entropy_floor: float | None = None, horizon: int = 200, window: int = 20,
                 per_head: bool = False, warn: bool = True, sinks: Sequence[Callable] = (),
                 reduce: bool = True, start: int = 0, reach: float | None = 4.0,
                 clip_on: str = "step"):
        for name, v in (("qk_clip", qk_clip), ("logit_limit", logit_limit)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not math.isfinite(v) or v <= 0):
                raise SpecError(name, f"must be a positive number (got {v!r})")
        if not (isinstance(beta_c, int | float) and math.isfinite(beta_c) and beta_c > 0):
            raise SpecError("beta_c", f"must be a positive number (got {beta_c!r})")
        if entropy_floor is not None and not (isinstance(entropy_floor, int | float)
                                              and 0 < entropy_floor < 1):
            raise SpecError("entropy_floor", f"must be a number in (0, 1) (got "
                                             f"{entropy_floor!r})")
        if reach is not None and not (isinstance(reach, int | float) and reach > 1):
            raise SpecError("reach", f"must be a number > 1 or None (got {reach!r})")
        if not (isinstance(clip_alpha, int | float) and 0 <= clip_alpha <= 1):
            raise SpecError("clip_alpha", f"must be a number in [0, 1] (got {clip_alpha!r})")
        for name, v, lo in (("horizon", horizon, 1), ("window", window, 5)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(name, f"must be an integer >= {lo} (got {v!r})")
        if clip_on not in CLIP_ON:
            raise SpecError("clip_on", f"must be one of {', '.join(CLIP_ON)} (got {clip_on!r})")
        self.model, self.clip_on = model, clip_on
        self.bound = None
        if qk_clip is not None and clip_on == "bound":
            from ..models.methods.qk_bound import LogitBound

            self.bound = LogitBound(model)  # refuses what it cannot bound, before any hook
        self.telemetry = AttentionTelemetry(
            model, rows=rows, every=every, seed=seed, start=start,
            keep_inputs=qk_clip is not None and clip_on == "updated")
        self.qk_clip, self.clip_alpha = qk_clip, float(clip_alpha)
        limit = float(logit_limit or qk_clip or DEFAULT_LOGIT_LIMIT)
        kw = dict(window=window, min_points=min(5, window), horizon=horizon)
        self.trends = {"max_logit": Trend(limit, reach=reach, **kw),
                       "beta": Trend(float(beta_c), reach=reach, **kw)}
        if entropy_floor is not None:
            self.trends["entropy"] = Trend(float(entropy_floor), rising=False, reach=None,
                                           **kw)
        self.per_head, self.warn, self.reduce = per_head, warn, reduce
        self.sinks = list(sinks)
        self.events: list[HealthEvent] = []
        self.rows: list[dict] = []
        self.scalars: list[dict] = []
        self._told: set = set()
        self._crossed: set = set()
        self._forecast: dict = {}  # (what, (layer, head)) -> the last projected step
        self._clip_index: dict | None = None  # telemetry layer -> qk_clip_'s, on first use
        self._bound_scalars: dict[str, float] = {}
        d = _dist()
        self.rank0 = d is None or d.get_rank() == 0
        if self.bound is not None:
            self._check_bound_covers()
            self._tell(self._clip_bound(self.telemetry.step - 1))

    # ---- one step ----------------------------------------------------------------------
    def after_step(self, step: int | None = None) -> dict[str, float]:
        """Read the step's statistics (after the optimizer step; on steps the telemetry did
        not read: ``{}``), reduce them across ranks, apply QK-Clip, update the forecasts and
        tell the sinks (rank 0). Returns the step's scalars."""
        step = self.telemetry.step if step is None else int(step)
        stats = self.telemetry.end_step(step)
        if self.reduce:
            stats = reduce_stats(stats)
        missing = self._unreadable(step)
        # the certified clip runs after every optimizer step, read by the telemetry or not
        clipped = self._clip_bound(step) if self.bound is not None else []
        if not stats:
            self._tell(missing + clipped)
            return {}
        events = missing + self._check(step, stats)
        if self.qk_clip is not None and self.bound is None:
            events += self._clip(step, stats)
        events += clipped
        scalars = {**self._scalars(stats), **self._bound_scalars}
        if self.rank0:
            rows = rows_of(stats, step)
            self.rows += rows
            self.scalars.append({"step": step, **scalars})
            if self.sinks:
                import pandas as pd

                frame = pd.DataFrame.from_records(rows)
                for sink in self.sinks:
                    sink(step, frame, scalars)
        self._tell(events)
        return scalars

    def _unreadable(self, step: int) -> list[HealthEvent]:
        """The attention layers the telemetry has newly found it cannot read, once each."""
        out = []
        for layer, why in sorted(self.telemetry.unreadable.items()):
            if ("unreadable", layer) not in self._told:
                self._told.add(("unreadable", layer))
                out.append(HealthEvent(step, layer, -1, "unreadable", "q/k", math.nan,
                                       math.nan, note=why))
        return out

    def _tell(self, events: list[HealthEvent]) -> None:
        """Keep ``events`` and warn each but QK-Clip's (rank 0; :meth:`after_step`'s caller
        is where the warning points)."""
        if not (events and self.rank0):
            return
        self.events += events
        if self.warn:
            for e in events:
                if e.kind != "qk_clip":
                    w = AttentionWarning(e.message())
                    w.event = e
                    warnings.warn(w, stacklevel=3)

    def _check(self, step: int, stats) -> list[HealthEvent]:
        out = []
        for layer, st in stats.items():
            values = {"max_logit": st["max_logit"], "beta": beta_of(st),
                      "entropy": st["entropy"]}
            for h in range(len(st["max_logit"])):
                m = float(st["max_logit"][h])
                if not math.isfinite(m):
                    if ("non_finite", layer, h) not in self._told:
                        self._told.add(("non_finite", layer, h))
                        out.append(HealthEvent(step, layer, h, "non_finite", "max_logit", m,
                                               math.inf))
                    continue
                for what, trend in self.trends.items():
                    v = float(values[what][h])
                    key = (layer, h)
                    trend.add(key, step, v)
                    if trend.crossed(v) and (what, key) not in self._crossed:
                        self._crossed.add((what, key))
                        out.append(HealthEvent(step, layer, h, "crossed", what, v,
                                               trend.threshold))
                        continue
                    p = trend.project(key)
                    last = self._forecast.get((what, key))
                    # once per episode: again only after an earlier projection's step has
                    # passed by a window without the crossing (the trend faded)
                    if p is not None and (last is None or step > last + trend.window):
                        self._forecast[(what, key)] = p.at
                        out.append(HealthEvent(step, layer, h, "forecast", what, v,
                                               trend.threshold, p.at))
        return out

    def _clip(self, step: int, stats) -> list[HealthEvent]:
        """QK-Clip on every head whose largest logit passed the threshold
        (:func:`sigprop.models.methods.qk_clip.qk_clip_`; its layers are matched to the
        telemetry's by block name)."""
        from ..models.methods.qk_clip import qk_clip_, qk_clip_own_

        if self.clip_on == "updated":  # the maxima the updated weights give on these inputs
            now = self.telemetry.max_logit_now()
            if self.reduce and now and _dist() is not None:
                now = _reduce_max(now)
            stats = {i: {**st, **now.get(i, {})} for i, st in stats.items()}
        own = self.telemetry._own  # sigprop's own stack: each slice clipped by its own maxima
        if own:
            out = []
            for i, st in stats.items():
                if i in own:
                    m = st.get("slice:max_logit", st["max_logit"][None])
                    for r in qk_clip_own_(own[i], m, tau=float(self.qk_clip),
                                          alpha=self.clip_alpha):
                        if r["gamma"] is not None:
                            out.append(HealthEvent(step, i, r["head"], "qk_clip", "max_logit",
                                                   r["max_logit"], float(self.qk_clip),
                                                   slice=r["slice"]))
            return out
        index = self._layer_index()
        back = {v: k for k, v in index.items()}
        logits = {index[i]: st["max_logit"] for i, st in stats.items() if i in index}
        done = qk_clip_(self.model, logits, tau=float(self.qk_clip), alpha=self.clip_alpha)
        return [HealthEvent(step, back[int(r["layer"])], int(r["head"]), "qk_clip",
                            "max_logit", float(r["max_logit"]), float(self.qk_clip))
                for r in done if r.get("gamma") is not None]

    def _layer_index(self) -> dict[int, int]:
        """Telemetry layer -> QK-Clip's layer index (:func:`~sigprop.models.methods.qk_clip.
        attention_layers`), matched by block name; found once."""
        from ..models.methods.qk_clip import attention_layers

        if self._clip_index is None:
            names = [n for n, _ in attention_layers(self.model)]
            self._clip_index = {i: names.index(n) for i, (n, _) in
                                enumerate(self.telemetry.blocks) if n in names}
        return self._clip_index

    def _check_bound_covers(self) -> None:
        """``clip_on="bound"`` certifies every layer the telemetry reads, or refuses."""
        index = self._layer_index()
        left = [self.telemetry.blocks[i][0] for i in self.telemetry.attention_layers
                if i not in index]
        if left:
            self.telemetry.close()
            raise SpecError("clip_on", f"'bound' cannot bound this model's logits: the "
                                       f"attention of {', '.join(left)} is outside the block "
                                       "list QK-Clip rescales")

    def _clip_bound(self, step: int) -> list[HealthEvent]:
        """The certified clip (``clip_on="bound"``): every head whose bound over all inputs
        (:class:`~sigprop.models.methods.qk_bound.LogitBound`, the weights as they are now)
        passed tau is rescaled by tau / bound through
        :func:`~sigprop.models.methods.qk_clip.qk_clip_`. Keeps the bounds as scalars."""
        from ..models.methods.qk_clip import qk_clip_

        back = {v: k for k, v in self._layer_index().items()}
        bounds = self.bound.bounds()
        sc: dict[str, float] = {}
        for i, b in bounds.items():
            t = back.get(i, i)
            sc[f"attention/logit_bound/L{t}"] = float(b.max())
            if self.per_head:
                for h, v in enumerate(b.tolist()):
                    sc[f"attention/logit_bound/L{t}.H{h}"] = float(v)
        sc["attention/logit_bound"] = max(float(b.max()) for b in bounds.values())
        self._bound_scalars = sc
        done = qk_clip_(self.model, bounds, tau=float(self.qk_clip), alpha=self.clip_alpha)
        return [HealthEvent(step, back.get(int(r["layer"]), int(r["layer"])), int(r["head"]),
                            "qk_clip", "logit_bound", float(r["max_logit"]),
                            float(self.qk_clip)) for r in done if r.get("gamma") is not None]

    def _scalars(self, stats) -> dict[str, float]:
        out: dict[str, float] = {}
        every = []
        for layer, st in stats.items():
            mx = st["max_logit"]
            every.append(mx)
            out[f"attention/max_logit/L{layer}"] = float(mx.max())
            out[f"attention/entropy/L{layer}"] = float(st["entropy"].nanmean())
            out[f"attention/sink/L{layer}"] = float(st["sink"].mean())
            out[f"attention/beta/L{layer}"] = float(beta_of(st).max())
            if self.per_head:
                for h in range(len(mx)):
                    out[f"attention/max_logit/L{layer}.H{h}"] = float(mx[h])
                    out[f"attention/entropy/L{layer}.H{h}"] = float(st["entropy"][h])
        allm = torch.cat(every)
        out["attention/max_logit"] = float(allm.max()) if bool(torch.isfinite(allm).all()) \
            else float("nan")
        ents = torch.cat([st["entropy"] for st in stats.values()])
        out["attention/min_entropy"] = float(ents[~ents.isnan()].min()) if \
            bool((~ents.isnan()).any()) else float("nan")
        return out

    # ---- results -----------------------------------------------------------------------
    def trajectory(self):
        """Every measured step's per-head rows (``step, layer, head, observable, value``)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.rows, columns=["step", "layer", "head",
                                                             "observable", "value"])

    def close(self) -> None:
        """Remove the telemetry's hooks."""
        self.telemetry.close()
