"""How fast can one step of the trainability grid be on this machine? (issue 19, item 4)

Times, on one intra-op thread, one training step of ``sigprop trainability``'s default grid
(DEEP_SMALL, 3 betas x 3 alphas as slices of one batched model, batch 64) and, separately,
the matrix products of that step alone: every ``bmm`` / ``baddbmm`` / ``mm`` / ``addmm`` the
step runs (forward and backward, shapes recorded by torch's profiler), replayed back to
back on fresh random operands of the same shapes. The products are the arithmetic the step
cannot drop without changing the model or the protocol; everything else (softmax, norms,
activations, copies, the optimiser) is what a faster step could still remove. The ratio of
the two is therefore a ceiling on any speed-up of the step at fixed arithmetic and float32.

    .venv/bin/python benchmarks/grid_floor.py [--steps 5]

Prints seconds per step, seconds of products per step, and what those imply for the grid
on 1 and 2 cores against the per-alpha path (``sigprop bench training`` times that path).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

GEMMS = ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after 3 warm-up steps)")
    args = ap.parse_args()

    from sigprop.data.batches import Batches
    from sigprop.data.corpus import load_corpus
    from sigprop.spec import ArchSpec
    from sigprop.training.loop import make_optimizer, train_step
    from sigprop.training.task import TaskModel
    from sigprop.training.trainability import (
        DEEP_SMALL,
        DEFAULT_ALPHAS,
        DEFAULT_BETAS,
        TRAINABILITY_CONFIG,
    )

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = TRAINABILITY_CONFIG
    pb = [b for _ in DEFAULT_ALPHAS for b in DEFAULT_BETAS]
    pa = [a for a in DEFAULT_ALPHAS for _ in DEFAULT_BETAS]
    spec = replace(ArchSpec(), **DEEP_SMALL, alpha_attn=pa[0], beta=pb[0])
    batches = Batches(spec, cfg, corpus=load_corpus("builtin"))
    model = TaskModel(spec, cfg, batches.vocab, pb, head_bias=batches.unigram_logp, alphas=pa)
    opt, sched, params = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")

    def step():
        train_step(model, cfg, *batches.train_batch(gen, cpu), opt, sched, params)

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    t_step = (time.perf_counter() - t0) / args.steps

    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        step()
    calls = [(e.name, [tuple(s) for s in e.input_shapes if s])
             for e in prof.events() if e.name in GEMMS]
    g = torch.Generator().manual_seed(1)
    ops = []
    for name, shapes in calls:
        t = [torch.randn(*s, generator=g) for s in shapes]
        fn = {"aten::bmm": torch.bmm, "aten::mm": torch.mm, "aten::baddbmm": torch.baddbmm,
              "aten::addmm": torch.addmm}[name]
        ops.append((fn, t))
    for fn, t in ops:  # warm
        fn(*t)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for fn, t in ops:
            fn(*t)
        best = min(best, time.perf_counter() - t0)
    steps = cfg.steps
    print(f"grid step (1 thread): {t_step:.3f} s; its {len(ops)} matrix products alone: "
          f"{best:.3f} s ({best / t_step:.0%} of the step)")
    print(f"ceiling at fixed arithmetic: the step at most {t_step / best:.2f}x faster on one "
          f"core; {steps} steps >= {best * steps:.0f} s on 1 core, >= {best * steps / 2:.0f} s "
          f"on 2 (perfect scaling, evaluations left out)")


if __name__ == "__main__":
    main()
