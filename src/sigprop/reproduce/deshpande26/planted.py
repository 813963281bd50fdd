"""deshpande26 Eq. 13, retrieval of a planted key: ``deshpande26.retrieval``, one key with logit
margin m among N - 1 noise keys, against kappa = m / (sigma sqrt(2 log N)). Theory: the
retrieval threshold of :mod:`sigprop.theory.scaling`, the exact success probability
Phi(m/sigma)^(N-1) and the Gumbel median of the noise maximum (:func:`kappa_half_gumbel`). The
item is a data function, a checks function and a plot function composed by the registered
item."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import log_ndtr

from ...theory import scaling as sc
from ..core import Check, Experiment, frame
from ..plots import axes_row, decorate
from .common import COLOURS, n_sweep_item, rng_of, trials

__all__ = ["BETA_FACTORS", "kappa_half_gumbel", "retrieval", "retrieval_data",
           "retrieval_checks", "plot_retrieval"]

#: beta / beta_c at which the planted key's weight is sampled.
BETA_FACTORS = (1.0, 2.0, 4.0)


def kappa_half_gumbel(N) -> np.ndarray:
    """Median of the largest of N standard Gaussians over sqrt(2 log N), to O(1/log^2 N):
    1 - (log log N + log 4 pi + 2 log log 2) / (4 log N)."""
    L = np.log(np.asarray(N, float))
    return 1.0 - (np.log(L) + math.log(4 * math.pi) + 2 * math.log(math.log(2))) / (4 * L)


def _retrieval_length(N, ks, k_fine, sigma, budget, seed):
    """One length N: success and target-weight records, the largest |z| of the sampled
    success against Phi(m/sigma)^(N-1), and the table row (transition and its width)."""
    thr = float(sc.retrieval_threshold(N, sigma))
    rows = trials(budget, N, 200)
    U = sigma * rng_of(seed, N).standard_normal((rows, N - 1))
    top = U.max(axis=1)
    m = ks * thr
    ok = m[:, None] > top[None, :]
    p = ok.mean(axis=1)
    exact = np.exp((N - 1) * log_ndtr(m / sigma))
    se = np.sqrt(exact * (1 - exact) / rows)
    z = float(np.max(np.abs(p - exact) / (se + 0.005 / 4)))
    p_fine = np.exp((N - 1) * log_ndtr(k_fine * thr / sigma))
    recs = [dict(observable="success", source="measured", value=v, stderr=e, N=N, kappa=k)
            for k, v, e in zip(ks, p, np.sqrt(p * (1 - p) / rows), strict=True)]
    recs += [dict(observable="success", source="theory", value=v, N=N, kappa=k)
             for k, v in zip(k_fine, p_fine, strict=True)]
    bc = float(sc.deshpande_beta_c(N, sigma))
    for f in BETA_FACTORS:
        lse = np.logaddexp.reduce(f * bc * U, axis=1)           # log of the noise mass
        w = 1.0 / (1.0 + np.exp(lse[None, :] - f * bc * m[:, None]))
        recs += [dict(observable="target_weight", source="measured", value=v,
                      stderr=e, N=N, kappa=k, beta_over_c=f)
                 for k, v, e in zip(ks, w.mean(1), w.std(1, ddof=1) / math.sqrt(rows),
                                    strict=True)]
        # the paper's approximation w* ~ 1 / (1 + exp(beta (M_N - m))), M_N = threshold
        recs += [dict(observable="target_weight", source="paper", value=v, N=N, kappa=k,
                      beta_over_c=f)
                 for k, v in zip(k_fine, 1 / (1 + np.exp(f * bc * thr * (1 - k_fine))),
                                 strict=True)]
    k_half = float(np.interp(0.5, p_fine, k_fine))
    row = dict(N=N, rows=rows, kappa_half_measured=float(np.interp(0.5, p, ks)),
               kappa_half_exact=k_half, kappa_half_gumbel=float(kappa_half_gumbel(N)),
               width_10_90=float(np.interp(0.9, p_fine, k_fine)
                                 - np.interp(0.1, p_fine, k_fine)))
    return recs, z, row


def retrieval_data(Ns: list[int], sigma: float, budget: int, seed: int) -> dict:
    """Sampled and exact retrieval success on kappa in [0.5, 1.5] for every N, the sampled
    target weight at beta = 1, 2, 4 beta_c with the paper's approximation, the N -> infinity
    step, their tidy frame and one table row per N."""
    ks = np.round(np.arange(0.5, 1.5 + 1e-9, 0.05), 10)
    k_fine = np.linspace(0.4, 1.6, 241)
    recs, rows_t, zmax = [], [], 0.0
    for N in Ns:
        rr, z, row = _retrieval_length(N, ks, k_fine, sigma, budget, seed)
        recs += rr
        zmax = max(zmax, z)
        rows_t.append(row)
    recs += [dict(observable="success", source="theory_asymptotic", value=float(k > 1),
                  N=np.inf, kappa=k) for k in k_fine]
    return dict(df=frame(recs), table=pd.DataFrame(rows_t), Ns=Ns, ks=ks, zmax=zmax)


def retrieval_checks(r: dict) -> list[Check]:
    """Eq. 13 on :func:`retrieval_data`'s result: samples on the exact law, the transition at
    its finite-N place, moving up and sharpening with N, and a larger beta sharpening the
    target weight at the margin."""
    table, df, Ns, ks = r["table"], r["df"], r["Ns"], r["ks"]
    kh = table.kappa_half_measured.to_numpy()
    kg = table.kappa_half_gumbel.to_numpy()
    NL = Ns[-1]
    wt = df[(df.observable == "target_weight") & (df.source == "measured") & (df.N == NL)
            & np.isclose(df.kappa, 1.0)].sort_values("beta_over_c").value.to_numpy()
    big = np.array([1e6, 1e12])
    p_hi = np.exp((big - 1) * log_ndtr(0.9 * np.sqrt(2 * np.log(big))))
    p_hi2 = np.exp((big - 1) * log_ndtr(1.1 * np.sqrt(2 * np.log(big))))
    return [
        Check.within("sampled retrieval (target is the argmax) agrees with the exact "
                     "Phi(m/sigma)^(N-1) (largest |z|)", r["zmax"], 0.0, 4.5,
                     why="binomial standard errors (+0.005 for p near 0 or 1), 4.5 sigma over "
                         f"{len(ks) * len(Ns)} points"),
        Check.within(f"Eq. 13: the transition (success 1/2) sits at m / (sigma sqrt(2 log N)) "
                     f"= 1 up to the finite-N shift; N = {NL}", kh[-1], kg[-1] - 0.03,
                     kg[-1] + 0.03,
                     why=f"finite N: the median of the largest noise logit is "
                         f"{kg[-1]:.3f} sigma sqrt(2 log N) (Gumbel, O(1/log^2 N) error); "
                         "grid 0.05 interpolated, sampling"),
        Check.that("the transition moves up towards 1 as N grows "
                   f"({', '.join(f'{v:.3f}' for v in kh)})",
                   all(np.diff(kh) > 0) and kh[-1] < 1.0, kh[-1], "increasing in N, below 1",
                   why="shift (log log N + log 4 pi + 2 log log 2) / (4 log N) -> 0"),
        Check.that("the transition sharpens to the step at 1 as N grows (exact success at "
                   f"kappa = 0.9 / 1.1: N = 1e6 {p_hi[0]:.3f} / {p_hi2[0]:.3f}, N = 1e12 "
                   f"{p_hi[1]:.2e} / {p_hi2[1]:.4f})",
                   bool(np.all(np.diff(table.width_10_90) < 0)) and p_hi[1] < 0.01
                   and p_hi2[1] > 0.99, float(table.width_10_90.iloc[-1]),
                   "10-90% width decreasing in N; kappa 0.9 fails, 1.1 succeeds at N = 1e12",
                   why="P = Phi(kappa sqrt(2 log N))^(N-1) exactly"),
        Check.that(f"Eq. 13: at the margin kappa = 1, N = {NL} a larger beta sharpens retrieval "
                   "(mean "
                   f"target weight at beta/beta_c = 1, 2, 4: "
                   f"{', '.join(f'{v:.3f}' for v in wt)})",
                   bool(np.all(np.diff(wt) > 0)) and wt[-1] > 0.8, wt[-1],
                   "increasing in beta, > 0.8 at 4 beta_c",
                   why="w* = 1 / (1 + exp(log Z_noise - beta m)); at kappa = 1 the target beats "
                       "the noise maximum in ~90% of rows (finite-N shift), where w* -> 1 as "
                       "beta grows"),
    ]


def plot_retrieval(r: dict, ax=None):
    """Two panels: success against kappa per N (exact lines, sampled points, the step), and
    the target weight at the largest N per beta with the paper's approximation dashed;
    returns the Figure."""
    df, Ns = r["df"], r["Ns"]
    NL = Ns[-1]
    fig, (ax1, ax2) = axes_row(ax, 2, (8.0, 3.5))
    for k, N in enumerate(Ns):
        c = COLOURS[k % len(COLOURS)]
        t = df[(df.observable == "success") & (df.source == "theory") & (df.N == N)]
        ax1.plot(t.kappa, t.value, "-", color=c, lw=1.2)
        mm = df[(df.observable == "success") & (df.source == "measured") & (df.N == N)]
        ax1.errorbar(mm.kappa, mm.value, yerr=mm.stderr, fmt="o", ms=3, color=c, capsize=1.5,
                     label=f"N = {N}")
    a = df[(df.observable == "success") & (df.source == "theory_asymptotic")]
    ax1.plot(a.kappa, a.value, "k--", lw=1, label="N → ∞")
    ax1.axvline(1.0, color="grey", ls=":", lw=1)
    decorate(ax1, "m / (σ √(2 log N))", "P(target is the argmax)", "deshpande26 Eq. 13: retrieval")
    for k, f in enumerate(BETA_FACTORS):
        c = COLOURS[k % len(COLOURS)]
        mm = df[(df.observable == "target_weight") & (df.source == "measured") & (df.N == NL)
                & (df.beta_over_c == f)]
        ax2.errorbar(mm.kappa, mm.value, yerr=mm.stderr, fmt="o", ms=3, color=c, capsize=1.5,
                     label=f"β = {f:g} β_c")
        pp = df[(df.observable == "target_weight") & (df.source == "paper") & (df.N == NL)
                & (df.beta_over_c == f)]
        ax2.plot(pp.kappa, pp.value, "--", color=c, lw=1)
    ax2.axvline(1.0, color="grey", ls=":", lw=1)
    decorate(ax2, "m / (σ √(2 log N))", "E w*  (target weight)",
             f"N = {NL}; dashed: 1/(1 + e^(β(M_N − m)))")
    return fig


@n_sweep_item("deshpande26.retrieval", sigma=1.5, budget=4_000_000,
              runtime={"tiny": 0.3, "quick": 2.0, "default": 2.0})
def retrieval(Ns: list[int], sigma: float, budget: int, seed: int) -> Experiment:
    r = retrieval_data(Ns, sigma, budget, seed)
    return Experiment(r["df"], r["table"], retrieval_checks(r), plot_retrieval, r)
