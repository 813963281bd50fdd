"""gg25 Appendix C: attention spectra under the standard and the REM score scaling
(``gg25.figC1``, the circular law of Bordenave et al.) and the update map of a block without
skip connections (``gg25.figC3``), measured on single heads (:func:`~.common.head_sweep`) and
on sigprop's model against :mod:`sigprop.theory.spectral` and :mod:`sigprop.theory.depth`."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...spec import ArchSpec
from ...theory import depth as tdepth
from ...theory import rem, spectral
from .. import args
from ..core import Check, Experiment, frame, one_thread, register, slope
from ..plots import axes_row, decorate
from .common import GG25_VARS, SQRT2, at, head_sweep

__all__ = ["figC1", "figC1_data", "figC1_checks", "plot_figC1", "figC3", "figC3_data",
           "figC3_checks", "plot_figC3"]


# ============================================================================================
# Fig. C.1: attention spectra


def figC1_data(*, seed: int, Ts: list[int], sigma_standard: float, beta: float, d_head: int,
               seeds: int) -> dict:
    """Eigenvalues of one head per length under both scalings: the bulk radius (95% quantile
    of |lambda| over sqrt(0.95)) against the circular law, and the last length's spectra."""
    recs, rows, eig_last = [], [], None
    for T in Ts:
        ls = math.sqrt(math.log(T))
        sw = head_sweep([sigma_standard / ls, beta], [0.0], T, d_head, None, seeds,
                        seed=seed + T, keep_eigs=True)
        eig = sw["eigs"][:, 0]                      # (2, seeds, T)
        sig = np.array([sigma_standard, beta * ls])
        th = spectral.softmax_sigma_A(sig) / math.sqrt(T)
        for k, name in enumerate(("standard", "rem")):
            mods = np.sort(np.abs(eig[k]), axis=-1)[:, :-1]    # drop the Perron eigenvalue 1
            radius = float(np.mean(np.quantile(mods, 0.95, axis=-1)) / math.sqrt(0.95))
            rows.append(dict(scaling=name, T=T, radius=radius, radius_theory=th[k],
                             sigma_s=sig[k]))
            recs.append(dict(observable="bulk_radius", source="measured", value=radius,
                             scaling=name, T=T))
            recs.append(dict(observable="bulk_radius", source="theory", value=th[k],
                             scaling=name, T=T))
        eig_last = eig
    for k, name in enumerate(("standard", "rem")):
        for lam in eig_last[k, 0]:
            recs.append(dict(observable="eigenvalue_re", source="measured", value=lam.real,
                             scaling=name, T=Ts[-1], im=lam.imag))
    return dict(recs=recs, table=pd.DataFrame(rows), eig_last=eig_last, Ts=Ts,
                sigma_standard=sigma_standard, beta=beta, d_head=d_head, seeds=seeds)


def figC1_checks(data: dict) -> list[Check]:
    """T^-1/2 under the standard scaling, slower under the REM one, the circular-law radius."""
    df, Ts = data["table"], data["Ts"]
    st, rm = df[df.scaling == "standard"], df[df.scaling == "rem"]
    s_st, s_rm = slope(st["T"], st["radius"]), slope(rm["T"], rm["radius"])
    s_rm_th = slope(rm["T"], rm["radius_theory"])
    ratio = (df["radius"] / df["radius_theory"]).to_numpy()
    return [
        Check.within("gg25 C.1 (Bordenave et al.): under the standard scaling the bulk radius "
                     "falls like T^-1/2 (log-log slope)", s_st, -0.58, -0.42,
                     why=f"{len(Ts)} lengths, {data['seeds']} seed(s): the radius is read as "
                         "the 95% quantile of |lambda| over the circular law's sqrt(0.95) R"),
        Check.that("gg25 C.1: under the REM scaling it falls more slowly than T^-1/2 (slope "
                   "above the standard one by > 0.1)", s_rm > s_st + 0.1, s_rm,
                   f"> {s_st + 0.1:.3f}",
                   why=f"circular law with sigma_A^2 = T^(beta^2) - 1 predicts "
                       f"{s_rm_th:.3f} over these T"),
        Check.within("circular-law radius sigma_A / sqrt(T) (sigma_A = sqrt(e^(sigma_s^2) - 1), "
                     "docs/theory.md §5) against the measured bulk, worst ratio over T and "
                     "scalings", float(ratio[np.argmax(np.abs(ratio - 1))]), 0.85, 1.1,
                     why=f"finite T edge effects and d_H = {data['d_head']} (scores not "
                         "exactly Gaussian); measured 0.93-0.96"),
    ]


def plot_figC1(data: dict, ax=None):
    """The two spectra at the largest T with their radii, and the radius over T."""
    fig, axes = axes_row(ax, 3, (11.0, 3.7))
    df, eig_last = data["table"], data["eig_last"]
    st, rm = df[df.scaling == "standard"], df[df.scaling == "rem"]
    t = np.linspace(0, 2 * np.pi, 200)
    T = data["Ts"][-1]
    for a, k, name in ((axes[0], 0, f"standard, σ_s = {data['sigma_standard']:g}"),
                       (axes[1], 1, f"REM, β = {data['beta']:g}")):
        lam = eig_last[k, 0]
        R = df[(df["T"] == T)].iloc[k]["radius_theory"]
        a.plot(lam.real, lam.imag, ".", ms=2, color=f"C{k}")
        a.plot(R * np.cos(t), R * np.sin(t), "k--", lw=1.0, label="σ_A/√T")
        a.set_aspect("equal")
        lim = 1.6 * max(R, float(np.sort(np.abs(lam))[-2]))
        a.set_xlim(-lim, lim)
        a.set_ylim(-lim, lim)
        decorate(a, "Re λ", "Im λ", f"gg25 Fig. C.1: {name}, T = {T}")
    a = axes[2]
    for k, (name, d) in enumerate((("standard", st), ("REM", rm))):
        a.plot(d["T"], d["radius_theory"], "-", color=f"C{k}", label=f"{name}: σ_A/√T")
        a.plot(d["T"], d["radius"], "o", color=f"C{k}", label=f"{name}: measured")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    decorate(a, "T", "bulk radius", "bulk radius over T")
    return fig


@register("gg25.figC1", tiny=dict(Ts=(64, 128), seeds=1),
          quick=dict(Ts=(128, 256, 512, 1024), seeds=1),
          runtime={"tiny": 0.1, "quick": 2.4, "default": 2.4})
def figC1(*, seed: int = 0, device: str = "cpu", Ts=(128, 256, 512, 1024),
          sigma_standard: float = 1.0, beta: float = 0.5, d_head: int = 256,
          seeds: int = 1) -> Experiment:
    Ts = args.integers("Ts", Ts, 16, 4096, increasing=True, n_min=2)
    args.real("sigma_standard", sigma_standard, 0.01, 3.0)
    args.real("beta", beta, 0.01, 1.0)
    args.integer("d_head", d_head, 4, 4096)
    args.integer("seeds", seeds, 1, 16)
    data = figC1_data(seed=seed, Ts=Ts, sigma_standard=sigma_standard, beta=beta,
                      d_head=d_head, seeds=seeds)
    return Experiment(frame(data["recs"]), data["table"], figC1_checks(data), plot_figC1, data)


# ============================================================================================
# Fig. C.3: a block without skip connections


def _one_block_points(one: ArchSpec, betas, rhos_in, *, seeds: int, seed: int) -> tuple:
    """One block measured at every (beta, rho_in) against the finite-T map: the points and
    their records."""
    import torch

    from ...measurement.engine import measure

    pts, recs = [], []
    for b in betas:
        for r in rhos_in:
            m = measure(one.replace(beta=float(b)), seeds=seeds, sequences=1, input="rho",
                        rho0=float(r), seed=seed, stable_rank=False, dtype=torch.float32)
            r0 = float(np.clip(m.rho0, 0.0, 1.0))
            mv = at(m.trajectory, "cos")[-1]
            tv = float(tdepth.final_cos(one.replace(beta=float(b)), rho0=r0))
            pts.append(dict(beta=float(b), rho_in=r0, measured=mv[1], theory=tv))
            recs.append(dict(observable="block_map", source="measured", value=mv[1],
                             stderr=mv[2], beta=float(b), rho_in=r0))
    return pd.DataFrame(pts), recs


def _depth_curves(base: ArchSpec, betas, *, seeds: int, seed: int) -> tuple:
    """The stack from orthogonal tokens at every beta: measured, finite-T and T -> inf
    cosine over depth, one summary row per beta and the records."""
    import torch

    from ...measurement.engine import measure

    rows, curves, recs = [], [], []
    for b in betas:
        sp = base.replace(beta=float(b))
        m = measure(sp, seeds=seeds, sequences=1, input="rho", rho0=0.0, seed=seed,
                    stable_rank=False, dtype=torch.float32)
        r0 = float(np.clip(m.rho0, 0.0, 1.0))
        th, ta = tdepth.propagate(sp, rho0=r0), tdepth.propagate(sp, rho0=r0, asymptotic=True)
        mc, tc, ac = at(m.trajectory, "cos"), at(th, "cos"), at(ta, "cos")
        for src, arr in (("measured", mc), ("theory", tc), ("theory_asymptotic", ac)):
            for lay, v, e in arr:
                recs.append(dict(observable="cos", source=src, value=v, stderr=e,
                                 layer=int(lay), beta=float(b)))
        rows.append(dict(beta=float(b), rho_L_measured=mc[-1, 1], rho_L_theory=tc[-1, 1],
                         max_abs_gap=float(np.max(np.abs(mc[:, 1] - tc[:, 1])))))
        curves.append((b, mc, tc, ac))
    return pd.DataFrame(rows), curves, recs


def figC3_data(*, seed: int, betas: np.ndarray, rhos_in: np.ndarray, depth: int, T: int,
               d_model: int, heads: int, seeds: int) -> dict:
    """The one-block map over (beta, rho_in) (finite T and T -> inf), measured one-block
    points, and the stack over depth at every beta."""
    base = ArchSpec(depth=depth, d_model=d_model, heads=heads, seq_len=T, beta=1.0,
                    alpha_attn=0.0, alpha_mlp=0.0, **GG25_VARS)
    one = base.replace(depth=1)
    grid_b = np.linspace(0.0, 5.0, 101)
    grid_r = np.linspace(0.0, 0.98, 50)
    fmap = tdepth.final_cos(one, beta=grid_b[:, None], rho0=grid_r[None, :])
    amap = tdepth.final_cos(one, beta=grid_b[:, None], rho0=grid_r[None, :], asymptotic=True)
    recs = [dict(observable="block_map", source=src, value=z[i, j], beta=b, rho_in=r)
            for src, z in (("theory", fmap), ("theory_asymptotic", amap))
            for i, b in enumerate(grid_b) for j, r in enumerate(grid_r)]
    pts, r1 = _one_block_points(one, betas, rhos_in, seeds=seeds, seed=seed)
    df, curves, r2 = _depth_curves(base, betas, seeds=seeds, seed=seed)
    return dict(recs=recs + r1 + r2, pts=pts, table=df, curves=curves, grid_b=grid_b,
                grid_r=grid_r, fmap=fmap, amap=amap, depth=depth, T=T, d_model=d_model,
                seeds=seeds, rhos_in=tuple(rhos_in))


def figC3_checks(data: dict) -> list[Check]:
    """One block on the theory, the T -> inf map's 1 below / < 1 above beta_c, depth curves
    on the theory, and C.3's 'signal propagates' (a :meth:`Check.differs`)."""
    pts, df, amap, depth = data["pts"], data["table"], data["amap"], data["depth"]
    grid_b, grid_r = data["grid_b"], data["grid_r"]
    size = f"d = {data['d_model']}, T = {data['T']}, {data['seeds']} seeds"
    bcg = np.asarray(rem.beta_c(grid_r))[None, :]
    below = grid_b[:, None] <= bcg
    above = grid_b[:, None] > 1.1 * bcg
    hi = df[df.beta > SQRT2]
    return [
        Check.within("gg25 Fig. C.3: one block, measured rho_out on sigprop's finite-T map "
                     "(max over beta and rho_in)", float(np.max(np.abs(pts.measured
                                                                       - pts.theory))),
                     0.0, 0.08,
                     why=f"{size}: condensed rows make single tokens' norms fluctuate"),
        Check.that("gg25 C.3 / Eq. 14: in the T -> inf map one block gives rho_out = 1 at "
                   "every beta <= beta_c(rho_in) (the MLP cannot undo rank collapse) and "
                   "rho_out < 1 above 1.1 beta_c(rho_in)",
                   bool(np.all(amap[below] > 1 - 1e-9) and np.all(amap[above] < 1 - 1e-6)),
                   float(np.max(amap[above])), "1 below, < 1 above",
                   why="exact limit map; the 10% margin keeps the grid off the boundary"),
        Check.within("gg25 C.3 over depth, theory vs measured (max over layers and beta)",
                     float(df.max_abs_gap.max()), 0.0, 0.08, why=size),
        Check.differs("gg25 C.3: 'signal propagation becomes possible in the high-beta "
                      f"regime': smallest measured cosine after {depth} blocks above beta_c",
                      float(hi.rho_L_measured.min()), 0.95, 1.0,
                      paper="C.3 says the signal propagates above beta_c without skips; "
                            "block by block it does (rho_out < 1), but the cosine still "
                            "climbs to 1 within a few ReLU blocks at every beta (measured "
                            f"{hi.rho_L_measured.min():.3f} after {depth} blocks)",
                      why="Eq. 14 never lowers the cosine and the ReLU kernel raises it, so "
                          "rho_l increases to 1; band for finite d and T"),
    ]


def plot_figC3(data: dict, ax=None):
    """Left the one-block map with the measured points, right the depth curves."""
    fig, (ax0, ax1) = axes_row(ax, 2, (10.0, 3.8))
    grid_b, grid_r, pts = data["grid_b"], data["grid_r"], data["pts"]
    im = ax0.pcolormesh(grid_b, grid_r, data["fmap"].T, vmin=0, vmax=1, cmap="viridis",
                        shading="nearest")
    rr = np.linspace(0, 0.98, 100)
    ax0.plot(np.sqrt(2 / (1 - rr)), rr, "w--", lw=1.2, label="β_c(ρ)")
    ax0.scatter(pts.beta, pts.rho_in, c=pts.measured, vmin=0, vmax=1, cmap="viridis",
                edgecolors="w", s=40, label="measured")
    ax0.set_xlim(grid_b[0], grid_b[-1])
    decorate(ax0, "β", "ρ_in", "gg25 Fig. C.3: one block, no skips, ρ_out (finite T)",
             loc="lower right")
    fig.colorbar(im, ax=ax0, label="ρ_out")
    for k, (b, mc, tc, ac) in enumerate(data["curves"]):
        c = f"C{k}"
        ax1.plot(tc[:, 0], tc[:, 1], "-", color=c, lw=1.4, label=f"β = {b:g}")
        ax1.plot(ac[:, 0], ac[:, 1], ":", color=c, lw=1.0)
        ax1.errorbar(mc[:, 0], mc[:, 1], yerr=np.nan_to_num(mc[:, 2]), fmt="o", ms=3, color=c)
    ax1.set_ylim(-0.02, 1.02)
    decorate(ax1, "layer", "mean cosine similarity",
             "iterated from orthogonal tokens: lines theory (dotted T → ∞), dots "
             "measured", size=8)
    return fig


@register("gg25.figC3",
          tiny=dict(depth=6, T=32, d_model=128, seeds=2, betas=(0.5, 3.0), rhos_in=(0.0, 0.5)),
          quick=dict(depth=20, T=64, d_model=128, seeds=3),
          runtime={"tiny": 0.8, "quick": 1.0, "default": 1.0})
@one_thread
def figC3(*, seed: int = 0, device: str = "cpu", betas=(0.5, 1.0, 2.5, 4.0),
          rhos_in=(0.0, 0.3, 0.6), depth: int = 20, T: int = 64, d_model: int = 128,
          heads: int = 1, seeds: int = 3) -> Experiment:
    betas = args.reals("betas", betas, 0.0, 50.0)
    rhos_in = args.reals("rhos_in", rhos_in, 0.0, 0.95)
    args.need("betas", bool(np.any(betas < SQRT2)) and bool(np.any(betas > SQRT2)),
              f"values on both sides of sqrt 2 (got {betas!r})")
    args.integer("depth", depth, 1, 500)
    args.integer("T", T, 4, 2048)
    args.integer("d_model", d_model, 8, 4096)
    args.integer("seeds", seeds, 1, 64)
    data = figC3_data(seed=seed, betas=betas, rhos_in=rhos_in, depth=depth, T=T,
                      d_model=d_model, heads=heads, seeds=seeds)
    table = pd.concat([data["pts"].assign(kind="one block"),
                       data["table"].assign(kind="depth")], ignore_index=True)
    return Experiment(frame(data["recs"]), table, figC3_checks(data), plot_figC3, data)
