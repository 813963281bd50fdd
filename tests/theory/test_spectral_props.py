"""Formula tests for the sigprop additions to theory/spectral.py used by the mindthegap
experiments (docs/theory.md §5): kq_bulk_m4 (Prop. 1 at finite d_qk), centred_outlier_rho (centring
on
correlated tokens) and grad_norm_value (Props. 4, 6). Simulation checks of the full claims are
in tests/experiments/test_mindthegap.py; here each formula is checked against limits, an
independent integral, or a Monte Carlo of its own ingredient (not of the code under test).
"""

import math

import numpy as np
import pytest
from scipy import integrate

from sigprop.theory import spectral as sp


@pytest.mark.parametrize("sigma_A", [0.3, 1.0, 2.0])
def test_kq_bulk_m4_limits(sigma_A):
    # c = T / d_qk -> 0: the quarter circle's fourth moment, by quadrature of its density
    m4_qc = integrate.quad(lambda x: x**4 * float(sp.quarter_circle_pdf(x, sigma_A)),
                           0, 2 * sigma_A)[0]
    assert float(sp.kq_bulk_m4(sigma_A, 0.0)) == pytest.approx(m4_qc, rel=1e-8)
    assert m4_qc == pytest.approx(2 * sigma_A**4, rel=1e-8)
    # the extra term is c log(1 + sigma_A^2)^2, linear in c
    grid = sp.kq_bulk_m4(sigma_A, np.array([0.0, 0.5, 1.0]))
    assert np.diff(grid) == pytest.approx([0.5 * math.log1p(sigma_A**2) ** 2] * 2, rel=1e-12)


def test_kq_bulk_m4_small_logits_is_fuss_catalan():
    """sigma_A -> 0, c = 1: A_perp is the linear part, a product of two square Gaussians, whose
    squared singular values have second moment FC_2(2) = 3 (Fuss-Catalan)."""
    s = 1e-4
    assert float(sp.kq_bulk_m4(s, 1.0)) / s**4 == pytest.approx(sp.fuss_catalan(2, 2), rel=1e-6)


@pytest.mark.parametrize("c", [0.25, 1.0])
def test_kq_bulk_m4_product_ingredient_monte_carlo(c):
    """The ingredient (1/T) tr((L L^T)^2) = 2 + c for L = G1 G2^T / sqrt(T d_qk), T / d_qk = c.

    T = 300, 3 draws: finite-size corrections O(1/T) (~1 %) and fluctuations ~0.5 %; tol 4 %.
    """
    T = 300
    dqk = int(T / c)
    rng = np.random.default_rng(0)
    vals = []
    for _ in range(3):
        Lm = rng.standard_normal((T, dqk)) @ rng.standard_normal((dqk, T)) / math.sqrt(T * dqk)
        S = Lm @ Lm.T
        vals.append((S * S).sum() / T)
    assert np.mean(vals) == pytest.approx(2 + c, rel=0.04)


def test_centred_outlier_rho_formula_and_ingredient():
    assert float(sp.centred_outlier_rho(1.3, 0.0)) == 0.0
    rho = np.linspace(0.05, 0.95, 7)
    np.testing.assert_allclose(sp.centred_outlier_rho(0.8, rho),
                               sp.centred_outlier_rho(0.8, 1 - rho), rtol=1e-12)
    small = float(sp.centred_outlier_rho(1e-4, 0.5))
    assert small == pytest.approx(1e-4 * 0.5, rel=1e-6)
    # the ingredient: w = softmax of i.i.d. N(0, v) column effects, sqrt(T) |w - 1/T| -> sqrt(e^v-1)
    # T = 200000 draws: relative error of the sample second moment ~ sqrt(kurtosis/T) < 1 %; tol 3 %
    sigma_s, r, T = 1.2, 0.4, 200_000
    v = sigma_s**2 * r * (1 - r)
    c = math.sqrt(v) * np.random.default_rng(1).standard_normal(T)
    w = np.exp(c) / np.exp(c).sum()
    assert math.sqrt(T) * np.linalg.norm(w - 1 / T) == pytest.approx(
        float(sp.centred_outlier_rho(sigma_s, r)), rel=0.03)


def test_grad_norm_value_special_cases_and_rates():
    d = 128.0
    # L = 1: ||A X0||_F^2 * ||I_d||_F^2 with ||A X0||^2 = 1 + sigma_A^2 (rank one + bulk)
    assert float(sp.grad_norm_value(1, 0.7, 3.0, d, d)) == pytest.approx(d * (1 + 0.49))
    assert float(sp.grad_norm_value(1, 0.7, 3.0, d, d, centre=True)) == pytest.approx(0.49 * d)
    assert float(sp.grad_norm_value(3, 0.0, 1.0, d, d, centre=True)) == 0.0
    # sigma_V enters as sigma_V^(2(L-1)) (W_l itself is differentiated away)
    assert float(sp.grad_norm_value(3, 0.5, 2.0, d, d) / sp.grad_norm_value(3, 0.5, 1.0, d, d)) \
        == pytest.approx(2.0**4)
    # Prop. 6: centred is linear in d at fixed gamma = T/d, for every depth
    for L in (1, 2, 4):
        for gamma in (0.5, 1.0):
            ratio = sp.grad_norm_value(L, 1.0, 1.0, gamma * 2 * d, 2 * d, True) / \
                sp.grad_norm_value(L, 1.0, 1.0, gamma * d, d, True)
            assert float(ratio) == pytest.approx(2.0)
    # uncentred at gamma = 1: local exponent L (>= Prop. 4's L - 1) at large T
    T = np.array([1e4, 2e4])
    for L in (2, 3):
        v = sp.grad_norm_value(L, 1.0, 1.0, T, T)
        assert math.log(v[1] / v[0]) / math.log(2) == pytest.approx(L, abs=1e-3)
