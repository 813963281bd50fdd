"""mindthegap Sec. 2: the spectral gap of attention. ``fig1`` (eigenvalues of Random Markov,
softmax and linear key-query attention), ``thm2_prop1`` (Thm 2's gap, Lemma 3's quarter
circle, Prop. 1's first-layer key-query attention) and ``prop1_xavier`` (Xavier Q/K make
attention uniform). The formulas come from :mod:`sigprop.theory.spectral`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from ...theory import spectral as sp
from .. import args
from ..core import Check, Experiment, frame, mean_se, one_thread, register, slope
from ..plots import axes_grid, decorate, titled
from .common import (
    C_GAP,
    C_ID,
    C_KQ,
    C_PERP,
    SPECTRUM_SIZES,
    bars,
    kq_logits,
    positive,
    rng_of,
    sizes,
    softmax_rows,
    spectrum_args,
    sub,
    tokens,
    tol_T,
)

__all__ = ["fig1", "fig1_data", "fig1_checks", "plot_fig1", "first_layer", "thm2_prop1",
           "thm2_prop1_data", "thm2_prop1_checks", "plot_thm2_prop1", "prop1_xavier",
           "prop1_xavier_data", "prop1_xavier_checks", "plot_prop1_xavier"]



# ---------------------------------------------------------------------------------------------
# Fig. 1: eigenvalues of Random Markov, softmax key-query and linear key-query attention
# ---------------------------------------------------------------------------------------------


def fig1_data(T: int, sigma_A: float, n_seeds: int, seed: int) -> dict:
    """Eigenvalues of the three ensembles (first seed), their tidy rows and the summary table
    (top eigenvalue, bulk edge over the predicted radius, outlier ratio; means over seeds)."""
    sigma_qk2 = float(sp.logit_std_for_sigma_A(sigma_A))  # logit std s = sigma_qk^2 (d_qk = T)
    radius = {"markov": sigma_A / math.sqrt(T), "softmax": sigma_A / math.sqrt(T),
              "linear": sigma_qk2 * math.sqrt(T)}
    top, bulk, ratio = ({k: [] for k in radius} for _ in range(3))
    first: dict[str, np.ndarray] = {}
    for j in range(n_seeds):
        rng = np.random.default_rng(sub(seed, 1, j))
        S = kq_logits(tokens(T, T, 0.0, seed=rng), sigma_qk2, T, rng)
        mats = {"markov": sp.random_markov(T, sigma_A, seed=rng), "softmax": softmax_rows(S),
                "linear": S}
        for k, M in mats.items():
            ev = np.linalg.eigvals(M)
            a = np.sort(np.abs(ev))[::-1]
            top[k].append(a[0])
            bulk[k].append(a[1] / radius[k])
            ratio[k].append(a[0] / a[1])
            if j == 0:
                first[k] = ev
    rows, table = [], []
    for k, ev in first.items():
        rows += [dict(observable="eigenvalue", source="measured", value=float(e.real),
                      imag=float(e.imag), panel=k, T=T) for e in ev]
        rows.append(dict(observable="bulk_radius", source="theory", value=radius[k], panel=k,
                         T=T))
        m, se = mean_se(bulk[k])
        table.append(dict(panel=k, T=T, lambda1=float(np.mean(top[k])),
                          bulk_edge_over_radius=float(m), bulk_edge_se=float(se),
                          outlier_ratio=float(np.mean(ratio[k]))))
    return dict(T=T, sigma_A=sigma_A, radius=radius, first=first, top=top, rows=rows,
                table=pd.DataFrame(table).set_index("panel"))


def fig1_checks(r: dict) -> list[Check]:
    """Fig. 1 (a)-(c) and Thm 2's bulk edge, on :func:`fig1_data`'s result."""
    T, tab = r["T"], r["table"]
    tol = 0.1 + 2.0 / math.sqrt(T)
    gap_ratio = math.sqrt(T) / r["sigma_A"]
    return [
        Check.within("Fig. 1(a) / Thm 2: the Random Markov Perron eigenvalue is exactly 1",
                     float(np.max(np.abs(np.asarray(r["top"]["markov"]) - 1))), 0.0, 1e-9,
                     why="rows sum to 1 and entries are positive: lambda_1 = 1 up to rounding"),
        Check.within("Fig. 1(a): |lambda_2| sqrt(T) / sigma_A (bulk edge, circular law radius 1; "
                     "Thm 2 bounds it by 2)", tab.loc["markov", "bulk_edge_over_radius"],
                     1 - tol, 1 + tol,
                     why=f"finite T = {T}: the largest bulk eigenvalue of a circular-law matrix "
                         f"fluctuates ~ T^(-1/2) around the edge; tol 0.1 + 2/sqrt(T)"),
        Check.within("Fig. 1(b) / Prop. 1: softmax key-query attention has the same disc "
                     "(|lambda_2| sqrt(T) / sigma_A)", tab.loc["softmax", "bulk_edge_over_radius"],
                     1 - tol, 1 + tol,
                     why="as (a); d_qk = T leaves the linear logit part correlated, which moves "
                         "the edge by a few % only (measured 1.01-1.05 at T = 256-1024)"),
        Check.within("Fig. 1(b): outlier ratio |lambda_1| / |lambda_2| of softmax attention "
                     "(gap: about sqrt(T) / sigma_A)", tab.loc["softmax", "outlier_ratio"],
                     0.5 * gap_ratio, 1.5 * gap_ratio,
                     why="lambda_1 = 1 over a bulk edge sigma_A / sqrt(T) (within the tol above)"),
        Check.within("Fig. 1(c): linear key-query attention has no outlier "
                     "(|lambda_1| / |lambda_2|)", tab.loc["linear", "outlier_ratio"], 1.0, 1.25,
                     why="no row normalisation, no mean part: the top two eigenvalues are both "
                         "at the bulk edge; spacing there ~ T^(-1/2)"),
    ]


def plot_fig1(r: dict, ax=None):
    """The three eigenvalue clouds with their predicted radii (three panels)."""
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 3, (3.6 * 3, 3.6))
    titles = {"markov": "(a) Random Markov A", "softmax": "(b) softmax key-query A(X)",
              "linear": "(c) linear key-query"}
    th = np.linspace(0, 2 * np.pi, 200)
    for a, (k, ev) in zip(ax[0], r["first"].items(), strict=False):
        a.scatter(ev.real, ev.imag, s=3, color=C_PERP if k != "linear" else C_KQ,
                  label="eigenvalues")
        rad = r["radius"][k]
        a.plot(rad * np.cos(th), rad * np.sin(th), color="k", lw=1, label="radius theory")
        if k != "linear":
            a.scatter([1.0], [0.0], s=25, color="k", zorder=3, label="outlier 1")
        a.set_aspect("equal", adjustable="datalim")
        decorate(a, "Re λ", None, titles[k], legend=None)
    decorate(ax[0][0], None, "Im λ", loc="upper left")
    return titled(fig, f"mindthegap Fig. 1 (T = {r['T']}, σ_A = {r['sigma_A']:g})", own)


@register("mindthegap.fig1", **SPECTRUM_SIZES, runtime={"tiny": 0.9, "quick": 4.0, "default": 4.0})
def fig1(*, seed: int = 0, device: str = "cpu", T: int = 512, sigma_A: float = 1.0,
         n_seeds: int = 3) -> Experiment:
    T, sigma_A, n_seeds = spectrum_args(T, "sigma_A", sigma_A, n_seeds)
    r = fig1_data(T, sigma_A, n_seeds, seed)
    return Experiment(frame(r["rows"]), r["table"].reset_index(), fig1_checks(r), plot_fig1, r)


# ---------------------------------------------------------------------------------------------
# Thm 2, Lemma 3, Prop. 1
# ---------------------------------------------------------------------------------------------


def first_layer(Ts, sigma_A, qk_ratio, rho, n_seeds, bins, seed) -> dict:
    """Spectra of Random Markov and first-layer key-query attention (same sigma_A)."""
    rng = rng_of(seed)
    sigma_qk2 = float(sp.logit_std_for_sigma_A(sigma_A)) / math.sqrt(1.0 - rho)
    edges = np.linspace(0.0, 2.5 * sigma_A, bins + 1)
    qc_mass = np.diff(sp.quarter_circle_cdf(edges, sigma_A))
    keys = ("s1", "s2", "s2_spike", "top_perp", "ks", "m2", "m4", "l1")
    Ts = np.asarray(Ts)
    out: dict = {"T": Ts, "sigma_qk2": sigma_qk2, "edges": edges,
                 "d_qk": np.maximum(1, np.round(qk_ratio * Ts)).astype(int),
                 "hist_theory": qc_mass / np.diff(edges)}
    res = {e: {k: np.empty((len(Ts), n_seeds)) for k in keys} for e in ("markov", "keyquery")}
    for i, T in enumerate(Ts):
        d_qk = int(out["d_qk"][i])
        for j in range(n_seeds):
            mats = {"markov": sp.random_markov(int(T), sigma_A, seed=rng)}
            X0 = tokens(int(T), int(T) + (rho > 0), rho, seed=rng)
            mats["keyquery"] = softmax_rows(kq_logits(X0, sigma_qk2, d_qk, rng))
            for e, A in mats.items():
                r = res[e]
                s = np.linalg.svd(A, compute_uv=False)
                B = math.sqrt(T) * sp.centred(A)
                sb = np.linalg.svd(B, compute_uv=False)
                bulk = sb[1:] if rho > 0 and e == "keyquery" else sb
                r["s1"][i, j], r["s2"][i, j] = s[0], math.sqrt(T) * s[1]
                r["s2_spike"][i, j] = float(sp.s2_entry_spike(B.max(), sigma_A))
                r["top_perp"][i, j] = sb[0] / math.sqrt(T)
                r["ks"][i, j] = stats.kstest(
                    bulk, lambda x: sp.quarter_circle_cdf(x, sigma_A)).statistic
                r["m2"][i, j] = np.mean(bulk**2) / sigma_A**2
                r["m4"][i, j] = np.mean(bulk**4) / sigma_A**4
                counts = np.histogram(bulk, edges)[0] / bulk.size
                r["l1"][i, j] = np.abs(counts - qc_mass).sum()
                if i == len(Ts) - 1 and j == 0:
                    out[f"hist_{e}"] = counts / np.diff(edges)
    out.update(res)
    out["m4_theory"] = {"markov": np.full(len(Ts), 2.0),
                        "keyquery": sp.kq_bulk_m4(sigma_A, Ts / out["d_qk"]) / sigma_A**4}
    out["top_perp_theory"] = top = float(sp.centred_outlier_rho(sigma_qk2, rho))
    out["m2_theory"] = {"markov": 1.0, "keyquery": 1.0 - top**2 / sigma_A**2}
    return out


def thm2_prop1_data(Ts, sigma_A, qk_ratio, rho, n_seeds, bins, seed) -> dict:
    """:func:`first_layer`'s spectra plus their tidy rows and the per-(ensemble, T) table."""
    r = first_layer(Ts, sigma_A, qk_ratio, rho, n_seeds, bins, seed)
    T = Ts[-1]
    rows, table = [], []
    centres = 0.5 * (r["edges"][1:] + r["edges"][:-1])
    for e in ("markov", "keyquery"):
        rows += [dict(observable="sv_density", source="measured", value=float(v), x=float(x),
                      ensemble=e, T=T) for x, v in zip(centres, r[f"hist_{e}"], strict=False)]
        for i, t in enumerate(Ts):
            row = dict(ensemble=e, T=t, d_qk=int(r["d_qk"][i]))
            for k in ("s1", "s2", "top_perp", "ks", "m2", "m4", "l1", "s2_spike"):
                m, se = mean_se(r[e][k][i])
                row[k], row[k + "_se"] = float(m), float(se)
            row["s2_over_2sigmaA"] = row["s2"] / (2 * sigma_A)
            row["edge_perp_over_2sigmaA"] = row["top_perp"] * math.sqrt(t) / (2 * sigma_A)
            row["m4_theory"] = float(r["m4_theory"][e][i])
            table.append(row)
            for obs, val, se in (("s2_sqrtT_A", row["s2"], row["s2_se"]),
                                 ("s1_sqrtT_A_perp", row["top_perp"] * math.sqrt(t),
                                  row["top_perp_se"] * math.sqrt(t)),
                                 ("s1_A", row["s1"], row["s1_se"])):
                rows.append(dict(observable=obs, source="measured", value=val, stderr=se,
                                 ensemble=e, T=t))
    rows += [dict(observable="sv_density", source="theory", value=float(v), x=float(x),
                  ensemble="quarter_circle", T=T)
             for x, v in zip(centres, r["hist_theory"], strict=False)]
    rows += [dict(observable="s2_sqrtT_A", source="theory", value=2 * sigma_A, T=t)
             for t in Ts]
    r.update(rows=rows, table=pd.DataFrame(table), Ts=Ts, sigma_A=sigma_A, rho=rho,
             qk_ratio=qk_ratio)
    return r


def _thm2_checks(r: dict) -> list[Check]:
    """Thm 2 and Lemma 3 on the Random Markov ensemble, Prop. 1's s1 on key-query."""
    Ts, tab, rho = r["Ts"], r["table"], r["rho"]
    T = Ts[-1]
    mk = tab[tab["T"] == T].set_index("ensemble").loc["markov"]
    s1_kq = math.sqrt(1.0 + r["top_perp_theory"] ** 2)
    tol_edge = tol_T(T, 0.02)
    ks = tab[tab.ensemble == "markov"]["ks"]
    return [
        Check.within("Thm 2: s1(A) -> 1 (Random Markov; max |s1 - 1| over T and seeds)",
                     float(np.max(np.abs(r["markov"]["s1"] - 1))), 0.0, 0.01,
                     why="s1(A) = 1 + O(sigma_A^2 / T); 1 % covers T >= 64"),
        Check.within(f"Thm 2: s2(sqrt(T) A) / (2 sigma_A) at T = {T} (Random Markov)",
                     mk["s2_over_2sigmaA"], 1 - tol_edge, 1 + tol_edge,
                     why=f"edge fluctuations ~ T^(-2/3): tol 0.02 + T^(-2/3) = {tol_edge:.3f}"),
        Check.within(f"Lemma 3: no gap left, sqrt(T) s1(A_perp) / (2 sigma_A) at T = {T}",
                     mk["edge_perp_over_2sigmaA"], 1 - tol_edge, 1 + tol_edge,
                     why="the top singular value of A_perp sits at the quarter-circle edge; "
                         "same edge tolerance"),
        Check.within(f"Lemma 3: KS distance of the singular values of sqrt(T) A_perp to the "
                     f"quarter circle at T = {T}", mk["ks"], 0.0, 2 * math.log(T) / T,
                     why="eigenvalue rigidity: the empirical CDF is within O(log T / T) of its "
                         "limit; band 2 log(T) / T"),
        Check.that("Lemma 3: the KS distance shrinks with T (Random Markov)",
                   ks.iloc[-1] < ks.iloc[0], ks.iloc[-1], "KS(T_max) < KS(T_min)",
                   why="convergence in law"),
        Check.within(f"Lemma 3: 4th moment of the quarter circle, E x^4 / sigma_A^4 = 2 "
                     f"(T = {T})", mk["m4"], 2 * (1 - 0.03 - 8 / T), 2 * (1 + 0.03 + 8 / T),
                     why="finite-T bias O(1/T) from the row normalisation plus seed spread; "
                         "tol 3 % + 8/T"),
        Check.within("Prop. 1: s1(A(X_0)) -> 1 for first-layer key-query attention (rho > 0: "
                     "sqrt(1 + s1(A_perp)^2), the column outlier adds to it)",
                     float(np.max(np.abs(r["keyquery"]["s1"] - s1_kq))), 0.0, 0.01 + 0.1 * rho,
                     why="as for Random Markov matrices; for rho > 0 the outlier's lognormal "
                         "spread (12 %) enters at second order"),
    ]


def _prop1_bulk_checks(r: dict) -> list[Check]:
    """Orthonormal tokens: the key-query bulk is wider than the quarter circle (differs)."""
    T = r["Ts"][-1]
    kq = r["table"][r["table"]["T"] == T].set_index("ensemble").loc["keyquery"]
    rm4 = float(kq["m4_theory"]) / 2.0
    tol4 = 0.04 + 8 / T
    tol_edge = tol_T(T, 0.02)
    return [
        Check.differs(
            f"Prop. 1 + Lemma 3: bulk 4th moment of key-query attention (d_qk = "
            f"{int(kq['d_qk'])}, T = {T}), E x^4 / sigma_A^4",
            kq["m4"], float(kq["m4_theory"]) * (1 - tol4), float(kq["m4_theory"]) * (1 + tol4),
            paper="a Random Markov matrix: the quarter circle's 2",
            why=f"the logits' linear part is a product of Gaussian matrices (c = T / d_qk = "
                f"{T / kq['d_qk']:.2g}): sigprop's kq_bulk_m4 = 2 + c s^4 / sigma_A^4 = "
                f"{kq['m4_theory']:.3f}; tol 4 % + 8/T (seeds, finite T)"),
        Check.differs(
            f"Thm 2 via Prop. 1: key-query s2(sqrt(T) A) / (2 sigma_A) at T = {T}",
            kq["s2_over_2sigmaA"], 1 + 0.2 * (rm4 - 1), 1 + 2 * (rm4 - 1) + tol_edge,
            paper="2 sigma_A (ratio 1)",
            why="the wider key-query bulk (4th moment ratio "
                f"{rm4:.3f} to the quarter circle's) pushes the edge out by a fraction between "
                "0.2 and 2 times that excess (a law of that 4th moment on a compact support), "
                "plus the edge tolerance; it returns to 1 only as d_qk / T -> infinity"),
    ]


def _rho_checks(r: dict) -> list[Check]:
    """Correlated tokens (rho > 0): centring leaves an outlier (sigprop, beyond Prop. 1)."""
    T = r["Ts"][-1]
    last = r["table"][r["table"]["T"] == T].set_index("ensemble")
    mk, kq = last.loc["markov"], last.loc["keyquery"]
    top_th = r["top_perp_theory"]
    return [
        Check.within(f"sigprop (beyond Prop. 1): tokens of cosine rho = {r['rho']:g} leave an "
                     f"outlier s1(A_perp) = centred_outlier_rho = {top_th:.3f} (key-query)",
                     kq["top_perp"], 0.88 * top_th, 1.12 * top_th,
                     why="it is a sum of T lognormal column weights: tol 12 %"),
        Check.within(f"sigprop: the bulk keeps 1 - s1(A_perp)^2 / sigma_A^2 = "
                     f"{r['m2_theory']['keyquery']:.3f} of the variance (key-query)",
                     kq["m2"], 0.94 * r["m2_theory"]["keyquery"],
                     1.06 * r["m2_theory"]["keyquery"], why="seeds, finite T: tol 6 %"),
        Check.that("sigprop: the centred Random Markov matrix has no outlier while "
                   "centred key-query attention does (sqrt(T) s1(A_perp) ratio > 3)",
                   kq["top_perp"] * math.sqrt(T) > 3 * mk["top_perp"] * math.sqrt(T),
                   kq["top_perp"] / mk["top_perp"], "> 3",
                   why="an O(1) outlier against the O(T^-1/2) edge; 3 is far below "
                       "sqrt(T) s1 / (2 sigma_A) at T >= 128"),
    ]


def thm2_prop1_checks(r: dict) -> list[Check]:
    """Every check of ``mindthegap.thm2_prop1`` on :func:`thm2_prop1_data`'s result."""
    return _thm2_checks(r) + (_prop1_bulk_checks(r) if r["rho"] == 0 else _rho_checks(r))


def plot_thm2_prop1(r: dict, ax=None):
    """Singular-value densities against the quarter circle, and s2 / s1(A_perp) over T."""
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 2, (4.6 * 2, 3.5))
    sigma_A, tab, T, rho = r["sigma_A"], r["table"], r["Ts"][-1], r["rho"]
    a = ax[0][0]
    a.stairs(r["hist_markov"], r["edges"], color=C_GAP, label="Random Markov")
    a.stairs(r["hist_keyquery"], r["edges"], color=C_KQ, ls="--", label="key-query A(X)")
    xs = np.linspace(0, 2 * sigma_A, 200)
    a.plot(xs, sp.quarter_circle_pdf(xs, sigma_A), color="k", lw=1.2, label="quarter circle")
    decorate(a, r"singular value of $\sqrt{T}\,A_\perp$", "density", f"Lemma 3, T = {T}")
    b = ax[0][1]
    for e, c, mk_ in (("markov", C_GAP, "o"), ("keyquery", C_KQ, "s")):
        t = tab[tab.ensemble == e]
        bars(b, t["T"], t["s2"], t["s2_se"], color=c, marker=mk_,
             label=f"{e}: $s_2(\\sqrt{{T}}A)$")
        bars(b, t["T"], t["top_perp"] * np.sqrt(t["T"]), t["top_perp_se"] * np.sqrt(t["T"]),
             color=c, marker=mk_, mfc="none", label=f"{e}: $s_1(\\sqrt{{T}}A_\\perp)$")
    b.axhline(2 * sigma_A, color="k", lw=1, label=r"$2\sigma_A$ (Thm 2)")
    b.set_xscale("log")
    decorate(b, "T", "singular value", "Thm 2: second singular value", legend=6)
    return titled(fig, f"mindthegap Thm 2, Lemma 3, Prop. 1 (σ_A = {sigma_A:g}, d_qk = "
                       f"{r['qk_ratio']:g} T{f', ρ = {rho:g}' if rho else ''})", own)


@register("mindthegap.thm2_prop1", tiny=dict(Ts=(128, 256, 512), n_seeds=3),
          quick=dict(Ts=(256, 512, 1024), n_seeds=3),
          full=dict(Ts=(512, 1024, 2048, 4096), n_seeds=4),
          runtime={"tiny": 1.7, "quick": 8.0, "default": 8.0})
@one_thread
def thm2_prop1(*, seed: int = 0, device: str = "cpu", Ts: Sequence[int] = (256, 512, 1024),
               sigma_A: float = 0.5, qk_ratio: float = 4.0, rho: float = 0.0, n_seeds: int = 3,
               bins: int = 24) -> Experiment:
    Ts = sizes("Ts", Ts)
    sigma_A = positive("sigma_A", sigma_A)
    qk_ratio = positive("qk_ratio", qk_ratio)
    args.need("rho", 0.0 <= rho < 1.0, f"in [0, 1) (got {rho!r})")
    n_seeds = args.integer("n_seeds", n_seeds, 1)
    bins = args.integer("bins", bins, 2)
    r = thm2_prop1_data(Ts, sigma_A, qk_ratio, rho, n_seeds, bins, seed)
    return Experiment(frame(r["rows"]), r["table"], thm2_prop1_checks(r), plot_thm2_prop1, r)


# ---------------------------------------------------------------------------------------------
# Prop. 1, second part: Xavier / He key-query scaling makes first-layer attention uniform
# ---------------------------------------------------------------------------------------------

SCHEMES = {"N(0, 1)": lambda n: 1.0, "Xavier": lambda n: 1.0 / n, "He": lambda n: 2.0 / n}


def prop1_xavier_data(T: int, d_qks: tuple, n_seeds: int, seed: int) -> dict:
    """sigma_A (std of the entries of T A) of first-layer attention per Q/K scheme and d_qk,
    measured and ``softmax_sigma_A`` of the logit std."""
    rows, table = [], []
    meas = {k: np.empty((len(d_qks), n_seeds)) for k in SCHEMES}
    for i, n in enumerate(d_qks):
        for j in range(n_seeds):
            rng = np.random.default_rng(sub(seed, 2, n, j))
            X = tokens(T, T, 0.0, seed=rng)
            for k, f in SCHEMES.items():
                A = softmax_rows(kq_logits(X, f(n), n, rng))
                meas[k][i, j] = float((T * A).std())  # entries of T A: mean 1, std ~ sigma_A
    for k, f in SCHEMES.items():
        th = sp.softmax_sigma_A(np.array([f(n) for n in d_qks]))  # logit std = sigma_qk^2
        m, se = mean_se(meas[k])
        for n, mi, si, ti in zip(d_qks, m, se, th, strict=False):
            rows += [dict(observable="sigma_A", source="measured", value=mi, stderr=si,
                          d_qk=n, scheme=k, T=T),
                     dict(observable="sigma_A", source="theory", value=float(ti), d_qk=n,
                          scheme=k, T=T)]
            table.append(dict(scheme=k, d_qk=n, sigma_A=mi, sigma_A_se=si, theory=float(ti)))
    return dict(T=T, d_qks=d_qks, meas=meas, rows=rows, table=pd.DataFrame(table))


def prop1_xavier_checks(r: dict) -> list[Check]:
    """Xavier and He rates (slope -1 in d_qk) and N(0, 1)'s constant sigma_A."""
    d_qks, meas, tab = r["d_qks"], r["meas"], r["table"]
    sx = slope(d_qks, meas["Xavier"].mean(axis=1))
    sh = slope(d_qks, meas["He"].mean(axis=1))
    n1 = tab[tab.scheme == "N(0, 1)"]
    rel = float(np.max(np.abs(n1["sigma_A"] / n1["theory"] - 1)))
    return [
        Check.within("Prop. 1: Xavier Q/K, sigma_A ~ 1/d_qk -> 0 (log-log slope over d_qk)", sx,
                     -1.15, -0.85, why="sigma_A = sqrt(exp(sigma_qk^4) - 1) ~ sigma_qk^2 = "
                                      "1/d_qk; the sample std of T^2 entries is unbiased to "
                                      "O(1/T): tol 0.15"),
        Check.within("Prop. 1: He Q/K, same rate (slope)", sh, -1.15, -0.85, why="as Xavier"),
        Check.within("Prop. 1: N(0, 1) Q/K keep sigma_A = sqrt(e - 1) = 1.31 at every d_qk "
                     "(max relative deviation)", rel, 0.0, 0.15,
                     why=f"lognormal entries (heavy tail) at T = {r['T']}: the sample std of T^2 "
                         "entries is within ~10 % of sigma_A; d_qk = 16 logits are not quite "
                         "Gaussian"),
    ]


def plot_prop1_xavier(r: dict, ax=None):
    """sigma_A against d_qk per scheme (points measured, lines theory)."""
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 1, (5, 3.5))
    a, tab = ax[0][0], r["table"]
    for (k, c) in zip(SCHEMES, (C_GAP, C_PERP, C_ID), strict=False):
        t = tab[tab.scheme == k]
        bars(a, t["d_qk"], t["sigma_A"], t["sigma_A_se"], color=c, marker="o", label=k)
        a.plot(t["d_qk"], t["theory"], color=c, lw=1)
    a.set_xscale("log")
    a.set_yscale("log")
    decorate(a, r"$d_{qk}$", r"$\sigma_A$ of $A_1(X_0)$", legend=8,
             legend_title="Q/K init (lines: theory)", title_fontsize=7)
    return titled(fig, "mindthegap Prop. 1: degenerate attention under Xavier/He "
                       f"(T = {r['T']})", own)


@register("mindthegap.prop1_xavier", tiny=dict(T=64, d_qks=(16, 64, 256), n_seeds=2),
          quick=dict(T=128, d_qks=(16, 64, 256, 1024), n_seeds=3),
          runtime={"tiny": 0.1, "quick": 0.2, "default": 0.2})
def prop1_xavier(*, seed: int = 0, device: str = "cpu", T: int = 128,
                 d_qks: Sequence[int] = (16, 64, 256, 1024), n_seeds: int = 3) -> Experiment:
    T = args.integer("T", T, 8)
    d_qks = sizes("d_qks", d_qks, low=2)
    n_seeds = args.integer("n_seeds", n_seeds, 1)
    r = prop1_xavier_data(T, d_qks, n_seeds, seed)
    return Experiment(frame(r["rows"]), r["table"], prop1_xavier_checks(r), plot_prop1_xavier, r)
