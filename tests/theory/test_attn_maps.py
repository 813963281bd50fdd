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
