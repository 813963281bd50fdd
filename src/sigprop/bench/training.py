"""``sigprop bench training``: the trainability grid and the training step (issue 19, item 4).

Figures, each pair timed in the same call:

* ``training/grid-step``: one step of the whole (beta, alpha_attn) grid of ``sigprop
  trainability`` (default: DEEP_SMALL, 3 betas x 3 alphas, batch 64) trained as slices of
  one batched model (per-slice alpha_attn, one worker), against the per-alpha path it
  replaced (one model per alpha, :func:`sigprop.training.trainability.trainability` with
  ``batched=False``), the sum of its three models' steps. Timed over ``steps`` steps per
  path from ``on_step`` timestamps, leaving out the first step (warm-up) and the last (it
  carries the final evaluation); the periodic evaluations of a 500-step run (11 of them,
  each ~1.3 steps' worth of forward passes) are not in the figure. ``notes`` extrapolate
  to the 500-step grid.
* ``training/grid-step-2-workers``: the same grid split into two shards trained side by
  side (one intra-op thread each) against the per-alpha path on one thread: what the
  second core of a 2-core machine adds (only on an otherwise idle machine: under load the
  shards share one core).
* ``training/train-step``: one step of ``sigprop train``'s training defaults (batch 64,
  lr 2e-3, the unigram readout bias) on the 1-layer acceptance model (d = T = 64, beta 0.5;
  the CLI's bare default model, BERT-base at T = 512, needs ~35 GB and is refused on a
  small machine) inside :func:`sigprop.training.loop.train` against a bare step of the
  same model (forward, backward, AdamW: :func:`sigprop.training.steps.step` without
  clipping or schedule, and no loss bookkeeping): the loop's own overhead.

``quick``: a 2-layer d = 16 model on a 2 x 2 grid, 6 steps (seconds; the test suite).
"""

from __future__ import annotations

import time
from dataclasses import replace

from .core import Figure, register

DEFAULT_STEPS = 20  #: steps per path at size "default" (18 timed)
QUICK_STEPS = 6
GRID_STEPS = 500  #: TRAINABILITY_CONFIG.steps, for the extrapolation


def _grid_setup(size: str, device: str):
    from ..data.corpus import load_corpus
    from ..spec import ArchSpec
    from ..training.trainability import (
        DEEP_SMALL,
        DEFAULT_ALPHAS,
        DEFAULT_BETAS,
        TRAINABILITY_CONFIG,
    )

    if size == "quick":
        spec = ArchSpec(depth=2, d_model=16, heads=2, seq_len=16, norm="post", sigma_v2=0.2,
                        sigma_w2=0.2, sigma_b2=4e-4)
        betas, alphas, steps = (0.3, 8.0), (0.5, 2.0), QUICK_STEPS
        corpus = load_corpus("builtin", n_documents=200, vocab_size=300)
        cfg = replace(TRAINABILITY_CONFIG, batch_size=8, eval_sequences=16)
    else:
        spec = replace(ArchSpec(), **DEEP_SMALL)
        betas, alphas, steps = DEFAULT_BETAS, DEFAULT_ALPHAS, DEFAULT_STEPS
        corpus = load_corpus("builtin")
        cfg = TRAINABILITY_CONFIG
    cfg = replace(cfg, steps=steps, eval_every=steps, device=device, threads=1)
    return spec, list(betas), list(alphas), cfg, corpus


def _time_grid(spec, betas, alphas, cfg, corpus, **kw) -> float:
    """Seconds per grid step of ``trainability(**kw)``: per alpha (the per-alpha path runs
    them one after another) the time from its step 1 to its step ``steps - 1``, summed."""
    from ..training.trainability import trainability

    n = cfg.steps
    stamps: dict[int, float] = {}

    def on_step(done: int, _total: int) -> None:
        stamps[done] = time.perf_counter()

    trainability(spec, betas, alphas, cfg, corpus=corpus, on_step=on_step, **kw)
    na = len(alphas)
    if kw.get("batched", True):  # done counts alpha-steps: step s is done = s * na
        return (stamps[(n - 1) * na] - stamps[na]) / (n - 2)
    return sum((stamps[ai * n + n - 1] - stamps[ai * n + 1]) / (n - 2) for ai in range(na))


def _train_step(size: str, device: str, repeat: int) -> tuple[float, float]:
    """(seconds per step inside ``train``, seconds per bare step) for ``sigprop train``'s
    defaults (quick: the tiny model)."""
    import torch

    from ..data.batches import Batches
    from ..data.corpus import load_corpus
    from ..measurement.threads import cpu_settings
    from ..spec import ArchSpec
    from ..training.config import TrainConfig
    from ..training.loop import train
    from ..training.steps import step
    from ..training.task import TaskModel, slice_losses

    steps = QUICK_STEPS if size == "quick" else DEFAULT_STEPS
    if size == "quick":
        spec = ArchSpec(depth=2, d_model=16, heads=2, seq_len=16)
        corpus = load_corpus("builtin", n_documents=200, vocab_size=300)
        cfg = TrainConfig(steps=steps, batch_size=8, eval_sequences=16, bias_init="unigram")
    else:  # the CLI's bare defaults (BERT-base, T 512) need ~35 GB: the acceptance model
        spec = ArchSpec(depth=1, d_model=64, heads=1, seq_len=64, beta=0.5)
        corpus = load_corpus("builtin")
        cfg = TrainConfig(steps=steps, bias_init="unigram")
    cfg = replace(cfg, eval_every=steps, measure_every=0, device=device)
    stamps: dict[int, float] = {}
    train(spec, cfg, corpus=corpus, on_step=lambda s, _t: stamps.__setitem__(
        s, time.perf_counter()))
    ours = (stamps[steps - 1] - stamps[1]) / (steps - 2)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with cpu_settings(threads=cfg.threads if dev.type == "cpu" else None,
                      flush_denormal=dev.type == "cpu"):
        b = Batches(spec, cfg, corpus=corpus)
        model = TaskModel(spec, cfg, b.vocab, head_bias=b.unigram_logp).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        gen = torch.Generator().manual_seed(0)
        batches = [b.train_batch(gen, dev) for _ in range(repeat + 1)]

        def bare(x, y):
            step(slice_losses(model, cfg.task, x, y), opt)

        bare(*batches[0])
        sync()
        t0 = time.perf_counter()
        for x, y in batches[1:]:
            bare(x, y)
        sync()
        ref = (time.perf_counter() - t0) / repeat
    return ours, ref


@register("training", title="trainability grid as one batched model; the training step",
          runtime=150)
def training(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    spec, betas, alphas, cfg, corpus = _grid_setup(size, device)
    grid = f"{len(betas)} betas x {len(alphas)} alphas, depth {spec.depth}, d {spec.d_model}, " \
           f"T {spec.seq_len}, batch {cfg.batch_size}"
    old = _time_grid(spec, betas, alphas, cfg, corpus, batched=False)
    new = _time_grid(spec, betas, alphas, cfg, corpus, workers=1)
    old2 = _time_grid(spec, betas, alphas, cfg, corpus, batched=False)
    two = _time_grid(spec, betas, alphas, cfg, corpus, workers=2) if device == "cpu" else None
    old = min(old, old2)  # best of two: the machine is shared
    sizes = {"grid": grid, "steps_timed": cfg.steps - 2}

    def minutes(t: float) -> str:
        return f"{t * GRID_STEPS / 60:.1f} min for {GRID_STEPS} steps"

    figs = [Figure("training/grid-step", f"one step of the trainability grid ({grid}) as "
                   "slices of one batched model (per-slice alpha_attn), 1 worker",
                   sigprop_s=new, reference="the per-alpha path (one batched model per "
                   "alpha), sum of its steps", reference_s=old, target="<= 0.33",
                   ok=new / old <= 1 / 3, size=sizes,
                   notes=f"extrapolated (evaluations left out): {minutes(new)} vs "
                         f"{minutes(old)}")]
    if two is not None:
        figs.append(Figure("training/grid-step-2-workers", "the same grid in 2 shards "
                           "trained side by side (1 intra-op thread each)", sigprop_s=two,
                           reference="the per-alpha path on 1 thread", reference_s=old,
                           target="<= 0.33", ok=two / old <= 1 / 3, size=sizes,
                           notes=f"extrapolated: {minutes(two)}; needs a second idle core"))
    ours, ref = _train_step(size, device, repeat=cfg.steps - 2)
    figs.append(Figure("training/train-step", "one step of sigprop train's defaults (1 layer, "
                       "d = T = 64) inside the training loop", sigprop_s=ours,
                       reference="bare step of the same model (forward, backward, AdamW)",
                       reference_s=ref, target="<= 1.1", ok=ours / ref <= 1.1,
                       size={"steps_timed": cfg.steps - 2}))
    return figs
