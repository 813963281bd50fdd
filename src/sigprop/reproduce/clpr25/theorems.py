"""clpr25 Sec. 2 on exact simplex inputs (Assumption 1) against n: ``clpr25.thm21`` (the output
cosine's three phases, with and without residual: Thm 2.1, Eqs. 2.4-2.5) and ``clpr25.thm23``
(the attention-only Jacobian's norm: Thm 2.3). Lines are sigprop's exact finite-n solution up
to n = 1e12, dots the layer evaluated on simplex points. Each item is a data function, a checks
function and a plot function composed by the registered item."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...theory import scaling as sc
from .. import args
from ..core import Check, Experiment, frame, register, slope
from ..plots import axes_row, decorate
from .common import COLOURS, rho_arg, seq, sizes

__all__ = ["PHASES", "thm21", "thm21_data", "thm21_checks", "plot_thm21", "thm23",
           "thm23_data", "thm23_checks", "plot_thm23"]

#: gamma / gamma_c of the three phases and their names.
PHASES = {0.5: "subcritical", 1.0: "critical", 2.0: "supercritical"}


# --------------------------------------------------------------------------------------------
# Theorem 2.1 (Eqs. 2.4-2.5)


def _thm21_measured(ns_sim, f, g, rho, al, seed):
    """The layer's output cosines on exact simplex points at gamma = ``g`` (``f`` gamma_c): one
    record per n and the largest deviation from the closed form."""
    recs, dev = [], 0.0
    for n in ns_sim:
        Xs = sc.simplex_points(n, n + 1, rho, seed=seq(seed, n))
        Z = sc.attention_forward(Xs, g, al)
        Zn = Z / np.linalg.norm(Z, axis=1, keepdims=True)
        C = (Zn @ Zn.T)[~np.eye(n, dtype=bool)]
        dev = max(dev, float(np.abs(C - sc.simplex_cos(n, g, rho, al)).max()))
        recs.append(dict(observable="cos", source="measured", value=float(C.mean()),
                         stderr=float(C.std()), n=n, alpha=al, gamma_over_c=f))
    return recs, dev


def thm21_data(ns_sim: list[int], rho: float, alpha: float, seed: int) -> dict:
    """For alpha in (0, ``alpha``) and the three phases: the exact finite-n cosine up to
    n = 1e12 and its limit, the simulated layer at ``ns_sim``, and one table row per case
    (error at 1e12 against its rate bound, fitted convergence rate)."""
    gc = float(sc.gamma_c(rho))
    n_th = np.logspace(1, 12, 45)
    recs, rows_t = [], []
    sim_dev, far_ok, rates = 0.0, [], []
    for al in (0.0, float(alpha)):
        for f in PHASES:
            g = f * gc
            th = sc.simplex_cos(n_th, g, rho, al)
            lim = float(sc.simplex_limit(g, rho, al))
            recs += [dict(observable="cos", source="theory", value=v, n=n, alpha=al,
                          gamma_over_c=f) for n, v in zip(n_th, th, strict=True)]
            recs.append(dict(observable="cos", source="theory_asymptotic", value=lim,
                             n=np.inf, alpha=al, gamma_over_c=f))
            meas, dev = _thm21_measured(ns_sim, f, g, rho, al, seed)
            recs += meas
            sim_dev = max(sim_dev, dev)
            err = float(abs(th[-1] - lim))
            x = f  # gamma (1 - rho) = gamma / gamma_c
            bound = 10.0 / n_th[-1] if f == 1.0 else n_th[-1] ** -abs(1 - x)
            far_ok.append(err <= bound)
            big = n_th >= 1e4
            e = np.abs(th[big] - lim)
            rate = slope(n_th[big][e > 0], e[e > 0])
            rates.append((al, f, rate))
            rows_t.append(dict(alpha=al, gamma_over_c=f, regime=PHASES[f], limit=lim,
                               cos_at_1e12=float(th[-1]), err_at_1e12=err, bound=bound,
                               rate=rate, stated_rate=-(abs(1 - x) if f != 1.0 else 1.0)))
    return dict(recs=recs, table=pd.DataFrame(rows_t), ns_sim=ns_sim, rho=rho, alpha=alpha,
                sim_dev=sim_dev, far_ok=far_ok, rates=rates)


def thm21_checks(r: dict) -> list[Check]:
    """Thm 2.1 on :func:`thm21_data`'s result: the closed form exact at finite n, Eq. 2.5's
    limits, the rate bound and fitted rate, and Eq. 2.4's limits with the residual."""
    table, rho, alpha, rates = r["table"], r["rho"], r["alpha"], r["rates"]
    fs = tuple(PHASES)
    eq25 = {0.5: 1.0, 1.0: 4 * rho / (1 + 3 * rho), 2.0: rho}   # the paper's Eq. 2.5
    lim0 = {f: float(table[(table.alpha == 0) & (table.gamma_over_c == f)].cos_at_1e12.iloc[0])
            for f in fs}
    lima = {f: float(table[(table.alpha == alpha) & (table.gamma_over_c == f)].limit.iloc[0])
            for f in fs}
    worst25 = max(abs(lim0[f] - eq25[f]) for f in fs)
    rate_ok = all(r_ <= -(abs(1 - f) if f != 1 else 1.0) + 0.05 for _, f, r_ in rates)
    return [
        Check.within("Thm 2.1's simplex computation is exact at finite n: the simulated layer "
                     "(Q = K = V = I on exact simplex points) equals sigprop's closed form "
                     "(max abs difference of output cosines)", r["sim_dev"], 0.0, 1e-9,
                     why="float64 round-off only"),
        Check.within(f"Eq. 2.5 (alpha = 0): cos -> 1, 4 rho/(1+3 rho) = {eq25[1.0]:.4f}, rho = "
                     f"{rho} in the three phases (max |cos(n = 1e12) - Eq. 2.5|)", worst25, 0.0,
                     1e-5,
                     why="finite n = 1e12: error O(n^-|1 - gamma(1-rho)|) = 1e-6 at gamma_c/2"),
        Check.that("Eqs. 2.4-2.5: every phase reaches its limit within the rate bound "
                   "n^-|1 - gamma(1-rho)| at n = 1e12 (10/n at gamma_c)", all(r["far_ok"]),
                   float(table.err_at_1e12.max()), "within the bound in all 6 cases",
                   why="the bound is the algebraic rate of the diagonal weight"),
        Check.that("convergence rate: log-log slope of |cos(n) - limit| over n in [1e4, 1e12] "
                   "is at least the stated -|1 - gamma(1-rho)| (-1 at gamma_c)", rate_ok,
                   max(r_ for *_, r_ in rates), "slope <= stated + 0.05 in all 6 cases",
                   why="without residual the subcritical error is a^2 ~ n^-1, faster than the "
                       "bound n^-1/2"),
        Check.that(f"Eq. 2.4 (alpha = {alpha}): the sub- and critical limits stay above rho "
                   f"(contraction despite the residual: {lima[0.5]:.3f}, {lima[1.0]:.3f}) and "
                   f"the supercritical one equals rho", lima[0.5] > rho and lima[1.0] > rho
                   and abs(lima[2.0] - rho) < 1e-12, lima[1.0], "> rho, > rho, = rho",
                   why="exact n -> infinity limits (Thm 2.1)"),
    ]


def plot_thm21(r: dict, ax=None):
    """Two panels (alpha = 0 and alpha): the cosine against n per phase, its limit dashed and
    rho dotted; returns the Figure."""
    rho, alpha = r["rho"], r["alpha"]
    fig, axes = axes_row(ax, 2, (8.0, 3.4), sharey=True)
    df = frame(r["recs"])
    for a, al in zip(axes, (0.0, float(alpha)), strict=True):
        for k, (f, name) in enumerate(PHASES.items()):
            c = COLOURS[k]
            t = df[(df.source == "theory") & (df.alpha == al) & (df.gamma_over_c == f)]
            a.plot(t.n, t.value, "-", color=c, lw=1.3, label=f"γ = {f:g} γ_c ({name})")
            m = df[(df.source == "measured") & (df.alpha == al) & (df.gamma_over_c == f)]
            a.plot(m.n, m.value, "o", ms=4, color=c)
            li = df[(df.source == "theory_asymptotic") & (df.alpha == al)
                    & (df.gamma_over_c == f)].value.iloc[0]
            a.axhline(li, color=c, ls="--", lw=0.8)
        a.axhline(rho, color="grey", ls=":", lw=1)
        a.set_xscale("log")
        decorate(a, "n (tokens)", None,
                 f"clpr25 Thm 2.1, α = {al:g}" + (" (Eq. 2.5)" if al == 0 else
                 " (Eq. 2.4)"), legend=None)
    decorate(axes[0], None, "output cosine ⟨x'_i, x'_j⟩ / |x'|²")
    return fig


@register("clpr25.thm21", tiny=dict(ns_sim=(8, 32, 64)), quick=dict(ns_sim=(16, 64, 256)),
          runtime={"tiny": 0.3, "quick": 0.6, "default": 0.6})
def thm21(*, seed: int = 0, device: str = "cpu", ns_sim: Sequence[int] = (16, 64, 256),
          rho: float = 0.5, alpha: float = 0.5) -> Experiment:
    ns_sim = sizes("ns_sim", ns_sim, 4, 2)
    rho = rho_arg(rho)
    alpha = args.real("alpha", alpha, 0.0, math.inf, lo_open=True)
    r = thm21_data(ns_sim, rho, alpha, seed)
    return Experiment(frame(r["recs"]), r["table"], thm21_checks(r), plot_thm21, r)


# --------------------------------------------------------------------------------------------
# Theorem 2.3

#: The n -> infinity limits of the normalised Jacobian norm on a simplex, per gamma / gamma_c.
THM23_LIMITS = {0.5: 0.0, 1.0: 0.25, 2.0: 1.0}


def thm23_data(ns_sim: list[int], rho: float, seed: int) -> dict:
    """Per phase: the simplex closed form up to n = 1e12 (width d = n + 1) and its limit, the
    Jacobian from its blocks at ``ns_sim`` with the largest relative difference, and one table
    row (value and error at 1e12)."""
    gc = float(sc.gamma_c(rho))
    n_th = np.logspace(1, 12, 45)
    recs, rows_t, rel = [], [], 0.0
    for f, lim in THM23_LIMITS.items():
        th = sc.jacobian_norm_simplex(n_th, f * gc, rho, d=n_th + 1)
        recs += [dict(observable="jacobian_norm", source="theory", value=v, n=n,
                      gamma_over_c=f) for n, v in zip(n_th, th, strict=True)]
        recs.append(dict(observable="jacobian_norm", source="theory_asymptotic",
                         value=lim, n=np.inf, gamma_over_c=f))
        for n in ns_sim:
            Xs = sc.simplex_points(n, n + 1, rho, seed=seq(seed, n))
            v = float(sc.jacobian_norm(Xs, f * gc))
            closed = float(sc.jacobian_norm_simplex(n, f * gc, rho, d=n + 1))
            rel = max(rel, abs(v / closed - 1))
            recs.append(dict(observable="jacobian_norm", source="measured", value=v, n=n,
                             gamma_over_c=f))
        rows_t.append(dict(gamma_over_c=f, J_at_1e12=float(th[-1]), limit=lim,
                           err=float(abs(th[-1] - lim))))
    return dict(recs=recs, table=pd.DataFrame(rows_t), ns_sim=ns_sim, rho=rho, rel=rel)


def thm23_checks(r: dict) -> list[Check]:
    """Thm 2.3 on :func:`thm23_data`'s result: the blocks against the closed form, and the
    limits 0, 1/4, 1 at n = 1e12."""
    table = r["table"]
    err = table.set_index("gamma_over_c").err
    return [
        Check.within("the Jacobian of the layer at exact simplex points (computed from its "
                     "blocks) equals sigprop's closed form (max relative difference)", r["rel"],
                     0.0, 1e-8, why="float64 round-off; both exact at finite n"),
        Check.within("Thm 2.3 (Eq. 2.17): below gamma_c the norm -> 0 (value at n = 1e12)",
                     table.J_at_1e12.iloc[0], 0.0, 1e-5,
                     why="closed form ~ a^2 + 1/n with a ~ n^-1/2: 2e-12 at n = 1e12"),
        Check.within("Thm 2.3: at gamma_c the norm -> 1/4 (|J(1e12) - 1/4|)", err[1.0], 0.0,
                     1e-5, why="O(1/n) corrections at n = 1e12"),
        Check.within("Thm 2.3 (Eq. 2.19): above gamma_c the norm -> 1 (|J(1e12) - 1|)",
                     err[2.0], 0.0, 1e-5, why="1 - a ~ 1/n and 1/d corrections at n = 1e12"),
    ]


def plot_thm23(r: dict, ax=None):
    """The norm against n per phase (closed form, blocks, limit dashed); returns the
    Figure."""
    fig, (a,) = axes_row(ax, 1, (5.0, 3.5))
    df = frame(r["recs"])
    for k, (f, lim) in enumerate(THM23_LIMITS.items()):
        c = COLOURS[k]
        t = df[(df.source == "theory") & (df.gamma_over_c == f)]
        a.plot(t.n, t.value, "-", color=c, lw=1.3, label=f"γ = {f:g} γ_c")
        m = df[(df.source == "measured") & (df.gamma_over_c == f)]
        a.plot(m.n, m.value, "o", ms=4, color=c)
        a.axhline(lim, color=c, ls="--", lw=0.8)
    a.set_xscale("log")
    decorate(a, "n (tokens), d = n + 1", "‖J‖²_F / (nd)", "clpr25 Thm 2.3 (simplex, α = 0)")
    return fig


@register("clpr25.thm23", tiny=dict(ns_sim=(8, 16, 32)), quick=dict(ns_sim=(16, 64, 128)),
          runtime={"tiny": 0.2, "quick": 0.5, "default": 0.5})
def thm23(*, seed: int = 0, device: str = "cpu", ns_sim: Sequence[int] = (16, 64, 128),
          rho: float = 0.5) -> Experiment:
    ns_sim = sizes("ns_sim", ns_sim, 4, 2)
    rho = rho_arg(rho)
    r = thm23_data(ns_sim, rho, seed)
    return Experiment(frame(r["recs"]), r["table"], thm23_checks(r), plot_thm23, r)
