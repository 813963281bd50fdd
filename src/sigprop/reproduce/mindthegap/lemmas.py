"""mindthegap's appendix lemmas on products of Random Markov and Gaussian matrices:
``lemma1`` (Lemma 1 and the edge of a Gaussian product used in the proof of Prop. 4) and
``lemma2_thm9_10`` (Lemma 2, Thms 9 and 10)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...theory import spectral as sp
from .. import args
from ..core import Check, Experiment, frame, mean_se, register, slope
from ..plots import axes_grid, decorate, titled
from .common import (
    C_PERP,
    MAX_SIZE,
    bars,
    plt_colours,
    positive,
    rng_of,
    sizes,
    sub,
    tol_T,
)

__all__ = ["lemma1", "lemma2_thm9_10", "lemma2_thm9_10_data", "lemma2_thm9_10_checks",
           "plot_lemma2_thm9_10"]



def plot_lemma1(r: dict, ax=None):
    """Lemma 1's moments (left) and the spectral edge in the proof of Prop. 4 (right);
    ``ax``: two Axes, or None for a new figure."""
    tab, n_samples, d_l, qs = r["tab"], r["n_samples"], r["d_l"], r["qs"]
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 2, (4.4 * 2, 3.5))
    a, b = ax[0]
    t = tab[tab.quantity == "lemma1"]
    a.errorbar(t["q"], t["mean"], yerr=t["std"] / math.sqrt(n_samples) * 2, fmt="o",
               color=C_PERP, capsize=2, label="measured mean")
    a.axhline(1.0, color="k", lw=1, label="Lemma 1: 1")
    decorate(a, "q", r"E $s_1^2(uu^\top W_1\cdots W_q)/d^q$", f"Lemma 1 (d = {d_l})")
    cols = plt_colours(len(qs))
    for c, q in zip(cols, qs, strict=False):
        t = tab[(tab.quantity == "edge") & (tab.q == q)]
        b.plot(t["d"], t["mean"], "o", color=c, label=f"q = {q}")
        b.axhline((q + 1) ** (q + 1) / q**q, color=c, lw=1)
    b.set_xscale("log")
    b.set_yscale("log")
    decorate(b, "d", r"$s_1^2(W_1\cdots W_q)/d^q$",
             "edge of a Gaussian product (lines: Fuss–Catalan)")
    return titled(fig, "mindthegap Lemma 1 and the edge in the proof of Prop. 4", own)


@register("mindthegap.lemma1", tiny=dict(ds=(32, 64, 128), qs=(1, 2, 3), n_samples=100),
          quick=dict(ds=(64, 128, 256), qs=(1, 2, 3), n_samples=300),
          full=dict(ds=(128, 256, 512, 1024), qs=(1, 2, 3, 4), n_samples=1000),
          runtime={"tiny": 0.2, "quick": 1.2, "default": 1.2})
def lemma1(*, seed: int = 0, device: str = "cpu", ds: Sequence[int] = (64, 128, 256),
           qs: Sequence[int] = (1, 2, 3), n_samples: int = 300) -> Experiment:
    ds = sizes("ds", ds, low=4)
    qs = args.integers("qs", qs, 1, MAX_SIZE)
    n_samples = args.integer("n_samples", n_samples, 10)
    rows, table, checks = [], [], []
    d_l = ds[-1]
    rng = np.random.default_rng(sub(seed, 11))
    for q in qs:
        # Lemma 1: the row vector u^T W_1 ... W_q (T = d here; u = e_1 by rotation invariance)
        v = rng.standard_normal((n_samples, d_l))
        for _ in range(q - 1):
            W = rng.standard_normal((n_samples, d_l, d_l))
            v = np.einsum("nd,nde->ne", v, W)
        s2 = (v**2).sum(axis=1) / float(d_l) ** q
        sd_th = math.sqrt((1 + 2 / d_l) ** q - 1)
        m = float(s2.mean())
        sc = np.sqrt(s2)
        checks.append(Check.within(
            f"Lemma 1: E s1^2(uu^T W_1..W_{q}) / d^{q} = 1 (d = {d_l}, {n_samples} samples)", m,
            1 - 4 * sd_th / math.sqrt(n_samples), 1 + 4 * sd_th / math.sqrt(n_samples),
            why="a product of q independent chi^2_d / d: std sqrt((1 + 2/d)^q - 1) per sample; "
                "4 standard errors"))
        checks.append(Check.within(
            f"Lemma 1: concentration, std of s1 / d^(q/2) over sqrt(q / (2d)) (q = {q})",
            float(sc.std(ddof=1)) / math.sqrt(q / (2 * d_l)), 0.75, 1.25,
            why=f"delta method for chi^2 products; sample std of {n_samples} draws (~"
                f"{100 / math.sqrt(2 * n_samples):.0f} %) and O(1/d): tol 25 %"))
        table.append(dict(quantity="lemma1", q=q, d=d_l, mean=m, std=float(sc.std(ddof=1)),
                          std_theory=math.sqrt(q / (2 * d_l))))
        rows.append(dict(observable="lemma1_mean", source="measured", value=m,
                         stderr=float(s2.std(ddof=1) / math.sqrt(n_samples)), q=q, d=d_l))
        rows.append(dict(observable="lemma1_mean", source="theory", value=1.0, q=q, d=d_l))
        # the edge of the product of q square Gaussian matrices
        edge_th = (q + 1) ** (q + 1) / q**q
        vals = []
        for d in ds:
            n_rep = max(2, int(round(4 * 64 / d)))
            e = []
            for _ in range(n_rep):
                P = np.eye(d)
                for _ in range(q):
                    P = P @ rng.standard_normal((d, d))
                e.append(np.linalg.norm(P, 2) ** 2 / float(d) ** q)
            mm, se = mean_se(e)
            vals.append(mm)
            rows += [dict(observable="edge_sq", source="measured", value=mm, stderr=se, q=q,
                          d=d),
                     dict(observable="edge_sq", source="theory", value=edge_th, q=q, d=d)]
            table.append(dict(quantity="edge", q=q, d=d, mean=mm, std=float(se) * math.sqrt(
                n_rep), std_theory=np.nan, theory=edge_th))
        tol = 3.0 * q * d_l ** (-2.0 / 3.0) + 0.02
        checks.append(Check.within(
            f"Prop. 4 proof: s1^2(W_1..W_{q}) / d^{q} over (q+1)^(q+1) / q^q = {edge_th:.3g} "
            f"(d = {d_l})", vals[-1] / edge_th, 1 - tol, 1 + 0.5 * tol,
            why=f"the largest singular value of a product approaches the Fuss-Catalan edge from "
                f"below with fluctuations ~ q d^(-2/3) (Tracy-Widom scale, compounding over q "
                f"factors): band [1 - {tol:.2f}, 1 + {0.5 * tol:.2f}]"))
    tab = pd.DataFrame(table)
    r = dict(tab=tab, n_samples=n_samples, d_l=d_l, qs=qs)
    return Experiment(frame(rows), tab, checks, plot_lemma1, r)


def _products(Ts, sigma_A, pq, n_seeds, seed) -> tuple:
    """Per T and seed: s1(A_p..A_1 - 11^T/T) and s2(A_p..A_1) for p = 1..max p (arrays
    (nT, P, n_seeds)), and s1 / d^(q/2), s2 of A_p..A_1 W_1..W_q per (p, q) ((nT, n_seeds))."""
    P = max(p for p, _ in pq)
    Q = max(q for _, q in pq)
    lem2 = np.empty((len(Ts), P, n_seeds))   # s1(A_p..A_1 - 11^T/T)
    s2A = np.empty_like(lem2)                # s2(A_p..A_1)
    s1 = {k: np.empty((len(Ts), n_seeds)) for k in pq}
    s2 = {k: np.empty((len(Ts), n_seeds)) for k in pq}
    for i, T in enumerate(Ts):
        for j in range(n_seeds):
            rng = rng_of(sub(seed, 9, T, j))
            As = [sp.random_markov(T, sigma_A, seed=rng) for _ in range(P)]
            Ws = [rng.standard_normal((T, T)) for _ in range(Q)]
            prodA = [As[0]]
            for A in As[1:]:
                prodA.append(A @ prodA[-1])
            for p in range(1, P + 1):
                lem2[i, p - 1, j] = np.linalg.norm(prodA[p - 1] - 1.0 / T, 2)
                s2A[i, p - 1, j] = np.linalg.svd(prodA[p - 1], compute_uv=False)[1]
            for (p, q) in pq:
                M = prodA[p - 1]
                for W in Ws[:q]:
                    M = M @ W
                sv = np.linalg.svd(M, compute_uv=False)
                s1[(p, q)][i, j] = sv[0] / T ** (q / 2)
                s2[(p, q)][i, j] = sv[1]
    return lem2, s2A, s1, s2


def lemma2_thm9_10_data(Ts, sigma_A, pq, n_seeds, seed) -> dict:
    """:func:`_products` summarised per p and per (p, q): means, slopes, sigprop's and the
    paper's values, tidy rows and the table."""
    lem2, s2A, s1, s2 = _products(Ts, sigma_A, pq, n_seeds, seed)
    P = max(p for p, _ in pq)
    T_arr = np.asarray(Ts, float)
    rows, table, per_p, per_pq = [], [], {}, {}
    for p in range(1, P + 1):
        m, se = mean_se(lem2[:, p - 1])
        m2, se2 = mean_se(s2A[:, p - 1])
        sl, sl2 = slope(Ts, m), slope(Ts, m2)
        sig = (2.0 if p == 1 else 1.0) * sigma_A / np.sqrt(T_arr)  # sigprop's leading term
        for i, T in enumerate(Ts):
            rows += [dict(observable="s1_A_minus_uniform", source="measured", value=m[i],
                          stderr=se[i], p=p, T=T),
                     dict(observable="s1_A_minus_uniform", source="theory", value=sig[i], p=p,
                          T=T),
                     dict(observable="s1_A_minus_uniform", source="paper",
                          value=(2 * sigma_A / math.sqrt(T)) ** p, p=p, T=T),
                     dict(observable="s2_A", source="measured", value=m2[i], stderr=se2[i],
                          p=p, T=T),
                     dict(observable="s2_A", source="theory",
                          value=(2 * sigma_A / math.sqrt(T)) ** p, p=p, T=T)]
        table.append(dict(quantity="lemma2", p=p, q=0, slope=sl, slope_paper=-p / 2,
                          slope_sigprop=-0.5, value_Tmax=m[-1] / sig[-1], slope_s2=sl2))
        per_p[p] = dict(ratio=m[-1] / sig[-1], slope=sl, slope_s2=sl2)
    for (p, q) in pq:
        m1, se1 = mean_se(s1[(p, q)])
        m2, se2 = mean_se(s2[(p, q)])
        sl2 = slope(Ts, m2)
        for i, T in enumerate(Ts):
            rows += [dict(observable="thm9_s1_over_dq2", source="measured", value=m1[i],
                          stderr=se1[i], p=p, q=q, T=T),
                     dict(observable="thm9_s1_over_dq2", source="paper", value=1.0, p=p, q=q,
                          T=T),
                     dict(observable="thm10_s2", source="measured", value=m2[i], stderr=se2[i],
                          p=p, q=q, T=T)]
        table.append(dict(quantity="thm9_10", p=p, q=q, slope=sl2, slope_paper=(q - p) / 2,
                          slope_sigprop=(q - p) / 2, value_Tmax=m1[-1], slope_s2=np.nan))
        per_pq[(p, q)] = dict(s1_Tmax=m1[-1], slope_s2=sl2)
    return dict(Ts=Ts, T_arr=T_arr, sigma_A=sigma_A, pq=pq, P=P, n_seeds=n_seeds, s1=s1,
                s2=s2, per_p=per_p, per_pq=per_pq, rows=rows, table=pd.DataFrame(table))


def _lemma2_checks(p: int, sl: float, sl2: float, ratio: float, Ts) -> list[Check]:
    """Lemma 2 for one p: the edge at p = 1; the differing rate, sigprop's constant and the
    s2 part Thm 10 uses for p >= 2."""
    checks = []
    tol_e = tol_T(Ts[-1], 0.02, 2.0)
    if p == 1:
        checks.append(Check.within(
            "Lemma 2, p = 1: sqrt(T) s1(A - 11^T/T) / (2 sigma_A) -> 1", ratio,
            1 - tol_e, 1 + tol_e, why=f"edge tol 0.02 + 2 T^(-2/3) = {tol_e:.3f}"))
    else:
        checks.append(Check.differs(
            f"Lemma 2: rate of s1(A_{p}..A_1 - 11^T/T) in T (log-log slope, p = {p})", sl,
            -0.65, -0.35, paper=f"O(T^(-p/2)), slope {-p / 2:g}",
            why="A_p..A_1 - 11^T/T = sum_k (11^T/T) A_k^perp..A_1^perp + A_p^perp..A_1^perp "
                "(the paper's own expansion); the k = 1 term has norm |1^T A_1^perp| / "
                "sqrt(T) ~ sigma_A / sqrt(T) (column sums of A_1^perp do not vanish), so "
                "the rate is T^(-1/2) for every p. Tol 0.15 (finite-T fit)"))
        checks.append(Check.within(
            f"sigprop: sqrt(T) s1(A_{p}..A_1 - 11^T/T) / sigma_A -> 1 (p = {p}, T = "
            f"{Ts[-1]})", ratio, 0.85, 1.15,
            why="the column-sum vector of A_1^perp has squared norm ~ sigma_A^2 (a sum of "
                "T independent terms: relative spread ~ T^(-1/2)); the other terms are "
                "O(1/T): tol 15 %"))
        checks.append(Check.within(
            f"Lemma 2 (the part Thm 10 uses): s2(A_{p}..A_1) ~ T^(-{p}/2) (log-log slope)",
            sl2, -p / 2 - 0.2, -p / 2 + 0.2,
            why="s2(A) <= s1(A_p^perp..A_1^perp) <= (2 sigma_A / sqrt(T))^p (rank-one "
                "interlacing); edge fluctuations and row normalisation over the T range: "
                "tol 0.2"))
    return checks


def lemma2_thm9_10_checks(r: dict) -> list[Check]:
    """Every check of ``mindthegap.lemma2_thm9_10`` on :func:`lemma2_thm9_10_data`'s result."""
    Ts, n_seeds = r["Ts"], r["n_seeds"]
    checks = []
    for p, x in r["per_p"].items():
        checks += _lemma2_checks(p, x["slope"], x["slope_s2"], x["ratio"], Ts)
    for (p, q), x in r["per_pq"].items():
        m1_last, sl2 = x["s1_Tmax"], x["slope_s2"]
        tol = 4 * math.sqrt(q / (2 * Ts[-1]) / n_seeds) + 2.0 * float(Ts[-1]) ** (-p / 2)
        checks.append(Check.within(
            f"Thm 9: s1(A_{p}..A_1 W_1..W_{q}) / d^({q}/2) -> 1 (T = d = {Ts[-1]})", m1_last,
            1 - tol, 1 + tol,
            why=f"Lemma 1's fluctuation sqrt(q / 2d) per draw (4 s.e. over {n_seeds} seeds) plus "
                f"the bulk's share O(d^(-p/2)): tol {tol:.3f}"))
        checks.append(Check.within(
            f"Thm 10: s2(A_{p}..A_1 W_1..W_{q}) = O(d^(({q}-{p})/2)) (log-log slope)", sl2,
            -math.inf, (q - p) / 2 + 0.15,
            why="an upper bound on the rate; 0.15 for the seed spread of the fit"))
    return checks


def plot_lemma2_thm9_10(r: dict, ax=None):
    """Lemma 2 (left), Thm 9 (middle) and Thm 10 (right) over T."""
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 3, (3.6 * 3, 3.4))
    data = frame(r["rows"])
    Ts, T_arr, P, pq, s1, s2 = (r[k] for k in ("Ts", "T_arr", "P", "pq", "s1", "s2"))
    sigma_A = r["sigma_A"]
    a, b, c = ax[0]
    cols = plt_colours(max(P, len(pq)))
    for p in range(1, P + 1):
        for obs, mk_, ls in (("s1_A_minus_uniform", "o", "-"), ("s2_A", "s", "--")):
            t = data[(data.observable == obs) & (data.p == p)]
            tm = t[t.source == "measured"]
            bars(a, tm["T"], tm["value"], tm["stderr"], color=cols[p - 1], marker=mk_,
                  mfc="none" if obs == "s2_A" else None,
                  label=f"p = {p}" if obs == "s1_A_minus_uniform" else None)
            th = t[t.source == "theory"]
            a.plot(th["T"], th["value"], color=cols[p - 1], lw=1, ls=ls)
        tp = data[(data.observable == "s1_A_minus_uniform") & (data.p == p)
                  & (data.source == "paper")]
        if p > 1:
            a.plot(tp["T"], tp["value"], color=cols[p - 1], lw=1, ls=":")
    a.plot([], [], "ko", label=r"$s_1(A_p\cdots A_1 - 11^\top/T)$")
    a.plot([], [], "ks", mfc="none", label=r"$s_2(A_p\cdots A_1)$")
    a.plot([], [], "k:", lw=1, label=r"Lemma 2: $(2\sigma_A/\sqrt{T})^p$")
    a.set_xscale("log")
    a.set_yscale("log")
    decorate(a, "T", None, "Lemma 2 (lines: sigprop)", legend=6)
    for k, (p, q) in enumerate(pq):
        m1, se1 = mean_se(s1[(p, q)])
        m2, se2 = mean_se(s2[(p, q)])
        bars(b, Ts, m1, se1, color=cols[k], marker="o", label=f"p = {p}, q = {q}")
        bars(c, Ts, m2, se2, color=cols[k], marker="o", label=f"p = {p}, q = {q}")
        c.plot(Ts, m2[0] * (T_arr / Ts[0]) ** ((q - p) / 2), color=cols[k], lw=1, ls=":")
    b.axhline(1.0, color="k", lw=1, label="Thm 9: 1")
    b.set_xscale("log")
    decorate(b, "T = d", r"$s_1(AW)/d^{q/2}$", "Thm 9")
    c.set_xscale("log")
    c.set_yscale("log")
    decorate(c, "T = d", r"$s_2(AW)$", r"Thm 10 (dotted: $d^{(q-p)/2}$)")
    return titled(fig, f"mindthegap Lemma 2, Thms 9-10 (σ_A = {sigma_A:g}, γ = 1)", own)


@register("mindthegap.lemma2_thm9_10", tiny=dict(Ts=(64, 128, 256), n_seeds=2),
          quick=dict(Ts=(64, 128, 256, 512), n_seeds=3),
          full=dict(Ts=(128, 256, 512, 1024, 2048), n_seeds=4),
          runtime={"tiny": 0.4, "quick": 1.8, "default": 1.8})
def lemma2_thm9_10(*, seed: int = 0, device: str = "cpu",
                   Ts: Sequence[int] = (64, 128, 256, 512), sigma_A: float = 0.5,
                   pq: Sequence[tuple] = ((1, 1), (2, 1), (2, 2), (3, 1)),
                   n_seeds: int = 3) -> Experiment:
    Ts = sizes("Ts", Ts)
    sigma_A = positive("sigma_A", sigma_A)
    args.need("pq", len(pq) >= 1 and all(p >= 1 and q >= 1 for p, q in pq),
              f"pairs (p, q) of integers >= 1 (got {pq!r})")
    n_seeds = args.integer("n_seeds", n_seeds, 1)
    r = lemma2_thm9_10_data(Ts, sigma_A, pq, n_seeds, seed)
    return Experiment(frame(r["rows"]), r["table"], lemma2_thm9_10_checks(r),
                      plot_lemma2_thm9_10, r)

