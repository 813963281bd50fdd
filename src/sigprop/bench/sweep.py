"""Sweep overhead: ``predict`` points computed one after another in one process, then as a
sweep on the local process pool (2 workers) into a fresh results store (docs/sweeps.md)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .core import Figure, register

POINTS = {"quick": 16, "default": 200}


@register("sweep", title="sigprop sweep against the same points in one process", runtime=20)
def sweep_overhead(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    from ..runs.executors import run_sweep
    from ..runs.grid import expand, parse_grid
    from ..runs.store import Store
    from ..runs.tasks import execute

    n = POINTS[size]
    tasks = expand("predict", parse_grid(f"beta=0.05:3:{max(1, n // 4)},depth=6,12,24,48"))
    execute("predict", tasks[0].config)  # warm the REM tables, as a worker does
    t0 = time.perf_counter()
    for t in tasks:
        execute("predict", t.config)
    base = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rep = run_sweep(tasks, Store(Path(tmp) / "st"), workers=2)
        wall = time.perf_counter() - t0
    if rep.done != len(tasks):
        raise RuntimeError(f"the sweep stored {rep.done} of {len(tasks)} tasks")
    return [Figure("sweep/local_pool", f"{len(tasks)} predict points as a sweep, local pool of "
                   f"2 workers, into a new store", wall, f"the same {len(tasks)} points one "
                   "after another in one process", base,
                   # at the quick size the pool's start-up is most of the time: no target
                   target="<= 2" if size == "default" else "",
                   ok=wall / base <= 2 if size == "default" else None,
                   size={"points": len(tasks), "workers": 2},
                   notes=f"pool start-up {rep.startup:.2f} s")]
