"""mindthegap (Naderi, Nait Saada & Tanner, ICML 2025) experiments as functions (docs/theory.md §5).

One registered function per claim, each seeded, returning data and never printing:

- ``mindthegap.prop1``: ``s2(sqrt(T) A) -> 2 sigma_A`` (Thm 2) and the quarter-circle law of
  ``sqrt(T) A_perp`` (Lemma 3) for Random Markov matrices and for first-layer key-query attention
  (Prop. 1), side by side with the same ``sigma_A``.
- ``mindthegap.prop3_5``: stable rank of ``Sigma_l = X_l X_l^T`` over T and depth, with and
  without the gap (Props. 3, 5).
- ``mindthegap.prop4_6_fig5``: ``||dX_L / dW_l^V||_F^2`` over T, with and without the gap, by
  autograd in torch float64 (Props. 4, 6, Fig. 5; key-query attention as in Figs. 6, 10).
- ``mindthegap.fig7``: number of eigenvalues with ``|lambda| > 0.5`` of each layer's key-query
  attention matrix at T = 100 (Fig. 7).

The formulas come from :mod:`sigprop.theory.spectral`; where a proposition's constant or rate
differs from simulation, that module's docstrings and tests/experiments/test_mindthegap.py give
the measured numbers. Dense NumPy / torch linear algebra is used (T up to ~2048).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy import stats

from .. import trajectory as _traj
from ..theory import spectral as sp
from . import register

__all__ = ["prop1", "prop3_5", "prop4_6_fig5", "fig7", "tokens", "loglog_slope"]


def _one_thread(fn: Callable) -> Callable:
    """Run ``fn`` with torch single-threaded (restored after): torch's OpenMP pool next to
    BLAS/LAPACK was measured 8x slower on the shared 2-core box (cf. measure.observables._lapack);
    NumPy's BLAS threads follow ``OPENBLAS_NUM_THREADS`` (tests set 1)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(n)
    return wrapper


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check(name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}")


def _check_Ts(Ts: Sequence[int], low: int = 8) -> np.ndarray:
    Ts = np.asarray(Ts, dtype=int)
    _check("Ts", Ts.ndim == 1 and Ts.size >= 2 and bool(np.all(Ts >= low))
           and bool(np.all(np.diff(Ts) > 0)), f"an increasing list of >= 2 sizes, each >= {low}")
    return Ts


def tokens(T: int, d: int, rho: float = 0.0, seed=0) -> np.ndarray:
    """Unit-norm tokens (T, d) with pairwise cosine ``rho``: ``sqrt(1-rho) e_a + sqrt(rho) u``.

    ``e_a`` orthonormal, ``u`` a unit vector orthogonal to them (random orientation, so needs
    ``d >= T + 1`` when ``rho > 0``); ``rho = 0`` gives orthonormal rows (``X X^T = I``, the
    isometric input of mindthegap Sec. 2).
    """
    _check("rho", 0.0 <= rho < 1.0, "in [0, 1)")
    _check("d", d >= T + (rho > 0), "at least T (T + 1 when rho > 0)")
    rng = _rng(seed)
    Q = np.linalg.qr(rng.standard_normal((d, T + (rho > 0))))[0].T  # orthonormal rows
    return Q[:T] if rho == 0 else math.sqrt(1.0 - rho) * Q[:T] + math.sqrt(rho) * Q[T]


def loglog_slope(x, y) -> np.ndarray:
    """Least-squares slope of ``log y`` against ``log x`` along the last axis of ``y``."""
    lx = np.log(np.asarray(x, dtype=np.float64))
    ly = np.log(np.asarray(y, dtype=np.float64))
    lx = lx - lx.mean()
    return ((ly - ly.mean(axis=-1, keepdims=True)) * lx).sum(axis=-1) / (lx**2).sum()


def _mean_se(a, axis=-1):
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[axis]
    se = a.std(axis=axis, ddof=1) / math.sqrt(n) if n > 1 else np.full(a.mean(axis).shape, np.nan)
    return a.mean(axis=axis), se


def _softmax_rows(S: np.ndarray) -> np.ndarray:
    Z = np.exp(S - S.max(axis=-1, keepdims=True))
    return Z / Z.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Prop. 1, Thm 2, Lemma 3
# ---------------------------------------------------------------------------------------------


@register("mindthegap.prop1")
@_one_thread
def prop1(Ts: Sequence[int] = (256, 512, 1024), sigma_A: float = 0.5, qk_ratio: float = 4.0,
          rho: float = 0.0, n_seeds: int = 3, bins: int = 24, seed: int = 0) -> dict:
    """Thm 2 / Lemma 3 for Random Markov matrices and first-layer key-query attention (Prop. 1).

    ``markov``: :func:`sp.random_markov` of parameter ``sigma_A``. ``keyquery``:
    ``softmax(X0 W_Q W_K^T X0^T / sqrt(d_qk))`` on :func:`tokens` of cosine ``rho``, with
    ``d_qk = qk_ratio * T`` and ``W_Q, W_K`` i.i.d. ``N(0, sigma_qk^2)``, ``sigma_qk^2`` chosen so
    that ``sp.softmax_sigma_A(sigma_qk^2, rho) = sigma_A`` (same sigma_A in both ensembles).

    Returns per ensemble arrays of shape (len(Ts), n_seeds): ``s1`` = s1(A) (Thm 2: 1), ``s2`` =
    s2(sqrt(T) A) (Thm 2: 2 sigma_A), ``s2_spike`` = :func:`sp.s2_entry_spike` of the largest
    entry of ``sqrt(T) A_perp``, ``top_perp`` = s1(A_perp) (0 in the limit for rho = 0;
    :func:`sp.centred_outlier_rho` otherwise), ``ks`` = KS distance of the singular values of
    ``sqrt(T) A_perp`` to :func:`sp.quarter_circle_cdf` (outlier of rho > 0 dropped), ``m2``,
    ``m4`` = their 2nd / 4th moments over ``sigma_A^2`` / ``sigma_A^4`` (quarter circle: 1, 2;
    key-query: :func:`sp.kq_bulk_m4`; for rho > 0 the outlier takes ``top_perp^2`` of the
    variance, so ``m2 = 1 - top_perp^2 / sigma_A^2``), ``hist_<ensemble>`` (binned density at
    the largest T, first seed; ``hist_theory`` the quarter circle's) and ``l1`` (binned L1
    distance to the quarter circle), plus the theory values.
    """
    Ts = _check_Ts(Ts)
    _check("sigma_A", sigma_A > 0, "> 0")
    _check("qk_ratio", qk_ratio > 0, "> 0")
    _check("n_seeds", n_seeds >= 1, ">= 1")
    _check("bins", bins >= 2, ">= 2")
    rng = _rng(seed)
    sigma_qk2 = float(sp.logit_std_for_sigma_A(sigma_A)) / math.sqrt(1.0 - rho)
    edges = np.linspace(0.0, 2.5 * sigma_A, bins + 1)
    qc_mass = np.diff(sp.quarter_circle_cdf(edges, sigma_A))
    keys = ("s1", "s2", "s2_spike", "top_perp", "ks", "m2", "m4", "l1")
    out: dict = {"T": Ts, "sigma_A": sigma_A, "sigma_qk2": sigma_qk2, "rho": rho,
                 "d_qk": np.maximum(1, np.round(qk_ratio * Ts)).astype(int), "edges": edges,
                 "hist_theory": qc_mass / np.diff(edges), "s2_limit": float(sp.s2_limit(sigma_A))}
    res = {e: {k: np.empty((len(Ts), n_seeds)) for k in keys} for e in ("markov", "keyquery")}
    for i, T in enumerate(Ts):
        d_qk = int(out["d_qk"][i])
        for j in range(n_seeds):
            mats = {"markov": sp.random_markov(T, sigma_A, seed=rng)}
            X0 = tokens(T, T + (rho > 0), rho, seed=rng)
            WQ = math.sqrt(sigma_qk2) * rng.standard_normal((X0.shape[1], d_qk))
            WK = math.sqrt(sigma_qk2) * rng.standard_normal((X0.shape[1], d_qk))
            mats["keyquery"] = _softmax_rows((X0 @ WQ) @ (X0 @ WK).T / math.sqrt(d_qk))
            for e, A in mats.items():
                r = res[e]
                s = np.linalg.svd(A, compute_uv=False)
                B = math.sqrt(T) * sp.centred(A)
                sp_ = np.linalg.svd(B, compute_uv=False)
                bulk = sp_[1:] if rho > 0 and e == "keyquery" else sp_
                r["s1"][i, j], r["s2"][i, j] = s[0], math.sqrt(T) * s[1]
                r["s2_spike"][i, j] = float(sp.s2_entry_spike(B.max(), sigma_A))
                r["top_perp"][i, j] = sp_[0] / math.sqrt(T)
                r["ks"][i, j] = stats.kstest(
                    bulk, lambda x: sp.quarter_circle_cdf(x, sigma_A)).statistic
                r["m2"][i, j] = np.mean(bulk**2) / sigma_A**2
                r["m4"][i, j] = np.mean(bulk**4) / sigma_A**4
                counts = np.histogram(bulk, edges)[0] / bulk.size
                r["l1"][i, j] = np.abs(counts - qc_mass).sum()
                if i == len(Ts) - 1 and j == 0:
                    out[f"hist_{e}"] = counts / np.diff(edges)
    out.update(res)
    out["m4_theory"] = {"markov": 2.0,
                        "keyquery": sp.kq_bulk_m4(sigma_A, Ts / out["d_qk"]) / sigma_A**4}
    out["top_perp_theory"] = top = float(sp.centred_outlier_rho(sigma_qk2, rho))
    out["m2_theory"] = {"markov": 1.0, "keyquery": 1.0 - top**2 / sigma_A**2}
    return out


# ---------------------------------------------------------------------------------------------
# Props. 3 and 5: stable rank in width and depth
# ---------------------------------------------------------------------------------------------


@register("mindthegap.prop3_5")
@_one_thread
def prop3_5(Ts: Sequence[int] = (64, 128, 256), depth: int = 3, sigma_A: float = 0.5,
            sigma_V: float = 1.0, n_seeds: int = 4, seed: int = 0) -> dict:
    """Stable rank of ``Sigma_l = X_l X_l^T`` over T and layers, gap kept or removed (gamma = 1).

    ``X_l`` from :func:`sp.attention_only_forward` with ``X0 = I_T`` (d = T), uncentred and
    centred with the same seeds. Returns ``excess`` = ``sr(Sigma_l) - 1`` computed as
    ``sum_{i>1} s_i^4 / s_1^4`` (no cancellation), shape (len(Ts), depth, n_seeds), its
    per-seed log-log ``slope`` over T (shape (depth, n_seeds)) with ``slope_mean/se``, against
    :func:`sp.sr_excess_uncentred` (rate ``1 - 2l``) and Prop. 3's printed ``1 - 4l``;
    ``ratio_perp`` = ``sr(Sigma_l^perp) / T`` against :func:`sp.sr_ratio_centred_gamma1`
    (Prop. 5's ``C_l``); and ``trajectory``: stable_rank rows (measured / theory_asymptotic)
    with ``seq_len`` and ``attention`` (softmax / centred) columns.
    """
    Ts = _check_Ts(Ts)
    _check("depth", depth >= 1, ">= 1")
    _check("n_seeds", n_seeds >= 2, ">= 2")
    layers = np.arange(1, depth + 1)
    excess = np.empty((len(Ts), depth, n_seeds))
    ratio = np.empty_like(excess)
    for i, T in enumerate(Ts):
        for j in range(n_seeds):
            s_ = int(np.random.SeedSequence([seed, int(T), j]).generate_state(1)[0])
            X = sp.attention_only_forward(np.eye(T), depth, sigma_A, sigma_V, seed=s_)
            Xc = sp.attention_only_forward(np.eye(T), depth, sigma_A, sigma_V, True, seed=s_)
            for l in layers:
                s = np.linalg.svd(X[l], compute_uv=False)
                excess[i, l - 1, j] = ((s[1:] / s[0]) ** 4).sum()
                sc = np.linalg.svd(Xc[l], compute_uv=False) ** 2
                ratio[i, l - 1, j] = (sc**2).sum() / sc[0] ** 2 / T
    slope = loglog_slope(Ts, np.moveaxis(excess, 0, -1))  # (depth, n_seeds)
    theory_excess = sp.sr_excess_uncentred(layers[None, :], sigma_A, 1.0, Ts[:, None])
    C = sp.sr_ratio_centred_gamma1(layers)
    rows = []
    for i, T in enumerate(Ts):
        for k, l in enumerate(layers):
            for att, meas, th in (("softmax", 1.0 + excess[i, k], 1.0 + theory_excess[i, k]),
                                  ("centred", T * ratio[i, k], T * C[k])):
                m, se = _mean_se(meas)
                rows += [dict(layer=l, observable="stable_rank", source="measured", value=m,
                              stderr=se, seq_len=int(T), attention=att),
                         dict(layer=l, observable="stable_rank", source="theory_asymptotic",
                              value=th, seq_len=int(T), attention=att)]
    sm, sse = _mean_se(slope)
    return {"T": Ts, "layers": layers, "excess": excess, "ratio_perp": ratio,
            "excess_theory": theory_excess, "slope": slope, "slope_mean": sm, "slope_se": sse,
            "slope_theory": 1.0 - 2.0 * layers, "slope_prop3": 1.0 - 4.0 * layers,
            "C_l": C, "trajectory": _traj.make(rows)}


# ---------------------------------------------------------------------------------------------
# Props. 4 and 6, Fig. 5: gradient norms
# ---------------------------------------------------------------------------------------------


def _grad_norms(T, d, L, sigma_A, sigma_V, centre, attention, sigma_qk, n_probes, seed):
    """``||dX_L/dW_l^V||_F^2`` for l = 1..L by autograd, float64, Hutchinson over ``n_probes``.

    ``E_G ||grad_W <G, X_L>||^2 = ||J||_F^2`` for G i.i.d. N(0, 1) (exact in expectation for
    any attention, also key-query attention that depends on the W^V of earlier layers). For
    Random Markov attention the exact ``||P_1||_F^2 ||P_2||_F^2`` (Eq. 19) is returned too.
    """
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    X0 = torch.from_numpy(tokens(T, d, 0.0, seed=seed))
    Ws = [(sigma_V * torch.randn(d, d, generator=g, dtype=f64)).requires_grad_()
          for _ in range(L)]
    X, As = X0, []
    for l in range(L):
        if attention == "markov":
            A = torch.from_numpy(sp.random_markov(T, sigma_A, seed=seed * 1000 + l))
        else:
            WQ, WK = (sigma_qk * torch.randn(d, d, generator=g, dtype=f64) for _ in range(2))
            A = torch.softmax((X @ WQ) @ (X @ WK).T / math.sqrt(d), dim=-1)
        A = A - 1.0 / T if centre else A
        As.append(A.detach())
        X = A @ X @ Ws[l]
    est = np.zeros(L)
    for _ in range(n_probes):
        G = torch.randn(X.shape, generator=g, dtype=f64)
        grads = torch.autograd.grad((G * X).sum(), Ws, retain_graph=True)
        est += np.array([float(gr.pow(2).sum()) for gr in grads]) / n_probes
    exact = np.full(L, np.nan)
    if attention == "markov":
        with torch.no_grad():
            W = [w.detach() for w in Ws]
            PA = torch.linalg.multi_dot([*As[::-1], X0])
            for l in range(L):
                P1 = PA
                for w in W[:l]:
                    P1 = P1 @ w
                P2 = torch.eye(d, dtype=f64)
                for w in W[l + 1:]:
                    P2 = P2 @ w
                exact[l] = float(P1.pow(2).sum() * P2.pow(2).sum())
    return est, exact


@register("mindthegap.prop4_6_fig5")
@_one_thread
def prop4_6_fig5(Ts: Sequence[int] = (64, 128, 256), depths: Sequence[int] = (1, 2, 3),
                 sigma_A: float = 1.0, sigma_V: float = 1.0, attention: str = "markov",
                 sigma_qk: float = 1.0, n_seeds: int = 3, n_probes: int = 8,
                 seed: int = 0) -> dict:
    """Gradient norm ``||dX_L/dW_l^V||_F^2`` over T (gamma = 1), with and without the gap.

    ``attention="markov"``: Random Markov ``A_l`` (mindthegap Eq. 3, Props. 4, 6);
    ``"keyquery"``: ``softmax(X W_Q W_K^T X^T / sqrt(d))`` of the current layer's input with
    ``N(0, sigma_qk^2)`` weights (the paper's "A(X)", Figs. 6, 10). ``W^V`` i.i.d.
    ``N(0, sigma_V^2)`` unscaled, orthonormal ``X0``, torch float64, autograd.

    Returns, per depth ``L`` and variant (``"gap"``: A, ``"perp"``: A_perp): ``grad[L][v]``
    (len(Ts), n_seeds, L) autograd estimates (Hutchinson: relative noise ~ sqrt(2 / (d
    n_probes)) per entry, more when P_2 is a long product), ``exact[L][v]`` (Random Markov only,
    Eq. 19), ``slope[L][v]`` / ``slope_exact[L][v]`` per-seed log-log slopes (n_seeds, L) of
    the autograd / exact norms, ``theory[L][v]`` from
    :func:`sp.grad_norm_value` (Random Markov model) and the propositions' exponents
    ``prop4_exponent[L]`` (= L - 1 for L >= 2, 1 for L = 1; a lower bound) and
    ``prop6_exponent`` (= 1); ``trajectory`` holds grad_v rows (layer = l, ``depth``,
    ``seq_len``, ``attention``).
    """
    Ts = _check_Ts(Ts)
    _check("attention", attention in ("markov", "keyquery"), "'markov' or 'keyquery'")
    _check("depths", len(depths) >= 1 and min(depths) >= 1, "a list of depths >= 1")
    _check("n_seeds", n_seeds >= 2, ">= 2")
    _check("n_probes", n_probes >= 1, ">= 1")
    out: dict = {"T": Ts, "depths": tuple(depths), "grad": {}, "exact": {}, "slope": {},
                 "slope_exact": {}, "theory": {}, "prop4_exponent": {}, "prop6_exponent": 1.0}
    rows = []
    for L in depths:
        out["prop4_exponent"][L] = float(L - 1) if L >= 2 else 1.0
        for key in ("grad", "exact", "slope", "slope_exact", "theory"):
            out[key][L] = {}
        for v, centre in (("gap", False), ("perp", True)):
            est = np.empty((len(Ts), n_seeds, L))
            exact = np.empty_like(est)
            for i, T in enumerate(Ts):
                for j in range(n_seeds):
                    s_ = int(np.random.SeedSequence([seed, L, int(T), j]).generate_state(1)[0])
                    est[i, j], exact[i, j] = _grad_norms(int(T), int(T), L, sigma_A, sigma_V,
                                                         centre, attention, sigma_qk,
                                                         n_probes, s_ % 2**31)
            th = sp.grad_norm_value(L, sigma_A, sigma_V, Ts, Ts, centre)
            out["grad"][L][v], out["exact"][L][v], out["theory"][L][v] = est, exact, th
            out["slope"][L][v] = loglog_slope(Ts, np.moveaxis(est, 0, -1))
            if attention == "markov":
                out["slope_exact"][L][v] = loglog_slope(Ts, np.moveaxis(exact, 0, -1))
            for i, T in enumerate(Ts):
                m, se = _mean_se(est[i].T)
                for l in range(L):
                    rows.append(dict(layer=l + 1, observable="grad_v", source="measured",
                                     value=m[l], stderr=se[l], seq_len=int(T), depth=L,
                                     attention="softmax" if v == "gap" else "centred"))
    out["trajectory"] = _traj.make(rows)
    return out


# ---------------------------------------------------------------------------------------------
# Fig. 7: outlier eigenvalues across layers of key-query attention
# ---------------------------------------------------------------------------------------------


@register("mindthegap.fig7")
@_one_thread
def fig7(T: int = 100, d: int = 100, depth: int = 8, sigma_qk: float = 1.0,
         sigma_V: float = 1.0, threshold: float = 0.5, skip: bool = False,
         layernorm: bool = False, n_seeds: int = 16, seed: int = 0) -> dict:
    """Eigenvalues ``|lambda| > threshold`` of each layer's key-query attention (mindthegap Fig. 7).

    Model: ``X_l = A_l(X_(l-1)) X_(l-1) W_l^V`` (mindthegap Eq. 3 with ``A(X)``, App. A.3.1),
    ``A(X) = softmax(X W_Q W_K^T X^T / sqrt(d))``, ``W_Q, W_K ~ N(0, sigma_qk^2)``,
    ``W^V ~ N(0, sigma_V^2)`` unscaled, orthonormal ``X0``; optional ``skip`` (``+ X_(l-1)``) and
    ``layernorm`` (each token rescaled to unit norm, the input's scale). Layer 1 is a Random
    Markov matrix (Prop. 1) of radius ``sigma_A / sqrt(T) = 0.13`` plus the outlier 1.

    Returns ``counts`` (n_seeds, depth), ``mean``, ``stderr`` per layer, ``entropy`` (mean row
    entropy / log T, 1 = uniform) per layer, and ``peak_layer`` (1-based) of the mean count.
    """
    _check("T", T >= 4, ">= 4")
    _check("d", d >= T, ">= T")
    _check("depth", depth >= 1, ">= 1")
    _check("n_seeds", n_seeds >= 2, ">= 2")
    _check("threshold", threshold > 0, "> 0")
    counts = np.zeros((n_seeds, depth), dtype=int)
    ent = np.zeros((n_seeds, depth))
    for j in range(n_seeds):
        rng = np.random.default_rng(np.random.SeedSequence([seed, j]))
        X = tokens(T, d, 0.0, seed=rng)
        for l in range(depth):
            WQ, WK = (sigma_qk * rng.standard_normal((d, d)) for _ in range(2))
            A = _softmax_rows((X @ WQ) @ (X @ WK).T / math.sqrt(d))
            counts[j, l] = int((np.abs(np.linalg.eigvals(A)) > threshold).sum())
            logA = np.log(np.maximum(A, np.finfo(np.float64).tiny))
            ent[j, l] = -(A * logA).sum(axis=-1).mean() / math.log(T)
            Y = A @ X @ (sigma_V * rng.standard_normal((d, d)))
            Y = Y + X if skip else Y
            X = Y / np.linalg.norm(Y, axis=-1, keepdims=True) if layernorm else Y
    mean, se = _mean_se(counts.T)
    return {"layers": np.arange(1, depth + 1), "counts": counts, "mean": mean, "stderr": se,
            "entropy": ent.mean(axis=0), "peak_layer": int(np.argmax(mean)) + 1,
            "threshold": threshold}
