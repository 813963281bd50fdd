"""gg25 Fig. 5: with a tanh MLP a post-LN transformer in the low-beta regime has an
order-to-chaos transition at infinite depth. The critical MLP weight variance comes from the
slope of the block map at rho = 1, written out here (:func:`tanh_slope_closed_form`) and taken
from sigprop's block map; simulation on sigprop's model on both sides of it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...spec import ArchSpec
from ...theory import blocks
from ...theory import depth as tdepth
from .. import args
from ..core import Check, Experiment, frame, one_thread, register
from ..plots import axes_row, decorate
from .common import BETA_HF, SQRT2, at

__all__ = ["tanh_slope_closed_form", "library_slope", "critical", "fig5", "fig5_data",
           "fig5_checks", "plot_fig5"]


def tanh_slope_closed_form(sigma_w2, *, var_v, var_b, alpha_attn, alpha_mlp, nodes: int = 96):
    """Slope at rho = 1 of gg25's post-LN tanh block in the T -> inf limit, written out:
    attention below beta_c (Y2 = Yx = 0) and residual give ``alpha_A^2 / (alpha_A^2 + s_v^2 +
    s_b^2)``; MLP and residual give ``(alpha_M^2 + s_w^4 E[phi'(u)^2]) / (alpha_M^2 + s_w^2
    E[phi(u)^2] + s_b^2)``, u ~ N(0, s_w^2 + s_b^2) (Price's theorem: the derivative of
    E[phi(u) phi(u')] in the covariance is E[phi'(u) phi'(u')]). 1-D Gauss-Hermite, independent
    of :mod:`sigprop.theory.kernels`. Above 1 the collapsed state rho = 1 is unstable (chaos)."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    sw = np.asarray(sigma_w2, dtype=np.float64)[..., None]
    t = np.tanh(np.sqrt(sw + var_b) * z)
    e2, ed2 = (t * t) @ w, ((1.0 - t * t) ** 2) @ w
    sw = sw[..., 0]
    a2, m2 = alpha_attn**2, alpha_mlp**2
    return a2 / (a2 + var_v + var_b) * (m2 + sw * sw * ed2) / (m2 + sw * e2 + var_b)


def library_slope(sigma_w2, spec: ArchSpec, eps: float = 1e-7):
    """The same slope from sigprop's block map (:func:`blocks.block_step`, T -> inf)."""
    sw = np.asarray(sigma_w2, dtype=np.float64)
    bp = blocks.BlockParams.from_spec(spec, var_w_in=sw, var_w_out=sw)
    one = np.ones_like(sw)
    q, p, _ = blocks.block_step(one, one - eps, bp, asymptotic=True)
    return (1.0 - p / q) / eps


def critical(fn, lo: float = 0.2, hi: float = 20.0) -> float:
    """Where ``fn(sigma_w2) = 1`` on [lo, hi]: a geometric grid, then two refinements."""
    for _ in range(3):
        g = np.geomspace(lo, hi, 65)
        s = fn(g) - 1.0
        k = int(np.argmax(s > 0))
        if s[k] <= 0 or k == 0:
            return float("nan")
        lo, hi = g[k - 1], g[k]
    return float(lo + (hi - lo) * (-fn(np.array([lo]))[0] + 1.0)
                 / (fn(np.array([hi]))[0] - fn(np.array([lo]))[0]))


def fig5_data(base: ArchSpec, sws: np.ndarray, s_closed: float, *, seed: int, seeds: int,
              sequences: int, rho0: float, kw: dict) -> dict:
    """At each sigma_w^2: the one-block map, the measured and predicted cosine over depth and
    the theory's cosine at 20x the depth; records, table and curves."""
    import torch

    from ...measurement.engine import measure

    depth = base.depth
    recs, rows, curves = [], [], []
    rin = np.linspace(0.0, 1.0, 101)
    one_block = base.replace(depth=1)
    for sw in sws:
        sp = base.replace(sigma_w2=float(sw))
        fmap = tdepth.final_cos(one_block.replace(sigma_w2=float(sw)), rho0=rin)
        for r, v in zip(rin, fmap, strict=True):
            recs.append(dict(observable="block_map", source="theory", value=v, rho_in=r,
                             sigma_w2=sw))
        m = measure(sp, seeds=seeds, sequences=sequences, input="rho", rho0=rho0, seed=seed,
                    stable_rank=False, dtype=torch.float32)
        r0 = float(np.clip(m.rho0, 0.0, 1.0))
        th = tdepth.propagate(sp, rho0=r0)
        inf = float(tdepth.final_cos(sp.replace(depth=20 * depth), rho0=r0))
        mc, tc = at(m.trajectory, "cos"), at(th, "cos")
        for src, arr in (("measured", mc), ("theory", tc)):
            for lay, v, e in arr:
                recs.append(dict(observable="cos", source=src, value=v, stderr=e,
                                 layer=int(lay), sigma_w2=sw))
        recs.append(dict(observable="cos_infinite_depth", source="theory", value=inf,
                         sigma_w2=sw))
        half = slice(len(mc) // 2, None)
        gap = float(np.mean(mc[half, 1]) - np.mean(tc[half, 1]))
        rows.append(dict(sigma_w2=sw, phase="ordered" if sw < s_closed else "chaotic",
                         rho_L_measured=mc[-1, 1], rho_L_theory=tc[-1, 1],
                         rho_infinite_depth=inf, plateau_gap=gap,
                         slope_at_1=float(tanh_slope_closed_form(sw, **kw))))
        curves.append((sw, fmap, mc, tc))
    df = pd.DataFrame(rows)
    df["sigma_w2_critical"] = s_closed
    return dict(recs=recs, table=df, curves=curves, rin=rin, s_closed=s_closed, depth=depth,
                rho0=rho0)


def fig5_checks(data: dict, s_lib: float, *, d_model: int, T: int, seeds: int,
                sequences: int) -> list[Check]:
    """Simulation on theory per variance, then the critical variance (library against the
    closed form) and both phases in theory and simulation."""
    df, depth, s_closed = data["table"], data["depth"], data["s_closed"]
    checks = [Check.within(
        f"gg25 Fig. 5 (right), sigma_w^2 = {r.sigma_w2:g}: measured minus theory cosine, "
        f"averaged over the last {depth - depth // 2} layers", r.plateau_gap, -0.08, 0.08,
        why=f"d = {d_model}, T = {T}, {seeds} seeds x {sequences} sequences: near the "
            "transition the block map is close to the identity, so finite-width noise is "
            "barely damped and single layers scatter by ~0.1; the layer average does not")
        for r in df.itertuples()]
    ordered, chaotic = df[df.phase == "ordered"], df[df.phase == "chaotic"]
    return checks + [
        Check.ratio("gg25 Fig. 5: the critical sigma_w^2 (slope of the block map at rho = 1 "
                    "equal to 1) of sigprop's block map equals the closed form", s_lib,
                    s_closed, 1.002,
                    why="two independent quadratures of the same T -> inf slope"),
        Check.that("gg25 Fig. 5: ordered phase below the critical variance: the theory's "
                   f"cosine after {20 * depth} layers is 1", bool(np.all(
                       ordered.rho_infinite_depth > 0.999)),
                   float(ordered.rho_infinite_depth.min()), "> 0.999",
                   why="rho = 1 is the attracting fixed point when the slope there is < 1"),
        Check.that("gg25 Fig. 5: chaotic phase above it: the theory's cosine after "
                   f"{20 * depth} layers stays below 0.99", bool(np.all(
                       chaotic.rho_infinite_depth < 0.99)),
                   float(chaotic.rho_infinite_depth.max()), "< 0.99",
                   why="rho = 1 is repelling; the iteration settles at rho* < 1"),
        Check.that("gg25 Fig. 5: simulation on both sides: measured final cosine >= 0.95 in "
                   "the ordered phase and <= 0.9 in the chaotic one",
                   bool(np.all(ordered.rho_L_measured >= 0.95)
                        and np.all(chaotic.rho_L_measured <= 0.9)) and len(ordered) > 0
                   and len(chaotic) > 0,
                   float(chaotic.rho_L_measured.max()), "ordered >= 0.95, chaotic <= 0.9",
                   why=f"after {depth} layers; the ordered side approaches 1 geometrically"),
    ]


def plot_fig5(data: dict, ax=None):
    """Left the one-block maps, right the cosine over depth (lines theory, dots measured)."""
    fig, (ax0, ax1) = axes_row(ax, 2, (10.0, 3.8))
    rin, s_closed = data["rin"], data["s_closed"]
    ax0.plot(rin, rin, "k:", lw=1.0, label="identity")
    for k, (sw, fmap, mc, tc) in enumerate(data["curves"]):
        c = f"C{k}"
        ph = "ordered" if sw < s_closed else "chaotic"
        ax0.plot(rin, fmap, "-", color=c, lw=1.5, label=f"σ_w² = {sw:g} ({ph})")
        ax1.plot(tc[:, 0], tc[:, 1], "-", color=c, lw=1.5, label=f"theory σ_w² = {sw:g}")
        every = max(1, len(mc) // 40)
        ax1.errorbar(mc[::every, 0], mc[::every, 1], yerr=np.nan_to_num(mc[::every, 2]),
                     fmt="o", ms=3, color=c, label=f"measured σ_w² = {sw:g}")
    decorate(ax0, "ρ_in", "ρ_out (one block)",
             f"gg25 Fig. 5 (left): tanh block map, σ_w²* = {s_closed:.3g}")
    ax1.set_ylim(-0.02, 1.02)
    decorate(ax1, "layer", "mean cosine similarity",
             f"gg25 Fig. 5 (right): {data['depth']} layers from ρ0 = {data['rho0']:g}")
    return fig


@register("gg25.fig5",
          tiny=dict(depth=40, T=16, d_model=32, seeds=2, sequences=1, sigma_w2s=(1.0, 6.0)),
          quick=dict(depth=200, T=32, d_model=64, seeds=3, sequences=1),
          full=dict(depth=200, T=128, d_model=512, seeds=25, sequences=10),
          runtime={"tiny": 1.0, "quick": 3.1, "default": 3.1})
@one_thread
def fig5(*, seed: int = 0, device: str = "cpu", sigma_w2s=(1.0, 8.0), depth: int = 200,
         beta: float = BETA_HF, rho0: float = 0.2, alpha_attn: float = 1.0,
         alpha_mlp: float = 1.0, var_v: float = 0.2, var_b: float = 4e-4, T: int = 32,
         d_model: int = 64, heads: int = 1, seeds: int = 3, sequences: int = 1) -> Experiment:
    sws = args.reals("sigma_w2s", sigma_w2s, 0.01, 100.0)
    args.integer("depth", depth, 2, 2000)
    args.real("beta", beta, 0.0, SQRT2)
    args.real("rho0", rho0, 0.0, 0.99)
    args.integer("T", T, 4, 2048)
    args.integer("d_model", d_model, 8, 4096)
    args.integer("seeds", seeds, 1, 64)
    args.integer("sequences", sequences, 1, 64)
    base = ArchSpec(depth=depth, d_model=d_model, heads=heads, seq_len=T, beta=beta,
                    alpha_attn=alpha_attn, alpha_mlp=alpha_mlp, activation="tanh",
                    sigma_v2=var_v, sigma_w2=1.0, sigma_b2=var_b)
    kw = dict(var_v=var_v, var_b=var_b, alpha_attn=alpha_attn, alpha_mlp=alpha_mlp)
    s_closed = critical(lambda g: tanh_slope_closed_form(g, **kw))
    s_lib = critical(lambda g: library_slope(g, base))
    args.need("sigma_w2s", bool(np.any(sws < s_closed)) and bool(np.any(sws > s_closed)),
              f"values on both sides of the critical sigma_w^2 = {s_closed:.3g} "
              f"(got {sigma_w2s!r})")
    data = fig5_data(base, sws, s_closed, seed=seed, seeds=seeds, sequences=sequences,
                     rho0=rho0, kw=kw)
    checks = fig5_checks(data, s_lib, d_model=d_model, T=T, seeds=seeds, sequences=sequences)
    return Experiment(frame(data["recs"]), data["table"], checks, plot_fig5, data)
