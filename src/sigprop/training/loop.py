"""Training checks: does a spec that the theory calls trainable actually train (gg25 Figs 1f, 4)?

One :func:`train` call trains ``config.seeds`` independent initialisations at once (the seed is
the leading dimension of every weight of :class:`sigprop.nn.model.SigpropTransformer`), and
optionally several score scales ``betas`` side by side (slice ``i * seeds + j`` holds beta ``i``,
seed ``j``; the Q/K draws are the same for every beta, rescaled by ``sqrt(beta)`` as the REM
initialisation of docs/theory.md §2.1 prescribes). The loss is the sum of the slices' losses, so
every slice gets its own gradient; AdamW and weight decay act elementwise, so each slice behaves
as an independent run; gradient clipping is applied to each slice's own norm. The steps are
those of :func:`sigprop.training.steps.run`, the loop every trainer in sigprop shares; the
AdamW and the clipping are in :mod:`sigprop.training.optim`.

Optimiser defaults follow gg25 A.1/A.3 (AdamW, linear schedule with warmup ratio 0.05, weight
decay 0.01 on matrices only (HF's convention: not on biases), gradient norm clipped at 1,
batch 64, MLM masking 0.15). Learning rate 2e-3 instead of Fig. 4's 5e-4: gg25 trains an
epoch of TinyStories, a CPU check trains ~2,000 steps; measured on the built-in stories (1 layer,
d = T = 64, 2,000 steps): at 5e-4 both beta = 0.5 and beta = 8 end at 5.15 nats (neither has
started using the context yet, unigram baseline 5.27); at 1e-3: 4.54 vs 4.95; at 2e-3:
3.48 vs 4.44 (all with a zero readout bias).

Readout bias (``bias_init``): ``"unigram"`` starts the LM head's bias at the log token
frequencies of the training stream (:func:`sigprop.data.collate.unigram_logp`, the same add-one
smoothed distribution as the baseline), so training starts from the context-free baseline
(plus the ~1/(2d) nats that the random ``h W`` term adds) and every nat of gain measures use of
the context. With a zero bias Adam moves each of the V bias entries by ~lr per step, so a short
run spends most of its budget learning token frequencies. Measured: the deep post-LN model of
:data:`sigprop.training.trainability.DEEP_SMALL` (alpha_attn = 2, beta = 0.3 and 1; batch 64, lr
2e-3,
500 steps) ends 0.62 and 0.69 nats below the unigram baseline with ``unigram``, but 0.01 nats
*above* it with ``zero`` (from log V = 7.6 it reaches the baseline by step ~300 and stays
there); the 1-layer
``sigprop train`` acceptance pair (d = T = 64, 2,000 steps) ends at 2.21 (beta 0.5) vs 4.20
nats (beta 8) with ``unigram`` against 3.52 vs 4.44 with ``zero``. The CLI commands default to
``unigram``, and so do the reproduced items that train (sigprop.reproduce.gg25.training and
friends); the library default stays ``zero`` for existing library callers. Tasks:

* ``mlm``: BERT masked LM on a corpus (:mod:`sigprop.data.corpus`); ``clm``: next-token LM
  (needs a causal spec); both with a linear head to the vocabulary;
* ``reverse``: noci22 C.1, symbols in reverse order (per-position cross-entropy);
* ``heaviside``: mindthegap A.3, the model's output fitted to ``1[X0 > 0]`` (MSE).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from ..spec import ArchSpec, SpecError
from .config import TrainConfig
from .optim import clip_per_slice, make_optimizer
from .steps import run, step
from .task import TaskModel, slice_losses

__all__ = ["TrainResult", "clip_per_slice", "make_optimizer", "save_checkpoint", "train",
           "train_step"]

def train_step(model: TaskModel, config: TrainConfig, x: Tensor, y: Tensor, opt, sched,
               params: Sequence[nn.Parameter]) -> Tensor:
    """One optimiser step of :func:`train` on the batch ``(x, y)``: every slice's loss, the
    summed loss's backward pass, per-slice gradient clipping, AdamW and the schedule
    (:func:`sigprop.training.steps.step`). Returns the per-slice losses (S,)."""
    return step(slice_losses(model, config.task, x, y), opt, sched=sched,
                on_grads=lambda: clip_per_slice(params, config.max_grad_norm))


# --------------------------------------------------------------------------------------------
# training loop
# --------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    """``trajectory``: tidy rows (``loss`` with ``step`` and ``split`` train/eval; measured
    observables with ``step``; a ``beta`` column when several betas were trained). Per-slice
    arrays: ``final_train`` / ``final_eval`` (S,), the last logged train loss and the last eval
    loss (pooled over the eval set's labelled positions, as ``baseline`` is). ``baseline``:
    the loss of a context-free predictor (unigram cross-entropy for LM tasks, log(n_symbols)
    for reverse, the target variance 0.25 for heaviside). ``scalars``: with
    ``config.train_alpha`` or ``config.tau_warmup``, a table (``step, layer, name, value,
    stderr`` and ``beta``) of the trained residual strengths (``alpha_attn``, ``alpha_mlp``
    per block) and the logit temperature (``tau``, layer 0) at every measuring step; None
    otherwise. ``events``: the training-time monitor's collapse events
    (:class:`sigprop.measurement.monitor.CollapseEvent`, every measured layer in rank or
    entropy collapse, with ``group`` ``{"beta": ...}`` when several betas were trained).
    ``health``: with ``config.telemetry_every`` or ``config.qk_clip``, the attention health's
    events (:class:`sigprop.training.health.HealthEvent`: forecasts, crossings, non-finite
    logits, QK-Clip rescales with their ``slice``); the trajectory then holds the training
    batch's ``max_logit`` (largest over heads) and ``entropy`` (mean over heads) per layer
    and slice group, rows with ``split = "train"``."""

    trajectory: object
    final_train: np.ndarray
    final_eval: np.ndarray
    baseline: float
    seconds: float
    spec: ArchSpec
    config: TrainConfig
    betas: list[float] | None = None
    info: dict = field(default_factory=dict)
    model: TaskModel | None = field(default=None, repr=False)
    scalars: object = None
    events: list = field(default_factory=list)
    alphas: list[float] | None = None
    health: list = field(default_factory=list)


def mean_err(v: np.ndarray) -> tuple[float, float]:
    v = np.asarray(v, dtype=np.float64)
    err = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
    return float(v.mean()), err


DEFAULT_CONFIG = TrainConfig()


def train(spec: ArchSpec, config: TrainConfig = DEFAULT_CONFIG, *, data: str = "builtin",
          corpus=None, betas: Sequence[float] | None = None,
          on_step: Callable[[int, int], None] | None = None,
          keep_model: bool = False, sinks: Sequence[Callable] = (),
          warn: bool = False, alphas: Sequence[float] | None = None) -> TrainResult:
    """Train ``config.seeds`` initialisations of ``spec`` (times ``len(betas)``) on
    ``config.task`` and return the loss curves and the observables measured during training.
    ``data``: ``builtin`` | ``tinystories`` | a path (token tasks); ``corpus``: an already
    loaded :class:`sigprop.data.corpus.Corpus`. ``on_step(step, total)`` after every step.
    ``alphas``: per-group ``alpha_attn`` values, paired point by point with ``betas`` when
    both are given (group ``i`` = ``(alphas[i], betas[i])``, slices ``i * seeds + j``), so any
    list of (beta, alpha_attn) points trains as slices of one batched model (the
    trainability grid); the trajectory then carries an ``alpha`` column as well.

    The observables are measured every ``config.measure_every`` steps (and at the first and
    last) by the training-time monitor (:class:`sigprop.measurement.monitor.Monitor`, on the
    seed-sliced model's own trace): ``sinks`` get every measurement (``sink(step, frame,
    scalars)``, e.g. :func:`sigprop.integrations.store_sink`), ``warn=True`` raises a
    :class:`~sigprop.measurement.monitor.CollapseWarning` for the first rank and the first
    entropy collapse (off by default: the reproductions train collapsed models on purpose);
    the events are in ``TrainResult.events`` either way.

    On CPU, denormal floats are flushed to zero while training (and the flag reset after):
    condensed attention (large beta) fills the softmax backward with denormals, which made
    the beta = 8 acceptance run 1.5x slower on this machine for a change below 1e-38."""
    from ..measurement.threads import cpu_settings

    check_memory(spec, config, betas=betas, alphas=alphas, data=data, corpus=corpus)
    cpu = config.device == "cpu"
    with cpu_settings(threads=config.threads if cpu else None, flush_denormal=cpu):
        return train_loop(spec, config, data, corpus, betas, on_step, keep_model, sinks, warn,
                      alphas)


def check_memory(spec: ArchSpec, config: TrainConfig, *, betas: Sequence[float] | None = None,
                 data: str = "builtin", corpus=None,
                 shrink: dict[str, int] | None = None,
                 alphas: Sequence[float] | None = None) -> float:
    """Refuse (``SpecError``) a training run that would not fit in memory, before any
    allocation (:func:`sigprop.measurement.memory.check`, ``train`` model). The vocabulary is the
    corpus's, or before it is loaded the built-in stories' (other data: BERT's 30522)."""
    from ..measurement import memory

    if config.task == "reverse":
        vocab = config.n_symbols
    elif config.task == "heaviside":
        vocab = None
    elif corpus is not None:
        vocab = corpus.vocab_size
    else:
        vocab = memory.BUILTIN_VOCAB if data == "builtin" else memory.OTHER_VOCAB
    slices = config.seeds * max(len(betas or ()), len(alphas or ()), 1)
    if shrink is None:
        shrink = {"seq_len": 2, "batch_size": 1, "d_model": spec.heads}
    return memory.check("train", spec=spec, batch_size=config.batch_size, slices=slices,
                        task=config.task, vocab=vocab, eval_sequences=config.eval_sequences,
                        tie=config.tie, shrink=shrink)


def train_loop(spec, config, data, corpus, betas, on_step, keep_model, sinks=(),
               warn=False, alphas=None) -> TrainResult:
    """:func:`train` without its memory check and CPU settings (the trainability grid runs it
    in each shard's thread): the batches, the task model and its optimiser, trained by
    :func:`sigprop.training.steps.run` with a :class:`_Record` writing down losses and
    observables as it goes."""
    from .. import trajectory
    from ..data.batches import Batches

    t0 = time.perf_counter()
    _check_task(spec, config)
    device = torch.device(config.device)
    batches = Batches(spec, config, data=data, corpus=corpus)
    bias = batches.unigram_logp if config.bias_init == "unigram" else None
    model = TaskModel(spec, config, batches.vocab, betas, head_bias=bias,
                      alphas=alphas).to(device)
    opt, sched, params = make_optimizer(model, config)
    train_gen = torch.Generator().manual_seed(config.seed)
    record = _Record(spec, config, model, batches, device, _group_keys(betas, alphas), sinks,
                     warn)
    tau_at = _temperature(spec, config)
    health = _health(model, config)

    def losses_at(k: int) -> Tensor:
        if tau_at is not None:
            model.set_temperature(tau_at(k))
        x, y = batches.train_batch(train_gen, device)
        return slice_losses(model, config.task, x, y)

    def after(k: int, losses: Tensor) -> None:
        if health is not None:  # before the record's evaluation: QK-Clip acts on this step
            record.telemetry(k, health.after_step(k), health.telemetry)
        record.after_update(k, losses)
        if on_step is not None:
            on_step(k, config.steps)

    if tau_at is not None:
        model.set_temperature(tau_at(0))
    record.start()
    try:
        run(losses_at, opt, config.steps, sched=sched, after=after,
            on_grads=lambda: clip_per_slice(params, config.max_grad_norm))
    finally:
        if health is not None:
            health.close()
    info = {"task": config.task, "data": batches.source, "vocab_size": batches.vocab,
            "slices": model.n_slices, "device": str(device)}
    return TrainResult(trajectory.make(record.rows, spec), record.last_train, record.last_eval,
                       batches.baseline, time.perf_counter() - t0, spec, config,
                       None if betas is None else [float(b) for b in betas], info,
                       model if keep_model else None, record.scalar_table(),
                       record.monitor.events,
                       None if alphas is None else [float(a) for a in alphas],
                       list(health.events) if health is not None else [])


def _health(model: TaskModel, config: TrainConfig):
    """The attention health of the training batch (TrainConfig docstring), or None."""
    if not config.telemetry_every and config.qk_clip is None:
        return None
    from .health import AttentionHealth

    every = 1 if config.qk_clip is not None else config.telemetry_every
    return AttentionHealth(model, every=every, seed=config.seed, qk_clip=config.qk_clip,
                           clip_alpha=config.qk_clip_alpha, warn=False, reduce=False,
                           start=1)


def _check_task(spec: ArchSpec, config: TrainConfig) -> None:
    """Refuse (``SpecError``) a task the spec cannot train: ``clm`` needs a causal model,
    ``mlm`` and ``reverse`` a bidirectional one, the temperature warm-up a spec scaling of
    ``none`` or ``tau``, ``heaviside`` ``seq_len <= d_model``."""
    if config.task == "clm" and not spec.causal:
        raise SpecError("task", "clm needs a causal model (add --causal)")
    if config.task in ("mlm", "reverse") and spec.causal:
        raise SpecError("task", f"{config.task} needs a bidirectional model (drop --causal)")
    if config.tau_warmup and spec.scaling not in ("none", "tau"):
        raise SpecError("tau_warmup", f"needs the spec's scaling none or tau (got "
                                      f"{spec.scaling}): the warm-up sets tau on the logits")
    if config.task == "heaviside" and spec.seq_len > spec.d_model:
        raise SpecError("seq_len", f"heaviside's isometric inputs need seq_len <= d_model="
                                   f"{spec.d_model} (got {spec.seq_len})")


def _temperature(spec: ArchSpec, config: TrainConfig) -> Callable[[int], float] | None:
    """noci22 C.3's warm-up (TrainConfig docstring): the logit temperature at each step, or
    None without a warm-up."""
    if not config.tau_warmup:
        return None
    tau_final = float(spec.multiplier) if spec.scaling == "tau" else 1.0
    return lambda k: tau_final * min(1.0, max(k, 1) / config.tau_warmup)


class _Record:
    """What :func:`train_loop` writes down: tidy ``rows`` (train and eval losses, the
    monitor's observables), ``scalars`` (trained residual strengths, the temperature), the
    last logged train loss and the last eval loss per slice, each slice group's mean and
    stderr over its seeds."""

    def __init__(self, spec: ArchSpec, config: TrainConfig, model: TaskModel, batches,
                 device, keys: list[dict], sinks, warn: bool):
        from ..measurement.monitor import Monitor

        self.spec, self.config, self.model, self.batches, self.device = (
            spec, config, model, batches, device)
        self.keys = keys
        self.group = np.arange(model.n_slices) // config.seeds  # group of every slice
        self.rows: list[dict] = []
        self.scalars: list[dict] = []
        self.log_every, self.eval_every = config.every("log_every"), config.every("eval_every")
        self.measure_every = config.every("measure_every")
        self.acc, self.n_acc = torch.zeros(model.n_slices, dtype=torch.float64), 0
        self.last_train, self.last_eval = None, None
        self.monitor = Monitor(model, batches.probe(device), every=self.measure_every,
                               measure=self.trace_rows, grads=False, warn=warn, sinks=sinks,
                               keep=False, group_by=tuple(keys[0]), rho_max=spec.rho_max)

    def emit(self, step: int, observable: str, layer: int, per_slice, *, out=None, **extra):
        """One row per slice group (into ``out``, default ``rows``)."""
        out = self.rows if out is None else out
        per_slice = np.asarray(per_slice, dtype=np.float64)
        for gi, key in enumerate(self.keys):
            m, e = mean_err(per_slice[self.group == gi])
            out.append(dict(layer=layer, observable=observable, source="measured", value=m,
                            stderr=e, step=step, **key, **extra))

    def start(self) -> None:
        """Step 0: the eval loss and the observables at initialisation."""
        self.last_eval = self.evaluate(0)
        self.measure(0)

    def after_update(self, step: int, losses: Tensor) -> None:
        """After update ``step`` with the losses it saw: the train loss averaged since the
        last log, the eval loss and the observables when they are due."""
        self.acc += losses.double().cpu()
        self.n_acc += 1
        last = step == self.config.steps
        if step % self.log_every == 0 or last:
            train = (self.acc / self.n_acc).numpy()
            self.last_train = np.where(np.isfinite(train), train, np.nan)
            self.emit(step, "loss", self.spec.depth, self.last_train, split="train")
            self.acc.zero_()
            self.n_acc = 0
        if step % self.eval_every == 0 or last:
            self.last_eval = self.evaluate(step)
        self.measure(step)

    def telemetry(self, step: int, scalars: dict, telemetry) -> None:
        """The attention health's reading of this step's training batch (when it read it):
        per layer and slice group, the largest logit over heads and the mean entropy over
        heads, rows with ``split = "train"``."""
        if not scalars:
            return
        for layer, st in telemetry.last.items():  # (slices, H); one slice: no slice: keys
            mx = st.get("slice:max_logit", st["max_logit"][None])
            ent = st.get("slice:entropy", st["entropy"][None])
            self.emit(step, "max_logit", layer + 1, mx.amax(-1).double().numpy(),
                      split="train")
            self.emit(step, "entropy", layer + 1, ent.nanmean(-1).double().numpy(),
                      split="train")

    def evaluate(self, step: int) -> np.ndarray:
        """The eval loss per slice, pooled over the eval set (each batch's mean weighted by
        its labelled positions, or elements for heaviside), the same pooling as the baseline:
        an unweighted mean of batch means differs from it (measured: 0.024 nats for a
        unigram predictor on 8 batches of 8 sequences of 16 tokens, whose label counts
        vary)."""
        from ..data.collate import IGNORE

        model = self.model
        model.eval()
        with torch.no_grad():
            tot, n = torch.zeros(model.n_slices, dtype=torch.float64), 0
            for x, y in self.batches.eval_batches(self.device):
                w = y.numel() if self.config.task == "heaviside" else int((y != IGNORE).sum())
                if w == 0:
                    continue
                tot += slice_losses(model, self.config.task, x, y).double().cpu() * w
                n += w
            ev = (tot / max(n, 1)).numpy()
        self.emit(step, "loss", self.spec.depth, ev, split="eval")
        model.train()
        return ev

    def trace_rows(self, m: TaskModel, x: Tensor):
        """The monitor's measurement: :meth:`emit`'s rows (the monitor sets their step)."""
        import pandas as pd

        out: list[dict] = []
        _measure_rows(m, x, lambda s, name, layer, v: self.emit(s, name, layer, v, out=out), 0)
        return pd.DataFrame(out)

    def measure(self, step: int) -> None:
        """The monitor's observables and the trained scalars, every ``measure_every`` steps
        and at the last."""
        every, config = self.measure_every, self.config
        if not (every and (step % every == 0 or step == config.steps)):
            return
        self.rows.extend(self.monitor(step, force=True).to_dict("records"))
        if config.train_alpha:
            for name in ("alpha_attn", "alpha_mlp"):
                vals = getattr(self.model, name).detach().double().cpu().numpy()
                for layer in range(self.spec.depth):
                    self.emit(step, name, layer + 1, vals[:, layer], out=self.scalars)
        if config.tau_warmup:
            self.emit(step, "tau", 0, np.full(self.model.n_slices, self.model.tau),
                      out=self.scalars)

    def scalar_table(self):
        """``scalars`` as :attr:`TrainResult.scalars`' table, or None when empty."""
        if not self.scalars:
            return None
        import pandas as pd

        return pd.DataFrame(self.scalars).drop(columns=["source"]).rename(
            columns={"observable": "name"})


def _group_keys(betas, alphas) -> list[dict]:
    """The extra trajectory columns of each slice group: ``{}`` (one group), ``{"beta": b}``
    and, with per-group alphas, ``{"alpha": a, "beta": b}`` (``{"alpha": a}`` alone when no
    betas were given)."""
    if alphas is None:
        return [{}] if betas is None else [{"beta": float(b)} for b in betas]
    if betas is None:
        return [{"alpha": float(a)} for a in alphas]
    if len(betas) != len(alphas):
        raise ValueError(f"betas and alphas pair up point by point: give as many of each "
                         f"(got {len(betas)} and {len(alphas)})")
    return [{"alpha": float(a), "beta": float(b)} for a, b in zip(alphas, betas, strict=True)]


@torch.no_grad()
def _measure_rows(model: TaskModel, x: Tensor, emit, step: int) -> None:
    """cos and q = |x|^2 / d (layers 0..L) and attention ipr / entropy / wmax (layers 1..L)
    on the probe batch, per slice (docs/theory.md §1), each averaged over sequences (and
    heads; q over tokens too)."""
    from ..measurement import observables as obs

    hidden, stats = model.trace(x)
    for layer, h in enumerate(hidden):
        h = h.double()
        emit(step, "cos", layer, obs.mean_cos(h).mean(dim=1).cpu().numpy())
        emit(step, "q", layer, h.square().mean(dim=(1, 2, 3)).cpu().numpy())
        if layer > 0:
            st = stats[layer - 1]
            for name in ("entropy", "ipr", "wmax"):
                emit(step, name, layer, st[name].double().mean(dim=(1, 2)).cpu().numpy())


def save_checkpoint(result: TrainResult, directory: str) -> list[str]:
    """Write ``model.safetensors`` (every weight, seed-sliced) and ``spec.json`` (spec, config,
    betas, final losses) to ``directory``; returns the paths written."""
    import json
    import os

    from safetensors.torch import save_file

    if result.model is None:
        raise ValueError("train(..., keep_model=True) is needed to save a checkpoint")
    os.makedirs(directory, exist_ok=True)
    weights = os.path.join(directory, "model.safetensors")
    state = {k: v.detach().cpu().contiguous() for k, v in result.model.state_dict().items()}
    save_file(state, weights)
    meta = os.path.join(directory, "spec.json")
    with open(meta, "w") as fh:
        json.dump({"spec": result.spec.to_dict(), "config": asdict(result.config),
                   "betas": result.betas, "final_eval": result.final_eval.tolist()}, fh,
                  indent=1)
    return [weights, meta]
