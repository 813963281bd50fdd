"""Tests for sigprop.theory.scaling (docs/theory.md §3.1, §3.3; clpr25, deshpande26).

Formula tests check closed forms and limits; agreement tests compare them with a direct NumPy
evaluation of the layer, finite differences or Monte Carlo, with the tolerance each one expects.
"""

import numpy as np
import pytest
from scipy.special import log_ndtr

from sigprop.theory import scaling as sc

RHO = 0.4
GC = 1.0 / (1.0 - RHO)


def _exact_simplex(n, d, rho, q, seed):
    """|x_i|^2 = q, cos = rho exactly: sqrt(rho) shared + sqrt(1-rho) orthonormal, random basis."""
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, n + 1)))
    return np.sqrt(q) * (np.sqrt(rho) * Q[:, 0] + np.sqrt(1 - rho) * Q[:, 1:].T)


# ----------------------------------------------------------------------------- docs/theory.md §3.1


@pytest.mark.parametrize(
    "n,gamma,rho,alpha,q",
    [
        (5, 1.3, 0.3, 0.0, 1.0),
        (12, 0.7, 0.5, 0.4, 2.5),
        (40, 3.0, 0.1, 1.0, 0.7),
        (3, 9.0, 0.8, 0.2, 4.0),
    ],
)
def test_simplex_update_matches_direct_layer(n, gamma, rho, alpha, q):
    # the simplex formulas are exact at finite n: only float64 round-off (measured < 1e-14)
    X = _exact_simplex(n, n + 3, rho, q, seed=n)
    Xp = sc.attention_forward(X, gamma, alpha)
    G = Xp @ Xp.T
    q_out, p_out = sc.simplex_update(n, gamma, rho, alpha, q)
    assert np.allclose(np.diag(G), q_out, rtol=0, atol=1e-10)
    assert np.allclose(G[~np.eye(n, dtype=bool)], p_out, rtol=0, atol=1e-10)
    A = np.exp(gamma * np.log(n) * (X @ X.T) / q)
    A /= A.sum(1, keepdims=True)
    a, b = sc.simplex_weights(n, gamma * np.log(n), rho)
    assert np.allclose(np.diag(A), a, atol=1e-12)
    assert np.allclose(A[~np.eye(n, dtype=bool)], b, atol=1e-12)


def test_simplex_points_geometry():
    X = sc.simplex_points(7, 10, 0.25, q=3.0, seed=2)
    G = X @ X.T
    assert np.allclose(G, 3.0 * (0.75 * np.eye(7) + 0.25), atol=1e-12)


def test_regimes_as_n_grows():
    ns = np.array([1e3, 1e6, 1e9, 1e12])
    a_sub, _ = sc.simplex_weights(ns, 0.5 * GC * np.log(ns), RHO)
    a_crit, _ = sc.simplex_weights(ns, GC * np.log(ns), RHO)
    a_sup, _ = sc.simplex_weights(ns, 2.0 * GC * np.log(ns), RHO)
    assert np.all(np.diff(a_sub) < 0) and a_sub[-1] < 1e-5  # a ~ n^{-1/2}
    assert np.allclose(a_crit, ns / (2 * ns - 1), rtol=1e-12)  # exactly n / (2n - 1) -> 1/2
    assert np.all(np.diff(a_sup) > 0) and 1 - a_sup[-1] < 1e-11  # 1 - a ~ 1/n
    cos_sub = sc.simplex_cos(ns, 0.5 * GC, RHO)
    cos_sup = sc.simplex_cos(ns, 2.0 * GC, RHO)
    assert np.all(np.diff(cos_sub) > 0) and 1 - cos_sub[-1] < 1e-9
    assert np.all(np.diff(cos_sup) < 0) and cos_sup[-1] - RHO < 1e-9
    assert np.isclose(sc.gamma_c(RHO), GC) and sc.gamma_c(1.0) == np.inf


@pytest.mark.parametrize("f", [0.5, 0.8, 1.0, 1.25, 2.0])
@pytest.mark.parametrize("alpha,q", [(0.0, 1.0), (0.5, 2.0)])
def test_limit_matches_huge_n(f, alpha, q):
    # finite-n error is O(n^-|1 - gamma(1-rho)|) (measured <= 0.5 of that bound at n >= 1e3);
    # assert within the bound itself at n = 1e12
    n = 1e12
    err = abs(sc.simplex_cos(n, f * GC, RHO, alpha, q) - sc.simplex_limit(f * GC, RHO, alpha, q))
    bound = 10.0 / n if f == 1.0 else n ** -abs(1 - f)  # at gamma_c: a = n / (2n - 1), O(1/n)
    assert err <= bound
    if alpha == 0.0:
        expected = {0.5: 1.0, 0.8: 1.0, 1.0: 4 * RHO / (1 + 3 * RHO), 1.25: RHO, 2.0: RHO}[f]
        assert np.isclose(sc.simplex_limit(f * GC, RHO), expected, rtol=1e-12)


@pytest.mark.parametrize("gamma,expected", [(0.3, 1.0), (0.5, 0.5), (0.8, 0.0), (1.5, 0.0)])
def test_limit_at_rho_zero(gamma, expected):
    # rho = 0, alpha = 0: subcritical limit is a ratio of two vanishing terms (see the docstring);
    # finite-n error O(n^-|1 - 2 gamma|) + O(n^-|1 - gamma|) -> at n = 1e12 at most ~2e-5
    assert sc.simplex_limit(gamma, 0.0) == expected
    assert abs(sc.simplex_cos(1e12, gamma, 0.0) - expected) < 1e-4


def test_almost_simplex_statistics():
    n, rho = 64, 0.3
    # first-order fluctuation of a pairwise cosine: sd = (1-rho) sqrt(1 + 2 rho - rho^2) / sqrt(d)
    sd_pred = (1 - rho) * np.sqrt(1 + 2 * rho - rho**2)
    for d in (256, 16384):
        X = sc.almost_simplex(n, d, rho, seed=3)
        Y = X / np.linalg.norm(X, axis=1, keepdims=True)
        off = (Y @ Y.T)[~np.eye(n, dtype=bool)]
        rms = np.sqrt(np.mean((off - rho) ** 2)) * np.sqrt(d)
        assert abs(rms / sd_pred - 1) < 0.15  # 2016 correlated pairs: a few % sampling error
        assert np.abs(off - rho).max() < 5 / np.sqrt(d)
        assert abs(off.mean() - rho) < 0.5 / np.sqrt(d)
        assert np.abs(np.sum(X**2, axis=1) - 1).max() < 5 / np.sqrt(d)  # |x|^2 ~ q = 1
    assert np.array_equal(
        sc.almost_simplex(5, 8, rho, seed=1), sc.almost_simplex(5, 8, rho, seed=1)
    )
    assert not np.allclose(
        sc.almost_simplex(5, 8, rho, seed=1), sc.almost_simplex(5, 8, rho, seed=2)
    )
    assert np.allclose(np.sum(sc.almost_simplex(4, 20000, rho, q=3.0) ** 2, 1), 3.0, rtol=0.05)


def _fd_jacobian_norm(X, gamma, h=1e-6):
    """||J||_F^2 / (nd) of X -> attention_forward(X, gamma, 0) by central differences (batched)."""
    n, d = X.shape
    E = h * np.eye(n * d).reshape(n * d, n, d)
    J = (sc.attention_forward(X + E, gamma) - sc.attention_forward(X - E, gamma)) / (2 * h)
    return np.sum(J**2) / (n * d)


@pytest.mark.parametrize(
    "n,gamma,rho,q", [(5, 1.3, 0.3, 1.0), (8, 0.7, 0.5, 2.5), (6, 4.0, 0.1, 0.7)]
)
def test_jacobian_matches_finite_differences(n, gamma, rho, q):
    # central differences with h = 1e-6: truncation ~h^2, round-off ~1e-16/h -> rel. error ~1e-8
    d = n + 3
    X = _exact_simplex(n, d, rho, q, seed=7)
    fd = _fd_jacobian_norm(X, gamma)
    assert np.isclose(sc.jacobian_norm_simplex(n, gamma, rho, d=d, q=q), fd, rtol=1e-6)
    assert np.isclose(sc.jacobian_norm(X, gamma), fd, rtol=1e-6)
    Z = np.random.default_rng(n).standard_normal((n, d))  # general (non-simplex) input
    assert np.isclose(sc.jacobian_norm(Z, gamma), _fd_jacobian_norm(Z, gamma), rtol=1e-6)


def test_jacobian_phase_transition():
    # clpr25 Fig. 2 / Thm 2.3: ~0 below gamma_c, finite above (limits 0, 1/4, 1 for q = 1, d >= n)
    ns = np.array([1e3, 1e6, 1e9])
    sub = sc.jacobian_norm_simplex(ns, 0.5 * GC, RHO, d=ns)
    crit = sc.jacobian_norm_simplex(ns, GC, RHO, d=ns)
    sup = sc.jacobian_norm_simplex(ns, 2.0 * GC, RHO, d=ns)
    assert np.all(np.diff(sub) < 0) and sub[-1] < 1e-8
    assert np.allclose(crit[-1], 0.25, atol=1e-6)
    assert np.all(np.diff(sup) > 0) and abs(sup[-1] - 1) < 1e-6
    # on almost-simplex inputs (clpr25 Eq. 3.1) at n = 128, d = 4096 the general formula agrees
    # with the simplex closed form to ~1% (angle fluctuations are O(1/sqrt(d)))
    X = sc.almost_simplex(128, 4096, RHO, seed=1)
    for f in (0.5, 1.0, 2.0):
        closed = sc.jacobian_norm_simplex(128, f * GC, RHO, d=4096)
        assert np.isclose(sc.jacobian_norm(X, f * GC), closed, rtol=0.05)


def test_vectorisation_and_extremes():
    n = np.array([2.0, 1e3, 1e12])[:, None, None]
    gamma = np.array([0.0, 1.0, 1e4 / np.log(1e12)])[None, :, None]
    rho = np.array([0.0, 0.5, 0.999999, 1.0])
    shape = (3, 3, 4)
    for out in (
        *sc.simplex_weights(n, gamma * np.log(n), rho),
        *sc.simplex_update(n, gamma, rho, 0.3, 2.0),
        sc.simplex_cos(n, gamma, rho),
        sc.jacobian_norm_simplex(n, gamma, rho),
        sc.jacobian_norm_simplex(n, gamma, rho, d=n + 1),
    ):
        assert out.shape == shape and np.all(np.isfinite(out))
    cos = sc.simplex_cos(n, gamma, rho)
    assert np.all((cos >= -1e-12) & (cos <= 1 + 1e-12))
    lim = sc.simplex_limit(gamma[0], rho, np.array([[[0.0]], [[1.0]]]))
    assert lim.shape == (2, 3, 4) and np.all(np.isfinite(lim))
    assert np.all(
        np.isfinite(sc.deshpande_wmax_bulk(np.array([0, 1, 1e4])[:, None], [2, 1e12], 1.0))
    )
    assert sc.gamma_c(rho).shape == (4,)
    # batched attention_forward with per-batch gamma equals the single calls
    X = np.random.default_rng(0).standard_normal((3, 6, 4))
    g = np.array([0.1, 1.0, 30.0])
    out = sc.attention_forward(X, g, alpha=0.5)
    assert np.allclose(out, np.stack([sc.attention_forward(X[i], g[i], 0.5) for i in range(3)]))
    with pytest.raises(ValueError):
        sc.simplex_weights(1, 1.0, 0.5)


# ----------------------------------------------------------------------------- docs/theory.md §3.3


def test_deshpande_formulas():
    N = np.array([10.0, 1e4, 1e9])[:, None]
    sigma = np.array([0.5, 1.0, 3.0])
    bc = sc.deshpande_beta_c(N, sigma)
    assert np.allclose(bc, np.sqrt(2 * np.log(N)) / sigma)
    assert np.allclose(sc.deshpande_to_gg(bc, sigma, N), np.sqrt(2), rtol=1e-14)
    assert np.allclose(sc.retrieval_threshold(N, sigma), sigma * np.sqrt(2 * np.log(N)))
    assert np.allclose(sc.deshpande_wmax_bulk(0.0, N, sigma), 1 / N)  # uniform at beta = 0
    assert np.all(sc.deshpande_wmax_bulk(bc, N, sigma) == 1.0)
    assert np.all(sc.deshpande_wmax_bulk(5 * bc, N, sigma) == 1.0)  # documented cap above beta_c
    m = np.array([0.9, 1.1]) * sc.retrieval_threshold(1e4, 2.0)
    assert sc.retrieval_succeeds(m, 1e4, 2.0).tolist() == [False, True]


def _mc_wmax(N, beta, sigma, trials, rng):
    """Geometric mean over trials of max_j softmax(beta U)_j, U_j ~ N(0, sigma^2) i.i.d."""
    z = beta * sigma * rng.standard_normal((trials, N))
    z -= z.max(axis=1, keepdims=True)
    return np.exp(np.mean(-np.log(np.exp(z).sum(axis=1))))


def test_wmax_bulk_vs_monte_carlo():
    # Measured (sigma = 1, N = 1e2..1e4): MC / bulk = 0.62-0.69 at beta/beta_c = 0.25,
    # 0.39-0.47 at 0.5, 0.27-0.37 at 0.75, i.e. the bulk formula overestimates by up to ~4x
    # (the finite-N maximum logit is below sigma sqrt(2 log N)).  We test the order of magnitude,
    # the monotone trends and the N-exponent -(1 - beta/beta_c)^2 away from beta_c.
    rng = np.random.default_rng(0)
    sigma, xs, Ns = 1.0, [0.25, 0.5, 0.75], [100, 10_000]
    mc = np.array(
        [
            [_mc_wmax(N, x * sc.deshpande_beta_c(N, sigma), sigma, 10**6 // N, rng) for x in xs]
            for N in Ns
        ]
    )
    bulk = np.array(
        [
            [sc.deshpande_wmax_bulk(x * sc.deshpande_beta_c(N, sigma), N, sigma) for x in xs]
            for N in Ns
        ]
    )
    ratio = mc / bulk
    assert np.all((ratio > 0.15) & (ratio < 1.0)), ratio
    assert np.all(np.diff(mc, axis=1) > 0)  # grows with beta
    assert np.all(mc[1] < mc[0])  # shrinks with N at fixed beta / beta_c < 1
    slope = np.log(mc[1] / mc[0]) / np.log(Ns[1] / Ns[0])
    # measured -0.58, -0.29 vs bulk -0.5625, -0.25; near beta_c (0.75) -0.14 vs -0.0625
    assert np.allclose(slope[:2], [-((1 - x) ** 2) for x in xs[:2]], atol=0.1), slope


def test_retrieval_monte_carlo():
    # P(target is argmax) = P(m > max of N-1 noise logits) = Phi(m/sigma)^(N-1) exactly; MC agrees
    # within 4 binomial standard errors (+0.005).  Across m* the probability goes from ~0 to ~1 as N
    # grows; note at m = m* itself it is ~0.9 (finite-N maximum sits below m*), -> 1 slowly.
    rng, sigma = np.random.default_rng(1), 2.0
    kappa = np.array([0.7, 0.85, 1.15, 1.3])
    p_mc = {}
    for N in (100, 1000, 10_000):
        trials = max(200, 2_000_000 // N)
        noise_max = (sigma * rng.standard_normal((trials, N - 1))).max(axis=1)
        m = kappa * sc.retrieval_threshold(N, sigma)
        p = np.mean(m[None, :] > noise_max[:, None], axis=0)
        exact = np.exp((N - 1) * log_ndtr(m / sigma))
        assert np.all(np.abs(p - exact) <= 4 * np.sqrt(exact * (1 - exact) / trials) + 0.005)
        p_mc[N] = p
    assert p_mc[10_000][0] < 0.01 < 0.15 < p_mc[100][0]  # below m*: fails more as N grows
    assert p_mc[10_000][3] > 0.99 and p_mc[100][3] > 0.99  # well above m*: succeeds
    Ns = np.array([1e2, 1e4, 1e6, 1e9, 1e12])[:, None]
    exact = np.exp((Ns - 1) * log_ndtr(kappa * sc.retrieval_threshold(Ns, sigma) / sigma))
    # monotone in N (non-strict: the kappa = 0.7 column underflows to exactly 0 from N = 1e9)
    assert np.all(np.diff(exact[:, :2], axis=0) <= 0) and np.all(np.diff(exact[:, 2:], axis=0) > 0)
    assert exact[-1, 1] < 1e-9 and exact[-1, 2] > 0.9999
