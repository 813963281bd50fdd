"""Tests for sigprop.theory.kernels (docs/theory.md §2.5: MLP kernels E[phi^2], E[phi phi'])."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from sigprop.theory import kernels as K
from sigprop.theory.kernels import (
    ACTIVATIONS,
    activation_fn,
    dblquad_kernel,
    gauss_kernel,
    kernel,
    relu_kernel,
)

PROPS = settings(max_examples=40, deadline=None, derandomize=True)


def _relu_off_1d(q1: float, c: float) -> float:
    """Independent 1-D form of E[relu(u) relu(u')]: the z-integral done in closed form,
    E_z[(c x + s z)^+] = c x Phi(c x / s) + s phi(c x / s), then quad over x > 0."""
    s = math.sqrt(1.0 - c * c)

    def f(x: float) -> float:
        m = c * x / s
        return x * (c * x * special.ndtr(m) + s * math.exp(-0.5 * m * m) / math.sqrt(2 * math.pi)) \
            * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)

    return q1 * integrate.quad(f, 0.0, np.inf, epsabs=1e-14, epsrel=1e-13, limit=200)[0]


# ReLU closed form (arc-cosine kernel, docs/theory.md §2.5) against two independent quadratures.
# Both references are smooth integrals requested to ~1e-13 / 1e-10, so 1e-10 is a fair bound.
@pytest.mark.parametrize("q1,c", [(1.0, 0.0), (1.0, 0.5), (0.7, 0.99), (2.5, -0.5), (0.3, -0.99)])
def test_relu_closed_form_vs_quadrature(q1, c):
    diag, off = relu_kernel(q1, c * q1)
    assert abs(float(diag) - q1 / 2) <= 1e-15 * q1
    assert abs(float(off) - _relu_off_1d(q1, c)) <= 1e-10
    d_ref, o_ref = dblquad_kernel("relu", q1, c * q1)
    assert abs(float(diag) - d_ref) <= 1e-10
    assert abs(float(off) - o_ref) <= 1e-10


def test_relu_endpoints_and_zero_variance():
    d, o = relu_kernel(np.array([2.0, 2.0, 0.0]), np.array([2.0, -2.0, 0.0]))
    np.testing.assert_array_equal(d, [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(o, [1.0, 0.0, 0.0])  # k(1) = 1 and k(-1) = 0 exactly


# Smooth activations: the default rule is converged to ~1e-12 (measured) and dblquad is asked
# for epsabs = epsrel = 1e-10 per integral, so 1e-9 leaves room only for the reference's error
# (stricter than the 1e-7 the design brief asked for).
TANH_POINTS = [(q, c) for q in (0.2, 1.0, 4.0) for c in (0.0, 0.3, 0.9, 0.999)]


@pytest.mark.parametrize("q1,c", TANH_POINTS + [(10.0, 0.5), (10.0, -0.9)])
def test_tanh_vs_dblquad(q1, c):
    got = gauss_kernel("tanh", q1, c * q1)
    ref = dblquad_kernel("tanh", q1, c * q1)
    assert abs(float(got[0]) - ref[0]) <= 1e-9
    assert abs(float(got[1]) - ref[1]) <= 1e-9


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("q1,c", [(1.0, 0.5), (4.0, -0.7), (10.0, 0.95)])
def test_gelu_silu_vs_dblquad(act, q1, c):
    got = kernel(act, q1, c * q1)
    ref = dblquad_kernel(act, q1, c * q1)
    assert abs(float(got[0]) - ref[0]) <= 1e-9
    assert abs(float(got[1]) - ref[1]) <= 1e-9


def test_hermite_rule_agrees_at_moderate_q1():
    # Gauss-Hermite is kept for comparison; at q1 <= 1 it converges (~1e-13) like the default.
    q1, p1 = 0.8, np.array([-0.4, 0.1, 0.7])
    a = gauss_kernel("tanh", q1, p1, rule="hermite", n=128)
    b = gauss_kernel("tanh", q1, p1)
    np.testing.assert_allclose(a[0], b[0], atol=1e-12, rtol=0)
    np.testing.assert_allclose(a[1], b[1], atol=1e-12, rtol=0)


def test_linear_exact():
    q1 = np.array([0.5, 1.0, 3.0])
    p1 = np.array([-0.2, 1.0, 1.5])
    d, o = kernel("linear", q1, p1)
    np.testing.assert_array_equal(d, q1)
    np.testing.assert_array_equal(o, p1)
    # the quadrature is exact for polynomial integrands up to roundoff
    dq, oq = gauss_kernel("linear", q1, p1)
    np.testing.assert_allclose(dq, q1, rtol=1e-13)
    np.testing.assert_allclose(oq, p1, rtol=1e-13, atol=1e-15)


def test_swiglu_product_formula():
    q1, p1 = 1.3, np.array([-0.9, 0.0, 0.4, 1.3])
    d, o = kernel("swiglu", q1, p1)
    ds, os_ = kernel("silu", q1, p1)
    np.testing.assert_array_equal(d, ds * q1)
    np.testing.assert_array_equal(o, os_ * p1)


@pytest.mark.parametrize("q1,c", [(1.0, 0.6), (2.0, -0.4)])
def test_swiglu_monte_carlo(q1, c):
    # gate g and up-projection v: independent, each ~ N(0, [[q1, c q1], [c q1, q1]]).
    rng = np.random.default_rng(1234)
    n = 400_000
    s = math.sqrt(1 - c * c)
    g = math.sqrt(q1) * rng.standard_normal((2, n))
    g[1] = c * g[0] + s * g[1]
    v = math.sqrt(q1) * rng.standard_normal((2, n))
    v[1] = c * v[0] + s * v[1]
    h = activation_fn("silu")(g) * v
    d, o = kernel("swiglu", q1, c * q1)
    for sample, theory in ((h[0] ** 2, d), (h[0] * h[1], o)):
        se = sample.std() / math.sqrt(n)
        assert abs(sample.mean() - float(theory)) <= 4 * se


# Properties (hypothesis).  Single points go through direct quadrature.
acts_all = st.sampled_from(["relu", "tanh", "gelu", "silu", "swiglu", "linear"])
q1s = st.floats(1e-3, 10.0)
cs = st.floats(-1.0, 1.0)


@PROPS
@given(acts_all, q1s, cs)
def test_cauchy_schwarz(act, q1, c):
    d, o = kernel(act, q1, c * q1)
    assert float(d) >= 0.0
    assert abs(float(o)) <= float(d)


@PROPS
@given(st.sampled_from(["tanh", "gelu", "silu"]), q1s, cs)
def test_raw_quadrature_cauchy_schwarz(act, q1, c):
    # kernel() clips |off| <= diag against roundoff; the unclipped quadrature must already obey
    # it up to roundoff.
    d, o = K._quad(activation_fn(act), np.array([q1]), np.array([c]), "trapezoid", K._auto_n(q1))
    assert abs(o[0]) <= d[0] * (1 + 1e-13) + 1e-300


@PROPS
@given(acts_all, q1s)
def test_off_diagonal_at_c_one(act, q1):
    d, o = kernel(act, q1, q1)
    assert float(o) == float(d)
    # continuity from below (not forced): |K(1) - K(1 - delta)| <= q1 E[phi'^2] delta <= 2 q1 delta
    # (|phi'| <= 1.13 for gelu/silu).  swiglu: q1 [K_d - K_o(1 - delta) + delta K_o] with
    # K_d <= q1 (|silu(u)| <= |u|), so <= 3 q1^2 delta.
    delta = 1e-9
    d2, o2 = kernel(act, q1, (1 - delta) * q1)
    bound = 3 * q1 * q1 * delta if act == "swiglu" else 2 * q1 * delta
    assert abs(float(d2) - float(o2)) <= bound + 1e-12


@PROPS
@given(st.sampled_from(["relu", "tanh"]), q1s, cs, cs)
def test_monotone_in_c(act, q1, c1, c2):
    lo, hi = sorted((c1, c2))
    _, o_lo = kernel(act, q1, lo * q1)
    _, o_hi = kernel(act, q1, hi * q1)
    assert float(o_lo) <= float(o_hi) + 1e-13


# Fast path: cached spline in theta = arccos c for many points sharing q1.
@pytest.mark.parametrize("act", ["tanh", "gelu", "silu"])
@pytest.mark.parametrize("q1", [0.2004, 1.0, 4.0])
def test_fast_path_matches_direct(act, q1):
    rng = np.random.default_rng(7)
    tails = np.logspace(-12, -1, 50)
    c = np.concatenate([rng.uniform(-1, 1, 400), 1 - tails, -1 + tails, [-1.0, 0.0, 1.0]])
    before = K._c_table.cache_info().misses + K._c_table.cache_info().hits
    fast = kernel(act, q1, c * q1)
    assert K._c_table.cache_info().misses + K._c_table.cache_info().hits > before  # path taken
    direct = gauss_kernel(act, q1, c * q1)
    np.testing.assert_allclose(fast[0], direct[0], atol=1e-12, rtol=0)
    np.testing.assert_allclose(fast[1], direct[1], atol=1e-9, rtol=0)


def test_fast_path_several_q1_values_and_swiglu():
    rng = np.random.default_rng(3)
    q1 = np.repeat([0.5, 2.0], 300)
    c = rng.uniform(-1, 1, q1.size)
    for act in ("tanh", "swiglu"):
        fast = kernel(act, q1, c * q1)
        direct = (kernel(act, q1[i], c[i] * q1[i]) for i in range(0, q1.size, 37))
        for j, (d, o) in zip(range(0, q1.size, 37), direct, strict=True):
            assert abs(fast[0][j] - d) <= 1e-12 and abs(fast[1][j] - o) <= 1e-9


def test_chunking_does_not_change_results(monkeypatch):
    q1 = np.array([0.3, 1.0, 2.0, 5.0, 7.0])
    p1 = np.array([0.1, -0.5, 1.9, 0.0, 6.0])
    ref = gauss_kernel("gelu", q1, p1)
    monkeypatch.setattr(K, "_CHUNK_ELEMS", 1000)  # one point per chunk
    got = gauss_kernel("gelu", q1, p1)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-14)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-14)


def test_broadcasting_and_shapes():
    q1 = np.array([[0.5], [1.0], [3.0]])
    p1 = np.array([-0.2, 0.0, 0.3, 0.5])
    for act in ACTIVATIONS:
        d, o = kernel(act, q1, p1)
        assert d.shape == o.shape == (3, 4)
        assert d.dtype == o.dtype == np.float64
        d11, o11 = kernel(act, 1.0, 0.3)
        assert np.ndim(d11) == 0
        # the default step follows max(q1) of the call, so a lone point may differ by roundoff
        assert abs(o[1, 2] - float(o11)) <= 1e-12 and abs(d[1, 2] - float(d11)) <= 1e-12


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_zero_variance_gives_zero(act):
    d, o = kernel(act, 0.0, 0.0)
    assert float(d) == 0.0 and float(o) == 0.0


def test_roundoff_clip_and_invalid_covariance():
    d, o = kernel("tanh", 1.0, 1.0 + 5e-13)  # c - 1 = 5e-13: roundoff, clipped to c = 1
    assert float(o) == float(d)
    with pytest.raises(ValueError, match="p1"):
        kernel("tanh", 1.0, 1.0 + 1e-9)
    with pytest.raises(ValueError, match="q1"):
        relu_kernel(-1.0, 0.0)


def test_bad_activation_names():
    allowed = "relu, gelu, tanh, silu, linear, swiglu"
    with pytest.raises(ValueError, match=allowed):
        kernel("sigmoid", 1.0, 0.5)
    with pytest.raises(ValueError, match=allowed):
        dblquad_kernel("elu", 1.0, 0.5)
    with pytest.raises(ValueError, match="swiglu"):
        gauss_kernel("swiglu", 1.0, 0.5)
    with pytest.raises(ValueError, match="relu"):
        activation_fn("softplus")


def test_activation_functions():
    x = np.array([-800.0, -3.0, -0.5, 0.0, 0.7, 4.0, 800.0])
    with np.errstate(all="raise"):  # stable: no overflow for large |x|
        silu = activation_fn("silu")(x)
        gelu = activation_fn("gelu")(x)
    np.testing.assert_allclose(silu[1:-1], x[1:-1] / (1 + np.exp(-x[1:-1])), rtol=1e-15)
    assert silu[0] == 0.0 and silu[-1] == 800.0
    erf_form = 0.5 * x * (1 + special.erf(x / math.sqrt(2)))
    np.testing.assert_allclose(gelu, erf_form, rtol=1e-14, atol=1e-300)
    np.testing.assert_array_equal(activation_fn("relu")(x), np.maximum(x, 0))
    np.testing.assert_array_equal(activation_fn("tanh")(x), np.tanh(x))
    np.testing.assert_array_equal(activation_fn("linear")(x), x)
