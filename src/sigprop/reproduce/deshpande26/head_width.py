"""deshpande26 Eq. 12, why the 1/sqrt(d) factor matters: ``deshpande26.eq12``, E w_max of real
query-key dot products with and without it against the head width d. Theory: the exact finite-N
E w_max of :mod:`sigprop.theory.rem` averaged over the query-norm law
(``wmax_finite(..., d_head=d)``). The item is a data function, a checks function and a plot
function composed by the registered item."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...theory import rem
from ...theory import scaling as sc
from .. import args
from ..core import Check, Experiment, frame, register
from ..plots import axes_row, decorate
from .common import COLOURS, MAX_SIZE, positive, rng_of

__all__ = ["eq12", "eq12_data", "eq12_checks", "plot_eq12"]


def _eq12_width(d, N, beta, queries, key_sets, seed):
    """One head width d: the sampled largest weights of both scalings, the query norms
    sigma^2 = |q|^2 / d, over ``key_sets`` draws of keys and queries."""
    w = {"scaled": [], "unscaled": []}
    sig2 = []
    for s in range(key_sets):
        rng = rng_of(seed, d, s)
        K = rng.standard_normal((N, d))
        Q = rng.standard_normal((queries, d))
        S = Q @ K.T
        sig2.append((Q * Q).sum(1) / d)
        for name, fac in (("scaled", 1 / math.sqrt(d)), ("unscaled", 1.0)):
            z = beta * fac * S
            z -= z.max(axis=1, keepdims=True)
            w[name].append(1.0 / np.exp(z).sum(axis=1))
    return {k: np.concatenate(v) for k, v in w.items()}, np.concatenate(sig2)


def eq12_data(ds: list[int], N: int, beta: float, queries: int, key_sets: int,
              seed: int) -> dict:
    """Sampled and exact E w_max with (``scaled``) and without (``unscaled``) the 1/sqrt(d)
    factor per head width, and one table row per d (mean sigma^2, both values, beta /
    beta_c)."""
    recs, rows_t = [], []
    zmax = 0.0
    for d in ds:
        w, sig2 = _eq12_width(d, N, beta, queries, key_sets, seed)
        row = dict(d=d, sigma2_mean=float(sig2.mean()))
        # theory: exact finite-N E w_max averaged over sigma^2 ~ chi2_d / d (one call per d)
        ths = rem.wmax_finite(np.array([beta**2, beta**2 * d]), float(N), d_head=d)
        for name, vbar, th in (("scaled", beta**2, float(ths[0])),
                               ("unscaled", beta**2 * d, float(ths[1]))):
            ww = w[name]
            m, se = float(ww.mean()), float(ww.std(ddof=1) / math.sqrt(ww.size))
            x = math.sqrt(vbar) / math.sqrt(2 * math.log(N))       # beta / beta_c at sigma_bar
            zmax = max(zmax, abs(m - th) / (2 * se + 0.01))
            recs.append(dict(observable="wmax", source="measured", value=m, stderr=se, d=d,
                             logits=name))
            recs.append(dict(observable="wmax", source="theory", value=th, d=d, logits=name))
            row |= {f"wmax_{name}": m, f"wmax_{name}_theory": th, f"beta_over_c_{name}": x}
        rows_t.append(row)
    return dict(recs=recs, table=pd.DataFrame(rows_t), ds=ds, N=N, beta=beta, queries=queries,
                key_sets=key_sets, zmax=zmax, d_cross=float(2 * math.log(N) / beta**2))


def eq12_checks(r: dict) -> list[Check]:
    """Eq. 12 on :func:`eq12_data`'s result: sigma^2 averages to 1, samples on the theory,
    diffuse at every d with the factor, collapsing as d grows without it."""
    table, ds, N, beta = r["table"], r["ds"], r["N"], r["beta"]
    bc = float(sc.deshpande_beta_c(N, 1.0))
    sc_w, un_w = table.wmax_scaled.to_numpy(), table.wmax_unscaled.to_numpy()
    xs_un = table.beta_over_c_unscaled.to_numpy()
    d_cross = r["d_cross"]                                        # unscaled: beta_c reached
    sig_dev = float(np.max(np.abs(table.sigma2_mean - 1.0)
                           * np.sqrt(np.array(ds) * r["queries"] * r["key_sets"] / 2.0)))
    pd_last = float(rem.wmax_asymptotic(math.sqrt(2) * xs_un[-1]))
    return [
        Check.within("Eq. 12: sigma^2 = |q|^2 / d averages to 1 for isotropic queries (largest "
                     "deviation in standard errors)", sig_dev, 0.0, 4.0,
                     why="|q|^2/d ~ chi2_d / d: standard error sqrt(2 / (d queries))"),
        Check.within("sampled dot-product attention agrees with the finite-N theory averaged "
                     "over the query-norm law (largest |z|, both scalings)", r["zmax"], 0.0, 4.0,
                     why="2 x the sampling error (keys shared across the queries of a set) + "
                         "0.01"),
        Check.that(f"with 1/sqrt(d) the row stays diffuse at every d (beta/beta_c = "
                   f"{beta / bc:.2f}; w_max {sc_w.min():.3f}-{sc_w.max():.3f})",
                   sc_w.max() < 0.1 and sc_w.max() - sc_w.min() < 0.05, sc_w.max(),
                   "< 0.1 and flat in d (within 0.05)",
                   why="beta/beta_c fixed; only the chi2 spread of sigma changes with d"),
        Check.that(f"without 1/sqrt(d) the row collapses as d grows (beta_c reached at d = "
                   f"{d_cross:.0f}; w_max {un_w[0]:.3f} -> {un_w[-1]:.3f}, N -> infinity "
                   f"limit {pd_last:.3f} at d = {ds[-1]})",
                   bool(np.all(np.diff(un_w) > 0)) and un_w[-1] > 0.8, un_w[-1],
                   "increasing in d, > 0.8 at the largest d",
                   why="beta/beta_c = sqrt(d / (2 log N)) grows without bound"),
    ]


def plot_eq12(r: dict, ax=None):
    """E w_max against d with and without the factor (theory lines, sampled points), the width
    where beta_c is reached without it marked; returns the Figure."""
    d_cross = r["d_cross"]
    fig, (a,) = axes_row(ax, 1, (5.0, 3.5))
    df = frame(r["recs"])
    for k, name in enumerate(("scaled", "unscaled")):
        c = COLOURS[k]
        t = df[(df.source == "theory") & (df.logits == name)]
        a.plot(t.d, t.value, "-", color=c, lw=1.2)
        mm = df[(df.source == "measured") & (df.logits == name)]
        a.errorbar(mm.d, mm.value, yerr=mm.stderr, fmt="o", ms=4, color=c, capsize=2,
                   label="q·k/√d" if name == "scaled" else "q·k (no 1/√d)")
    a.axvline(d_cross, color="grey", ls=":", lw=1)
    a.text(d_cross, 0.5, " β_c reached\n (no 1/√d)", fontsize=7, color="grey")
    a.set_xscale("log")
    decorate(a, "head width d", "E w_max", f"deshpande26 Eq. 12: N = {r['N']}, β = {r['beta']:g}")
    return fig


@register("deshpande26.eq12", tiny=dict(ds=(8, 64, 512), N=512, queries=64, key_sets=2),
          quick=dict(ds=(4, 16, 64, 256, 1024), N=1024, queries=128, key_sets=4),
          runtime={"tiny": 0.3, "quick": 2.0, "default": 2.0})
def eq12(*, seed: int = 0, device: str = "cpu", ds: Sequence[int] = (4, 16, 64, 256, 1024),
         N: int = 1024, beta: float = 1.0, queries: int = 128, key_sets: int = 4) -> Experiment:
    ds = [int(d) for d in args.grid("ds", ds, 1, MAX_SIZE, ints=True, n_min=3)]
    N = args.integer("N", N, 16)
    beta = positive("beta", beta)
    queries = args.integer("queries", queries, 8)
    key_sets = args.integer("key_sets", key_sets, 1)
    r = eq12_data(ds, N, beta, queries, key_sets, seed)
    return Experiment(frame(r["recs"]), r["table"], eq12_checks(r), plot_eq12, r)
