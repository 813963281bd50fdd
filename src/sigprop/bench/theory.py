"""Theory speed: each figure times sigprop's theory beside its slow reference in the same call.

``causal_diagram``: the causal trainability diagram against the bidirectional one at the same
grid and depth (the speed issue's item 2: within 2x). ``theory``: the vectorised diagram
against a scalar per-point loop of the same block map, the tanh MLP kernel against scipy's
dblquad, the finite-T Y2 quadrature against Monte Carlo at the same accuracy (the three
figures of ``benchmarks/bench_theory.py``). Where the reference would take minutes it is
timed on a sample and extrapolated (said in the figure's ``notes``).

Theory runs on NumPy: ``device`` is accepted for the common signature and ignored.
"""

from __future__ import annotations

import time

import numpy as np

from .core import Figure, best_of, register

_SIZES = {  # grid points per axis, depth, repeats, scalar-loop sample, tanh points
    "quick": dict(grid=48, depth=20, repeat=1, sample=10, points=4096, dblquad=4),
    "default": dict(grid=256, depth=60, repeat=3, sample=200, points=65536, dblquad=20),
}


def _size(size: str) -> dict:
    if size not in _SIZES:
        raise ValueError(f"size must be one of {tuple(_SIZES)} (got {size!r})")
    return _SIZES[size]


@register("causal_diagram", title="causal trainability diagram against the bidirectional one",
          runtime=15)
def causal_diagram(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    """``diagram.compute`` of the default spec with ``causal=True`` against the same spec
    bidirectional, same grid and depth (``sigprop diagram --depth 60 [--causal]``); the tables
    of both are built before the clock starts (they are cached on disk after the first run)."""
    from ..spec import ArchSpec
    from ..theory import diagram

    s = _size(size)
    bidir, causal = ArchSpec(depth=s["depth"]), ArchSpec(depth=s["depth"], causal=True)
    for spec in (bidir, causal):  # warm: tables, imports
        diagram.compute(spec, n_beta=8, n_alpha=8)
    n = s["grid"]
    t_ref, _ = best_of(lambda: diagram.compute(bidir, n_beta=n, n_alpha=n), s["repeat"])
    t_c, _ = best_of(lambda: diagram.compute(causal, n_beta=n, n_alpha=n), s["repeat"])
    return [Figure(f"causal_diagram/{n}x{n}x{s['depth']}",
                   f"diagram.compute, causal post-LN softmax T 512, {n} x {n} grid, depth "
                   f"{s['depth']}", sigprop_s=t_c,
                   reference="the same diagram bidirectional", reference_s=t_ref,
                   target="<= 2", ok=t_c / t_ref <= 2.0,
                   size={"grid": n, "depth": s["depth"], "repeat": s["repeat"]})]


def _diagram_vs_loop(s: dict) -> Figure:
    from ..spec import ArchSpec
    from ..theory import blocks, depth

    spec = ArchSpec(depth=s["depth"], beta=0.5, rho0=0.0, sigma_v2=0.2, sigma_w2=0.2,
                    sigma_b2=4e-4)
    n = s["grid"]
    betas, alphas = np.linspace(0.0, 3.0, n), np.linspace(0.0, 2.0, n)
    depth.final_cos(spec, beta=betas[:4, None], alpha_attn=alphas[None, :4])  # warm tables
    t_vec, grid = best_of(lambda: depth.final_cos(spec, beta=betas[:, None],
                                                  alpha_attn=alphas[None, :]), s["repeat"])
    idx = np.random.default_rng(0).integers(0, n, size=(s["sample"], 2))
    t0, worst = time.perf_counter(), 0.0
    for i, j in idx:  # the scalar loop: one grid point at a time through the same map
        bp = blocks.BlockParams.from_spec(spec, sigma_s0=float(betas[i]) * np.sqrt(np.log(512)),
                                          alpha_attn=float(alphas[j]))
        q, p = 1.0, 0.0
        for _ in range(spec.depth):
            q, p, _ = blocks.block_step(q, p, bp)
        worst = max(worst, abs(p / q - grid[i, j]))
    t_loop = (time.perf_counter() - t0) / s["sample"] * n * n
    return Figure(f"theory/diagram_{n}x{n}x{s['depth']}",
                  "final cosine over the grid, vectorised (depth.final_cos)", sigprop_s=t_vec,
                  reference="scalar per-point loop of the same block map", reference_s=t_loop,
                  target="< 1", ok=t_vec < t_loop, size={"grid": n, "depth": s["depth"]},
                  notes=f"loop extrapolated from {s['sample']} points; max |diff| "
                        f"{worst:.1e}")


def _tanh_kernel(s: dict) -> Figure:
    from ..theory import kernels

    rng = np.random.default_rng(1)
    n = s["points"]
    q1 = rng.uniform(0.2, 4.0, n)
    p1 = rng.uniform(-0.95, 0.999, n) * q1
    m = s["dblquad"]
    t0 = time.perf_counter()
    ref = [kernels.dblquad_kernel("tanh", float(q1[i]), float(p1[i])) for i in range(m)]
    t_dq = (time.perf_counter() - t0) / m * n
    kernels.gauss_kernel("tanh", q1[:2], p1[:2])  # warm-up
    t_gh, (gd, go) = best_of(lambda: kernels.gauss_kernel("tanh", q1, p1), s["repeat"])
    err = max(max(abs(gd[i] - r[0]), abs(go[i] - r[1])) for i, r in enumerate(ref))
    return Figure(f"theory/tanh_kernel_{n}", f"tanh MLP kernel at {n} points (q1 in [0.2, 4]),"
                  " default rule", sigprop_s=t_gh, reference="scipy dblquad per point",
                  reference_s=t_dq, target="< 1", ok=t_gh < t_dq, size={"points": n},
                  notes=f"dblquad extrapolated from {m} points; max |diff| {err:.1e}")


def _y2_vs_mc(s: dict, target: float = 1e-4) -> Figure:
    from ..theory import rem

    T, beta = 1024, 1.5
    v = beta**2 * np.log(T)
    t_q, val = best_of(lambda: rem.y2_finite(v, T), max(3, s["repeat"]))
    rng = np.random.default_rng(2)
    rows = 2000 if s["repeat"] == 1 else 20000
    t0 = time.perf_counter()
    x = rng.standard_normal((rows, T)) * np.sqrt(v)
    x -= x.max(axis=1, keepdims=True)
    w = np.exp(x)
    w /= w.sum(axis=1, keepdims=True)
    y = (w**2).sum(axis=1)
    t_row = (time.perf_counter() - t0) / rows
    n_needed = (y.std() / target) ** 2
    return Figure("theory/y2_finite_T1024", f"finite-T Y2 (T {T}, beta {beta}) by quadrature",
                  sigprop_s=t_q, reference=f"Monte Carlo rows reaching {target:g} accuracy",
                  reference_s=n_needed * t_row, target="< 1", ok=t_q < n_needed * t_row,
                  size={"T": T, "beta": beta},
                  notes=f"quadrature {float(val):.5f}, MC {y.mean():.5f} +- "
                        f"{y.std() / np.sqrt(rows):.5f}; MC needs {n_needed:.2e} rows "
                        f"(extrapolated from {rows})")


@register("theory", title="theory against its slow baselines (loop, dblquad, Monte Carlo)",
          runtime=25)
def theory(*, size: str = "default", device: str = "cpu") -> list[Figure]:
    """The three figures of the module docstring."""
    s = _size(size)
    return [_diagram_vs_loop(s), _tanh_kernel(s), _y2_vs_mc(s)]
