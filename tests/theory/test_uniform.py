"""noci22 uniform-attention theory (docs/theory.md §4): Lemmas 3.2/3.3, Thm 3.3, Eqs. 17-18, 43-47.

Gradient formulas are checked against torch autograd Jacobians of one attention layer
(noci22 Lemma A.2's model), forward formulas against sigprop's one recursion (depth.propagate).
Monte Carlo checks use fixed seeds and 4-standard-error bands (SE = sample std / sqrt(draws)).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sigprop.spec import ArchSpec
from sigprop.theory import depth
from sigprop.theory import uniform as U

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------------------ forward pass
def _c0_f0(n, d, rho0, sx2=1.0):
    return n * d * sx2 * (1 + (n - 1) * rho0), n * d * sx2


@pytest.mark.parametrize("L,a1,a2,n,rho0,sx2", [
    (5, 0.7, 1.3, 16, 0.2, 1.0), (12, 0.3, 0.5, 64, 0.0, 0.5), (30, 1.0, 1.0, 8, 0.9, 2.0),
    (7, 0.0, 0.8, 10, 0.3, 1.0), (7, 0.6, 0.0, 10, 0.3, 1.0), (4, 0.0, 0.0, 5, 0.1, 1.0),
])
def test_lemmas_32_33_equal_propagate(L, a1, a2, n, rho0, sx2):
    # noci22 Eqs. 10 and 12 in closed form == the (q, p) recursion of depth.propagate, to
    # roundoff (both are exact; 1e-12 relative leaves room for L multiplications).
    d = 32
    tr = U.propagate_noci(L, a1, a2, n, rho0, d=d, sigma_x2=sx2)
    C0, F0 = _c0_f0(n, d, rho0, sx2)
    ell = np.arange(L + 1)
    np.testing.assert_allclose(tr.C, U.lemma32_C(ell, a1, a2, C0), rtol=1e-12)
    np.testing.assert_allclose(tr.F, U.lemma33_norm(ell, a1, a2, C0, F0, n), rtol=1e-12)
    # Lemma 3.3 as printed (Eq. 12, explicit geometric sum, C0/n = n |xbar|^2)
    geo = np.array([sum((1 + a1**2) ** k for k in range(i)) for i in ell])
    eq12 = (1 + a2**2) ** ell * a1**2 * geo * C0 / n + (1 + a2**2) ** ell * F0
    np.testing.assert_allclose(tr.F, eq12, rtol=1e-12)
    if a1 == 0:  # attention branch off: linear MLP residual scales all moments alike
        np.testing.assert_allclose(tr.rho, rho0, rtol=1e-12)


def test_skip_gauge_agrees_with_branch_gauge():
    # docs/theory.md §2.6 skip convention: alpha_skip = 1/alpha_1 gives Z/alpha_1, the same cosines
    # and second moments smaller by (alpha_1 alpha_2)^2 per block (representable at small L).
    L, a1, a2, n, rho0 = 9, 0.4, 0.7, 12, 0.25
    spec = ArchSpec(depth=L, norm="none", attention="uniform", activation="linear",
                    sigma_v2=1.0, sigma_w2=1.0, sigma_b2=0.0, alpha_attn=1 / a1,
                    alpha_mlp=1 / a2, seq_len=n)
    traj = depth.propagate(spec, rho0=rho0)

    def col(name):
        return traj[traj["observable"] == name].sort_values("layer")["value"].to_numpy()

    tr = U.propagate_noci(L, a1, a2, n, rho0, d=1)
    np.testing.assert_allclose(col("cos"), tr.rho, rtol=1e-12)
    np.testing.assert_allclose(col("q") * (a1 * a2) ** (2 * np.arange(L + 1)), tr.F / n,
                               rtol=1e-12)


@pytest.mark.parametrize("at1,at2", [(1.0, 0.5), (3.0, 1.0)])
def test_thm33_depth_scaled_limit(at1, at2):
    # alpha_i^2 = alpha~_i / L: rho_L -> Eq. 15. With E = (1 + a/L)^L = e^a (1 - a^2/(2L) +
    # O(1/L^2)) the error is c1 / L, c1 = -(d rho / d E) e^a a^2 / 2; we check that coefficient
    # (to 1 %) at L = 1e3 and 1e4, so the tolerance at L = 1e4 is |c1| / L (c1 = -0.133, -0.543).
    n, d, rho0 = 16, 64, 0.2
    C0, F0 = _c0_f0(n, d, rho0)
    lim = float(U.thm33_rho_limit(at1, C0, F0, n))
    E = math.exp(at1)
    drho_dE = n * C0 * (n * F0 - C0) / ((n - 1) * ((E - 1) * C0 + n * F0) ** 2)
    c1 = -drho_dE * E * at1**2 / 2
    for L in (1000, 10000):
        tr = U.propagate_noci(L, math.sqrt(at1 / L), math.sqrt(at2 / L), n, rho0, d=d)
        err = tr.rho[-1] - lim
        assert err * L == pytest.approx(c1, rel=1e-2)
        assert abs(err) <= 1.02 * abs(c1) / L
    assert 0 < lim < 1 and lim > rho0  # correlations grow, but stay bounded away from 1


def test_thm33_constant_alpha_collapses():
    # Eq. 16: constant alpha -> rho_L -> 1, geometrically: 1 - rho_L ~ 2^-L at alpha = 1
    n, rho0 = 16, 0.2
    one_minus = [1 - U.propagate_noci(L, 1.0, 1.0, n, rho0, d=64).rho[-1] for L in (10, 20, 40)]
    assert one_minus[0] > one_minus[1] > one_minus[2] and one_minus[2] < 1e-10
    assert one_minus[0] / one_minus[1] == pytest.approx(2.0**10, rel=0.05)


# ------------------------------------------------------------------------------ gradients
@pytest.fixture(autouse=True)
def _float64_default():
    # the autograd checks below run in float64; restore the default for other test modules
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _attention(X, Wq, Wk, Wv, tau):
    # noci22 A (Lemma A.2): S = softmax(tau X W_Q (X W_K)^T / sqrt(d_k)) X W_V; tau: Eq. 45
    M = tau * (X @ Wq) @ (X @ Wk).T / math.sqrt(Wq.shape[1])
    return torch.softmax(M, dim=-1) @ (X @ Wv)


def _jac_sq_norms(X, Wq, Wk, Wv, tau):
    # full Jacobians dS/dW_Q, dS/dW_V: sum over all output and parameter entries of squares
    jq, jv = torch.func.jacrev(_attention, argnums=(1, 3))(X, Wq, Wk, Wv, tau)
    return (jv**2).sum(), (jq**2).sum()


def _simulate(n, d, sx2, rho, draws, *, seed, d_head=None, wq_std=0.0, tau=1.0):
    """Per-draw squared Jacobian norms (value, query). Columns of X i.i.d.
    N(0, sx2 [(1-rho) I + rho 11^T]) (noci22 A.2); W_K, W_V ~ N(0, 1/d) (fan-in);
    W_Q ~ N(0, wq_std^2): wq_std = 0 is Assumption 3.1 exactly (A = 11^T/n)."""
    dh = d if d_head is None else d_head
    g = torch.Generator().manual_seed(seed)
    X = (math.sqrt(sx2 * (1 - rho)) * torch.randn(draws, n, d, generator=g)
         + math.sqrt(sx2 * rho) * torch.randn(draws, 1, d, generator=g))
    Wk = torch.randn(draws, d, dh, generator=g) / math.sqrt(d)
    Wv = torch.randn(draws, d, dh, generator=g) / math.sqrt(d)
    Wq = wq_std * torch.randn(draws, d, dh, generator=g)
    fn = torch.vmap(_jac_sq_norms, in_dims=(0, 0, 0, 0, None))
    v, q = fn(X, Wq, Wk, Wv, tau)
    return v.numpy(), q.numpy()


def _mean_se(x):
    return x.mean(), x.std(ddof=1) / math.sqrt(x.size)


def test_eqs_17_18_by_autograd_settle_sigma_x_power():
    # Uniform regime, sigma_x^2 = 2 so that sigma_x^6 (Eq. 46, docs/theory.md) and sigma_x^2 (A.2's
    # restatement) differ by 4x. n = d = 8, rho = 0.3, 4000 draws (SE ~ 0.8 % / 1.4 %).
    n, d, sx2, rho = 8, 8, 2.0, 0.3
    v, q = _simulate(n, d, sx2, rho, 4000, seed=0)
    g_v, g_q = U.grad_norms(sx2, d, n, rho)
    _, g_q_exact = U.grad_norms(sx2, d, n, rho, exact=True)
    (vm, vse), (qm, qse) = _mean_se(v), _mean_se(q)
    assert abs(vm - g_v) < 4 * vse  # Eq. 17 (exact)
    assert abs(qm - g_q_exact) < 4 * qse  # Eq. 18 x isserlis_factor (1.044 here)
    assert abs(qm - g_q) < 0.06 * g_q  # Eq. 18 itself within its O(1/(n d)) correction
    typo = g_q / sx2**2  # sigma_x^2 in place of sigma_x^6
    assert abs(qm - typo) > 50 * qse


def test_eq18_finite_size_factor_measured():
    # Eq. 18 drops the correlation of ||X||^2 and ||X^T L X||^2: at n = d = 4, rho = 0 the
    # exact factor is 1 + 4/16 = 1.25; autograd measures 1.226 +- 0.020 (16000 draws).
    n, d, sx2, rho = 4, 4, 1.0, 0.0
    _, q = _simulate(n, d, sx2, rho, 16000, seed=1)
    _, g_q = U.grad_norms(sx2, d, n, rho)
    qm, qse = _mean_se(q)
    assert float(U.isserlis_factor(d, n, rho)) == 1.25
    assert abs(qm / g_q - 1.25) < 4 * qse / g_q
    assert qm / g_q - 1.0 > 8 * qse / g_q  # plain Eq. 18 is rejected at this size


def test_grad_norms_per_head():
    # heads of width d_head = 4 cut from d = 16 weights of variance 1/d (d_head keyword)
    n, d, dh, sx2, rho = 8, 16, 4, 1.0, 0.5
    v, q = _simulate(n, d, sx2, rho, 4000, seed=2, d_head=dh)
    g_v, g_q = U.grad_norms(sx2, d, n, rho, d_head=dh, exact=True)
    (vm, vse), (qm, qse) = _mean_se(v), _mean_se(q)
    assert abs(vm - g_v) < 4 * vse and abs(qm - g_q) < 4 * qse
    # the ratio, hence tau*, does not depend on the head width
    for head in (1, 4, 16):
        gv_h, gq_h = U.grad_norms(sx2, d, n, rho, d_head=head)
        assert gv_h / gq_h == pytest.approx(float(U.tau_star(sx2, d, n, rho)) ** 2, rel=1e-12)


@pytest.mark.parametrize("sx2,rho,v_ratio,q_ratio", [
    (1.0, 0.0, 2.355, 0.926),  # noci22's stated init: logits of O(1) variance
    (1.0, 0.3, 1.223, 0.956),
    (1 / 8, 0.0, 1.027, 1.053),  # sigma_x = 1/sqrt(d) (noci22 B.2): near-uniform attention
])
def test_seed_init_measured_constants(sx2, rho, v_ratio, q_ratio):
    # Softmax attention with W_Q, W_K, W_V ~ N(0, 1/d), n = d = 8, 4000 draws: measured
    # (value / Eq. 17, query / Eq. 18) +- SE: (2.355 +- 0.019, 0.926 +- 0.012),
    # (1.223 +- 0.010, 0.956 +- 0.013), (1.027 +- 0.008, 1.053 +- 0.015), recorded here with
    # 4-SE bands. At sigma_x^2 = 1 the attention is far from uniform and Eq. 17 underestimates
    # the value gradient 2.4x at rho = 0 (peaked rows average fewer tokens); at
    # sigma_x^2 = 1/d both match the uniform theory (query: Eq. 18 x 1.0625 isserlis_factor).
    n, d = 8, 8
    v, q = _simulate(n, d, sx2, rho, 4000, seed=3, wq_std=1 / math.sqrt(d))
    g_v, g_q = U.grad_norms(sx2, d, n, rho)
    (vm, vse), (qm, qse) = _mean_se(v), _mean_se(q)
    assert abs(vm / g_v - v_ratio) < 4 * vse / g_v
    assert abs(qm / g_q - q_ratio) < 4 * qse / g_q
    if sx2 < 1:
        assert abs(vm / g_v - 1) < 0.04
        _, g_q_exact = U.grad_norms(sx2, d, n, rho, exact=True)
        assert abs(qm - g_q_exact) < 4 * qse


def test_eq46_temperature_by_autograd():
    # Under Assumption 3.1 (W_Q = 0) tau rescales dM/dW_Q and leaves A uniform: per draw the
    # query norm is tau^2 times, the value norm unchanged (exact identity, roundoff only).
    n, d, tau = 6, 5, 3.7
    v1, q1 = _simulate(n, d, 1.0, 0.2, 50, seed=4)
    vt, qt = _simulate(n, d, 1.0, 0.2, 50, seed=4, tau=tau)
    np.testing.assert_allclose(vt, v1, rtol=1e-12)
    np.testing.assert_allclose(qt, tau**2 * q1, rtol=1e-12)
    gv, gq = U.grad_norms_tempered(1.0, d, n, 0.2, tau)
    assert gq == pytest.approx(tau**2 * U.grad_norms(1.0, d, n, 0.2)[1], rel=1e-14)
    assert gv == U.grad_norms(1.0, d, n, 0.2)[0]


# ------------------------------------------------------------------------------ temperature
def test_tau_star_iwslt14():
    # noci22 C.3 (Table 3): hidden size 512, 4 heads (d_head = 128). tau* uses d = 512: with
    # fan-in weight variance 1/512 the value/query ratio is independent of the head width.
    # n = 25 (a typical IWSLT'14 sentence in tokens), small rho = 0.2, LN-scale sigma_x^2 = 1:
    # tau* = 3.00 (single digits; the paper's 8.5 would need rho ~ 0.56 or sigma_x^2 ~ 0.35).
    tau = float(U.tau_star(1.0, 512, 25, 0.2))
    assert tau == pytest.approx(3.000, abs=5e-3)
    taus = U.tau_star(1.0, 512, np.array([[25], [30]]), np.array([0.1, 0.2, 0.3]))
    assert taus.shape == (2, 3) and np.all((taus > 1) & (taus < 10))
    assert float(U.tau_star(1.0, 512, 25, 0.5559)) == pytest.approx(8.5, abs=1e-2)
    gv, gq = U.grad_norms_tempered(1.0, 512, 25, 0.2, tau)
    assert gq == pytest.approx(gv, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(sx2=st.floats(0.01, 10), d=st.integers(1, 4096), n=st.integers(2, 4096),
       rho=st.floats(0.0, 0.999), exact=st.booleans())
def test_tau_star_equalises(sx2, d, n, rho, exact):
    tau = U.tau_star(sx2, d, n, rho, exact=exact)
    gv, gq = U.grad_norms_tempered(sx2, d, n, rho, tau, exact=exact)
    assert gq == pytest.approx(gv, rel=1e-12)


def test_vectorised_and_rank_collapse_limit():
    sx2 = np.array([0.5, 1.0, 2.0])[:, None, None]
    n = np.array([4, 16])[None, :, None]
    rho = np.array([0.0, 0.5, 1.0 - 1e-12, 1.0])
    gv, gq = U.grad_norms(sx2, 64, n, rho)
    assert gv.shape == gq.shape == (3, 2, 4)
    assert np.all(np.isfinite(gv)) and np.all(np.isfinite(gq))
    assert np.all(gq[..., -1] == 0)  # Thm 3.2: query gradients vanish under rank collapse
    with np.errstate(all="raise"):
        tau = U.tau_star(sx2, 64, n, rho)
    assert not np.any(np.isnan(tau)) and np.all(np.isinf(tau[..., -1]))
    assert np.all(np.isfinite(tau[..., :-1]))
    assert np.isinf(U.tau_star(1.0, 8, 1, 0.3))  # a single token has no query gradient
    C = U.lemma32_C(np.arange(5)[:, None], np.array([0.0, 0.5]), 1.0, 10.0)
    F = U.lemma33_norm(np.arange(5)[:, None], np.array([0.0, 0.5]), 1.0, 10.0, 4.0, 4)
    lim = U.thm33_rho_limit(np.array([0.0, 1.0, 5.0]), 10.0, 4.0, 4)
    assert C.shape == F.shape == (5, 2) and lim.shape == (3,)
    assert lim[0] == pytest.approx((10 / 4 - 1) / 3)  # alpha~_1 = 0: rho0 preserved


# ------------------------------------------------------------------------------ Lemma A.7
def _logits(rng, X, d_k, sigma_k2, draws):
    d_v = X.shape[1]
    Wq = rng.standard_normal((draws, d_v, d_k)) * math.sqrt(sigma_k2)
    Wk = rng.standard_normal((draws, d_v, d_k)) * math.sqrt(sigma_k2)
    return (X @ Wq) @ np.swapaxes(X @ Wk, 1, 2) / math.sqrt(d_k)


def test_eq43_second_moment_of_logits():
    rng = np.random.default_rng(5)
    n, d_v, d_k, draws = 4, 8, 16, 20000
    X = rng.standard_normal((n, d_v)) * np.array([0.5, 1.0, 1.5, 2.0])[:, None]
    sk2 = 2 / (d_v + d_k)
    M = _logits(rng, X, d_k, sk2, draws)
    nrm = (X**2).sum(1)
    pred = U.uniform_deviation(sk2, nrm[:, None], nrm[None, :])
    mean, se = (M**2).mean(0), (M**2).std(0, ddof=1) / math.sqrt(draws)
    assert np.all(np.abs(mean - pred) < 3 * se)  # every (i, j), i = j included
    assert np.all(np.abs(M.mean(0)) < 4 * M.std(0) / math.sqrt(draws))  # E M = 0
    # equal-norm tokens: glorot_deviation is Eq. 43 at sigma_k^2 = 2 / (d_v + d_k)
    np.testing.assert_allclose(U.glorot_deviation(d_v, d_k, nrm), np.diag(pred), rtol=1e-14)


def test_eq44_logits_vanish_like_inverse_dk_squared():
    # d_v = 8 and the tokens (hence their norms) held fixed; d_k from 64 to 2048 (Fig. 7 setup,
    # smaller d_v). Fitted log-log slope of E M^2 and of ||A - 11^T/n||_F^2 / n^2 vs the slope
    # of Eq. 44's law 4 |x|^4 / (d_v + d_k)^2 on the same grid (-1.94; -> -2 as d_k/d_v grows).
    rng = np.random.default_rng(6)
    n, d_v, draws = 6, 8, 200
    X = rng.standard_normal((n, d_v))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # |X_i|^2 = 1 for every token
    dks = 2 ** np.arange(6, 12)
    m2, dev = [], []
    for d_k in dks:
        M = _logits(rng, X, int(d_k), 2 / (d_v + d_k), draws)
        A = np.exp(M - M.max(-1, keepdims=True))
        A /= A.sum(-1, keepdims=True)
        m2.append((M**2).mean())
        dev.append(((A - 1 / n) ** 2).sum((1, 2)).mean() / n**2)
    x = np.log(dks)
    law = U.glorot_deviation(d_v, dks, 1.0)
    slope_law = np.polyfit(x, np.log(law), 1)[0]
    assert slope_law == pytest.approx(-1.94, abs=0.01)
    assert np.polyfit(x, np.log(m2), 1)[0] == pytest.approx(slope_law, abs=0.05)
    assert np.polyfit(x, np.log(dev), 1)[0] == pytest.approx(slope_law, abs=0.05)
    np.testing.assert_allclose(m2, law, rtol=0.1)  # 200 draws x 36 entries: ~3 % noise
