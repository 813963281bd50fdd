"""The moments of sigmoid and differential attention rows (sigprop.theory.attn_maps,
docs/theory.md §2.4.7-2.4.8) against independent Monte Carlo computations with fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit

from sigprop.theory import attn_maps
from sigprop.theory.attention import attention_stats


@pytest.mark.parametrize("r", [-0.5, 0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("sigma, b1, b2", [(0.5, 0.0, 0.0), (2.2, 3.47, 3.47), (4.0, 1.0, 2.5)])
def test_sigmoid_pair_is_the_gaussian_expectation(sigma, r, b1, b2):
    """F = E sigmoid(X - b1) sigmoid(Y - b2) against 4e6 correlated Gaussian draws: within 5
    standard errors of the sample mean (the quadrature's own error is far smaller)."""
    g = np.random.default_rng(3)
    z1, z2 = g.standard_normal((2, 4_000_000))
    x, y = sigma * z1, sigma * (r * z1 + math.sqrt(1 - r * r) * z2)
    f = expit(x - b1) * expit(y - b2)
    se = f.std() / math.sqrt(f.size)
    assert abs(float(attn_maps.sigmoid_pair(sigma, r, b1, b2)) - f.mean()) < 5 * se + 1e-9


def _scores(g, n, sigma, rho, reps):
    """Scores with the REM's product covariance sigma^2 K_ac K_bd (K: 1 on the diagonal, rho
    off it), drawn as the four independent parts common / per row / per key / per entry."""
    c = g.standard_normal((reps, 1, 1)) * rho
    r = g.standard_normal((reps, n, 1)) * math.sqrt(rho * (1 - rho))
    k = g.standard_normal((reps, 1, n)) * math.sqrt(rho * (1 - rho))
    e = g.standard_normal((reps, n, n)) * (1 - rho)
    return sigma * (c + r + k + e)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sigma, rho", [(1.0, 0.3), (2.2, 0.6)])
def test_sigmoid_moments_against_monte_carlo_rows(sigma, rho, causal):
    """y2, yx, w2, wx of sigmoid(s - log n) rows over T = 16 keys from 20000 draws of the
    Gaussian scores: bidirectional within 2% (the sampling error is ~0.5%); causal within 6%
    (the causal positions on 12 nodes, pairs of rows as independent positions)."""
    T, reps = 16, 20000
    g = np.random.default_rng(7)
    s = _scores(g, T, sigma, rho, reps)
    vis = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    n = vis.sum(1, keepdims=True)
    w = np.where(vis, expit(s - np.log(n)), 0.0)
    mass = w.sum(-1)
    off = ~np.eye(T, dtype=bool)
    cross = np.einsum("rab,rcb->rac", w, w)[:, off].mean()
    want = ((w**2).sum(-1).mean(), cross, (mass**2).mean(),
            (mass[:, :, None] * mass[:, None, :])[:, off].mean())
    m = attn_maps.sigmoid_moments(sigma, rho, T, (1.0, 0.0), causal=causal)
    got = [m.y2, m.yx, m.w2, m.wx]
    np.testing.assert_allclose(np.array(got, dtype=float), want, rtol=0.06 if causal else 0.02)


@pytest.mark.parametrize("rho", [0.0, 0.35, 0.8])
@pytest.mark.parametrize("d", [1, 8, 32])
def test_query_gram_has_the_wishart_moments(d, rho):
    """The quadrature of (G_aa, G_cc, G_ac) = Wishart_2(d, [[1, rho], [rho, 1]]) / d has its
    exact first and second moments (E G_ij G_kl = S_ij S_kl + (S_ik S_jl + S_il S_jk) / d):
    the rules are exact for these polynomials, so to roundoff."""
    g = attn_maps.query_gram(rho, d)
    e = lambda x: float(np.sum(g.w * x))  # noqa: E731
    want = [1.0, 1.0, rho, 1 + 2 / d, 1 + 2 / d, rho * rho + (1 + rho * rho) / d,
            1 + 2 * rho * rho / d, rho * (1 + 2 / d)]
    got = [e(g.gaa), e(g.gcc), e(g.gac), e(g.gaa**2), e(g.gcc**2), e(g.gac**2),
           e(g.gaa * g.gcc), e(g.gaa * g.gac)]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    inf = attn_maps.query_gram(rho, None)
    assert (inf.gaa, inf.gcc, inf.gac, inf.w) == (1.0, 1.0, rho, 1.0)


def _bilinear_scores(g, n, d, sigma, rho, reps):
    """sigma q_a . k_b / sqrt(d): queries and keys with d i.i.d. channels, each N(0, K)
    over the n tokens (K: 1 on the diagonal, rho off it), independent of each other -- the
    law of the scores of tokens at cosine rho under Gaussian W_Q, W_K."""
    chol = np.linalg.cholesky((1 - rho) * np.eye(n) + rho)
    q = chol @ g.standard_normal((reps, n, d))
    k = chol @ g.standard_normal((reps, n, d))
    return sigma * q @ k.transpose(0, 2, 1) / math.sqrt(d)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rho", [0.0, 0.6])
def test_sigmoid_moments_at_finite_d_head_against_bilinear_scores(rho, causal):
    """y2, yx, w2, wx with d_head = 8 (the scores Gaussian given the queries, averaged over
    their Gram) against 40000 draws of the bilinear scores q . k / sqrt(8) at sigma 2.2,
    T = 16. Bidirectional: within 4 standard errors of the draws' means (measured: < 1),
    where the Gaussian scores (d_head None) miss by 4.5 to 56 (so the test tells the two
    apart); causal: within 6% (the causal positions' nodes, as the Gaussian test above)."""
    T, d, sigma, reps = 16, 8, 2.2, 40000
    s = _bilinear_scores(np.random.default_rng(5), T, d, sigma, rho, reps)
    vis = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    w = np.where(vis, expit(s - np.log(vis.sum(1, keepdims=True))), 0.0)
    mass, off = w.sum(-1), ~np.eye(T, dtype=bool)
    per = np.stack([(w**2).sum(-1).mean(-1), np.einsum("rab,rcb->rac", w, w)[:, off].mean(-1),
                    (mass**2).mean(-1), (mass[:, :, None] * mass[:, None, :])[:, off].mean(-1)])
    want, se = per.mean(1), per.std(1) / math.sqrt(reps)

    def four(m):
        return np.array([m.y2, m.yx, m.w2, m.wx], dtype=float)

    got = four(attn_maps.sigmoid_moments(sigma, rho, T, (1.0, 0.0), causal=causal, d_head=d))
    if causal:
        np.testing.assert_allclose(got, want, rtol=0.06)
        return
    assert np.all(np.abs(got - want) < 4 * se), (got - want) / se
    gauss = four(attn_maps.sigmoid_moments(sigma, rho, T, (1.0, 0.0), causal=causal))
    assert np.all(np.abs(gauss - want) > 4 * se), (gauss - want) / se


def test_sigmoid_moments_evaluate_equal_heads_once():
    """Equal (std, cosine) points share one evaluation: the result is the single point's,
    broadcast to the input's shape."""
    one = attn_maps.sigmoid_moments(1.7, 0.4, 16, (1.0, 0.0), d_head=16)
    many = attn_maps.sigmoid_moments(np.full((2, 3), 1.7), 0.4, 16, (1.0, 0.0), d_head=16)
    assert many.wx.shape == (2, 3)
    np.testing.assert_allclose(many.wx, one.wx, rtol=1e-12)


def test_sigmoid_fixed_bias():
    """bias (0, b0): sigmoid(s + b0) at every row length (k = 0): at sigma 0 every weight is
    sigmoid(b0), so y2 = T sigmoid(b0)^2 and the rows' masses are T sigmoid(b0)."""
    T, b0 = 12, -1.3
    sm = attn_maps.sigmoid_moments(1e-9, 0.4, T, (0.0, b0))
    m = expit(b0)
    np.testing.assert_allclose([sm.y2, sm.yx, sm.w2, sm.wx], [T * m * m, T * m * m, (T * m) ** 2,
                                                  (T * m) ** 2], rtol=1e-6)


def test_diff_lambda_moments_against_its_draw():
    """E lambda and E lambda^2 of exp(l1 . l2) - exp(l3 . l4) + lambda_init with the vectors'
    entries N(0, 0.3^2), 16 each, from 10^6 draws (5 standard errors)."""
    g = np.random.default_rng(11)
    lv = g.normal(0.0, 0.3, (4, 1_000_000, 16))
    lam = np.exp((lv[0] * lv[1]).sum(-1)) - np.exp((lv[2] * lv[3]).sum(-1)) + 0.35
    m1, m2 = attn_maps.diff_lambda_moments(0.35, 0.3, 16)
    assert abs(m1 - lam.mean()) < 5 * lam.std() / 1e3
    assert abs(m2 - (lam**2).mean()) < 5 * (lam**2).std() / 1e3


@pytest.mark.parametrize("sigma, rho", [(1.0, 0.2), (2.5, 0.7)])
def test_diff_rows_from_two_independent_softmaxes(sigma, rho):
    """E sum_b D_ab^2 and E sum_b D_ab D_cb of D = A1 - lam A2 (A1, A2 softmax rows of two
    independent score draws on the same tokens, T = 16) against (1 + lam^2) Y2 - 2 lam / T
    and (1 + lam^2) Yx - 2 lam / T built from the same draws' Y2, Yx (the identity of §2.4.8,
    sampling error only: 1.5%), and those against the REM tables (the infinite-d_head ones:
    3%)."""
    T, reps, lam = 16, 20000, 0.6
    g = np.random.default_rng(5)

    def rows():
        s = _scores(g, T, sigma, rho, reps)
        a = np.exp(s - s.max(-1, keepdims=True))
        return a / a.sum(-1, keepdims=True)

    a1, a2 = rows(), rows()
    d = a1 - lam * a2
    off = ~np.eye(T, dtype=bool)

    def cross(x):
        return np.einsum("rab,rcb->rac", x, x)[:, off].mean()

    y2d, yxd = (d**2).sum(-1).mean(), cross(d)
    y2, yx = ((a1**2).sum(-1).mean() + (a2**2).sum(-1).mean()) / 2, (cross(a1) + cross(a2)) / 2
    np.testing.assert_allclose([y2d, yxd], [(1 + lam**2) * y2 - 2 * lam / T,
                                            (1 + lam**2) * yx - 2 * lam / T], rtol=0.015)
    np.testing.assert_allclose(d.sum(-1), 1 - lam, atol=1e-12)
    st = attention_stats(sigma, rho, T)
    np.testing.assert_allclose([y2, yx], [float(st.y2), float(st.yx)], rtol=0.03)
