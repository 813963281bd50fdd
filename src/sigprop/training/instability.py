"""A provoked training instability and the fixes against it (issue 37; docs/instability.md).

A small GPT-2-style causal LM (pre-LN, no QK normalisation; ``arch="llama"`` for a
Llama-style one) is trained on the built-in stories with AdamW (no weight decay, beta2 0.95)
whose learning rate ramps linearly from 0 to a very high peak (Wortsman et al. 2023,
"Small-scale proxies for large-scale Transformer training instabilities", scaled down to a
CPU): the attention logits grow, the attention entropy falls, and the loss spikes and
diverges. Every run is watched by :class:`~sigprop.training.health.AttentionHealth`, whose
early warning (a head's largest logit projected to reach the logit limit) is compared with
the spike. The output logits are kept tame with Wortsman's z-loss (``z_loss``), as in their
runs, so that the attention is the instability left to look at.

``optimizer="muon"`` trains the hidden matrices with Muon instead (AdamW on the embeddings,
norms and biases: :class:`~sigprop.training.optim.MuonAdamW`), the optimizer QK-Clip was
introduced with (Kimi K2's MuonClip): the logits grow and the loss spikes there too, and the
clip holds both the logits and the loss (docs/instability.md, "With Muon").

The arms (``fixes``):

* ``none``: the model as built;
* ``qk-clip``: the same, with QK-Clip at ``tau`` after every optimizer step
  (``AttentionHealth(qk_clip=tau)``, :mod:`sigprop.models.methods.qk_clip`);
* ``qk-norm``: the registered ``qk-norm`` method (RMSNorm of each head's q and k with a
  trainable gain) applied through :func:`sigprop.models.methods.apply_methods` before training;
* ``sigma-reparam``: the registered ``sigma-reparam`` method (W_Q, W_K divided by their
  spectral norm at init) through the registry, and then -- because the registry's method only
  rescales the weights at init (the written folder holds the weights at init) -- the
  training-time reparametrisation ``W = gamma W / sigma(W)`` on W_Q and W_K (a scalar gain
  ``gamma``, ones at init, trained; ``sigma`` by one power iteration per forward, Zhai et al.
  2023) installed here with :mod:`torch.nn.utils.parametrize`.

Spike rule (:func:`spike_step`): the first step ``t >= spike_after`` whose training loss
exceeds ``spike_factor`` times the lowest loss of the steps before it. Warning: the first
``forecast`` event of a head's largest logit (the threshold is ``logit_limit``, default the
QK-Clip ``tau``, in every arm). Lead time: spike step - warning step.

QK-Clip bound: QK-Clip acts after the optimizer step on the logits of the batch just seen,
so the next step's measured largest logit may exceed ``tau`` by one step's growth. The
tested bound: ``max_logit <= tau * (1 + clip_slack)`` on every step (``clip_slack`` default
0.5; the measured overshoot is reported as ``max_logit / tau``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..spec import SpecError

__all__ = ["DEFAULTS", "FIXES", "OPTIMIZERS", "InstabilityConfig", "InstabilityResult",
           "build_model", "run_instability", "spike_step", "train_one"]

FIXES = ("none", "qk-clip", "qk-norm", "sigma-reparam")
ARCHS = ("llama", "gpt2")
#: ``adamw``: AdamW on every parameter; ``muon``: :class:`~sigprop.training.optim.MuonAdamW`
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class InstabilityConfig:
    """The recipe: model (``arch``, ``d_model``, ``layers``, ``heads``, ``seq_len``), data
    (``batch``, ``documents``, ``vocab`` of the built-in corpus), optimizer (AdamW at peak
    ``lr`` reached linearly over ``warmup`` steps (0: no ramp), ``beta2``, ``weight_decay``),
    ``steps``, ``z_loss`` (Wortsman's output-logit z-loss coefficient, 0: off); QK-Clip's
    ``tau`` and the warning's ``logit_limit`` (None: ``tau``), its
    ``horizon`` and ``window``; the spike rule (``spike_factor``, ``spike_after``) and the
    QK-Clip bound's ``clip_slack``; ``rows``: the telemetry's sampled rows; ``clip_on``:
    what QK-Clip acts on (:data:`sigprop.training.health.CLIP_ON`: ``"updated"``, Kimi's
    ``"step"``, or the certified ``"bound"`` over every input); ``optimizer``: ``"adamw"``
    or ``"muon"`` (Muon on the hidden matrices, AdamW with ``beta2`` on the rest, one peak
    ``lr``: :class:`~sigprop.training.optim.MuonAdamW`)."""

    arch: str = "gpt2"
    steps: int = 300
    lr: float = 0.2
    warmup: int | None = None  # None: = steps (the ramp spans the run)
    beta2: float = 0.95
    weight_decay: float = 0.0
    d_model: int = 128
    layers: int = 2
    heads: int = 2
    seq_len: int = 64
    batch: int = 16
    documents: int = 2000
    vocab: int = 2000
    tau: float = 30.0
    logit_limit: float | None = 100.0
    horizon: int = 200
    window: int = 20
    spike_factor: float = 1.1
    spike_after: int = 20
    spike_window: int = 10
    clip_slack: float = 0.5
    rows: int = 16
    z_loss: float = 1e-4
    clip_on: str = "updated"
    optimizer: str = "adamw"

    def check(self) -> InstabilityConfig:
        def positive_int(name, lo=1):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(name, f"must be an integer >= {lo} (got {v!r})")

        def positive(name):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or v <= 0:
                raise SpecError(name, f"must be a positive number (got {v!r})")

        for n in ("steps", "d_model", "layers", "heads", "seq_len", "batch", "rows"):
            positive_int(n)
        positive_int("documents", 2)
        positive_int("vocab", 100)
        positive_int("horizon")
        positive_int("window", 5)
        positive_int("spike_after", 0)
        positive_int("spike_window")
        for n in ("lr", "tau", "clip_slack"):
            positive(n)
        if self.logit_limit is not None:
            positive("logit_limit")
        if self.warmup is not None:
            positive_int("warmup", 0)
        if not (isinstance(self.spike_factor, int | float) and self.spike_factor > 1):
            raise SpecError("spike_factor", f"must be a number > 1 (got {self.spike_factor!r})")
        if not (isinstance(self.beta2, int | float) and 0 < self.beta2 < 1):
            raise SpecError("beta2", f"must be a number in (0, 1) (got {self.beta2!r})")
        if not (isinstance(self.weight_decay, int | float) and self.weight_decay >= 0):
            raise SpecError("weight_decay", f"must be a number >= 0 (got {self.weight_decay!r})")
        from .health import CLIP_ON

        if self.clip_on not in CLIP_ON:
            raise SpecError("clip_on", f"must be one of {', '.join(CLIP_ON)} (got "
                                       f"{self.clip_on!r})")
        if self.optimizer not in OPTIMIZERS:
            raise SpecError("optimizer", f"must be one of {', '.join(OPTIMIZERS)} (got "
                                         f"{self.optimizer!r})")
        if self.arch not in ARCHS:
            raise SpecError("arch", f"must be one of {', '.join(ARCHS)} (got {self.arch!r})")
        if self.d_model % self.heads:
            raise SpecError("heads", f"must divide d_model {self.d_model} (got {self.heads})")
        return self

    @property
    def limit(self) -> float:
        return float(self.logit_limit if self.logit_limit is not None else self.tau)

    @property
    def ramp(self) -> int:
        return self.steps if self.warmup is None else self.warmup


DEFAULTS = InstabilityConfig()


def spike_step(losses: Sequence[float], factor: float = DEFAULTS.spike_factor,
               after: int = DEFAULTS.spike_after,
               window: int = DEFAULTS.spike_window) -> int | None:
    """The spike rule: the loss averaged over the ``window`` steps ending at ``t`` (the
    batch noise averaged out; 1: the loss itself); the first step ``t >= after`` (and past
    the first full window) at which that average exceeds ``factor`` times its lowest value
    before ``t``, or a loss is not finite; None if none."""
    v = np.asarray(losses, dtype=np.float64)
    bad = ~np.isfinite(v)
    window = max(1, int(window))
    start = max(after, window)
    for t in range(len(v)):
        if bad[t] and t >= max(after, 1):
            return t
    if len(v) < window:
        return None
    c = np.concatenate([[0.0], np.cumsum(np.where(bad, 0.0, v))])
    avg = (c[window:] - c[:-window]) / window  # avg[i]: steps i .. i + window - 1
    ends = np.arange(window - 1, len(v))
    best = np.minimum.accumulate(np.concatenate([[np.inf], avg[:-1]]))  # lowest before
    hit = (ends >= start) & (avg > factor * best)
    i = np.flatnonzero(hit)
    return int(ends[i[0]]) if len(i) else None


# ---- the model ------------------------------------------------------------------------------
def build_model(cfg: InstabilityConfig, vocab_size: int, fix: str = "none", seed: int = 0):
    """The causal LM of ``cfg`` (GPT-2 or Llama-style, MHA, tied embeddings) drawn
    with ``seed``, with ``fix``'s init-time change applied (qk-norm, sigma-reparam through
    the registry; sigma-reparam's training-time reparametrisation). Returns (model,
    lines describing what was applied)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from ..models import methods as M
    from ..models.arch import spec_from_config

    if fix not in FIXES:
        raise SpecError("fixes", f"unknown fix {fix!r} (known: {', '.join(FIXES)})")
    if cfg.arch == "llama":
        hf = LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.d_model,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.heads, intermediate_size=4 * cfg.d_model,
                         max_position_embeddings=2 * cfg.seq_len, rope_theta=10000.0,
                         bos_token_id=2, eos_token_id=3, pad_token_id=0,
                         tie_word_embeddings=True)
        cls = LlamaForCausalLM
    else:
        hf = GPT2Config(vocab_size=vocab_size, n_embd=cfg.d_model, n_layer=cfg.layers,
                        n_head=cfg.heads, n_positions=2 * cfg.seq_len, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2, eos_token_id=3,
                        pad_token_id=0)
        cls = GPT2LMHeadModel
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(hf)
    model.config.use_cache = False
    lines: list[str] = []
    if fix in ("qk-norm", "sigma-reparam"):
        spec = spec_from_config(model.config, cfg.seq_len)
        rep = M.apply_methods(model, [fix], None, M.context_for(model, spec))
        lines += rep.changes
    if fix == "sigma-reparam":
        from .sigma_train import install_sigma_reparam

        done = install_sigma_reparam(model, seed)
        lines.append(f"W = gamma W / sigma(W) during training on {len(done)} projections")
    model.train()
    return model, lines


# ---- one run --------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One (fix, seed) run: per step ``loss``, ``lr``, ``max_logit``, ``min_entropy``; the
    health check's events; what was applied; seconds."""

    fix: str
    seed: int
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    max_logit: list[float] = field(default_factory=list)
    min_entropy: list[float] = field(default_factory=list)
    logit_bound: list[float] = field(default_factory=list)  # clip_on="bound": before the clip
    events: list = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _corpus(cfg: InstabilityConfig):
    from ..data.corpus import load_corpus

    return load_corpus("builtin", n_documents=cfg.documents, vocab_size=cfg.vocab, seed=0)


def train_one(cfg: InstabilityConfig, fix: str, seed: int, corpus=None,
              on_step: Callable[[], None] | None = None) -> RunRecord:
    """Train one arm at one seed (one CPU thread; the batches and the init depend on the
    seed only, so every fix sees the same data)."""
    import warnings

    from ..measurement.threads import cpu_settings
    from .health import AttentionHealth

    corpus = corpus if corpus is not None else _corpus(cfg)
    stream = torch.from_numpy(np.asarray(corpus.train, dtype=np.int64))
    T, B = cfg.seq_len, cfg.batch
    if len(stream) <= T + 1:
        raise SpecError("seq_len", f"the corpus has {len(stream)} tokens; need more than {T}")
    rec = RunRecord(fix, seed)
    t0 = time.perf_counter()
    with torch.random.fork_rng(), cpu_settings(threads=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' advisories; the events are kept
        model, rec.applied = build_model(cfg, corpus.vocab_size, fix, seed)
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        health = AttentionHealth(model, rows=cfg.rows, seed=seed, warn=False,
                                 qk_clip=cfg.tau if fix == "qk-clip" else None,
                                 logit_limit=cfg.limit, horizon=cfg.horizon,
                                 window=cfg.window, clip_on=cfg.clip_on)
        if cfg.optimizer == "muon":
            from .optim import MuonAdamW

            opt = MuonAdamW(model, cfg.lr, betas=(0.9, cfg.beta2),
                            weight_decay=cfg.weight_decay)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, cfg.beta2),
                                    weight_decay=cfg.weight_decay)
        ramp = cfg.ramp
        try:
            for step in range(cfg.steps):
                lr = cfg.lr * min(1.0, (step + 1) / ramp) if ramp > 0 else cfg.lr
                for g in opt.param_groups:
                    g["lr"] = lr
                starts = torch.randint(0, len(stream) - T, (B,), generator=gen)
                ids = torch.stack([stream[a:a + T] for a in starts.tolist()])
                out = model(input_ids=ids, labels=ids)
                loss = out.loss
                total = loss
                if cfg.z_loss > 0:  # Wortsman et al.'s z-loss: keeps the output logits tame
                    z = torch.logsumexp(out.logits[:, :-1].float(), dim=-1)
                    total = loss + cfg.z_loss * z.square().mean()
                opt.zero_grad(set_to_none=True)
                total.backward()
                opt.step()
                sc = health.after_step(step)
                rec.loss.append(float(loss.detach()))
                rec.lr.append(lr)
                rec.max_logit.append(float(sc.get("attention/max_logit", math.nan)))
                rec.min_entropy.append(float(sc.get("attention/min_entropy", math.nan)))
                rec.logit_bound.append(float(sc.get("attention/logit_bound", math.nan)))
                if on_step is not None:
                    on_step()
        finally:
            health.close()
        rec.events = list(health.events)
    rec.seconds = time.perf_counter() - t0
    return rec


# ---- the experiment -------------------------------------------------------------------------
@dataclass
class InstabilityResult:
    """:func:`run_instability`'s result: ``config``; ``steps`` (tidy: fix, seed, step, lr,
    loss, max_logit, min_entropy); ``runs`` (one row per fix and seed: spike_step,
    warning_step, lead, max_logit (over the run), max_logit_after_spike...); ``events``
    (every health event, fix and seed added); ``summary`` (one row per fix); ``seconds``."""

    config: InstabilityConfig
    fixes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: object
    runs: object
    events: object
    summary: object
    seconds: float
    rule: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self, *, steps: bool = False) -> dict:
        d = {"config": asdict(self.config), "fixes": list(self.fixes),
             "seeds": list(self.seeds), "rule": self.rule, "notes": list(self.notes),
             "summary": _records(self.summary), "runs": _records(self.runs),
             "seconds": self.seconds}
        if steps:
            d["steps"] = _records(self.steps)
        return d


def _records(frame) -> list[dict]:
    out = []
    for r in frame.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else
                        v.item() if isinstance(v, np.generic) else v) for k, v in r.items()})
    return out


def rule_text(cfg: InstabilityConfig) -> str:
    avg = f"{cfg.spike_window}-step mean loss" if cfg.spike_window > 1 else "loss"
    return (f"spike: the first step >= {cfg.spike_after} whose {avg} exceeds "
            f"{cfg.spike_factor:g}x its lowest value before it (or a loss is not finite); "
            f"warning: "
            f"the first forecast that a head's largest logit reaches {cfg.limit:g} within "
            f"{cfg.horizon} steps; lead = spike step - warning step; QK-Clip holds when "
            f"every step's largest logit <= {cfg.tau:g} x {1 + cfg.clip_slack:g}")


def _run_row(cfg: InstabilityConfig, rec: RunRecord) -> dict:
    spike = spike_step(rec.loss, cfg.spike_factor, cfg.spike_after, cfg.spike_window)
    warn = next((e.step for e in rec.events if e.kind == "forecast"
                 and e.what == "max_logit"), None)
    crossed = next((e.step for e in rec.events if e.kind == "crossed"
                    and e.what == "max_logit"), None)
    ml = np.asarray(rec.max_logit, dtype=float)
    upto = ml[:spike] if spike is not None else ml
    finite = ml[np.isfinite(ml)]
    ent = np.asarray(rec.min_entropy, dtype=float)
    ent = ent[np.isfinite(ent)]
    clips = sum(e.kind == "qk_clip" for e in rec.events)
    loss = np.asarray(rec.loss, dtype=float)
    row = {"fix": rec.fix, "seed": rec.seed, "spiked": spike is not None,
           "spike_step": spike, "spike_loss": float(loss[spike]) if spike is not None else None,
           "lr_at_spike": rec.lr[spike] if spike is not None else None,
           "warning_step": warn, "crossed_step": crossed,
           "lead": (spike - warn) if spike is not None and warn is not None else None,
           "max_logit": float(finite.max()) if len(finite) else math.nan,
           "max_logit_before_spike": float(np.nanmax(upto)) if len(upto) and
           np.isfinite(upto).any() else math.nan,
           "non_finite": bool((~np.isfinite(ml)).any()),
           "min_entropy": float(ent.min()) if len(ent) else math.nan,
           "min_loss": float(np.nanmin(loss)), "final_loss": float(np.nanmean(loss[-10:])),
           "qk_clips": clips, "events": len(rec.events), "seconds": rec.seconds}
    if rec.fix == "qk-clip":
        row["clip_ratio"] = row["max_logit"] / cfg.tau
        # the steps once the clip is active (from the first logit above tau): the typical
        # ratio to tau and the share within the bound
        on = np.flatnonzero(ml > cfg.tau)
        held = ml[on[0]:] if len(on) else ml[:0]
        held = held[np.isfinite(held)]
        row["clip_median_ratio"] = float(np.median(held) / cfg.tau) if len(held) else None
        row["clip_within"] = float(np.mean(held <= cfg.tau * (1 + cfg.clip_slack))) \
            if len(held) else None
        row["clip_held"] = bool(row["max_logit"] <= cfg.tau * (1 + cfg.clip_slack)
                                and not row["non_finite"])
        bound = np.asarray(rec.logit_bound, dtype=float)
        bound = bound[np.isfinite(bound)]
        # clip_on="bound": the largest bound an update produced (before its clip)
        row["max_logit_bound"] = float(bound.max()) if len(bound) else None
    return row


def _summary(runs, cfg: InstabilityConfig, fixes):
    import pandas as pd

    out = []
    for fix in fixes:
        sub = runs[runs["fix"] == fix]
        leads = [v for v in sub["lead"] if v is not None and not pd.isna(v)]
        warned = [v for v in sub["warning_step"] if v is not None and not pd.isna(v)]
        row = {"fix": fix, "seeds": len(sub), "spikes": int(sub["spiked"].sum()),
               "warned": len(warned),
               "median_spike_step": _median(sub["spike_step"]),
               "median_warning_step": _median(sub["warning_step"]),
               "median_lead": float(np.median(leads)) if leads else None,
               "min_lead": int(min(leads)) if leads else None,
               "max_lead": int(max(leads)) if leads else None,
               "max_logit": float(sub["max_logit"].max()),
               "median_min_loss": float(sub["min_loss"].median()),
               "median_final_loss": float(sub["final_loss"].median())}
        if fix == "qk-clip":
            row["clip_held"] = bool(sub["clip_held"].all())
            row["clip_ratio"] = float(sub["clip_ratio"].max())
            row["clip_median_ratio"] = _median(sub["clip_median_ratio"])
            row["clip_within"] = _median(sub["clip_within"])
            bounds = [v for v in sub["max_logit_bound"] if v is not None and not pd.isna(v)]
            row["max_logit_bound"] = float(max(bounds)) if bounds else None
        out.append(row)
    return pd.DataFrame.from_records(out)


def _median(col):
    import pandas as pd

    vals = [v for v in col if v is not None and not pd.isna(v)]
    return float(np.median(vals)) if vals else None


_WORKER: dict = {}


def _worker_init(cfg: InstabilityConfig) -> None:  # one corpus per worker process
    _WORKER["corpus"] = _corpus(cfg)


def _worker_run(cfg: InstabilityConfig, fix: str, seed: int) -> RunRecord:
    return train_one(cfg, fix, seed, _WORKER["corpus"])


def _train_all(cfg, jobs, corpus, workers, progress) -> dict:
    """``{(seed, fix): RunRecord}``: in this process (``workers`` 1, a progress tick per
    step) or in ``workers`` spawned processes of one thread each (a tick of ``steps`` per
    finished run). Each run is the same either way: its init, batches and row sampling
    depend on its seed only."""
    out = {}
    if workers <= 1 or len(jobs) <= 1:
        for s, fix in jobs:
            if progress is not None:
                progress(0, description=f"{fix}, seed {s}")
            out[(s, fix)] = train_one(cfg, fix, s, corpus, on_step=progress)
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")  # fork after torch's thread pools: unsafe
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx,
                             initializer=_worker_init, initargs=(cfg,)) as pool:
        futs = {pool.submit(_worker_run, cfg, fix, s): (s, fix) for s, fix in jobs}
        for f in as_completed(futs):
            out[futs[f]] = f.result()
            if progress is not None:
                progress(cfg.steps, description=f"{futs[f][1]}, seed {futs[f][0]} done")
    return out


def run_instability(seeds: int | Sequence[int] = 5, steps: int | None = None,
                    lr: float | None = None, fixes: Sequence[str] = FIXES, *,
                    tau: float | None = None, seed: int = 0,
                    config: InstabilityConfig | None = None,
                    progress: Callable[..., None] | None = None,
                    workers: int = 1) -> InstabilityResult:
    """Train every fix at every seed (module docstring) and compare the early warning with
    the loss spike. ``seeds``: a count (seeds ``seed .. seed + n - 1``) or the seeds
    themselves; ``steps``, ``lr``, ``tau`` override ``config`` (default :data:`DEFAULTS`).
    ``progress(n=1, *, description=None)``: called after every training step (a
    :func:`sigprop.cli.common.progress` tick takes it). ``workers``: runs trained at once in
    separate processes of one thread each (the results do not depend on it; the processes are
    spawned, so a script calling this with ``workers > 1`` runs it under ``if __name__ ==
    "__main__":``, as any spawned pool needs)."""
    import pandas as pd

    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
        raise SpecError("workers", f"must be an integer in [1, 256] (got {workers!r})")
    cfg = config or DEFAULTS
    over = {k: v for k, v in (("steps", steps), ("lr", lr), ("tau", tau)) if v is not None}
    if over:
        from dataclasses import replace

        cfg = replace(cfg, **over)
    cfg.check()
    if isinstance(seeds, bool) or not isinstance(seeds, int | Sequence) or \
            isinstance(seeds, str):
        raise SpecError("seeds", f"must be a count or a list of seeds (got {seeds!r})")
    if isinstance(seeds, int):
        if seeds < 1:
            raise SpecError("seeds", f"must be an integer >= 1 (got {seeds})")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SpecError("seed", f"must be an integer >= 0 (got {seed!r})")
        seeds = tuple(range(seed, seed + seeds))
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise SpecError("seeds", "need at least one seed")
    fixes = tuple(fixes)
    if not fixes:
        raise SpecError("fixes", "need at least one fix")
    for f in fixes:
        if f not in FIXES:
            raise SpecError("fixes", f"unknown fix {f!r} (known: {', '.join(FIXES)})")
    if len(set(fixes)) != len(fixes):
        raise SpecError("fixes", "a fix is named twice")
    t0 = time.perf_counter()
    corpus = _corpus(cfg) if workers <= 1 else None  # each worker loads its own
    steps_rows, run_rows, event_rows = [], [], []
    recs = _train_all(cfg, [(s, fix) for s in seeds for fix in fixes], corpus, workers,
                      progress)
    for s in seeds:
        for fix in fixes:
            rec = recs[(s, fix)]
            for t in range(len(rec.loss)):
                steps_rows.append({"fix": fix, "seed": s, "step": t, "lr": rec.lr[t],
                                   "loss": rec.loss[t], "max_logit": rec.max_logit[t],
                                   "min_entropy": rec.min_entropy[t],
                                   "logit_bound": rec.logit_bound[t]})
            event_rows += [{"fix": fix, "seed": s, **asdict(e)} for e in rec.events]
            run_rows.append(_run_row(cfg, rec) | {"applied": "; ".join(rec.applied)})
    runs = pd.DataFrame.from_records(run_rows)
    notes = []
    if "sigma-reparam" in fixes:
        notes.append("sigma-reparam: the registry's method rescales W_Q, W_K to spectral "
                     "norm 1 at init; the training-time W = gamma W / sigma(W) is installed "
                     "by sigprop.training.instability (the registry has none)")
    return InstabilityResult(
        config=cfg, fixes=fixes, seeds=seeds,
        steps=pd.DataFrame.from_records(steps_rows),
        runs=runs,
        events=pd.DataFrame.from_records(event_rows, columns=[
            "fix", "seed", "step", "layer", "head", "kind", "what", "value", "threshold",
            "at"]),
        summary=_summary(runs, cfg, fixes), seconds=time.perf_counter() - t0,
        rule=rule_text(cfg), notes=notes)
