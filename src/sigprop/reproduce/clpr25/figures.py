"""clpr25 Sec. 3, the figures on almost-simplex tokens: ``clpr25.fig1`` (the angle ratio
theta'/theta against gamma, Fig. 1) and ``clpr25.fig2`` (the attention-only Jacobian's
normalised norm against gamma, Fig. 2 / Thm 2.4). Each item is a data function, a checks
function and a plot function composed by the registered item."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...theory import scaling as sc
from .. import args
from ..core import Check, Experiment, frame, mean_se, register
from ..plots import axes_row, decorate
from .common import (
    COLOURS,
    angle_ratios,
    crossing,
    gamma_grid,
    ratio_limit,
    ratio_theory,
    rho_arg,
    sd_cos,
    seq,
    sizes,
    width,
)

__all__ = ["fig1", "fig1_data", "fig1_checks", "plot_fig1", "fig2", "fig2_data", "fig2_checks",
           "plot_fig2"]


# --------------------------------------------------------------------------------------------
# Fig. 1


def fig1_data(ns: list[int], ds: list[int], rho: float, n_seeds: int, rows: int, n_gamma: int,
              seed: int) -> dict:
    """Measured (almost-simplex, ``n_seeds`` draws) and exact simplex angle ratios on the gamma
    grid for every (n, d), their n -> infinity limit, and one table row per (n, d) (the
    crossing of 1/2, the 0.2-0.8 width, the value at gamma_c, the largest deviation)."""
    gc = float(sc.gamma_c(rho))
    gam = gamma_grid(n_gamma) * gc
    recs, rows_t = [], []
    for n in ns:
        th = ratio_theory(n, gam, rho)
        recs += [dict(observable="angle_ratio", source="theory", value=v, n=n, d=np.nan,
                      gamma=g, gamma_over_c=g / gc) for g, v in zip(gam, th, strict=True)]
        for d in ds:
            runs = np.stack([angle_ratios(sc.almost_simplex(n, d, rho, seed=seq(seed, n, d, s)),
                                          gam, rows) for s in range(n_seeds)])
            m, se = mean_se(runs, 0)
            recs += [dict(observable="angle_ratio", source="measured", value=v, stderr=e, n=n,
                          d=d, gamma=g, gamma_over_c=g / gc)
                     for g, v, e in zip(gam, m, se, strict=True)]
            rows_t.append(dict(n=n, d=d, gamma_half_over_c=crossing(gam, m, 0.5) / gc,
                               width_over_c=width(gam, m, 0.2, 0.8) / gc,
                               ratio_at_gamma_c=float(np.interp(gc, gam, m)),
                               max_dev_theory=float(np.max(np.abs(m - th)))))
    lim = ratio_limit(gam, rho)
    recs += [dict(observable="angle_ratio", source="theory_asymptotic", value=v, n=np.inf,
                  d=np.nan, gamma=g, gamma_over_c=g / gc) for g, v in zip(gam, lim, strict=True)]
    return dict(recs=recs, table=pd.DataFrame(rows_t), ns=ns, ds=ds, rho=rho, gc=gc,
                n_seeds=n_seeds, rows=rows)


def fig1_checks(r: dict) -> list[Check]:
    """Fig. 1's transition: where it sits, that it moves to gamma_c and sharpens as n grows,
    the value at gamma_c (Eq. 2.5) and the smoothing at small d, on :func:`fig1_data`'s
    result."""
    table, ns, ds, rho, gc = r["table"], r["ns"], r["ds"], r["rho"], r["gc"]
    r_c = float(ratio_limit(gc, rho))                # n -> infinity value at gamma_c
    fine = np.linspace(0.02, 2.0, 1000) * gc
    nL, dL = ns[-1], ds[-1]
    big = table[(table.n == nL) & (table.d == dL)].iloc[0]
    half_th = {n: crossing(fine, ratio_theory(n, fine, rho), 0.5) / gc for n in ns}
    half_inf = crossing(fine, ratio_theory(1e12, fine, rho), 0.5) / gc
    sd = sd_cos(dL, rho) / math.acos(rho)
    halves = [float(table[(table.n == n) & (table.d == dL)].gamma_half_over_c.iloc[0])
              for n in ns]
    w_small = float(table[(table.n == nL) & (table.d == ds[0])].width_over_c.iloc[0])
    widths = [float(table[(table.n == n) & (table.d == dL)].width_over_c.iloc[0]) for n in ns]
    return [
        Check.within(f"Fig. 1: the transition (theta'/theta = 1/2) at n = {nL}, d = {dL} sits "
                     f"where the exact simplex layer puts it, gamma/gamma_c = "
                     f"{half_th[nL]:.3f}", big.gamma_half_over_c, half_th[nL] - 0.03,
                     half_th[nL] + 0.03,
                     why=f"almost-simplex angles fluctuate by sd {sd:.3f} (in theta'/theta) at "
                         f"d = {dL}; over the curve's slope (~0.9 per gamma_c) that moves the "
                         "crossing by < 0.03"),
        Check.that(f"Thm 2.1 / Fig. 1: the transition moves to gamma_c as n grows "
                   f"(gamma_1/2 / gamma_c increasing in n, exact simplex at n = 1e12: "
                   f"{half_inf:.3f})", all(np.diff(halves) > 0) and halves[-1] < 1.0
                   and abs(half_inf - 1.0) < 0.05, halves[-1],
                   "increasing in n, below 1; n = 1e12 within 0.05 of 1",
                   why="finite-n shift of the crossing is -log(1/a_1/2 - 1)/log n (a the "
                       "diagonal weight), i.e. O(1/log n): 0.016 at n = 1e12"),
        Check.within(f"Eq. 2.5: at gamma = gamma_c the ratio tends to "
                     f"arccos(4 rho/(1 + 3 rho))/arccos(rho) = {r_c:.3f}", big.ratio_at_gamma_c,
                     r_c - 0.03, r_c + 0.03,
                     why=f"finite n = {nL}: a = n/(2n - 1) exactly (O(1/n)); finite d = {dL}: "
                         f"angle fluctuation {sd:.3f}; interpolation on the gamma grid"),
        Check.that(f"Sec. 3: the transition sharpens as n grows (0.2-0.8 width in gamma/gamma_c "
                   f"at d = {dL}: {', '.join(f'{w:.2f}' for w in widths)})",
                   all(np.diff(widths) < 0), widths[-1], "decreasing in n",
                   why="the width of the diagonal weight's switch is 2 ln 9 / ((1-rho) log n) "
                       "in gamma"),
        Check.that(f"Sec. 3: small d smooths the transition (width at d = {ds[0]}: "
                   f"{w_small:.2f} vs {widths[-1]:.2f} at d = {dL}, n = {nL})",
                   w_small > 1.3 * widths[-1], w_small / widths[-1], "> 1.3x the large-d width",
                   why="at small d pairwise cosines spread by ~1/sqrt(d), so pairs switch at "
                       "different gamma"),
    ]


def plot_fig1(r: dict, ax=None):
    """One panel per d: exact simplex lines and measured points per n, the n -> infinity step,
    gamma_c marked; returns the Figure."""
    ns, ds, gc = r["ns"], r["ds"], r["gc"]
    df = frame(r["recs"])
    fig, axes = axes_row(ax, len(ds), (3.3 * len(ds), 3.4), sharey=True)
    for a, d in zip(axes, ds, strict=True):
        for k, n in enumerate(ns):
            c = COLOURS[k % len(COLOURS)]
            th = df[(df.source == "theory") & (df.n == n)]
            if "d" in th and th.d.notna().any():
                th = th[th.d == d]
            a.plot(th.gamma, th.value, "-", color=c, lw=1.2)
            m = df[(df.source == "measured") & (df.n == n) & (df.d == d)]
            a.errorbar(m.gamma, m.value, yerr=m.stderr, fmt="o", ms=3, color=c, capsize=1.5,
                       label=f"n = {n}")
        lim = df[df.source == "theory_asymptotic"]
        a.step(lim.gamma, lim.value, "k--", lw=1, where="mid", label="n → ∞")
        a.axvline(gc, color="grey", ls=":", lw=1)
        a.text(gc, 0.02, " γ_c", color="grey", fontsize=8)
        decorate(a, "γ  (β = γ log n)", None, f"clpr25 Fig. 1, d = {d}", legend=None)
    decorate(axes[0], None, "angle ratio θ'/θ", loc="upper left")
    return fig


@register("clpr25.fig1", tiny=dict(ns=(32, 128), ds=(16, 256), n_seeds=2, rows=32, n_gamma=20),
          quick=dict(ns=(64, 256, 1024), ds=(16, 128, 1024), n_seeds=2, rows=64, n_gamma=20),
          full=dict(ns=(256, 1024, 4096), ds=(16, 128, 1024, 4096), n_seeds=8, rows=128,
                    n_gamma=40),
          runtime={"tiny": 0.5, "quick": 3.0, "default": 3.0})
def fig1(*, seed: int = 0, device: str = "cpu", ns: Sequence[int] = (64, 256, 1024),
         ds: Sequence[int] = (16, 128, 1024), rho: float = 0.5, n_seeds: int = 3,
         rows: int = 64, n_gamma: int = 20) -> Experiment:
    ns, ds = sizes("ns", ns, 8, 2), sizes("ds", ds, 2, 2)
    rho = rho_arg(rho)
    n_seeds = args.integer("n_seeds", n_seeds, 2)
    rows = args.integer("rows", rows, 4)
    n_gamma = args.integer("n_gamma", n_gamma, 5)
    r = fig1_data(ns, ds, rho, n_seeds, rows, n_gamma, seed)
    return Experiment(frame(r["recs"]), r["table"], fig1_checks(r), plot_fig1, r)


# --------------------------------------------------------------------------------------------
# Fig. 2


def fig2_data(ns: list[int], ds: list[int], rho: float, n_gamma: int, seed: int) -> dict:
    """The exact Jacobian norm of one almost-simplex input per (n, d) on the gamma grid, the
    simplex closed form (at width d when d >= n + 1, else d = infinity), the n -> infinity
    step, and one table row per (n, d) (values at gamma_c/2, gamma_c, 2 gamma_c, width)."""
    gc = float(sc.gamma_c(rho))
    gam = gamma_grid(n_gamma) * gc
    recs, rows_t = [], []
    for n in ns:
        for d in ds:
            X = sc.almost_simplex(n, d, rho, seed=seq(seed, n, d))
            m = np.array([sc.jacobian_norm(X, g) for g in gam])
            # simplex closed form: exact at width d >= n + 1, the wide limit d = inf otherwise
            dd = d if d >= n + 1 else np.inf
            th = sc.jacobian_norm_simplex(n, gam, rho, d=dd)
            recs += [dict(observable="jacobian_norm", source="theory", value=v, n=n, d=d,
                          gamma=g, gamma_over_c=g / gc, theory_width=dd)
                     for g, v in zip(gam, th, strict=True)]
            recs += [dict(observable="jacobian_norm", source="measured", value=v, n=n, d=d,
                          gamma=g, gamma_over_c=g / gc) for g, v in zip(gam, m, strict=True)]
            at = {f: float(np.interp(f * gc, gam, m)) for f in (0.5, 1.0, 2.0)}
            th_at = {f: float(np.interp(f * gc, gam, th)) for f in (0.5, 1.0, 2.0)}
            rows_t.append(dict(n=n, d=d, J_sub=at[0.5], J_crit=at[1.0], J_super=at[2.0],
                               J_sub_theory=th_at[0.5], J_crit_theory=th_at[1.0],
                               J_super_theory=th_at[2.0],
                               width_over_c=width(gam, m, 0.2, 0.8) / gc))
    lim = np.where(gam < gc, 0.0, np.where(np.isclose(gam, gc), 0.25, 1.0))
    recs += [dict(observable="jacobian_norm", source="theory_asymptotic", value=v, n=np.inf,
                  d=np.nan, gamma=g, gamma_over_c=g / gc) for g, v in zip(gam, lim, strict=True)]
    return dict(recs=recs, table=pd.DataFrame(rows_t), ns=ns, ds=ds, rho=rho, gc=gc)


def fig2_checks(r: dict) -> list[Check]:
    """Thms 2.3/2.4 and Fig. 2 on :func:`fig2_data`'s result: the closed form followed at large
    d, the subcritical norm vanishing, the supercritical one at the normalisation map's, the
    critical 1/4, and the smoothing at small d."""
    table, ns, ds, rho = r["table"], r["ns"], r["ds"], r["rho"]
    nL, dL = ns[-1], ds[-1]
    big = table[(table.n == nL) & (table.d == dL)].iloc[0]
    dev = max(abs(big.J_sub - big.J_sub_theory), abs(big.J_crit - big.J_crit_theory),
              abs(big.J_super - big.J_super_theory))
    subs = [float(table[(table.n == n) & (table.d == dL)].J_sub.iloc[0]) for n in ns]
    w_small = float(table[(table.n == nL) & (table.d == ds[0])].width_over_c.iloc[0])
    w_big = float(big.width_over_c)
    norm_map = 1.0 - 1.0 / dL
    return [
        Check.within(f"Thm 2.3/2.4: at d = {dL} >= n the almost-simplex Jacobian follows the "
                     "simplex closed form at gamma_c/2, gamma_c, 2 gamma_c (max abs deviation)",
                     dev, 0.0, 0.05,
                     why=f"almost-simplex inputs at d = {dL}: cosines fluctuate by "
                         f"{sd_cos(dL, rho):.3f}, a few % of J"),
        Check.that(f"Thm 2.4 (Eq. 2.20): below gamma_c the norm vanishes as n grows "
                   f"(J(gamma_c/2) at d = {dL}: {', '.join(f'{v:.4f}' for v in subs)})",
                   all(np.diff(subs) < 0) and subs[-1] < 0.05, subs[-1],
                   "decreasing in n and < 0.05",
                   why="simplex theory: J ~ a^2 + 1/n with a ~ n^{-1/2}, i.e. ~2/n"),
        Check.within(f"Thm 2.4 (Eqs. 2.21-2.22): at 2 gamma_c attention acts as the "
                     f"normalisation map, J -> (1 - 1/d) = {norm_map:.4f}", big.J_super,
                     min(norm_map, big.J_super_theory) - 0.05, norm_map + 0.02,
                     why=f"finite n = {nL}: 1 - a ~ 1/n lowers J (simplex value "
                         f"{big.J_super_theory:.3f}); angle fluctuations at finite d"),
        Check.within("critical value: J(gamma_c) -> 1/4 as n -> infinity (sigprop's closed "
                     "form; the paper's Eq. 2.18 was lost in the text)", big.J_crit, 0.2, 0.32,
                     why=f"finite n = {nL} (+O(1/n)) and finite d = {dL} (fluctuations)"),
        Check.that(f"Fig. 2: small d smooths the transition (0.2-0.8 width in gamma/gamma_c "
                   f"{w_small:.2f} at d = {ds[0]} vs {w_big:.2f} at d = {dL})",
                   w_small > 1.2 * w_big, w_small / w_big, "> 1.2x the large-d width",
                   why="at small d pairwise cosines spread by ~1/sqrt(d)"),
    ]


def plot_fig2(r: dict, ax=None):
    """One panel per d: simplex closed form and measured norm per n, gamma_c and 1 - 1/d
    marked; returns the Figure."""
    ns, ds, gc = r["ns"], r["ds"], r["gc"]
    fig, axes = axes_row(ax, len(ds), (3.3 * len(ds), 3.4), sharey=True)
    df = frame(r["recs"])
    for a, d in zip(axes, ds, strict=True):
        for k, n in enumerate(ns):
            c = COLOURS[k % len(COLOURS)]
            th = df[(df.source == "theory") & (df.n == n) & (df.d == d)]
            a.plot(th.gamma, th.value, "-", color=c, lw=1.2,
                   label=f"simplex, n = {n}" + (" (d = ∞)" if d < n + 1 else ""))
            mm = df[(df.source == "measured") & (df.n == n) & (df.d == d)]
            a.plot(mm.gamma, mm.value, "o", ms=3, color=c, label=f"measured, n = {n}")
        a.axvline(gc, color="grey", ls=":", lw=1)
        a.axhline(1 - 1 / d, color="k", ls="--", lw=0.8)
        decorate(a, "γ  (β = γ log n)", None, f"clpr25 Fig. 2, d = {d}", legend=None)
    decorate(axes[0], None, "‖J‖²_F / (nd)", legend=6, loc="upper left")
    return fig


@register("clpr25.fig2", tiny=dict(ns=(32, 64), ds=(16, 128), n_gamma=20),
          quick=dict(ns=(64, 256), ds=(16, 128, 1024), n_gamma=20),
          full=dict(ns=(256, 1024), ds=(16, 128, 1024, 4096), n_gamma=40),
          runtime={"tiny": 0.3, "quick": 2.0, "default": 2.0})
def fig2(*, seed: int = 0, device: str = "cpu", ns: Sequence[int] = (64, 256),
         ds: Sequence[int] = (16, 128, 1024), rho: float = 0.5, n_gamma: int = 20) -> Experiment:
    ns, ds = sizes("ns", ns, 8, 2), sizes("ds", ds, 2, 2)
    rho = rho_arg(rho)
    n_gamma = args.integer("n_gamma", n_gamma, 5)
    r = fig2_data(ns, ds, rho, n_gamma, seed)
    return Experiment(frame(r["recs"]), r["table"], fig2_checks(r), plot_fig2, r)
