"""sigprop.measurement.rho_tokens: the one generator of tokens at pairwise cosine rho draws,
number for number, what the generators it replaced drew (measurement.inputs.rho_tokens,
gg25's correlated rows, noci22's Gaussian tokens), and its laws hold."""

import math

import numpy as np
import pytest

from sigprop.measurement import inputs
from sigprop.measurement.rho_tokens import rho_tokens
from sigprop.reproduce import noci22


@pytest.mark.parametrize("T,d", [(5, 16), (12, 8)])   # exact (T + 1 <= d) and T + 1 > d
def test_exact_law_is_measurement_inputs(T, d):
    old = inputs.rho_tokens(3, T, d, 0.4, seed=7).numpy()
    np.testing.assert_array_equal(rho_tokens(T, d, 0.4, 7, n_seq=3), old)
    np.testing.assert_array_equal(rho_tokens(T, d, 0.4, 7), old[0])


def test_exact_law_cosines_and_norms():
    X = rho_tokens(6, 16, 0.3, 1)
    G = X @ X.T
    np.testing.assert_allclose(np.diag(G), 16.0)
    np.testing.assert_allclose(G[~np.eye(6, dtype=bool)] / 16.0, 0.3, atol=1e-12)


def test_gaussian_law_draws_as_before():
    # gg25's rows: sqrt(1 - rho) z + sqrt(rho) u, z (T, k) drawn before u (k,)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    z = a.standard_normal((7, 4))
    old = math.sqrt(1.0 - 0.6) * z + math.sqrt(0.6) * a.standard_normal(4)
    np.testing.assert_array_equal(rho_tokens(7, 4, 0.6, b, law="gaussian"), old)
    # noci22 A.2 (variance sigma_x2), and its earlier public name
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    z, u = a.standard_normal((2, 3, 5)), a.standard_normal((2, 1, 5))
    old = math.sqrt(1.5 * (1.0 - 0.2)) * z + math.sqrt(1.5 * 0.2) * u
    np.testing.assert_array_equal(
        rho_tokens(3, 5, 0.2, b, n_seq=2, law="gaussian", var=1.5), old)
    np.testing.assert_array_equal(noci22.gaussian_tokens(np.random.default_rng(5), 2, 3, 5,
                                                         1.5, 0.2), old)


def test_gaussian_law_correlation():
    X = rho_tokens(2, 20_000, 0.7, 0, law="gaussian", var=2.0)
    assert np.mean(X[0] * X[1]) / 2.0 == pytest.approx(0.7, abs=0.03)


def test_bad_arguments():
    with pytest.raises(ValueError, match="law"):
        rho_tokens(4, 8, 0.1, law="uniform")
    with pytest.raises(ValueError, match="rho"):
        rho_tokens(4, 8, 1.5)
