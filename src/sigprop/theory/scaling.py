"""Attention scaling with context length: clpr25 and deshpande26 (docs/theory.md §3).

Pure NumPy, float64, vectorised: every scalar argument may be an array and results broadcast.

Conventions of this module (docs/theory.md §3.1, which differs from the per-dimension ``q`` of
docs/theory.md §1):
``q`` is the *total* squared norm of a token, ``|x_i|^2 = q``; ``rho`` is the pairwise cosine
``<y_i, y_j>`` of the normalised tokens ``y_i = x_i / |x_i|``; ``n`` the number of tokens;
``beta = gamma * log(n)`` the inverse temperature of the clpr25 layer.

clpr25 = Chen, Lin, Polyanskiy & Rigollet, "Critical attention scaling in long-context
transformers" (2025).  deshpande26 = Deshpande, "A phase transition of attention collapse" (2026).
The practical score multipliers of docs/theory.md §3.2 (none, log-n, qwen, ssmax, yarn, tau) are
defined in ``sigprop.spec`` (the ArchSpec needs them) and re-exported here.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "simplex_weights",
    "simplex_update",
    "simplex_cos",
    "simplex_limit",
    "gamma_c",
    "simplex_points",
    "almost_simplex",
    "attention_forward",
    "jacobian_norm",
    "jacobian_norm_simplex",
    "deshpande_beta_c",
    "deshpande_wmax_bulk",
    "retrieval_threshold",
    "retrieval_succeeds",
    "deshpande_to_gg",
]

_CRIT_TOL = 1e-9  # |gamma (1 - rho) - 1| below this counts as critical in simplex_limit


def _f(x):
    return np.asarray(x, dtype=np.float64)


def _weights(n, gamma, rho):
    """(a, c, m, beta): diagonal weight, total off-diagonal mass c = (n-1) b = 1 - a, m = n-1."""
    n, gamma, rho = np.broadcast_arrays(_f(n), _f(gamma), _f(rho))
    if np.any(n < 2):
        raise ValueError("clpr25 simplex formulas need n >= 2 tokens")
    m = n - 1.0
    beta = gamma * np.log(n)
    # a = 1 / (1 + m exp(-beta (1 - rho))) = sigmoid(-t); evaluated through logaddexp (no overflow)
    t = np.log(m) - beta * (1.0 - rho)
    a = np.exp(-np.logaddexp(0.0, t))
    c = np.exp(-np.logaddexp(0.0, -t))
    return a, c, m, beta


def simplex_weights(n, beta, rho):
    """Diagonal ``a`` and off-diagonal ``b`` of the attention matrix on simplex inputs.

    docs/theory.md §3.1 (clpr25 Assumption 1 and the proof of its Eq. 2.5): scores ``beta <y_i,
    y_j>``
    with ``<y_i, y_i> = 1``, ``<y_i, y_j> = rho``, so
    ``a = e^beta / (e^beta + (n-1) e^(beta rho))`` and ``b = e^(beta rho) / (same)``.
    Evaluated in log space: exact for beta up to 1e4 and beyond, n up to 1e12 and beyond.
    Note the argument is ``beta`` itself here (not ``gamma``); ``a + (n-1) b = 1``.
    """
    n, beta, rho = np.broadcast_arrays(_f(n), _f(beta), _f(rho))
    if np.any(n < 2):
        raise ValueError("simplex_weights needs n >= 2 tokens")
    m = n - 1.0
    t = np.log(m) - beta * (1.0 - rho)
    a = np.exp(-np.logaddexp(0.0, t))
    b = np.exp(-np.logaddexp(0.0, -t) - np.log(m))
    return a, b


def _products(a, c, m, rho):
    """Inner products of docs/theory.md §3.1 written with c = (n-1) b (no large-n cancellation).

    Returns ``S = |Att_i|^2``, ``P = <Att_i, Att_k>``, ``us = <Att_i, y_i>``, ``uo = <Att_i, y_k>``.
    """
    r1 = rho + (1.0 - rho) / m  # = |mean of the other tokens|^2 = [1 + (m-1) rho] / m
    S = a * a + 2.0 * a * c * rho + c * c * r1
    P = a * a * rho + 2.0 * a * c * r1 + c * c * (rho + (1.0 - rho) * (m - 1.0) / (m * m))
    us = a + c * rho
    uo = a * rho + c * r1
    return S, P, us, uo


def simplex_update(n, gamma, rho, alpha=0.0, q=1.0):
    """Exact finite-n clpr25 layer on a simplex input (docs/theory.md §3.1; clpr25 Eqs. 2.1-2.3,
    A.23-A.24).

    Input: ``|x_i|^2 = q``, ``cos(x_i, x_j) = rho``.  Update ``x_i' = Att_i + alpha sqrt(q) y_i``
    with ``Att_i = sum_j A_ij y_j``, ``A = softmax(beta Y Y^T)``, ``beta = gamma log n``.
    Returns ``(q_out, p_out) = (|x_i'|^2, <x_i', x_k'>)`` for ``i != k`` (total, not per dim).
    """
    a, c, m, _ = _weights(n, gamma, rho)
    rho = np.broadcast_to(_f(rho), a.shape)
    S, P, us, uo = _products(a, c, m, rho)
    r = alpha * np.sqrt(_f(q))
    q_out = S + 2.0 * r * us + r * r
    p_out = P + 2.0 * r * uo + r * r * rho
    return q_out, p_out


def simplex_cos(n, gamma, rho, alpha=0.0, q=1.0):
    """Cosine between two output tokens, ``p_out / q_out`` of :func:`simplex_update`."""
    q_out, p_out = simplex_update(n, gamma, rho, alpha, q)
    return p_out / q_out


def gamma_c(rho):
    """Critical clpr25 scaling ``gamma_c = 1 / (1 - rho)`` (docs/theory.md §3.1, clpr25 Thm 2.1).

    Returns inf at rho = 1 (identical tokens: no finite scaling separates them)."""
    one_m = 1.0 - _f(rho)
    with np.errstate(divide="ignore"):
        return np.where(one_m == 0.0, np.inf, 1.0 / np.where(one_m == 0.0, 1.0, one_m))


def simplex_limit(gamma, rho, alpha=0.0, q=1.0):
    """n -> infinity limit of :func:`simplex_cos` (docs/theory.md §3.1; clpr25 Eqs. 2.4-2.7).

    ``a -> 0`` for ``gamma < gamma_c``, ``1/2`` at ``gamma = gamma_c`` (within a relative 1e-9),
    ``1`` above; the off-diagonal mass ``c = 1 - a`` sits on the mean of the other tokens,
    whose squared norm tends to rho.  With alpha = 0 this gives cos -> 1, ``4 rho / (1 + 3 rho)``
    and rho.  The approach is algebraic: the finite-n error is O(n^-|1 - gamma (1 - rho)|).
    Meant for ``0 <= rho <= 1`` (a simplex with rho < 0 cannot exist as n -> infinity).
    Special case rho = 0, alpha = 0, gamma < 1: both |Att|^2 ~ a^2 + 1/n and <Att_i, Att_k> ~ 1/n
    vanish and the limit depends on their rates (derived here, not in the seeds): cos -> 1 for
    gamma < 1/2, 1/2 at gamma = 1/2, 0 for 1/2 < gamma < 1 (finite-n error O(n^-|1 - 2 gamma|)).
    """
    gamma, rho, alpha, q = np.broadcast_arrays(_f(gamma), _f(rho), _f(alpha), _f(q))
    x = gamma * (1.0 - rho)
    a = np.where(np.abs(x - 1.0) <= _CRIT_TOL, 0.5, np.where(x > 1.0, 1.0, 0.0))
    c = 1.0 - a
    S = a * a + 2.0 * a * c * rho + c * c * rho
    P = rho * (a + c) ** 2
    r = alpha * np.sqrt(q)
    q_out = S + 2.0 * r * (a + c * rho) + r * r
    p_out = P + 2.0 * r * rho + r * r * rho
    zero = (rho == 0.0) & (r == 0.0) & (x < 1.0 - _CRIT_TOL)
    g2 = 2.0 * gamma
    rate = np.where(np.abs(g2 - 1.0) <= _CRIT_TOL, 0.5, np.where(g2 < 1.0, 1.0, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(zero, rate, p_out / np.where(zero, 1.0, q_out))


def simplex_points(n, d, rho, q=1.0, seed=None):
    """Exact simplex input (clpr25 Assumption 1): ``|x_i|^2 = q`` and pairwise cosine ``rho``.

    ``x_i = sqrt(q) [sqrt(rho) e_0 + sqrt(1 - rho) e_(i+1)]`` (needs ``0 <= rho < 1`` and
    ``d >= n + 1``), optionally rotated by a seeded Haar orthogonal matrix; shape ``(n, d)``.
    """
    if d < n + 1 or not 0.0 <= rho < 1.0:
        raise ValueError("simplex_points needs d >= n + 1 and 0 <= rho < 1")
    X = np.zeros((n, d))
    X[:, 0] = np.sqrt(rho)
    X[np.arange(n), np.arange(1, n + 1)] = np.sqrt(1.0 - rho)
    if seed is not None:
        Q, R = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
        X = X @ (Q * np.sign(np.diag(R)))
    return np.sqrt(q) * X


def almost_simplex(n, d, rho, seed=0, q=1.0):
    """Almost-simplex tokens of clpr25 Eq. 3.1 (shared direction plus i.i.d. Gaussian vectors).

    ``x_i = sqrt(q) [sqrt(rho) u + sqrt((1 - rho) / d) g_i]`` with ``u`` a seeded random unit
    vector and ``g_i ~ N(0, I_d)``, so ``E|x_i|^2 = q`` and ``E<x_i, x_j> = q rho`` (clpr25's
    normalisation is q = 1).  Norms and cosines fluctuate by O(1/sqrt(d)).  Shape ``(n, d)``.
    """
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    g = rng.standard_normal((n, d))
    return np.sqrt(q) * (np.sqrt(rho) * u + np.sqrt((1.0 - rho) / d) * g)


def _attention(X, gamma):
    X = _f(X)
    n = X.shape[-2]
    Y = X / np.linalg.norm(X, axis=-1, keepdims=True)
    beta = _f(gamma)[..., None, None] * np.log(n)
    s = beta * (Y @ np.swapaxes(Y, -1, -2))
    s -= s.max(axis=-1, keepdims=True)
    A = np.exp(s)
    A /= A.sum(axis=-1, keepdims=True)
    return A, Y, beta


def attention_forward(X, gamma, alpha=0.0):
    """One clpr25 layer evaluated directly (clpr25 Eqs. 2.1-2.3; docs/theory.md §3.1).

    ``y_i = x_i / |x_i|``, ``A = softmax(beta Y Y^T)`` row-wise with ``beta = gamma log n``,
    ``X' = A Y + alpha X``.  ``X`` has shape ``(..., n, d)``; ``gamma`` broadcasts over ``...``.
    """
    A, Y, _ = _attention(X, gamma)
    return A @ Y + _f(alpha)[..., None, None] * _f(X)


def jacobian_norm(X, gamma):
    """Normalised Jacobian norm of the attention-only clpr25 map at any input ``X`` (n, d).

    The map is ``F(X) = Att(N(X))`` (clpr25 Eq. 2.13 with alpha = 0); ``J = dF/dX`` is
    ``nd x nd`` and we return its mean squared singular value ``||J||_F^2 / (n d)`` (clpr25
    Eq. 2.16 as described in its text; the equation itself was lost in conversion).  The blocks
    ``dF_i/dx_j`` are derived here: with ``P_j = I - y_j y_j^T``, ``v_ij = y_j - F_i`` and the
    attention-weighted covariance ``C_i = sum_k A_ik y_k y_k^T - F_i F_i^T``,
    ``dF_i/dx_j = A_ij (I + beta v_ij y_i^T) P_j / |x_j|`` for ``j != i`` and
    ``dF_i/dx_i = (A_ii I + beta C_i) P_i / |x_i|``.  Their Frobenius norms reduce to Gram-matrix
    expressions, O(n^3 + n^2 d) work, no nd x nd matrix is formed.
    """
    X = _f(X)
    n, d = X.shape
    A, Y, beta = _attention(X, gamma)
    beta = float(np.squeeze(beta))
    r2 = np.sum(X * X, axis=1)
    G = Y @ Y.T
    H = A @ G  # H_ij = <F_i, y_j>
    s = np.einsum("ij,ij->i", H, A)  # |F_i|^2
    Hd = np.diag(H)
    # off-diagonal blocks (the j = i entries are removed below)
    cross = G * H - Hd[:, None]
    vv = 1.0 - 2.0 * H + s[:, None]
    off = A**2 / r2[None, :] * ((d - 1) + 2 * beta * cross + beta**2 * vv * (1 - G**2))
    np.fill_diagonal(off, 0.0)
    # diagonal blocks: tr(C P) and tr(C P C) with P = P_i
    trCP = (1.0 - s) - (np.einsum("ik,ik->i", A, G**2) - Hd**2)
    CF2 = np.einsum("ik,ik->i", A @ (G**2), A) - 2 * np.einsum("ik,ik->i", A, H**2) + s**2
    W = A * G
    Cy2 = np.einsum("ik,ik->i", W @ G, W) - 2 * Hd * np.einsum("ik,ik->i", W, H) + Hd**2 * s
    Ad = np.diag(A)
    diag = (Ad**2 * (d - 1) + 2 * beta * Ad * trCP + beta**2 * (CF2 - Cy2)) / r2
    return (off.sum() + diag.sum()) / (n * d)


def jacobian_norm_simplex(n, gamma, rho, d=np.inf, q=1.0):
    """:func:`jacobian_norm` in closed form on a simplex input (docs/theory.md §3.1; clpr25 Thm
    2.3).

    Normalisation: mean squared singular value ``||J||_F^2 / (n d)`` of the attention-only
    Jacobian (alpha = 0) at an exact simplex input of width ``d >= n`` with ``|x_i|^2 = q``.
    Derived here, exact at every finite n: with ``m = n - 1``, ``c = 1 - a = m b``,
    ``|dF_i/dx_i|^2 q = a^2 (d-1) + 2 a beta tr(C P) + beta^2 tr(C P C)`` where
    ``C = a c w w^T + (c/m) W`` (w = y_i minus the mean of the others, W their scatter) and
    ``m |dF_i/dx_j|^2 q = (c^2/m) [(d-1) - 2 beta (1-rho)(a(1+rho) + c rho (1-1/m))
    + beta^2 (1-rho)(1-rho^2)((1-1/m) + a^2 (1+1/m))]``.
    ``d = inf`` (default) gives the wide limit ``(a^2 + c^2/m) / q``.  For n -> infinity with
    d >= n the result tends to 0, 1/(4q), 1/q below, at and above gamma_c (clpr25 Fig. 2 shows
    ~0 below and ~1 above with q = 1).
    """
    a, c, m, beta = _weights(n, gamma, rho)
    rho, d, q = np.broadcast_to(_f(rho), a.shape), _f(d), _f(q)
    om = 1.0 - rho
    trCP = a * c * om * (rho + 1.0 / m) + c * om * (m - 1.0) / m
    trCPC = a**2 * c**2 * om**2 * (1 + 1 / m) * (rho + 1 / m) + c**2 * om**2 * (m - 1) / m**2
    beta_diag = 2 * a * beta * trCP + beta**2 * trCPC
    bracket_off = -2 * beta * om * (a * (1 + rho) + c * rho * (1 - 1 / m)) + beta**2 * om * (
        1 - rho**2
    ) * ((1 - 1 / m) + a**2 * (1 + 1 / m))
    base = a**2 + c**2 / m
    extra = beta_diag + c**2 / m * bracket_off
    with np.errstate(invalid="ignore"):
        extra_over_d = np.where(np.isinf(d), 0.0, extra / d)
    return ((1.0 - 1.0 / d) * base + extra_over_d) / q


# --------------------------------------------------------------------------- deshpande26


def deshpande_beta_c(N, sigma):
    """deshpande26 Eq. 8 (docs/theory.md §3.3): ``beta_c = sqrt(2 log N) / sigma`` for N i.i.d.
    ``N(0, sigma^2)`` logits."""
    return np.sqrt(2.0 * np.log(_f(N))) / _f(sigma)


def deshpande_wmax_bulk(beta, N, sigma):
    """Bulk approximation of the largest softmax weight (deshpande26 Eq. 10; docs/theory.md §3.3).

    ``wmax ~ exp(-(sigma^2 / 2) (beta - beta_c)^2)`` for ``beta <= beta_c``: log Z replaced by its
    annealed value and the maximum logit by ``sigma sqrt(2 log N)``.  It equals 1/N at beta = 0
    and reaches 1 at beta_c.  It is an approximation, not an identity: at finite N the true
    maximum logit lies below ``sigma sqrt(2 log N)`` and the formula misses O(1)-in-the-exponent
    corrections (the tests measure the ratio).  Above beta_c the bulk formula does not apply
    (deshpande26 Eq. 11 only says wmax = Theta(1)); we return its cap 1.0 there, an upper bound,
    never NaN.
    """
    beta, N, sigma = np.broadcast_arrays(_f(beta), _f(N), _f(sigma))
    bc = deshpande_beta_c(N, sigma)
    gap = np.minimum(beta, bc) - bc
    return np.exp(-0.5 * sigma**2 * gap**2)


def retrieval_threshold(N, sigma):
    """deshpande26 retrieval condition (docs/theory.md §3.3): threshold ``m* = sigma sqrt(2 log N)``
    for one target logit m against N - 1 i.i.d. ``N(0, sigma^2)`` noise logits."""
    return _f(sigma) * np.sqrt(2.0 * np.log(_f(N)))


def retrieval_succeeds(m, N, sigma):
    """Boolean ``m > sigma sqrt(2 log N)`` (asymptotic statement: as N grows, the probability
    that the target is the argmax tends to 1 for m / m* > 1 and to 0 for m / m* < 1)."""
    return _f(m) > retrieval_threshold(N, sigma)


def deshpande_to_gg(beta_d, sigma, N):
    """Translate deshpande26's beta to gg25's (docs/theory.md §3.3).

    ``beta_gg = beta_d sigma / sqrt(log N)``; ``beta_d = beta_c(N, sigma)`` maps to ``sqrt(2)``,
    gg25's beta_c at rho = 0: the same transition."""
    return _f(beta_d) * _f(sigma) / np.sqrt(np.log(_f(N)))
