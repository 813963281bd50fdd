"""Dynamic Tanh, per-block norm placement (Mix-LN) and value residuals in the per-layer
theory (docs/theory.md §2.4.6, §2.6.1-2.6.2) and in sigprop's torch stack, each formula
against a computation that does not use it: Monte Carlo with fixed seeds for the tanh kernel
and for the mixed values' kernel, the theory's and the stack's own post-LN path for a
pre-LN spec whose blocks are all made post-LN, and each stack block recomputed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sigprop.nn.model import SigpropTransformer, normalise
from sigprop.spec import ArchSpec, LayerSpec, SpecError
from sigprop.theory import blocks, depth, kernels
from sigprop.theory.attention import AttentionStats
from sigprop.theory.attn_maps import ValueMix

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.mark.parametrize(("alpha", "q", "p"), [(0.5, 1.0, 0.3), (0.5, 6.0, -1.0),
                                                (0.8, 2.5, 2.0), (2.0, 1.0, 0.0)])
def test_dyt_kernel_matches_monte_carlo(alpha, q, p):
    """E tanh(alpha u)^2 and E tanh(alpha u) tanh(alpha v) over 4M Gaussian pairs (seed 0):
    the sample means' standard errors are below 5e-4, the tolerance 2.5e-3 is 5 of them."""
    rng = np.random.default_rng(0)
    n = 4_000_000
    u = rng.standard_normal(n) * np.sqrt(q)
    # v = (p / q) u + the rest, so Var v = q and Cov(u, v) = p
    v = (p / q) * u + rng.standard_normal(n) * np.sqrt(q - p * p / q)
    tu, tv = np.tanh(alpha * u), np.tanh(alpha * v)
    d, o = kernels.dyt_kernel(alpha, q, p)
    assert float(d) == pytest.approx(np.mean(tu * tu), abs=2.5e-3)
    assert float(o) == pytest.approx(np.mean(tu * tv), abs=2.5e-3)


def _homogeneous(T, d, q, p, rng):
    """T tokens of width d whose Gram matrix / d is exactly ``(q - p) I + p 11^T``."""
    K = (q - p) * np.eye(T) + p * np.ones((T, T))
    basis = np.linalg.qr(rng.standard_normal((d, T)))[0].T * np.sqrt(d)  # rows: |.|^2 = d
    return np.linalg.cholesky(K) @ basis


def test_value_residual_kernel_matches_monte_carlo_over_the_value_weights():
    """Fixed attention rows A (a softmax of Gaussian scores) mix ``ls V_l + lf V_1`` with
    ``V = X W + b``, two independent draws of (W, b) for the two blocks' values, over inputs
    with exact homogeneous Gram matrices: the mean over 400 draws of the outputs' second
    moment and mean pairwise product against :func:`attention_map` with ``first`` and the
    rows' own Y2, Yx (no cross term between the blocks). Standard error ~1% of the moments;
    tolerance 4%."""
    rng = np.random.default_rng(1)
    T, d, draws = 8, 256, 400
    ls, lf, var_v, var_v1, var_b = 0.6, 0.9, 1.3, 0.7, 0.05
    Xl, X1 = _homogeneous(T, d, 1.0, 0.4, rng), _homogeneous(T, d, 1.0, 0.1, rng)
    s = rng.standard_normal((T, T)) * 1.5
    A = np.exp(s) / np.exp(s).sum(1, keepdims=True)
    qs, ps = [], []
    off = ~np.eye(T, dtype=bool)
    for _ in range(draws):
        Vl = Xl @ rng.standard_normal((d, d)) * np.sqrt(var_v / d) + \
            rng.standard_normal(d) * np.sqrt(var_b)
        V1 = X1 @ rng.standard_normal((d, d)) * np.sqrt(var_v1 / d) + \
            rng.standard_normal(d) * np.sqrt(var_b)
        out = A @ (ls * Vl + lf * V1)
        G = out @ out.T / d
        qs.append(np.mean(np.diag(G)))
        ps.append(np.mean(G[off]))
    G2 = A @ A.T
    st = AttentionStats(y2=np.mean(np.diag(G2)), yx=np.mean(G2[off]), entropy=0.0, wmax=0.0,
                        inv_t=1.0 / T, inv_t_cross=1.0 / T)
    first = ValueMix(ls2=ls**2, lf2=lf**2, k1=var_v1 * 1.0 + var_b, c1=var_v1 * 0.1 + var_b)
    qa, pa = blocks.attention_map(1.0, 0.4, st, variant="softmax", var_v=var_v, var_b=var_b,
                                  first=first)
    assert float(qa) == pytest.approx(np.mean(qs), rel=0.04)
    assert float(pa) == pytest.approx(np.mean(ps), rel=0.04)
    # and without the first block's values the moments are far off (the check can fail)
    q0, _ = blocks.attention_map(1.0, 0.4, st, variant="softmax", var_v=var_v, var_b=var_b)
    assert abs(ls**2 * float(q0) - np.mean(qs)) > 0.2 * np.mean(qs)


def _layers(n, **kw):
    lay = LayerSpec(sigma_s=(2.0,) * 4, var_v=1.0, var_o=None, var_w_in=2.0, var_w_out=2.0,
                    var_b=0.0)
    return tuple(LayerSpec(**{**lay.__dict__, **(kw if i else {
        k: v for k, v in kw.items() if k != "value_mix"})}) for i in range(n))


def _spec(placement="pre", n=4, **kw):
    """A per-layer spec (mean-field mode: no output projection, as its layers say)."""
    return ArchSpec(depth=n, d_model=64, heads=4, seq_len=16, norm=placement, sigma_v2=1.0,
                    sigma_w2=2.0, layers=_layers(n, **kw))


def _cos(spec, rho0=0.2):
    t = depth.propagate(spec, rho0=rho0)
    return t[t["observable"] == "cos"]["value"].to_numpy()


def test_every_block_post_on_a_pre_spec_is_the_post_spec():
    """A pre-LN spec whose blocks all carry ``norm="post"`` is the post-LN spec: the theory's
    cosines and q, final_cos, and the torch stack's outputs (same seed: the same draws)."""
    post, mixed = _spec("post"), _spec("pre", norm="post")
    np.testing.assert_allclose(_cos(mixed), _cos(post), atol=1e-12)
    assert float(depth.final_cos(mixed, rho0=0.2)) == pytest.approx(
        float(depth.final_cos(post, rho0=0.2)), abs=1e-12)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = SigpropTransformer(mixed, n_seeds=2, seed=5)(x).output
        b = SigpropTransformer(post, n_seeds=2, seed=5)(x).output
    torch.testing.assert_close(a, b)


def test_mixed_placement_carries_the_state_unscaled():
    """Post-LN blocks below pre-LN ones: no scale-free mode, and the theory's q after the
    post block restarts at 1 (the pre-LN path alone would carry the embeddings' q)."""
    layers = _layers(4)
    spec = _spec("pre").replace(layers=tuple(
        LayerSpec(**{**x.__dict__, "norm": "post"}) if i < 2 else x
        for i, x in enumerate(layers)))
    bp = blocks.BlockParams.from_spec(spec, 1)
    assert bp.norm == "post" and blocks.BlockParams.from_spec(spec, 3).norm == "pre"
    assert depth.stack_mode(spec, bp) is None and depth.stack_mode(_spec("pre"),
                                                                   bp) is None
    t = depth.propagate(spec, rho0=0.2)
    q = t[t["observable"] == "q"]["value"].to_numpy()
    assert q[1] == q[2] == 1.0 and q[3] > 1.5


def _block_input(seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 16, 64, generator=g, dtype=torch.float64) * 1.7


def test_stack_dyt_block_by_hand():
    """A pre-LN DyT block: ``h = x + Attn(tanh(a_A x))``, ``h + MLP(tanh(a_M h))``; post-LN:
    ``tanh(a_A (x + Attn(x)))`` then ``tanh(a_M (y + MLP(y)))``."""
    for norm in ("pre", "post"):
        spec = _spec(norm, n=1, dyt=(0.8, 0.3))
        m = SigpropTransformer(spec, seed=2, dtype=torch.float64)
        blk, x = m.blocks[0], _block_input()
        with torch.no_grad():
            got = m(x).output
            if norm == "pre":
                h = x + blk.attn(torch.tanh(0.8 * x)).out
                want = h + blk.mlp(torch.tanh(0.3 * h))
            else:
                y = torch.tanh(0.8 * (x + blk.attn(x).out))
                want = torch.tanh(0.3 * (y + blk.mlp(y)))
        torch.testing.assert_close(got, want)


def test_stack_value_residual_block_by_hand():
    """Block 2 attends over ``ls V_2 + lf V_1``: recomputed from the two blocks' inputs and
    value weights (uniform attention: the output is each sequence's mean value)."""
    spec = _spec("pre", n=2, value_mix=(0.3, 1.6)).replace(attention="uniform")
    m = SigpropTransformer(spec, seed=2, dtype=torch.float64)
    x = _block_input()
    with torch.no_grad():
        out = m(x)
        b1, b2 = m.blocks
        v1 = normalise(x, "rms") @ b1.attn.w_v[0] + b1.attn.b_v[0]
        x2 = out.hidden[1]
        v2 = normalise(x2, "rms") @ b2.attn.w_v[0] + b2.attn.b_v[0]
        att = (0.3 * v2 + 1.6 * v1).mean(dim=-2, keepdim=True).expand_as(v2)
        h = x2 + att
        want = h + b2.mlp(normalise(h, "rms"))
        with pytest.raises(RuntimeError, match="first block's values"):
            b2(x2)
    torch.testing.assert_close(out.output, want)


def test_value_residual_theory_needs_the_carried_kernel_and_a_later_block():
    spec = _spec("pre", value_mix=(0.5, 0.5))
    with pytest.raises(SpecError, match="layers.value_mix"):
        blocks.block_step(1.0, 0.2, blocks.BlockParams.from_spec(spec, 2))
    with pytest.raises(SpecError, match="first block has no earlier values"):
        spec.replace(depth=2, layers=(spec.layers[1],) * 2)
    with pytest.raises(SpecError, match="layers.dyt"):
        _spec("none", dyt=(0.5, 0.5))
    # lambda = (1, 0) is the plain stack, lambda_first alone changes the prediction (with an
    # output projection; without one the stream's cross term partly offsets 0.5 / 0.5's)
    np.testing.assert_allclose(_cos(_spec("pre", value_mix=(1.0, 0.0))), _cos(_spec("pre")),
                               atol=1e-12)
    wo = _spec("pre", value_mix=(0.5, 0.5), var_o=1.0)
    assert abs(_cos(wo)[-1] - _cos(_spec("pre", var_o=1.0))[-1]) > 0.02
    assert abs(_cos(_spec("pre", value_mix=(0.0, 1.0)))[-1] - _cos(_spec("pre"))[-1]) > 0.02


def test_value_residual_in_the_gram_map_is_the_homogeneous_one_on_exchangeable_tokens():
    """The Gram-matrix map's value residual (the first block's value covariance mixed into the
    later blocks', no cross term) on a bidirectional stack with an output projection (without
    one the homogeneous map adds the stream's cross term with V_1, §2.4.6, which the Gram map
    leaves out) whose tokens all meet at one cosine (rho0 0.3), where the position-resolved
    map reduces to the homogeneous one: the
    two agree per layer within 0.01 (the Gram map's attention is sampled, 32 heads: ~0.003
    here), both on the mix and on the plain stack, and the mix moves the final cos by more
    than 0.02 (lambda (1, 0) is the plain stack exactly)."""
    from sigprop.theory import gram

    C0 = 0.7 * np.eye(16) + 0.3
    mix, plain = _spec("pre", value_mix=(0.5, 0.5), var_o=1.0), _spec("pre", var_o=1.0)
    for s in (mix, plain):
        np.testing.assert_allclose(gram.propagate_gram(s, C0), _cos(s, rho0=0.3), atol=0.01)
    np.testing.assert_allclose(gram.propagate_gram(_spec("pre", value_mix=(1.0, 0.0)), C0),
                               gram.propagate_gram(plain, C0), atol=1e-12)
    assert abs(gram.propagate_gram(mix, C0)[-1] - gram.propagate_gram(plain, C0)[-1]) > 0.02
