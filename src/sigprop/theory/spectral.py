"""Spectra of random attention (docs/theory.md §5; mindthegap = Naderi, Nait Saada & Tanner, ICML
2025).

Random Markov matrices (mindthegap Def. 1.1), their spectral gap (Thm 2), the centred attention
``A_perp = A - 11^T / T`` that removes it (Eq. 9), the quarter-circle law of its singular values
(Lemma 3), Fuss-Catalan numbers, the moment formulas of Props. 7 and 8, and the attention-only
network ``X_l = A_l X_{l-1} W_l^V`` (Eq. 3) in which Props. 3-8 are stated.

Conventions (those of mindthegap Sec. 2): ``T`` tokens, width ``d``, ``gamma = T / d``; the input
``X_0`` (T, d) has orthonormal rows (``X_0 X_0^T = I``); value matrices are d x d with i.i.d.
``N(0, sigma_V^2)`` entries, *not* divided by ``d`` (mindthegap's "Scaling of value matrices"
remark: the bulk of ``A`` is O(T^-1/2), which ``W^V`` of singular values O(sqrt d) compensates).
Everything is NumPy float64; random functions take ``seed`` (int or ``np.random.Generator``).

Where simulation disagrees with a stated constant, the function's docstring says so with numbers
(tests/theory/test_spectral.py holds the checks).
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np
from scipy import special

__all__ = [
    "random_markov",
    "softmax_sigma_A",
    "logit_std_for_sigma_A",
    "quarter_circle_pdf",
    "quarter_circle_cdf",
    "quarter_circle_mean",
    "s2_limit",
    "s2_entry_spike",
    "fuss_catalan",
    "prop7_moments",
    "prop8_moments",
    "centred",
    "attention_only_forward",
    "stable_rank",
    "sr_excess_uncentred",
    "sr_ratio_centred_gamma1",
    "kq_bulk_m4",
    "centred_outlier_rho",
    "grad_norm_value",
]


def _rng(seed) -> np.random.Generator:
    """A Generator from an int seed, or the Generator itself."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# sigma_A and its relation to softmax logits
# ---------------------------------------------------------------------------------------------


def softmax_sigma_A(sigma_s, rho=0.0):
    """sigma_A of softmax attention whose logits have std ``sigma_s`` and token cosine ``rho``.

    ``sigma_A = sqrt(exp(sigma_s^2 (1 - rho)) - 1)`` (docs/theory.md §5, §6). The part of a row's
    logits
    shared by all keys (variance ``sigma_s^2 rho``) cancels in the softmax, leaving i.i.d.
    ``N(0, s^2)`` logits with ``s^2 = sigma_s^2 (1 - rho)``; ``Z = e^logit`` is lognormal with
    ``std(Z) / mean(Z) = sqrt(e^{s^2} - 1)`` (mindthegap Def. 1.1 with ``sigma_A = sigma / m``).
    Vectorised (broadcasts ``sigma_s`` against ``rho``).
    """
    sigma_s = np.asarray(sigma_s, dtype=np.float64)
    rho = np.asarray(rho, dtype=np.float64)
    return np.sqrt(np.expm1(sigma_s**2 * (1.0 - rho)))


def logit_std_for_sigma_A(sigma_A):
    """Logit std giving a Random Markov softmax of ``sigma_A``: ``s = sqrt(log(1 + sigma_A^2))``.

    Inverse of :func:`softmax_sigma_A` at ``rho = 0`` (docs/theory.md §5). Vectorised.
    """
    sigma_A = np.asarray(sigma_A, dtype=np.float64)
    return np.sqrt(np.log1p(sigma_A**2))


# ---------------------------------------------------------------------------------------------
# Random Markov matrices and centring
# ---------------------------------------------------------------------------------------------


def random_markov(T, sigma_A=1.0, n=None, seed=0) -> np.ndarray:
    """Random Markov matrix (mindthegap Def. 1.1; docs/theory.md §5), shape (T, T) or (n, T, T).

    ``A_ij = Z_ij / sum_j Z_ij`` with ``Z_ij`` i.i.d. lognormal, ``std(Z) / mean(Z) = sigma_A``:
    ``Z = exp(N(mu, s^2))`` with ``e^{s^2} - 1 = sigma_A^2``. ``mu`` cancels in the row
    normalisation, so ``A`` is exactly the row-wise softmax of i.i.d. ``N(0, s^2)`` logits
    (mindthegap Prop. 1: first-layer key-query attention on orthonormal tokens). Rows sum to 1.
    ``sigma_A = 0`` gives uniform attention ``11^T / T``. ``n=None`` returns one (T, T) matrix;
    an integer ``n`` returns a batch (n, T, T).
    """
    rng = _rng(seed)
    s = float(logit_std_for_sigma_A(sigma_A))
    shape = (T, T) if n is None else (int(n), T, T)
    logits = s * rng.standard_normal(shape)
    logits -= logits.max(axis=-1, keepdims=True)
    Z = np.exp(logits)
    return Z / Z.sum(axis=-1, keepdims=True)


def centred(A) -> np.ndarray:
    """Centred attention ``A_perp = A - 11^T / T`` (mindthegap Eq. 8-9; docs/theory.md §2.4, §5).

    Works on (..., T, T) batches. For a row-stochastic ``A`` the rows of ``A_perp`` sum to 0, so
    ``A_perp 1 = 0``: the outlier eigenvalue 1 (the spectral gap of Thm 2) is removed.
    """
    A = np.asarray(A, dtype=np.float64)
    return A - 1.0 / A.shape[-1]


# ---------------------------------------------------------------------------------------------
# Limiting laws
# ---------------------------------------------------------------------------------------------


def quarter_circle_pdf(x, sigma_A):
    """Quarter-circle density ``sqrt(4 sigma_A^2 - x^2) / (pi sigma_A^2)`` on ``[0, 2 sigma_A]``.

    Limit of the empirical singular-value distribution of ``sqrt(T) A_perp`` (mindthegap Lemma 3,
    Eq. 31; docs/theory.md §5) and of ``sqrt(T) A`` minus its outlier. Zero outside the support.
    Vectorised (broadcasts ``x`` against ``sigma_A``).
    """
    x = np.asarray(x, dtype=np.float64)
    sigma_A = np.asarray(sigma_A, dtype=np.float64)
    inside = (x >= 0.0) & (x <= 2.0 * sigma_A)
    r2 = np.where(inside, 4.0 * sigma_A**2 - x**2, 0.0)
    return np.where(inside, np.sqrt(np.maximum(r2, 0.0)) / (np.pi * sigma_A**2), 0.0)


def quarter_circle_cdf(x, sigma_A):
    """CDF of :func:`quarter_circle_pdf`: ``(2/pi)(u sqrt(1 - u^2) + arcsin u)``, u = x/(2 sigma_A).

    Clipped to 0 below 0 and 1 above ``2 sigma_A``. Vectorised.
    """
    x = np.asarray(x, dtype=np.float64)
    u = np.clip(x / (2.0 * np.asarray(sigma_A, dtype=np.float64)), 0.0, 1.0)
    return (2.0 / np.pi) * (u * np.sqrt(1.0 - u**2) + np.arcsin(u))


def quarter_circle_mean(sigma_A):
    """Mean of the quarter-circle law, ``8 sigma_A / (3 pi)`` (second moment ``sigma_A^2``)."""
    return 8.0 * np.asarray(sigma_A, dtype=np.float64) / (3.0 * np.pi)


def s2_limit(sigma_A):
    """``lim_{T->inf} s_2(sqrt(T) A) = 2 sigma_A`` (mindthegap Thm 2, Eq. 2; Bordenave et al. 2011).

    The second singular value of the rescaled Random Markov matrix sits at the edge of the
    quarter-circle bulk, while ``s_1(A) -> 1``: the spectral gap is ``1 - 2 sigma_A / sqrt(T)``.
    At practical T the lognormal (softmax) entries break this for ``sigma_A >~ 1``: the largest
    entry of ``sqrt(T) A`` exceeds ``sigma_A`` and pulls ``s_2`` out of the bulk; see
    :func:`s2_entry_spike`. Measured s2 / (2 sigma_A) at T = 2000 over 20 seeds: sigma_A = 0.5:
    0.994-1.006; sigma_A = 1: median 1.01, max 1.24 (25 % of seeds above 1.05); sigma_A = 2:
    1.33-3.29.
    """
    return 2.0 * np.asarray(sigma_A, dtype=np.float64)


def s2_entry_spike(theta, sigma_A):
    """Finite-T ``s_2(sqrt(T) A)`` when one entry sticks out of the bulk (sigprop, not mindthegap).

    ``theta`` = largest entry of ``sqrt(T) A_perp``. A single entry ``theta`` is a rank-one spike
    on a bulk of i.i.d. entries of variance ``sigma_A^2 / T``; the spiked square-matrix
    (BBP-type) outlier is ``theta + sigma_A^2 / theta`` when ``theta > sigma_A``, otherwise ``s_2``
    stays at the edge ``2 sigma_A``. Returns ``max(2 sigma_A, theta + sigma_A^2 / theta)``.
    Measured at T = 1000-2000, sigma_A in {1, 1.31, 2}: s_2 within 8 % of this (within 4 % at
    sigma_A = 2), where Thm 2's ``2 sigma_A`` is off by up to 190 %. Vectorised.
    """
    theta = np.asarray(theta, dtype=np.float64)
    sigma_A = np.asarray(sigma_A, dtype=np.float64)
    spike = np.where(theta > sigma_A, theta + sigma_A**2 / np.maximum(theta, 1e-300), 0.0)
    return np.maximum(2.0 * sigma_A, spike)


def fuss_catalan(l, k):
    """Fuss-Catalan number ``FC_l(k) = binom(lk + k, k) / (lk + 1)`` (mindthegap, proof of Prop. 8).

    ``FC_l(k)`` is the k-th moment of the squared singular values of a product of ``l``
    independent square Ginibre matrices with unit-variance normalisation; ``FC_1`` are the Catalan
    numbers, ``FC_l(0) = 1``, ``FC_l(1) = 1``, ``FC_l(2) = l + 1``. Python ints in -> exact int
    out; arrays (or floats) -> float64 via the Gamma function, broadcast.
    """
    if isinstance(l, Integral) and isinstance(k, Integral):
        l, k = int(l), int(k)
        if l < 0 or k < 0:
            raise ValueError("fuss_catalan needs l >= 0 and k >= 0")
        num = math.comb(l * k + k, k)
        q, r = divmod(num, l * k + 1)
        assert r == 0  # FC_l(k) is always an integer
        return q
    l = np.asarray(l, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    return special.comb(l * k + k, k, exact=False) / (l * k + 1.0)


def prop7_moments(l, sigma_A, sigma_V, gamma):
    """Mean and variance of the limiting eigenvalue law of ``Sigma_l^perp`` (mindthegap Prop. 7).

    ``E Z = (sigma_A sigma_V / sqrt(gamma))^(2l)`` (Eq. 12),
    ``Var Z = l (1 + gamma) (sigma_A sigma_V / sqrt(gamma))^(4l)`` (Eq. 13); docs/theory.md §5.

    Normalisation: ``Sigma_l^perp = X_l X_l^T`` (T x T, unscaled) with
    ``X_l = A_l^perp ... A_1^perp X_0 W_1^V ... W_l^V`` (Eq. 9), ``X_0`` (T, d) orthonormal rows,
    ``W^V`` d x d i.i.d. ``N(0, sigma_V^2)``, ``A_l`` Random Markov of parameter ``sigma_A``,
    ``gamma = T / d``; ``Z`` is an eigenvalue drawn uniformly from the T eigenvalues (the moments
    are ``tr(Sigma)/T`` and ``tr(Sigma^2)/T - mean^2``). Simulation (T = 400, 4 seeds, l <= 3)
    agrees for ``gamma <= 1``: at sigma_A = 0.5 the mean is 0.3-2.2 % low (finite-T bias of the
    row normalisation, compounding with l) and ``Var/mean^2`` is within 2 % of ``l(1+gamma)``.

    ``gamma > 1`` (outside Prop. 7; ``X_0`` then has orthonormal *columns*, ``Sigma_0`` is a rank-d
    projection): the returned moments are those of the d *nonzero* eigenvalues (the law ``D_l``
    of the seed's remark after Prop. 7). Their mean is Eq. 12, but their variance is
    ``l (1 + 1/gamma) mean^2``, not Eq. 13: simulation at gamma = 2, T = 800, sigma_A = 0.5 gives
    ``Var/mean^2`` = 1.51, 3.02, 4.55 for l = 1, 2, 3 (Eq. 13: 3, 6, 9). The nonzero spectrum of
    ``X X^T`` is that of ``X^T X``, so only ``min(gamma, 1/gamma)`` can enter; this function uses
    ``Var = l (1 + min(gamma, 1/gamma)) mean^2``, which equals Eq. 13 for ``gamma <= 1``.
    Vectorised.
    """
    l = np.asarray(l, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    mean = (np.asarray(sigma_A, dtype=np.float64) * np.asarray(sigma_V, dtype=np.float64)) ** (
        2.0 * l
    ) / gamma**l
    var = l * (1.0 + np.minimum(gamma, 1.0 / gamma)) * mean**2
    return mean, var


def prop8_moments(l, sigma_A, sigma_V):
    """Mean and variance of the Jacobian's limiting squared singular values (mindthegap Prop. 8).

    ``E Z = (sigma_A sigma_V)^(2l)`` (Eq. 17), ``Var Z = l (l + 2) (sigma_A sigma_V)^(4l)``
    (Eq. 18); docs/theory.md §5. From the k-th moment ``(sigma_A sigma_V)^(2lk) FC_l(k)^2``:
    ``FC_l(1) = 1``, ``FC_l(2) = l + 1``, so ``Var = ((l + 1)^2 - 1) mean^2``. (The seed's proof
    writes ``(sigma_A^2)^k FC_l(k) (sigma_V^2)^k FC_l(k)``, i.e. drops the power ``l`` of the
    variances; Eqs. 17-18 have it, and so does this function.)

    Normalisation: the Jacobian of Eq. 16 with each factor rescaled to O(1) singular values,
    ``J~_l = (T^(l/2) A_l^perp ... A_1^perp) (x) (d^(-l/2) W_1^V ... W_l^V)`` = ``gamma^(l/2) J_l``
    (same setting as :func:`prop7_moments`). The unscaled ``J_l = dvec(X_l^perp)/dvec(X_0)`` has
    mean ``(sigma_A sigma_V)^(2l) / gamma^l``: Prop. 8 as printed holds for it only at
    ``gamma = 1``. Vectorised.
    """
    l = np.asarray(l, dtype=np.float64)
    mean = (np.asarray(sigma_A, dtype=np.float64) * np.asarray(sigma_V, dtype=np.float64)) ** (
        2.0 * l
    )
    var = l * (l + 2.0) * mean**2
    return mean, var


# ---------------------------------------------------------------------------------------------
# Attention-only network and stable rank
# ---------------------------------------------------------------------------------------------


def attention_only_forward(X0, L, sigma_A, sigma_V=1.0, centre=False, seed=0) -> list[np.ndarray]:
    """Forward pass of mindthegap's attention-only network (Eq. 3; centred: Eq. 9).

    ``X_l = A_l X_{l-1} W_l^V`` for ``l = 1..L`` with independent Random Markov ``A_l``
    (:func:`random_markov`, parameter ``sigma_A``), replaced by ``A_l^perp`` when ``centre``, and
    ``W_l^V`` d x d with i.i.d. ``N(0, sigma_V^2)`` entries, deliberately *unscaled* by ``1/d``
    (mindthegap Sec. 2 and its "Scaling of value matrices" remark). ``X0`` is (T, d); the model
    assumes orthonormal rows (``X0 X0^T = I``, e.g. ``np.eye(T, d)``) but any input is accepted.

    Returns ``[X_0, X_1, ..., X_L]`` (length ``L + 1``, so index = layer).
    """
    rng = _rng(seed)
    X = np.asarray(X0, dtype=np.float64)
    T, d = X.shape
    out = [X]
    for _ in range(int(L)):
        A = random_markov(T, sigma_A, seed=rng)
        if centre:
            A = centred(A)
        W = sigma_V * rng.standard_normal((d, d))
        X = A @ X @ W
        out.append(X)
    return out


def stable_rank(M) -> np.ndarray:
    """Stable rank ``sr(M) = ||M||_F^2 / ||M||_2^2 = sum_i s_i^2 / s_1^2`` (mindthegap Eq. 4).

    Works on (..., m, n) batches (returns an array of shape ``...``). For a token covariance
    ``Sigma = X X^T`` pass ``Sigma`` itself (docs/theory.md §1 ``stable_rank``), which equals
    ``sum s_i(X)^4 / s_1(X)^4``.
    """
    M = np.asarray(M, dtype=np.float64)
    s = np.linalg.svd(M, compute_uv=False)
    return (s**2).sum(axis=-1) / s[..., 0] ** 2


def sr_excess_uncentred(l, sigma_A, gamma, T):
    """``sr(Sigma_l) - 1`` without centring, leading order in 1/T (sigprop; cf. mindthegap Prop. 3).

    Prop. 3 states ``sr(Sigma_l) -> 1`` with ``|sr - 1| = O(T^(1 - 4l))``. Simulation gives the
    slower rate ``T^(1 - 2l)``: the top eigenvalue is ``|phi^T X_0 W_1...W_l|^2 ~ (d sigma_V^2)^l``
    (Lemma 1, Thm 9) and the other T - 1 interlace with the bulk of ``Sigma_l^perp``, whose second
    moment is ``mean^2 (1 + l (1 + gamma))`` (Prop. 7). Hence
    ``sr - 1 ~ (1 + l (1 + gamma)) sigma_A^(4l) T^(1 - 2l)`` (independent of sigma_V). Measured
    (sigma_A = 0.5, gamma = 1, T = 64-256, 6 seeds): slope of log(sr - 1) vs log T = -0.92
    (l = 1) and -2.85 (l = 2), against Prop. 3's -3 and -7; prefactor within 3 % at T = 256.
    Valid for ``gamma <= 1``. Vectorised.
    """
    l = np.asarray(l, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    return (
        (1.0 + l * (1.0 + gamma))
        * np.asarray(sigma_A, dtype=np.float64) ** (4.0 * l)
        * T ** (1.0 - 2.0 * l)
    )


def sr_ratio_centred_gamma1(l):
    """``lim sr(Sigma_l^perp) / T`` at ``gamma = 1`` (the constant ``C_l`` of mindthegap Prop. 5).

    Prop. 5 only proves ``C_l > 0``. At ``gamma = 1`` the eigenvalues of ``Sigma_l^perp`` divided by
    their mean follow the Fuss-Catalan law of order ``s = 2l`` (free product of ``l`` quarter-circle
    attention factors and ``l`` square Gaussian factors), with second moment ``FC_s(2) = s + 1``
    and right edge ``(s + 1)^(s + 1) / s^s``, so ``C_l = (2l + 1) / edge^2`` (independent of
    sigma_A, sigma_V): 0.0658, 0.0336, 0.0225 for l = 1, 2, 3. At T <= 256 the top eigenvalue is
    still below the edge and the measured ratio is 5-20 % above ``C_l``. Vectorised.
    """
    s = 2.0 * np.asarray(l, dtype=np.float64)
    edge = (s + 1.0) ** (s + 1.0) / s**s
    return (s + 1.0) / edge**2


# ---------------------------------------------------------------------------------------------
# sigprop additions for the mindthegap experiments (Prop. 1 at finite d_qk, Props. 4 and 6)
# ---------------------------------------------------------------------------------------------


def kq_bulk_m4(sigma_A, c):
    """``(1/T) tr((B B^T)^2)`` for ``B = sqrt(T) A_perp`` of first-layer key-query attention.

    sigprop, not mindthegap (docs/theory.md §5; mindthegap Prop. 1 claims a Random Markov matrix
    "when
    d_qk is large"). The logits ``Q K^T / sqrt(d_qk)`` are not i.i.d.: their linear (first
    Hermite) part, of variance ``s^2 = log(1 + sigma_A^2)``, is a product of two Gaussian
    matrices (T x d_qk)(d_qk x T), whose 4th singular-value moment is ``(2 + c) s^4`` with
    ``c = T / d_qk``; the higher Hermite parts act as free i.i.d. noise. Adding free cumulants
    gives ``2 sigma_A^4 + c s^4``; ``c = 0`` is the quarter circle's ``2 sigma_A^4`` (Lemma 3).
    Measured (T = 256-1024, sigma_A = 0.5 / 1 / 1.31): c = 1: 2.79-2.99 / 2.41-2.92 / 2.34-2.67
    (x sigma_A^4; formula 2.80 / 2.48 / 2.34); c = 1/4: 2.19-2.21 / 2.11-2.15 / 2.13-2.38 (2.20 /
    2.12 / 2.08). The bulk edge moves out with it: s2(sqrt(T) A) / (2 sigma_A) = 1.25 at
    sigma_A = 0.5, c = 1. Vectorised.
    """
    sigma_A = np.asarray(sigma_A, dtype=np.float64)
    return 2.0 * sigma_A**4 + np.asarray(c, dtype=np.float64) * np.log1p(sigma_A**2) ** 2


def centred_outlier_rho(sigma_s, rho):
    """``s_1(A_perp)`` left by centring key-query attention on tokens of cosine ``rho`` (sigprop).

    Unit-norm tokens ``x_a = sqrt(1 - rho) e_a + sqrt(rho) u`` and logit std ``sigma_s`` for
    unit-norm pairs (``sigma_qk^2`` in mindthegap Prop. 1): the logits split into a row constant
    (cancels), an i.i.d. part of variance ``sigma_s^2 (1 - rho)^2`` and a *column* part
    ``c_b`` of variance ``v = sigma_s^2 rho (1 - rho)`` shared by all rows. So ``A ~ 1 w^T +
    bulk`` with ``w_b = e^{c_b} / sum e^c``, and ``A - 11^T / T`` (mindthegap Eq. 8) keeps the
    rank-one part ``1 (w - 1/T)^T`` of norm ``sqrt(e^v - 1)``: an O(1) outlier, i.e. the gap is
    only removed for orthonormal tokens (rho = 0). The bulk keeps the rest of the variance,
    ``sigma_A^2 - (e^v - 1)``. Measured (sigma_A = 0.5, rho = 0.5, T = 128-256): outlier
    0.32-0.39 vs 0.344, bulk variance 0.50-0.53 sigma_A^2 vs 0.53. Vectorised.
    """
    sigma_s = np.asarray(sigma_s, dtype=np.float64)
    rho = np.asarray(rho, dtype=np.float64)
    return np.sqrt(np.expm1(sigma_s**2 * rho * (1.0 - rho)))


def grad_norm_value(L, sigma_A, sigma_V, T, d, centre=False):
    """``E ||dX_L / dW_l^V||_F^2`` in the attention-only network, leading order (sigprop).

    mindthegap Props. 4 and 6 (Eqs. 6, 7, 11; docs/theory.md §5) bound this from below by
    ``T^(L-1)``
    (uncentred) and state it is ``C d`` with ``A_perp``. By Eq. 19 the Jacobian is
    ``P_1 (x) P_2`` with ``P_1 = A_L..A_1 X_0 W_1..W_(l-1)``, ``P_2 = W_(l+1)..W_L``, so its norm
    is ``||P_1||_F^2 ||P_2||_F^2``. With ``E||A_perp M||_F^2 = (sigma_A^2 / T) ||M||_F^2``,
    ``A_L..A_1 = 1 v^T + A_L^perp..A_1^perp`` (``v ~ 1/T``) and orthonormal ``X_0`` (T, d):
    ``sigma_V^(2(L-1)) d^L (1 + sigma_A^(2L) T^(1-L))`` uncentred and
    ``sigma_V^(2(L-1)) d^L sigma_A^(2L) T^(1-L)`` centred, the same for every ``l``. Hence the
    uncentred norm grows like ``T^L`` at fixed gamma (Prop. 4's ``T^(L-1)`` is not tight) and the
    centred one like ``sigma_A^(2L) gamma^(1-L) d`` (Prop. 6, with its constant). Corrections
    are O(1/T) relative (row normalisation, column sums of A_perp). Vectorised.
    """
    L = np.asarray(L, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    bulk = np.asarray(sigma_A, dtype=np.float64) ** (2.0 * L) * T ** (1.0 - L)
    scale = np.asarray(sigma_V, dtype=np.float64) ** (2.0 * (L - 1.0)) * np.asarray(
        d, dtype=np.float64
    ) ** L
    return scale * (bulk if centre else 1.0 + bulk)
