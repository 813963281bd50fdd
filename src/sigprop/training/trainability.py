"""Trainability grid: train every (beta, alpha_attn) point of a deep model briefly and put the
outcome beside the theory's regime (gg25 Fig. 1(c) regimes checked by training, Fig. 1(f)).
``sigprop trainability`` is the command-line face of :func:`trainability`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..spec import ArchSpec, SpecError
from .config import TrainConfig
from .loop import _mean_err, check_memory, train

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
#: thread, 13-14 min for the grid. Spread of the alpha-2 gains (beta 0.3 / 1 / 8) over 5
#: earlier runs (seeds 0 and 1, and seed 0 with three vocabularies from the library's own
#: WordPiece trainer, which broke ties in hash order before sigprop made training
#: deterministic): 0.62-0.77 / 0.52-0.76 / 0.01-0.13.
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
                 on_step: Callable[[int, int], None] | None = None):
    """Train every (beta, alpha_attn) point briefly and classify it (:func:`criterion_text`)
    beside the theory's regime (:func:`sigprop.theory.depth.verdict`, docs/theory.md §2.7).

    Betas of one alpha train together (one batched model, slices = betas x seeds). Returns
    ``(table, trajectory)``: one table row per point with ``beta, alpha, theory, outcome,
    final_eval, final_eval_stderr, baseline, gain, agree``; the trajectory carries ``beta``
    and ``alpha`` columns. ``on_step(done, total)`` counts steps over the whole grid."""
    import pandas as pd

    from ..theory import depth

    if not betas or not alphas:
        raise SpecError("betas", "give at least one beta and one alpha")
    for name, vals, hi in (("betas", betas, 1e4), ("alphas", alphas, 1e6)):
        if any(not (math.isfinite(v) and 0 <= v <= hi) for v in vals):
            raise SpecError(name, f"every value must be a number in [0, {hi:g}] (got "
                                  f"{list(vals)})")
    # before loading the corpus or training any grid point; alpha and beta change no size
    check_memory(spec, config, betas=list(betas), data=data, corpus=corpus)
    if corpus is None and config.task in ("mlm", "clm"):
        from ..data.corpus import load_corpus

        corpus = load_corpus(data)
    rows, trajs = [], []
    for ai, a in enumerate(alphas):
        sp = replace(spec, alpha_attn=float(a), beta=float(betas[0]), qk_std=None)
        done = ai * config.steps

        def step_cb(s, _total, done=done):
            if on_step is not None:
                on_step(done + s, len(alphas) * config.steps)

        res = train(sp, config, data=data, corpus=corpus, betas=list(betas), on_step=step_cb)
        t = res.trajectory.copy()
        t["alpha"] = float(a)
        trajs.append(t)
        for bi, b in enumerate(betas):
            final = res.final_eval[bi * config.seeds:(bi + 1) * config.seeds]
            m, e = _mean_err(final)
            theory = depth.verdict(replace(sp, beta=float(b)))
            learned = m <= res.baseline - margin
            agree = learned == (theory == "trainable")
            rows.append(dict(beta=float(b), alpha=float(a), theory=theory,
                             outcome="learned" if learned else "stuck", final_eval=m,
                             final_eval_stderr=e, baseline=res.baseline,
                             gain=res.baseline - m, agree=agree))
    return pd.DataFrame(rows), pd.concat(trajs, ignore_index=True)
