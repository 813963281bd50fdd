"""The block maps and propagate (docs/theory.md §2.4-2.6), incl. noci22 Lemmas 3.2/3.3
(docs/theory.md §4)."""

import math

import numpy as np
import pytest

from sigprop.spec import ArchSpec
from sigprop.theory import attention as ta
from sigprop.theory import blocks, depth, kernels, rem


def _values(traj, obs):
    sub = traj[traj["observable"] == obs].sort_values("layer")
    return sub["value"].to_numpy()


def gg25_spec(**kw):
    base = dict(depth=10, beta=0.5, rho0=0.05, sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4)
    base.update(kw)
    return ArchSpec(**base)


def test_post_ln_asymptotic_hand_iteration():
    """gg25 post-LN ReLU map (docs/theory.md §2.6) iterated by hand, independent of blocks.py."""
    spec = gg25_spec()
    traj = depth.propagate(spec, asymptotic=True)
    assert set(traj["source"]) == {"theory_asymptotic"}
    cos = _values(traj, "cos")
    assert len(cos) == 11 and cos[0] == pytest.approx(0.05)
    rho, sv, sw, sb = 0.05, 0.2, 0.2, 4e-4
    for layer in range(1, 11):
        b_c = math.sqrt(2 / (1 - rho))
        y2 = 0.0 if 0.5 <= b_c else 1 - b_c / 0.5
        q_att, p_att = sv * (rho + (1 - rho) * y2) + sb, sv * rho + sb
        rho1 = (rho + p_att) / (1 + q_att)
        q1, p1 = sw + sb, sw * rho1 + sb
        c = p1 / q1
        kf = (math.sqrt(1 - c * c) + c * (math.pi - math.acos(c))) / math.pi
        q_h, p_h = sw * q1 / 2 + sb, sw * q1 / 2 * kf + sb
        rho = (rho1 + p_h) / (1 + q_h)
        assert cos[layer] == pytest.approx(rho, abs=1e-12)
    # low beta: rank collapse builds up monotonically with depth
    assert np.all(np.diff(cos) > 0)


def test_rank_collapse_without_residual_and_preservation_above_beta_c():
    # docs/theory.md §2.4 (gg25 Eq. 14): no residual, no bias: beta < beta_c -> cos -> 1 in one
    # layer;
    # beta > beta_c preserves rho / (rho + (1 - rho) Y2).
    kw = dict(depth=1, alpha_attn=0.0, alpha_mlp=0.0, sigma_v2=1.0, sigma_w2=1.0,
              activation="linear", norm="none", rho0=0.3)
    low = depth.propagate(ArchSpec(beta=0.5, **kw), asymptotic=True)
    assert _values(low, "cos")[1] == pytest.approx(1.0, abs=1e-12)
    beta = 3.0
    high = depth.propagate(ArchSpec(beta=beta, **kw), asymptotic=True)
    y2 = 1 - math.sqrt(2 / 0.7) / beta
    assert _values(high, "cos")[1] == pytest.approx(0.3 / (0.3 + 0.7 * y2), rel=1e-12)


def test_finite_t_source_and_ipr_close_to_mc_reference():
    # docs/theory.md §2.3 measured reference: key-query attention, T = 1024, rho = 0, beta = 1.5 ->
    # 0.26
    spec = ArchSpec(depth=1, beta=1.5, rho0=0.0, seq_len=1024)
    traj = depth.propagate(spec)
    assert set(traj["source"]) == {"theory"}
    assert abs(_values(traj, "ipr")[0] - 0.26) < 0.01


def _noci_spec(L, a1, a2, n):
    # noci22 writes Z = alpha_1 S + X (the residual weight multiplies the branch); sigprop's
    # alpha multiplies the skip (gg25). With no LN and linear maps, alpha_skip = 1/alpha_1 gives
    # Z / alpha_1: the same cosines, and second moments smaller by (alpha_1 alpha_2)^2 per block.
    return ArchSpec(depth=L, norm="none", attention="uniform", activation="linear",
                    sigma_v2=1.0, sigma_w2=1.0, sigma_b2=0.0, alpha_attn=1 / a1,
                    alpha_mlp=1 / a2, seq_len=n)


@pytest.mark.parametrize("L,a1,a2,n,rho0", [(5, 0.7, 1.3, 16, 0.2), (12, 0.3, 0.5, 64, 0.0)])
def test_noci22_lemmas_via_propagate(L, a1, a2, n, rho0):
    traj = depth.propagate(_noci_spec(L, a1, a2, n), rho0=rho0)
    q, cos = _values(traj, "q"), _values(traj, "cos")
    d = 1.0  # both sides per feature dimension
    scale = (a1 * a2) ** (2 * np.arange(L + 1))
    qn, pn = q * scale, cos * q * scale
    C = d * (n * qn + n * (n - 1) * pn)
    C0 = d * (n * 1.0 + n * (n - 1) * rho0)
    ell = np.arange(L + 1)
    # Lemma 3.2 (Eq. 10): E C(X^l) = (1 + a2^2)^l (1 + a1^2)^l C(X)
    np.testing.assert_allclose(C, (1 + a2**2) ** ell * (1 + a1**2) ** ell * C0, rtol=1e-12)
    # Lemma 3.3 (Eq. 12): E||X^l||^2 = n (1+a2^2)^l a1^2 sum_k<l (1+a1^2)^k |xbar|^2
    #                                   + (1+a2^2)^l ||X||^2, with n |xbar|^2 = C(X)/n
    geo = np.array([sum((1 + a1**2) ** k for k in range(i)) for i in ell])
    expect = (1 + a2**2) ** ell * a1**2 * geo * C0 / n + (1 + a2**2) ** ell * n * d
    np.testing.assert_allclose(n * d * qn, expect, rtol=1e-12)


def test_uniform_is_beta_zero_limit():
    # docs/theory.md §2.4: uniform attention is the beta -> 0 limit of softmax at finite T
    kw = dict(depth=4, seq_len=128, rho0=0.1, sigma_v2=0.5, sigma_w2=1.5, sigma_b2=0.01)
    u = depth.propagate(ArchSpec(attention="uniform", **kw))
    s = depth.propagate(ArchSpec(beta=1e-6, **kw))
    np.testing.assert_allclose(_values(u, "cos"), _values(s, "cos"), atol=1e-6)


def test_centred_removes_bias_and_mean():
    # docs/theory.md §2.4: centred attention cancels the value bias and the common component
    st = ta.AttentionStats(np.array(0.3), np.array(0.05), None, None, np.array(1 / 64),
                               np.array(1 / 64))
    qa, pa = blocks.attention_map(1.0, 0.4, st, variant="centred", var_v=2.0, var_b=5.0)
    assert qa == pytest.approx(2.0 * 0.6 * (0.3 - 1 / 64))
    assert pa == pytest.approx(2.0 * 0.6 * (0.05 - 1 / 64))


def test_pre_ln_grows_norm_and_keeps_rho_in_range():
    spec = ArchSpec(depth=24, norm="pre", beta=0.5, sigma_v2=1.0, sigma_w2=2.0, rho0=0.05)
    traj = depth.propagate(spec)
    q, cos = _values(traj, "q"), _values(traj, "cos")
    assert np.all(np.diff(q) > 0)  # residual stream accumulates
    assert np.all((cos >= 0) & (cos <= 1))


@pytest.mark.parametrize("act", kernels.ACTIVATIONS)
def test_every_activation_and_variant_runs_finite(act):
    for attention in ("softmax", "centred", "uniform"):
        for norm in ("post", "pre", "none"):
            spec = ArchSpec(depth=3, activation=act, attention=attention, norm=norm,
                            beta=1.0, rho0=0.2, seq_len=64, causal=(norm == "pre"))
            traj = depth.propagate(spec)
            assert np.isfinite(traj["value"]).all(), (act, attention, norm)


@pytest.mark.slow  # ~18 s; the causal tables' own tests (test_causal.py) run by default
def test_causal_statistics_lie_between_positions():
    # causal rows average positions 1..T: early queries see few keys, so the mean ipr is larger
    # than the encoder's at N = T (docs/theory.md §2.4 causal)
    enc = depth.propagate(ArchSpec(depth=1, beta=1.0, seq_len=256))
    dec = depth.propagate(ArchSpec(depth=1, beta=1.0, seq_len=256, causal=True))
    assert _values(dec, "ipr")[0] > _values(enc, "ipr")[0]


def test_verdicts():
    assert depth.verdict(ArchSpec(beta=3.0, depth=2)) == "entropy_collapse"
    deep = ArchSpec(depth=60, beta=0.5, rho0=0.05, sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4,
                    alpha_attn=0.2)
    assert depth.verdict(deep) == "rank_collapse"
    assert depth.verdict(deep.replace(alpha_attn=5.0)) == "trainable"
    # entropy collapse uses the asymptotic threshold beta_c(rho0) of docs/theory.md §2.7
    assert float(rem.beta_c(0.0)) == pytest.approx(math.sqrt(2))


def _causal_mc(v_shared, v_private, T, n_draws, seed=0):
    """Monte Carlo of causal rows a < b sharing key components: mean over pairs of
    sum_c A_ac A_bc, and mean over rows of sum_c A_ac^2."""
    rng = np.random.default_rng(seed)
    cross, diag = [], []
    mask = np.tril(np.ones((T, T), bool))
    for _ in range(n_draws):
        s = (np.sqrt(v_shared) * rng.standard_normal((1, T))
             + np.sqrt(v_private) * rng.standard_normal((T, T)))
        s = np.where(mask, s, -np.inf)
        A = np.exp(s - s.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        G = A @ A.T
        iu = np.triu_indices(T, 1)
        cross.append(G[iu].mean())
        diag.append(np.diag(G).mean())
    return np.mean(cross), np.std(cross) / np.sqrt(n_draws), np.mean(diag)


@pytest.mark.parametrize("beta,rho", [(0.0, 0.0), (0.7, 0.0), (0.7, 0.5), (1.5, 0.5)])
def test_causal_cross_term_vs_monte_carlo(beta, rho):
    """docs/theory.md §2.4 causal: rows a < b share only the first a keys, so the pair-averaged
    cross
    term is ~ (a/b) Yx(a) (uniform attention: exactly E[1/max(a, b)] ~ 2/T, not E[1/t]).
    Tolerance: 3 MC standard errors + 5% for the neglected correlation between the mass row b
    puts on the shared keys and its shape there, and the 12-node position quadrature
    (measured: <= 3%, e.g. uniform yx 0.01532 vs exact 0.01508)."""
    T = 128
    sigma_s = beta * np.sqrt(np.log(T))
    st = ta.attention_stats(sigma_s, rho, T, causal=True)
    v = sigma_s**2 * (1 - rho)
    mc, se, mc_diag = _causal_mc(v * rho, v * (1 - rho), T, 60)
    assert abs(float(st.yx) - mc) < 3 * se + 0.05 * mc
    assert abs(float(st.y2) - mc_diag) < 0.05 * mc_diag
    if beta == 0.0:  # uniform: what centred attention subtracts is the same node sum as yx
        # (so the centred cross term vanishes exactly), within the 12-node quadrature error
        # (<= 3%) of the exact pair mean E[1/max(a, b)]
        a, b = np.triu_indices(T, 1)
        assert float(st.inv_t_cross) == pytest.approx(float(st.yx), rel=1e-12)
        assert float(st.inv_t_cross) == pytest.approx(np.mean(1.0 / (b + 1)), rel=0.03)


def test_asymptotic_pre_ln_at_tiny_t_keeps_p_within_q():
    """Fuzz finding: pre-LN tanh, T = 2, asymptotic theory, alpha_crit's probes at alpha ~ 0.
    A roundoff-negative cosine (-1e-9) through the T -> inf attention map (Y2 = 0) made q_att
    negative and the next MLP input |p1| > q1 (ValueError). Must finish with in-range rows."""
    from sigprop.theory import diagram

    spec = ArchSpec(depth=3, d_model=8, heads=1, seq_len=2, norm="pre", activation="tanh")
    a = float(diagram.alpha_crit(spec, asymptotic=True)[0])
    assert np.isfinite(a) and a >= 0
    for alpha in (0.0, 1e-6, 1e-3, 1.0):
        traj = depth.propagate(spec.replace(alpha_attn=alpha), asymptotic=True)
        cos = traj[traj.observable == "cos"]["value"]
        assert cos.between(-1, 1).all()
