"""mindthegap Sec. 4: moments of the covariance and Jacobian spectra without the gap.
``prop7`` (eigenvalues of Sigma_l^perp, Eqs. 12-13, Lemma 4) and ``prop8`` (squared singular
values of the input-output Jacobian, Eqs. 16-18)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ...theory import spectral as sp
from .. import args
from ..core import Check, Experiment, frame, mean_se, register
from ..plots import axes_grid, decorate, titled
from .common import plt_colours, rng_of, sub, tokens

__all__ = ["prop7", "prop8", "prop8_data", "prop8_checks", "plot_prop8", "perp_stack"]


#: The sizes of Props. 7 and 8 (the same widths gamma = T/d and depths).
_MOMENT_SIZES = dict(tiny=dict(T=128, gammas=(1.0, 0.5), depth=3, n_seeds=4),
                     quick=dict(T=256, gammas=(1.0, 0.5), depth=3, n_seeds=3),
                     full=dict(T=1024, gammas=(1.0, 0.5, 0.25), depth=4, n_seeds=4))


def _check_gammas(gammas) -> None:
    """``gammas = T / d``: a non-empty list of numbers in (0, 1] (kept as given)."""
    args.need("gammas", len(gammas) >= 1 and all(0 < g <= 1 for g in gammas),
              f"a list of numbers in (0, 1] (got {gammas!r})")


def _moment_args(T, gammas, depth, n_seeds) -> tuple[int, int, int]:
    """Props. 7 and 8's checked sizes ``(T, depth, n_seeds)``, the widths ``gammas`` checked
    on the way (:func:`_check_gammas`)."""
    T = args.integer("T", T, 16)
    _check_gammas(gammas)
    return T, args.integer("depth", depth, 1), args.integer("n_seeds", n_seeds, 1)


def _moment_item(name: str, runtime: dict):
    """Register ``body(T, gammas, depth, sigma_A, sigma_V, n_seeds, seed) -> Experiment`` as
    the item ``name``: Props. 7 and 8 take the same keywords and sizes, checked the same way
    (:func:`_moment_args`)."""
    def deco(body):
        def item(*, seed: int = 0, device: str = "cpu", T: int = 256,
                 gammas: Sequence[float] = (1.0, 0.5), depth: int = 3, sigma_A: float = 0.5,
                 sigma_V: float = 2.0, n_seeds: int = 3) -> Experiment:
            T, depth, n_seeds = _moment_args(T, gammas, depth, n_seeds)
            return body(T, gammas, depth, sigma_A, sigma_V, n_seeds, seed)
        item.__name__ = item.__qualname__ = body.__name__
        return register(name, **_MOMENT_SIZES, runtime=runtime)(item)
    return deco


def perp_stack(T: int, d: int, depth: int, sigma_A: float, sigma_V: float, seed) -> tuple:
    """``(A_perp products, W products, X_l)`` for l = 1..depth of Eq. 9 (X_0 orthonormal)."""
    rng = rng_of(seed)
    X = tokens(T, d, 0.0, seed=rng)
    PA, PW, Xs = np.eye(T), np.eye(d), []
    for _ in range(depth):
        A = sp.centred(sp.random_markov(T, sigma_A, seed=rng))
        W = sigma_V * rng.standard_normal((d, d))
        PA, PW = A @ PA, PW @ W
        X = A @ X @ W
        Xs.append(X)
    return PA, PW, Xs


def plot_prop7(r: dict, ax=None):
    """Prop. 7: the eigenvalue mean (left) and variance ratio (right) of Sigma_l^perp per
    layer and gamma; ``ax``: two Axes, or None for a new figure."""
    gammas, tab, T, sigma_A, sigma_V = r["gammas"], r["tab"], r["T"], r["sigma_A"], r["sigma_V"]
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 2, (4.4 * 2, 3.5))
    cols = plt_colours(len(gammas))
    panels = (("mean", "mean_theory", r"E$(Z)$, $Z$ eigenvalue of $\Sigma^\perp_\ell$",
               "lines: Eq. 12"),
              ("var_over_mean2", "var_theory", "Var(Z) / E(Z)²", "lines: Eq. 13, ℓ(1+γ)"))
    for k, (a, (measured, theory, ylabel, lines)) in enumerate(zip(ax[0], panels, strict=True)):
        for c, g in zip(cols, gammas, strict=False):
            t = tab[tab.gamma == g]
            a.plot(t["layer"], t[measured], "o", color=c, label=f"γ = {g:g}")
            a.plot(t["layer"], t[theory], "-", color=c, lw=1)
        if k == 0:
            a.set_yscale("log")
        decorate(a, "layer ℓ", ylabel, legend_title=lines, title_fontsize=7)
    return titled(fig, f"mindthegap Prop. 7 (T = {T}, σ_A = {sigma_A:g}, σ_V = {sigma_V:g})", own)


@_moment_item("mindthegap.prop7", runtime={"tiny": 0.2, "quick": 0.5, "default": 0.5})
def prop7(T: int, gammas, depth: int, sigma_A: float, sigma_V: float, n_seeds: int,
          seed) -> Experiment:
    layers = np.arange(1, depth + 1)
    rows, table, checks = [], [], []
    hist = {}
    for gi, g in enumerate(gammas):
        d = int(round(T / g))
        mean = np.empty((depth, n_seeds))
        var = np.empty_like(mean)
        for j in range(n_seeds):
            _, _, Xs = perp_stack(T, d, depth, sigma_A, sigma_V, sub(seed, 7, gi, j))
            for k, X in enumerate(Xs):
                ev = np.linalg.svd(X, compute_uv=False) ** 2  # eigenvalues of Sigma_l^perp
                mean[k, j], var[k, j] = ev.mean(), ev.var()
                if j == 0 and gi == 0:
                    hist[k + 1] = ev / ev.mean()
        th_m, th_v = sp.prop7_moments(layers, sigma_A, sigma_V, g)
        mm, mse = mean_se(mean)
        rv, rvse = mean_se(var / mean**2)
        for k, l in enumerate(layers):
            rows += [dict(observable="sigma_perp_mean", source="measured", value=mm[k],
                          stderr=mse[k], layer=int(l), gamma=g, T=T, d=d),
                     dict(observable="sigma_perp_mean", source="theory", value=float(th_m[k]),
                          layer=int(l), gamma=g, T=T, d=d),
                     dict(observable="sigma_perp_var_over_mean2", source="measured",
                          value=rv[k], stderr=rvse[k], layer=int(l), gamma=g, T=T, d=d),
                     dict(observable="sigma_perp_var_over_mean2", source="theory",
                          value=float(th_v[k] / th_m[k] ** 2), layer=int(l), gamma=g, T=T,
                          d=d)]
            table.append(dict(gamma=g, layer=int(l), T=T, d=d, mean=mm[k],
                              mean_theory=float(th_m[k]), mean_rel=mm[k] / th_m[k],
                              var_over_mean2=rv[k], var_theory=float(l * (1 + g))))
        rel = mm / th_m
        tol_m = 0.03 + 0.5 * depth / math.sqrt(T * n_seeds)
        checks.append(Check.within(
            f"Prop. 7 Eq. 12: mean eigenvalue / (sigma_A sigma_V / sqrt(gamma))^(2l), gamma = "
            f"{g:g} (worst l)", float(rel[np.argmax(np.abs(rel - 1))]), 1 - tol_m, 1 + tol_m,
            why="finite-T row-normalisation bias (-0.3 to -2.2 % at T = 400, compounding with l) "
            f"and the seed spread of the trace (~ 0.5 l / sqrt(T n_seeds)): tol 3 % + 0.5 depth / "
            f"sqrt(T n_seeds) = {tol_m:.3f}"))
        rr = rv / (layers * (1 + g))
        tol_v = 0.05 + depth / math.sqrt(T * n_seeds)
        checks.append(Check.within(
            f"Prop. 7 Eq. 13 / Lemma 4: Var / mean^2 = l (1 + gamma), gamma = {g:g} (worst l, "
            "ratio)", float(rr[np.argmax(np.abs(rr - 1))]), 1 - tol_v, 1 + tol_v,
            why="a 4th-moment statistic, dominated by the few largest eigenvalues: seed "
                "spread ~ l / sqrt(T n_seeds); tol 5 % + depth / sqrt(T n_seeds) = "
                f"{tol_v:.2f}"))
    tab = pd.DataFrame(table)
    r = dict(gammas=gammas, tab=tab, T=T, sigma_A=sigma_A, sigma_V=sigma_V,
             sigma_AV=sigma_A * sigma_V)
    return Experiment(frame(rows), tab, checks, plot_prop7, r)


def _jacobian_check(seed: int) -> float:
    """Largest relative difference between the singular values of the autograd Jacobian
    dvec(X_2^perp)/dvec(X_0) and those of (A_2^perp A_1^perp) (x) (W_1 W_2) (Eq. 16)."""
    T, d = 5, 7
    rng = np.random.default_rng(seed)
    As = [torch.from_numpy(sp.centred(sp.random_markov(T, 1.0, seed=rng))) for _ in range(2)]
    Ws = [torch.from_numpy(rng.standard_normal((d, d))) for _ in range(2)]
    X0 = torch.from_numpy(tokens(T, d, 0.0, seed=rng))

    def f(X):
        for A, W in zip(As, Ws, strict=False):
            X = A @ X @ W
        return X

    J = torch.autograd.functional.jacobian(f, X0).reshape(T * d, T * d).numpy()
    K = np.kron((As[1] @ As[0]).numpy(), (Ws[0] @ Ws[1]).numpy())
    s1, s2 = (np.linalg.svd(M, compute_uv=False) for M in (J, K))
    keep = s2 > 1e-8 * s2[0]  # A_perp has a null vector: drop the zero singular values
    return float(np.max(np.abs(s1[keep] - s2[keep]) / s2[keep]))


def prop8_data(T, gammas, depth, sigma_A, sigma_V, n_seeds, seed) -> dict:
    """Mean and Var / mean^2 of the Jacobian's squared singular values per gamma and layer
    (from the factors' moments), Prop. 8's values, tidy rows and the table."""
    layers = np.arange(1, depth + 1)
    paper_m, paper_v = sp.prop8_moments(layers, sigma_A, sigma_V)
    rows, table = [], []
    res = {}
    for gi, g in enumerate(gammas):
        d = int(round(T / g))
        m1 = np.empty((depth, n_seeds))
        m2 = np.empty_like(m1)
        for j in range(n_seeds):
            rng = rng_of(sub(seed, 8, gi, j))
            PA, PW = np.eye(T), np.eye(d)
            for k in range(depth):
                PA = sp.centred(sp.random_markov(T, sigma_A, seed=rng)) @ PA
                PW = PW @ (sigma_V * rng.standard_normal((d, d)))
                a = np.linalg.svd(PA, compute_uv=False) ** 2
                w = np.linalg.svd(PW, compute_uv=False) ** 2
                # moments of the squared singular values of a Kronecker product: products
                m1[k, j] = a.mean() * w.mean()
                m2[k, j] = (a**2).mean() * (w**2).mean()
        mean = m1.mean(axis=1)
        rv = (m2 / m1**2 - 1).mean(axis=1)
        res[g] = (mean, rv)
        for k, l in enumerate(layers):
            rows += [dict(observable="jac_sq_sv_mean", source="measured", value=mean[k],
                          stderr=float(m1[k].std(ddof=1) / math.sqrt(n_seeds))
                          if n_seeds > 1 else np.nan, layer=int(l), gamma=g, T=T, d=d),
                     dict(observable="jac_sq_sv_mean", source="paper", value=float(paper_m[k]),
                          layer=int(l), gamma=g),
                     dict(observable="jac_sq_sv_mean", source="theory",
                          value=float(paper_m[k] / g**l), layer=int(l), gamma=g),
                     dict(observable="jac_var_over_mean2", source="measured", value=rv[k],
                          layer=int(l), gamma=g, T=T, d=d),
                     dict(observable="jac_var_over_mean2", source="theory",
                          value=float(l * (l + 2)), layer=int(l), gamma=g)]
            table.append(dict(gamma=g, layer=int(l), T=T, d=d, mean=mean[k],
                              mean_paper=float(paper_m[k]), mean_sigprop=float(paper_m[k] / g**l),
                              var_over_mean2=rv[k], var_theory=float(l * (l + 2))))
    return dict(T=T, gammas=gammas, depth=depth, sigma_A=sigma_A, sigma_V=sigma_V,
                n_seeds=n_seeds, layers=layers, paper_m=paper_m, res=res, rows=rows,
                table=pd.DataFrame(table), err=_jacobian_check(sub(seed, 16)))


def prop8_checks(r: dict) -> list[Check]:
    """Eq. 16 (autograd), Eq. 18 at every gamma, Eq. 17 at gamma = 1 and its differing
    normalisation elsewhere, on :func:`prop8_data`'s result."""
    T, depth, n_seeds, layers, paper_m = (r[k] for k in ("T", "depth", "n_seeds", "layers",
                                                          "paper_m"))
    err, gammas, res = r["err"], r["gammas"], r["res"]
    tol_m = 0.03 + 0.5 * depth / math.sqrt(T * n_seeds)
    tol_v = 0.05 + depth / math.sqrt(T * n_seeds)
    checks = [Check.within("Eq. 16: the Jacobian dvec(X_l^perp)/dvec(X_0) is the Kronecker "
                           "product of the attention and value products (singular values, "
                           "autograd, T = 5, d = 7, l = 2)", err, 0.0, 1e-9,
                           why="an identity: float64 rounding only")]
    for g in gammas:
        mean, rv = res[g]
        rel = mean / paper_m
        rr = rv / (layers * (layers + 2))
        checks.append(Check.within(
            f"Eq. 18: Var / mean^2 of the squared singular values = l (l + 2), gamma = {g:g} "
            "(worst l, ratio)", float(rr[np.argmax(np.abs(rr - 1))]), 1 - tol_v, 1 + tol_v,
            why="a 4th-moment statistic of both factors (Fuss-Catalan edges): seed spread ~ "
                f"l / sqrt(T n_seeds); tol 5 % + depth / sqrt(T n_seeds) = {tol_v:.2f}"))
        if g == 1.0:
            checks.append(Check.within(
                "Eq. 17 at gamma = 1: mean / (sigma_A sigma_V)^(2l) (worst l)",
                float(rel[np.argmax(np.abs(rel - 1))]), 1 - tol_m, 1 + tol_m,
                why=f"row-normalisation bias and seed spread of the traces: tol 3 % + 0.5 depth "
                f"/ sqrt(T n_seeds) = {tol_m:.3f}"))
        else:
            for k, l in enumerate(layers):
                target = g ** (-float(l))
                checks.append(Check.differs(
                    f"Eq. 17 at gamma = {g:g}: mean / (sigma_A sigma_V)^(2l), l = {l}",
                    rel[k], target * (1 - tol_m), target * (1 + tol_m),
                    paper="(sigma_A sigma_V)^(2l) at any gamma (ratio 1)",
                    why=f"the unscaled Jacobian's mean is (sigma_A^2 / T)^l (d sigma_V^2)^l = "
                        f"(sigma_A sigma_V)^(2l) / gamma^l = {target:g} x the paper's; Eq. 17 "
                        f"holds for gamma^(l/2) J_l (sigma_A^2/T per attention factor, "
                        f"d sigma_V^2 per value factor); tol {tol_m:.3f}"))
    return checks


def plot_prop8(r: dict, ax=None):
    """Mean (left) and Var / mean^2 (right) of the squared singular values over layers."""
    own = ax is None  # the plot made the figure: it may title it
    fig, ax = axes_grid(ax, 1, 2, (4.4 * 2, 3.5))
    layers, paper_m, gammas, res = r["layers"], r["paper_m"], r["gammas"], r["res"]
    T, sigma_A, sigma_V = r["T"], r["sigma_A"], r["sigma_V"]
    a, b = ax[0]
    cols = plt_colours(len(gammas))
    for c, g in zip(cols, gammas, strict=False):
        mean, rv = res[g]
        a.plot(layers, mean, "o", color=c, label=f"measured, γ = {g:g}")
        a.plot(layers, paper_m / g**layers, "-", color=c, lw=1)
        b.plot(layers, rv, "o", color=c, label=f"γ = {g:g}")
    a.plot(layers, paper_m, "k--", lw=1, label="Eq. 17 (paper)")
    a.set_yscale("log")
    decorate(a, "layer ℓ", r"E$(Z)$, $Z$ squared singular value of $J_\ell$",
             legend_title=r"lines: $(\sigma_A\sigma_V)^{2\ell}/\gamma^\ell$", title_fontsize=7)
    b.plot(layers, layers * (layers + 2), "k-", lw=1, label="Eq. 18: ℓ(ℓ+2)")
    decorate(b, "layer ℓ", "Var(Z) / E(Z)²")
    return titled(fig, f"mindthegap Prop. 8 (T = {T}, σ_A = {sigma_A:g}, σ_V = {sigma_V:g})", own)


@_moment_item("mindthegap.prop8", runtime={"tiny": 0.3, "quick": 0.7, "default": 0.7})
def prop8(T: int, gammas, depth: int, sigma_A: float, sigma_V: float, n_seeds: int,
          seed) -> Experiment:
    r = prop8_data(T, gammas, depth, sigma_A, sigma_V, n_seeds, seed)
    return Experiment(frame(r["rows"]), r["table"], prop8_checks(r), plot_prop8, r)

