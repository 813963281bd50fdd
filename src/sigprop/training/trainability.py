"""Trainability grid: train every (beta, alpha_attn) point of a deep model briefly and put the
outcome beside the theory's regime (gg25 Fig. 1(c) regimes checked by training, Fig. 1(f)).
``sigprop trainability`` is the command-line face of :func:`trainability`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch

from ..spec import ArchSpec, SpecError
from .config import TrainConfig
from .loop import check_memory, mean_err, train

#: the deep small model used when ``trainability`` gets no architecture: post-LN, gg25's
#: variances (sigma_v^2 = sigma_w^2 = 0.2, sigma_b^2 = 4e-4, no W_O), 24 layers, d = T = 32
#: (d = T = 64 measured 4.7x slower per step, out of reach of a few CPU minutes)
DEEP_SMALL = dict(depth=24, d_model=32, heads=2, seq_len=32, norm="post", sigma_v2=0.2,
                  sigma_w2=0.2, sigma_b2=4e-4)
DEFAULT_BETAS = (0.3, 1.0, 8.0)
DEFAULT_ALPHAS = (0.2, 0.5, 2.0)
DEFAULT_MARGIN = 0.5
#: ``trainability``'s training: gg25's batch 64 and lr 2e-3 (as ``train``), 500 steps per grid
#: point, the readout bias at the unigram log frequencies, no observables measured. Measured on
#: DEEP_SMALL, default grid, seed 0, the deterministic tokenizer (sigprop.data.tokenizer): alpha
#: 2 with beta 0.3 / 1 ends 0.72 / 0.70 nats below the baseline (5.315), beta 8 0.065, every
#: alpha 0.2 / 0.5 point within 0.03 of it; ~0.6 s per step for the 3 betas of one alpha on 1
#: thread, 13-14 min for the grid (per-alpha path). Cost (issue 19, ``sigprop bench
#: training``): the step is compute-bound, not overhead-bound: ~36 GFLOP of batched matmuls
#: per grid step (9 slices x 3 x 1.35 GFLOP), ~0.5 s at this machine's ~70 GFLOP/s
#: single-thread bmm rate, against ~0.95 s of CPU time measured, so the one batched model
#: (9 slices) steps as fast as the three per-alpha models (1.01x, 1.1 s wall each under
#: load) and no single-thread change reaches 3x; the second core does (shards, ``workers``;
#: 1.27x measured with the machine shared, up to ~2x idle). torch.compile of the block
#: (inductor, CPU): 1.1-1.2x less CPU time, 11-47 s to compile, outputs 1e-3 apart after
#: 24 layers, and wrong results with SDPA: not used. Spread of the alpha-2 gains (beta 0.3 /
#: 1 / 8) over 5 earlier runs (seeds 0 and 1, and seed 0 with three vocabularies from the
#: library's own WordPiece trainer, which broke ties in hash order before sigprop made
#: training deterministic): 0.62-0.77 / 0.52-0.76 / 0.01-0.13.
#: What did not work (alpha 2, beta 0.3): batch 16 (the old default; ~77 masked tokens per
#: step) with a zero bias stays above the baseline after 600 steps at lr 5e-3, and with the
#: unigram bias gains nothing at lr 2e-3, 1e-2 or 3e-2 in 300 steps; at batch 64, 300 steps, lr
#: 1e-3 / 2e-3 / 3e-3 / 4e-3 gain 0.29 / 0.40 / 0.29 / 0.06 nats (at 4e-3 the loss climbs back
#: to the baseline after step 120; a 20% warmup did not help at 2e-3 or 4e-3); with a zero bias
#: (batch 64, 500 steps) beta 0.3 and 1 end 0.01 nats above the baseline; 450 steps gain 0.63 /
#: 0.58, a thinner margin than 500 steps, and 600 steps would take ~17 min.
TRAINABILITY_CONFIG = TrainConfig(steps=500, batch_size=64, lr=2e-3, bias_init="unigram",
                                  measure_every=0)


def criterion_text(margin: float) -> str:
    return (f"learned = final eval loss (mean over seeds) at least {margin:g} nats below the "
            "context-free baseline (the unigram cross-entropy of the masked tokens); "
            "stuck otherwise")


def trainability(spec: ArchSpec, betas: Sequence[float] = DEFAULT_BETAS,
                 alphas: Sequence[float] = DEFAULT_ALPHAS,
                 config: TrainConfig = TRAINABILITY_CONFIG,
                 *, data: str = "builtin", corpus=None, margin: float = DEFAULT_MARGIN,
                 on_step: Callable[[int, int], None] | None = None,
                 batched: bool = True, workers: int | None = None):
    """Train every (beta, alpha_attn) point briefly and classify it (:func:`criterion_text`)
    beside the theory's regime (:func:`sigprop.theory.depth.verdict`, docs/theory.md §2.7).

    ``batched`` (default): every grid point is a slice group of one batched model (per-slice
    ``alpha_attn``, :class:`sigprop.training.task.TaskModel`), split into ``workers``
    contiguous shards trained side by side in threads with one intra-op thread each (default:
    ``config.threads``, at least 1; slices are independent, so a shard trains exactly as the
    same slices of one model). ``batched=False``: the per-alpha path (one model per alpha,
    slices = betas x seeds), kept for comparison (``sigprop bench training``) and used when
    the whole grid would not fit in memory. Both give the same outcomes up to float32
    rounding (tests/test_trainability_grid.py).

    Returns ``(table, trajectory)``: one table row per point with ``beta, alpha, theory,
    outcome, final_eval, final_eval_stderr, baseline, gain, agree``; the trajectory carries
    ``beta`` and ``alpha`` columns. ``on_step(done, total)`` counts steps over the whole grid
    (``total = len(alphas) * steps``, the per-alpha path's count)."""
    if not betas or not alphas:
        raise SpecError("betas", "give at least one beta and one alpha")
    for name, vals, hi in (("betas", betas, 1e4), ("alphas", alphas, 1e6)):
        if any(not (math.isfinite(v) and 0 <= v <= hi) for v in vals):
            raise SpecError(name, f"every value must be a number in [0, {hi:g}] (got "
                                  f"{list(vals)})")
    betas, alphas = [float(b) for b in betas], [float(a) for a in alphas]
    pb = [b for _ in alphas for b in betas]  # the grid, alpha-major: point i = (pa[i], pb[i])
    pa = [a for a in alphas for _ in betas]
    # before loading the corpus or training any grid point; alpha and beta change no size
    if batched:
        try:
            check_memory(spec, config, betas=pb, data=data, corpus=corpus)
        except SpecError:
            batched = False  # the per-alpha path needs a third of it for the default grid
    if not batched:
        check_memory(spec, config, betas=betas, data=data, corpus=corpus)
    if corpus is None and config.task in ("mlm", "clm"):
        from ..data.corpus import load_corpus

        corpus = load_corpus(data)
    if batched:
        results = _grid_batched(spec, config, pb, pa, data, corpus, on_step, len(alphas),
                                max(1, config.threads) if workers is None else workers)
    else:
        results = _grid_per_alpha(spec, config, betas, alphas, data, corpus, on_step)
    return _tables(spec, config, betas, alphas, results, margin)


def _grid_per_alpha(spec, config, betas, alphas, data, corpus, on_step):
    """One :func:`train` per alpha (its betas x seeds as slices): ``[(alpha, result), ...]``."""
    out = []
    for ai, a in enumerate(alphas):
        sp = replace(spec, alpha_attn=a, beta=betas[0], qk_std=None)
        done = ai * config.steps

        def step_cb(s, _total, done=done):
            if on_step is not None:
                on_step(done + s, len(alphas) * config.steps)

        out.append((a, train(sp, config, data=data, corpus=corpus, betas=betas,
                             on_step=step_cb)))
    return out


def _grid_batched(spec, config, pb, pa, data, corpus, on_step, n_alphas, workers):
    """Every point as a slice group: ``workers`` shards of consecutive points, each one
    batched model trained in its own thread (the first in the caller's). Returns
    ``[(None, result), ...]`` per shard (the alphas are in each result's ``alphas``)."""
    import threading

    from ..measurement.threads import cpu_settings
    from .loop import train_loop

    n = len(pb)
    cpu = config.device == "cpu"
    k = max(1, min(int(workers), n)) if cpu else 1  # one GPU: one stream of kernels
    cuts = [round(i * n / k) for i in range(k + 1)]
    shards = [(cuts[i], cuts[i + 1]) for i in range(k)]
    sp = replace(spec, alpha_attn=pa[0], beta=pb[0], qk_std=None)
    results: list = [None] * k
    errors: list[BaseException] = []

    def step_cb(s, _total):
        if on_step is not None:
            on_step(s * n_alphas, n_alphas * config.steps)

    def work(i: int) -> None:
        lo, hi = shards[i]
        try:
            if cpu:  # the denormal flag is per thread (the caller's is set by cpu_settings)
                torch.set_flush_denormal(True)
            results[i] = (None, train_loop(sp, config, data, corpus, pb[lo:hi], step_cb if i == 0
                                       else None, False, (), False, pa[lo:hi]))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)
        finally:
            if cpu and i > 0:
                torch.set_flush_denormal(False)

    threads = 1 if (cpu and k > 1) else (config.threads if cpu else None)
    with cpu_settings(threads=threads, flush_denormal=cpu):
        pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(1, k)]
        for th in pool:
            th.start()
        work(0)
        for th in pool:
            th.join()
    if errors:
        raise errors[0]
    return results


def _tables(spec, config, betas, alphas, results, margin):
    """The table and the trajectory of either path, in the per-alpha path's row order."""
    import pandas as pd

    from ..theory import depth

    nb, trajs, done = len(betas), [], 0
    finals = np.concatenate([res.final_eval for _, res in results]).reshape(-1, config.seeds)
    for a, res in results:
        t = res.trajectory.copy()
        if res.alphas is None:
            t["alpha"] = a
        else:  # rows come in events of one row per group, groups in point order
            g = len(res.alphas)
            point = done + np.arange(len(t)) % g
            t["_key"] = list(zip(point // nb, np.arange(len(t)) // g, point % nb, strict=True))
            t["spec.alpha_attn"] = t["alpha"]
            t = t[[c for c in t.columns if c != "alpha"] + ["alpha"]]
            done += g
        trajs.append(t)
    traj = pd.concat(trajs, ignore_index=True)
    if "_key" in traj:  # shards may cut through an alpha: order by (alpha, event, beta)
        order = sorted(range(len(traj)), key=traj["_key"].__getitem__)
        traj = traj.iloc[order].drop(columns="_key").reset_index(drop=True)
    baseline = results[0][1].baseline
    rows = []
    for ai, a in enumerate(alphas):
        for bi, b in enumerate(betas):
            m, e = mean_err(finals[ai * nb + bi])
            theory = depth.verdict(replace(spec, alpha_attn=a, beta=b, qk_std=None))
            learned = m <= baseline - margin
            agree = learned == (theory == "trainable")
            rows.append(dict(beta=b, alpha=a, theory=theory,
                             outcome="learned" if learned else "stuck", final_eval=m,
                             final_eval_stderr=e, baseline=baseline,
                             gain=baseline - m, agree=agree))
    return pd.DataFrame(rows), traj
