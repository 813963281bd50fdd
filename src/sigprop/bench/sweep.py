"""Sweep overhead: ``predict`` points computed one after another in one process, then as a
sweep on the local process pool (2 workers) into a fresh results store (docs/sweeps.md)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .core import Figure, register

POINTS = {"quick": 16, "default": 200}


def time_overhead(points: int, executors=("local",), workers: int = 2) -> dict:
    """``points`` ``predict`` tasks (a beta x depth grid) timed one after another in this
    process, then as a sweep on each executor into a fresh store, then that finished sweep
    again. Returns ``{"tasks": n, "baseline": s, executor: (seconds, startup, rerun_seconds)}``;
    raises when a sweep stored fewer tasks than it was given."""
    from ..runs.executors import run_sweep
    from ..runs.grid import expand, parse_grid
    from ..runs.store import Store
    from ..runs.tasks import execute

    tasks = expand("predict", parse_grid(f"beta=0.05:3:{max(1, points // 4)},depth=6,12,24,48"))
    execute("predict", tasks[0].config)  # warm the REM tables, as a worker does
    t0 = time.perf_counter()
    for t in tasks:
        execute("predict", t.config)
    out: dict = {"tasks": len(tasks), "baseline": time.perf_counter() - t0}
    with tempfile.TemporaryDirectory() as tmp:
        for name in executors:
            st = Store(Path(tmp) / name)
            t0 = time.perf_counter()
            rep = run_sweep(tasks, st, executor=name, workers=workers)
            wall = time.perf_counter() - t0
            if rep.done != len(tasks):
                raise RuntimeError(f"the {name} sweep stored {rep.done} of {len(tasks)} tasks")
            t0 = time.perf_counter()
            again = run_sweep(tasks, st, executor=name, workers=workers)
            if again.done:
                raise RuntimeError(f"the finished {name} sweep ran {again.done} tasks again")
            out[name] = (wall, rep.startup, time.perf_counter() - t0)
    return out


@register("sweep", title="sigprop sweep against the same points in one process", runtime=20)
def sweep_overhead(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    r = time_overhead(POINTS[size])
    n, base, (wall, startup, _) = r["tasks"], r["baseline"], r["local"]
    return [Figure("sweep/local_pool", f"{n} predict points as a sweep, local pool of "
                   f"2 workers, into a new store", wall, f"the same {n} points one "
                   "after another in one process", base,
                   # at the quick size the pool's start-up is most of the time: no target
                   target="<= 2" if size == "default" else "",
                   ok=wall / base <= 2 if size == "default" else None,
                   size={"points": n, "workers": 2},
                   notes=f"pool start-up {startup:.2f} s")]
