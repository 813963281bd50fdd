"""Sweep overhead and the Ray-against-local acceptance run (docs/sweeps.md "Measured").

    python benchmarks/bench_sweep.py [--points 200] [--no-ray] [--acceptance]

1. Overhead: ``--points`` ``predict`` tasks (a beta x depth grid) computed one after another
   in this process (the baseline), then as a sweep on the local pool (2 workers) and on a local
   Ray cluster (2 workers), each into a fresh store; ratios against the baseline, and the
   executors' start-up seconds (pool start; Ray cluster start).
2. ``--acceptance``: the 64-point ``measure`` sweep of docs/sweeps.md on Ray (2 workers) and on
   the local pool; the two stores compared row for row (exact), and the scan plot written to
   ``benchmarks/results/sweep_scan.png``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from sigprop.bench.sweep import time_overhead
from sigprop.runs.executors import run_sweep
from sigprop.runs.grid import expand, parse_grid
from sigprop.runs.store import Store

#: gg25's variances (sigma_v2 = sigma_w2 = 0.2): alpha_attn 0.5 collapses by depth 12
ACCEPTANCE = ("beta=0.1:3:16,alpha_attn=0.5,2,depth=4,12,d_model=64,heads=4,seq_len=32,"
              "rho0=0.3,sigma_v2=0.2,sigma_w2=0.2,sigma_b2=4e-4,seeds=2")


def overhead(points: int, ray: bool) -> None:
    r = time_overhead(points, ("local", "ray") if ray else ("local",))
    base = r["baseline"]
    print(f"{r['tasks']} predict points in one process: {base:.2f} s (baseline)")
    for name in ("local", "ray") if ray else ("local",):
        wall, startup, rerun = r[name]
        print(f"sweep, {name}, 2 workers: {wall:.2f} s = {wall / base:.2f}x the baseline "
              f"(start-up {startup:.2f} s); rerun of the finished sweep: {rerun:.3f} s")


def acceptance() -> None:
    from sigprop.plotting.scan import plot_scan

    tasks = expand("measure", parse_grid(ACCEPTANCE))
    assert len(tasks) == 64
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        for name in ("ray", "local"):
            st = Store(Path(tmp) / name)
            t0 = time.perf_counter()
            rep = run_sweep(tasks, st, executor=name, workers=2)
            print(f"64-point measure sweep, {name}, 2 workers: {time.perf_counter() - t0:.1f} s"
                  f" (start-up {rep.startup:.1f} s), {rep.done} done, {rep.failed} failed")
            stores[name] = st.read()
        a, b = stores["ray"], stores["local"]
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        print(f"stores equal row for row: {len(a)} rows, {a['config_hash'].nunique()} tasks")
        _fig, averaged = plot_scan(a, out / "sweep_scan.png", x="beta", y="cos", hue="depth",
                                   col="alpha_attn")
        print(f"scan written to {out / 'sweep_scan.png'} (averaged over: {averaged or 'none'})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--acceptance", action="store_true")
    args = ap.parse_args()
    overhead(args.points, not args.no_ray)
    if args.acceptance:
        acceptance()


if __name__ == "__main__":
    main()
