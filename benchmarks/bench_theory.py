"""Theory speed benchmarks, each against its slow baseline measured in the same run.

    python benchmarks/bench_theory.py [--quick]

1. Trainability diagram, 256 x 256 grid x 60 layers (vectorised `final_cos` over the grid)
   vs a scalar per-point loop of the same block map (timed on a sample of points and
   extrapolated to the grid: the full loop would take minutes).
2. tanh MLP kernel: 2-D Gauss-Hermite (vectorised) vs scipy dblquad per point (gg25's reference
   approach), both at <= 1e-7 agreement.
3. Finite-T Y2 (docs/theory.md §2.3): the 1-D quadrature vs Monte Carlo reaching the same accuracy
   (1e-4 absolute; MC cost extrapolated from its measured per-sample variance and speed).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sigprop.spec import ArchSpec
from sigprop.theory import blocks, depth, kernels, rem


def timeit(fn, repeat=3):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_diagram(n_sample: int) -> None:
    spec = ArchSpec(depth=60, beta=0.5, rho0=0.0, sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4)
    betas = np.linspace(0.0, 3.0, 256)
    alphas = np.linspace(0.0, 2.0, 256)
    depth.final_cos(spec, beta=betas[:4, None], alpha_attn=alphas[None, :4])  # warm tables
    t_vec, grid = timeit(lambda: depth.final_cos(spec, beta=betas[:, None],
                                                  alpha_attn=alphas[None, :]))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 256, size=(n_sample, 2))
    t0 = time.perf_counter()
    worst = 0.0
    for i, j in idx:  # the scalar loop: one grid point at a time through the same map
        bp = blocks.BlockParams.from_spec(spec, sigma_s0=float(betas[i]) * np.sqrt(np.log(512)),
                                          alpha_attn=float(alphas[j]))
        q, p = 1.0, 0.0
        for _ in range(spec.depth):
            q, p, _ = blocks.block_step(q, p, bp)
        worst = max(worst, abs(p / q - grid[i, j]))
    per_point = (time.perf_counter() - t0) / n_sample
    t_loop = per_point * 256 * 256
    print(f"diagram 256x256x60: vectorised {t_vec:.3f} s; scalar loop {per_point * 1e3:.2f} ms/"
          f"point -> {t_loop:.1f} s for the grid (extrapolated from {n_sample} points); "
          f"ratio {t_loop / t_vec:.0f}x; max |diff| {worst:.1e}")


def bench_tanh_kernel(n_points: int) -> None:
    rng = np.random.default_rng(1)
    q1 = rng.uniform(0.2, 4.0, n_points)
    c = rng.uniform(-0.95, 0.999, n_points)
    p1 = c * q1
    m = 20
    t0 = time.perf_counter()
    ref = [kernels.dblquad_kernel("tanh", float(q1[i]), float(p1[i])) for i in range(m)]
    t_dq = (time.perf_counter() - t0) / m
    # default rule (trapezoid on the Gaussian-weighted plane) and 2-D Gauss-Hermite (n = 128)
    for label, kw in (("trapezoid (default)", {}), ("Gauss-Hermite n=128", {"rule": "hermite",
                                                                           "n": 128})):
        kernels.gauss_kernel("tanh", q1[:2], p1[:2], **kw)  # warm-up
        t_gh, (gd, go) = timeit(lambda kw=kw: kernels.gauss_kernel("tanh", q1, p1, **kw))
        err = max(max(abs(gd[i] - r[0]), abs(go[i] - r[1])) for i, r in enumerate(ref))
        per = t_gh / n_points
        print(f"tanh kernel, {label}: {per * 1e6:.2f} us/point ({n_points} points, q1 in "
              f"[0.2, 4]); dblquad {t_dq * 1e3:.1f} ms/point; ratio {t_dq / per:.0f}x; "
              f"max |diff| vs dblquad {err:.1e}")
    # the diagram's path: one shared q1 (post-LN), 65536 correlations; the per-q1 table in
    # theta is built inside the timed call (cold: a q1 not seen before in this process)
    for q1s in (0.2004, 1.0, 4.0):
        pc = rng.uniform(-0.2, 1.0, 65536) * q1s
        t0 = time.perf_counter()
        kd, ko = kernels.kernel("tanh", q1s, pc)
        t_cold = time.perf_counter() - t0
        t_warm, _ = timeit(lambda q1s=q1s, pc=pc: kernels.kernel("tanh", q1s, pc))
        refs = [kernels.dblquad_kernel("tanh", q1s, float(pc[i])) for i in range(5)]
        err = max(max(abs(kd[i] - r[0]), abs(ko[i] - r[1])) for i, r in enumerate(refs))
        print(f"tanh kernel, shared q1={q1s:g} (diagram path), 65536 points: cold "
              f"{t_cold * 1e3:.1f} ms incl. table build, warm {t_warm * 1e3:.1f} ms; "
              f"ratio vs dblquad {t_dq * 65536 / t_cold:.0f}x cold, "
              f"{t_dq * 65536 / t_warm:.0f}x warm; "
              f"max |diff| {err:.1e}")


def bench_y2(target: float = 1e-4) -> None:
    T, beta = 1024, 1.5
    v = beta**2 * np.log(T)
    t_q, val = timeit(lambda: rem.y2_finite(v, T), repeat=5)
    rng = np.random.default_rng(2)
    rows = 20000
    t0 = time.perf_counter()
    s = rng.standard_normal((rows, T)) * np.sqrt(v)
    s -= s.max(axis=1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(axis=1, keepdims=True)
    y = (w**2).sum(axis=1)
    t_row = (time.perf_counter() - t0) / rows
    n_needed = (y.std() / target) ** 2
    t_mc = n_needed * t_row
    print(f"finite-T Y2 (T={T}, beta={beta}): quadrature {t_q * 1e3:.2f} ms -> {float(val):.5f};"
          f" Monte Carlo mean {y.mean():.5f} +- {y.std() / np.sqrt(rows):.5f}; MC needs "
          f"{n_needed:.2e} rows for {target:g} accuracy = {t_mc:.2f} s; ratio {t_mc / t_q:.0f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer baseline samples")
    a = ap.parse_args()
    bench_diagram(60 if a.quick else 400)
    bench_tanh_kernel(65536)
    bench_y2()


if __name__ == "__main__":
    main()
