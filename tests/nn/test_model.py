"""Torch half: batched attention, the stack, init schemes; agreement with the theory map.

Tolerances are stated where they are used; sampling-based ones come from the number of
independent samples (seeds x heads), agreement ones from the finite-size error expected.
"""

import math

import pytest
import torch

from sigprop.nn import SigpropTransformer, build, init_foreign, rem_qk_std
from sigprop.spec import ArchSpec
from sigprop.theory import attention as ta
from sigprop.theory import blocks, depth, kernels


def unit_tokens(shape, d, seed=0, dtype=torch.float64):
    """Gaussian tokens rescaled to |x|^2 = d exactly (q = 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, d, generator=g, dtype=dtype)
    return x * math.sqrt(d) / x.norm(dim=-1, keepdim=True)


def rho_tokens(B, T, d, rho, seed=0):
    """B sequences of T tokens with exact pairwise cosine rho and q = 1: the Gram matrix
    d((1-rho) I + rho 11^T) via its Cholesky factor times random orthonormal rows (works for
    T <= d, unlike a shared direction plus T orthonormal ones, which needs T < d)."""
    g = torch.Generator().manual_seed(seed)
    gram = (1 - rho) * torch.eye(T, dtype=torch.float64) + rho
    c = torch.linalg.cholesky(gram)
    out = [math.sqrt(d) * c @ torch.linalg.qr(torch.randn(d, T, generator=g,
                                                          dtype=torch.float64))[0].T
           for _ in range(B)]
    return torch.stack(out)


def pair_mean(gram):
    T = gram.shape[-1]
    return (gram.sum((-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)) / (T * (T - 1))


def mean_cos(x):
    """Mean over pairs a != b of cos(x_a, x_b), per (seed, sequence) (docs/theory.md §1 `cos`)."""
    xn = x / x.norm(dim=-1, keepdim=True)
    return pair_mean(xn @ xn.transpose(-1, -2))


def ratio_cos(x):
    """p / q of docs/theory.md §1 (ratio of the mean overlap to the mean squared norm)."""
    gram = x @ x.transpose(-1, -2)
    return pair_mean(gram) / gram.diagonal(dim1=-2, dim2=-1).mean(-1)


# ------------------------------------------------------------------ shapes, seeds, reproducibility
def test_shapes_and_outputs():
    spec = ArchSpec(depth=3, d_model=32, heads=4, d_ff=48, seq_len=16)
    m = build(spec, n_seeds=5, seed=3)
    assert all(p.shape[0] == 5 for p in m.parameters())
    assert m.blocks[0].attn.w_q.shape == (5, 32, 32) and m.blocks[0].mlp.w1.shape == (5, 32, 48)
    out = m(unit_tokens((2, 16), 32, dtype=torch.float32), return_probs=True)
    assert out.output.shape == (5, 2, 16, 32) and len(out.hidden) == 4 and len(out.stats) == 3
    assert set(out.stats[0]) == {"ipr", "ipr_cross", "entropy", "wmax"}
    assert all(v.shape == (5, 2, 4) for v in out.stats[2].values())
    assert out.probs[1].shape == (5, 2, 4, 16, 16)
    # post-LN (rms): every hidden state after block 0 has q = 1 exactly (up to eps)
    q = out.hidden[2].square().mean(-1)
    assert torch.allclose(q, torch.ones_like(q), atol=1e-4)
    # token ids with embeddings
    me = SigpropTransformer(spec, n_seeds=2, embeddings=50)
    ids = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(0))
    oe = me(ids, return_stats=False)
    assert oe.output.shape == (2, 3, 16, 32) and oe.stats is None
    assert torch.allclose(oe.hidden[0].square().mean(-1), torch.ones(2, 3, 16), atol=1e-4)
    with pytest.raises(ValueError):
        m(torch.zeros(4, 2, 16, 32))  # wrong number of seeds


def test_reproducible_and_independent_seeds():
    spec = ArchSpec(depth=2, d_model=16, heads=2, seq_len=8, sigma_b2=0.1)
    a = build(spec, n_seeds=3, seed=7)
    b = build(spec, n_seeds=3, seed=7)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n
        # different seed slices hold different draws
        assert not torch.equal(pa[0], pa[1]), n
    # slice i of seed k equals the single-seed model of seed k + i; float64 = float32 draws
    c = build(spec, n_seeds=1, seed=9, dtype=torch.float64)
    for pa, pc in zip(a.parameters(), c.parameters(), strict=True):
        assert torch.allclose(pa[2].double(), pc[0], rtol=1e-6, atol=1e-7)
    other = build(spec, n_seeds=3, seed=100)
    assert not torch.equal(a.blocks[0].attn.w_q, other.blocks[0].attn.w_q)


# ------------------------------------------------------------------ score variance (docs/theory.md
# §2.1)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("mode", [dict(beta=1.0), dict(qk_std=0.08),
                                  dict(beta=0.7, scaling="tau", scaling_param=0.5),
                                  dict(qk_std=0.05, scaling="log-n", scaling_param=16)])
def test_score_variance_matches_sigma_s(heads, mode):
    d, T, S, B = 64, 64, 16, 2
    spec = ArchSpec(depth=1, d_model=d, heads=heads, seq_len=T, **mode)
    attn = build(spec, n_seeds=S, seed=1, dtype=torch.float64).blocks[0].attn
    sc = attn.scores(unit_tokens((B, T), d, seed=2)).detach()
    # one variance estimate per independent (seed, head); the estimates are independent
    est = sc.square().mean((1, 3, 4)).flatten() / spec.sigma_s**2
    se = est.std() / math.sqrt(est.numel())
    # 5 standard errors; a per-head factor (the H-heads REM bug: H^2 in the variance) or a
    # missing multiplier is off by >= 40 % while 5 SE here is ~5 % (SE ~0.01 measured)
    assert abs(est.mean().item() - 1.0) < 5 * se.item(), (est.mean().item(), se.item())


def test_model_init_gives_spec_weight_laws():
    spec = ArchSpec(depth=1, d_model=128, heads=4, d_ff=256, seq_len=32, beta=1.5, sigma_v2=0.7,
                    sigma_w2=2.0, sigma_w2_out=1.5, sigma_o2=0.5, sigma_b2=0.04)
    m = build(spec, n_seeds=4, seed=0, dtype=torch.float64)
    a, f = m.blocks[0].attn, m.blocks[0].mlp
    want = {a.w_q: spec.rem_qk_std(), a.w_k: rem_qk_std(1.5, 32, 128), a.w_v: math.sqrt(0.7 / 128),
            a.w_o: math.sqrt(0.5 / 128), f.w1: math.sqrt(2.0 / 128), f.w2: math.sqrt(1.5 / 256),
            a.b_v: 0.2, f.b1: 0.2}
    for p, std in want.items():
        # relative std of a sample std from N draws is 1/sqrt(2N); 5 of them
        assert p.std().item() == pytest.approx(std, rel=5 / math.sqrt(2 * p.numel()))
    m.reinit("xavier", seed=1)
    assert a.w_q.std().item() == pytest.approx(math.sqrt(2 / 256), rel=0.02)
    assert f.w1.std().item() == pytest.approx(math.sqrt(2 / 384), rel=0.02)
    assert f.b1.abs().max().item() == 0.0
    m.reinit("he")
    assert f.w2.std().item() == pytest.approx(math.sqrt(2 / 256), rel=0.02)
    m.reinit("hf", std=0.03)
    assert a.w_q.std().item() == pytest.approx(0.03, rel=0.02)
    m.reinit("rem", beta=0.25)
    assert a.w_k.std().item() == pytest.approx(rem_qk_std(0.25, 32, 128), rel=0.02)


# ------------------------------------------------------------------ batched == per-seed loop
def reference_forward(model, i, x):
    """Seed i of the model by hand: explicit per-head loops, 2-D matmuls, float64."""
    sp = model.spec
    T, dh = x.shape[-2], sp.d_head

    def ln(z):
        if sp.ln_kind == "rms":
            return z / torch.sqrt(z.square().mean(-1, keepdim=True) + 1e-6)
        z = z - z.mean(-1, keepdim=True)
        return z / torch.sqrt(z.square().mean(-1, keepdim=True) + 1e-6)

    vis = torch.ones(T, T, dtype=torch.bool).tril() if sp.causal else torch.ones(T, T).bool()
    n = vis.sum(-1, keepdim=True).double()

    def attn(blk, z):
        at = blk.attn
        heads = []
        for h in range(sp.heads):
            c = slice(h * dh, (h + 1) * dh)
            q, k = z @ at.w_q[i][:, c], z @ at.w_k[i][:, c]
            v = z @ at.w_v[i][:, c] + at.b_v[i][c]
            s = (q @ k.mT / math.sqrt(dh)).masked_fill(~vis, -math.inf)
            a = torch.softmax(s, -1)
            if sp.attention == "centred":
                a = a - vis / n
            elif sp.attention == "uniform":
                a = vis / n
            heads.append(a @ v)
        o = torch.cat(heads, -1)
        return o @ at.w_o[i] + at.b_o[i] if at.has_out else o

    def mlp(blk, z):
        f = blk.mlp
        if f.swiglu:
            gate = torch.nn.functional.silu(z @ f.w_gate[i] + f.b_gate[i])
            hdn = gate * (z @ f.w_up[i] + f.b_up[i])
        else:
            hdn = torch.relu(z @ f.w1[i] + f.b1[i])
        return hdn @ f.w2[i] + f.b2[i]

    aa, am = sp.alpha_attn, sp.alpha_mlp
    for blk in model.blocks:
        if sp.norm == "post":
            x = ln(aa * x + attn(blk, x))
            x = ln(am * x + mlp(blk, x))
        elif sp.norm == "pre":
            x = aa * x + attn(blk, ln(x))
            x = am * x + mlp(blk, ln(x))
        else:
            x = aa * x + attn(blk, x)
            x = am * x + mlp(blk, x)
    return x


@pytest.mark.parametrize("kw", [
    dict(norm="post", beta=1.5, causal=True, sigma_b2=0.01),
    dict(norm="pre", ln_kind="layernorm", qk_std=0.2, activation="swiglu", alpha_attn=0.5),
    dict(norm="none", attention="centred", beta=1.0, sigma_v2=0.8, sigma_w2=1.2, causal=True),
    dict(norm="post", attention="uniform", sigma_v2=1.0, sigma_w2=1.0, sigma_o2=1.0),
])
def test_batched_equals_per_seed(kw):
    spec = ArchSpec(depth=2, d_model=32, heads=4, d_ff=64, seq_len=24, **kw)
    x = unit_tokens((3, 24), 32, seed=5)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        m = build(spec, n_seeds=3, seed=11, dtype=dtype)
        with torch.no_grad():
            full = m(x).output
            for i in range(3):
                one = m.seed_slice(i)(x.to(dtype)).output[0]
                assert (full[i] - one).abs().max().item() < tol
    with torch.no_grad():  # float64 model against the hand-written reference
        for i in range(3):
            ref = reference_forward(m, i, x)
            assert (full[i] - ref).abs().max().item() < 1e-10


# ------------------------------------------------------------------ attention statistics
@pytest.mark.parametrize("causal", [False, True])
def test_stats_equal_those_from_probs(causal):
    spec = ArchSpec(depth=1, d_model=32, heads=2, seq_len=20, beta=2.0, causal=causal)
    attn = build(spec, n_seeds=2, seed=0, dtype=torch.float64).blocks[0].attn
    with torch.no_grad():
        res = attn(unit_tokens((3, 20), 32), return_stats=True, return_probs=True)
    a = res.probs
    T = 20
    n = torch.arange(1, T + 1).double() if causal else torch.full((T,), T).double()
    if causal:  # row t sees exactly its t keys (1-based)
        vis = torch.ones(T, T, dtype=torch.bool).tril()
        assert torch.all(a[..., ~vis] == 0) and torch.all(a[..., vis] > 0)
    assert torch.allclose(a.sum(-1), torch.ones(()).double(), atol=1e-12)
    ipr = a.square().sum(-1).mean(-1)
    pair = a @ a.transpose(-1, -2)  # sum_b A_ab A_a'b for all pairs
    cross = (pair.sum((-1, -2)) - pair.diagonal(dim1=-2, dim2=-1).sum(-1)) / (T * (T - 1))
    ent_rows = -torch.where(a > 0, a * torch.log(a), torch.zeros_like(a)).sum(-1)
    rows = n > 1
    ent = (ent_rows[..., rows] / torch.log(n[rows])).mean(-1)
    wmax = a.max(-1).values.mean(-1)
    for name, ref in (("ipr", ipr), ("ipr_cross", cross), ("entropy", ent), ("wmax", wmax)):
        assert torch.allclose(res.stats[name], ref, atol=1e-10), name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scaling", ["none", "log-n"])
@pytest.mark.parametrize("w_o", [True, False])
def test_chunked_no_grad_path_equals_the_full_maps(causal, scaling, w_o, monkeypatch):
    """Without gradients and without probabilities, attention runs a few sequences at a time
    (nn.attention.CHUNK); its output and statistics equal the full-map path's (with
    return_probs, which never chunks) to 1e-12 in float64, with chunks of 2 maps (3 seeds x 3
    sequences: an uneven last chunk), and the seed/sequence layout survives. The value and
    output biases are drawn nonzero (the chunked path adds the value bias after the softmax,
    or folds it into the output bias), with and without W_O."""
    import sigprop.nn.attention as att

    spec = ArchSpec(depth=1, d_model=32, heads=2, seq_len=20, beta=2.0, causal=causal,
                    scaling=scaling, **({} if w_o else dict(sigma_v2=1.0, sigma_w2=2.0)))
    attn = build(spec, n_seeds=3, seed=0, dtype=torch.float64).blocks[0].attn
    assert attn.has_out == w_o
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (attn.b_v, attn.b_o) if w_o else (attn.b_v,):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = unit_tokens((3, 20), 32)
    monkeypatch.setattr(att, "CHUNK", 2 * 2 * 20 * 20)
    calls = []
    inner = att.BatchedAttention._chunked
    monkeypatch.setattr(att.BatchedAttention, "_chunked",
                        lambda self, *a: calls.append(1) or inner(self, *a))
    with torch.no_grad():
        full = attn(x, return_stats=True, return_probs=True)
        chunked = attn(x, return_stats=True)
    assert calls == [1] and chunked.probs is None
    torch.testing.assert_close(chunked.out, full.out, rtol=0, atol=1e-12)
    for name, ref in full.stats.items():
        torch.testing.assert_close(chunked.stats[name], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["softmax", "centred"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_path_equals_the_explicit_maps(causal, kind, dtype, monkeypatch):
    """When only the output is asked for (training), attention goes through torch's fused
    kernel (BatchedAttention._fused); its output and the gradients of a loss with respect to
    the input and every weight equal those of the explicit path (return_probs, which forms
    the maps) to roundoff: 1e-12 in float64, 2e-5 relative in float32 (a different
    summation order over 20 keys and 16 head dimensions, scores of std ~2)."""
    import sigprop.nn.attention as att

    spec = ArchSpec(depth=1, d_model=32, heads=2, seq_len=20, beta=2.0, causal=causal,
                    attention=kind)
    attn = build(spec, n_seeds=3, seed=1, dtype=dtype).blocks[0].attn
    calls = []
    inner = att.BatchedAttention._fused
    monkeypatch.setattr(att.BatchedAttention, "_fused",
                        lambda self, *a: calls.append(1) or inner(self, *a))
    x = unit_tokens((3, 20), 32).to(dtype)
    g = torch.Generator().manual_seed(2)
    w_out = torch.randn(3, 3, 20, 32, generator=g, dtype=dtype)

    def run(**kw):
        xr = x.clone().requires_grad_()
        out = attn(xr, **kw).out
        grads = torch.autograd.grad((out * w_out).sum(), [xr, *attn.parameters()])
        return out.detach(), grads

    fused, g_fused = run()
    explicit, g_explicit = run(return_probs=True)
    assert calls == [1]
    tol = dict(rtol=0, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(fused, explicit, **tol)
    for a, b in zip(g_fused, g_explicit, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_and_centred_variants(causal):
    T, d = 16, 32
    base = dict(depth=1, d_model=d, heads=2, seq_len=T, beta=1.0, causal=causal, sigma_v2=1.0,
                sigma_w2=1.0, sigma_b2=0.05)
    x = unit_tokens((2, T), d)
    uni = build(ArchSpec(attention="uniform", **base), n_seeds=2, dtype=torch.float64)
    st = uni.blocks[0].attn(x, return_stats=True).stats
    t = torch.arange(1, T + 1).double() if causal else torch.full((T,), T).double()
    assert torch.allclose(st["ipr"], (1 / t).mean().expand(2, 2, 2))
    assert torch.allclose(st["entropy"], torch.ones(2, 2, 2).double())
    assert torch.allclose(st["wmax"], (1 / t).mean().expand(2, 2, 2))
    # centred = softmax output minus the mean value row over the visible keys (same weights)
    soft = build(ArchSpec(**base), n_seeds=2, seed=4, dtype=torch.float64).blocks[0].attn
    cen = build(ArchSpec(attention="centred", **base), n_seeds=2, seed=4,
                dtype=torch.float64).blocks[0].attn
    with torch.no_grad():
        v = torch.einsum("btd,sde->sbte", x, soft.w_v) + soft.b_v[:, None, None]
        mean_v = v.cumsum(-2) / t[:, None] if causal else v.mean(-2, keepdim=True)
        out_s, out_c = soft(x, return_stats=True), cen(x, return_stats=True)
    assert torch.allclose(out_c.out, out_s.out - mean_v, atol=1e-12)
    for k in out_s.stats:  # centred stats are those of the underlying softmax
        assert torch.allclose(out_c.stats[k], out_s.stats[k])


def test_float32_stable_at_huge_scores():
    T = 64
    spec = ArchSpec(depth=2, d_model=64, heads=2, seq_len=T, beta=100 / math.sqrt(math.log(T)),
                    causal=True)
    assert spec.sigma_s == pytest.approx(100)
    out = build(spec, n_seeds=2)(unit_tokens((2, T), 64, dtype=torch.float32), return_probs=True)
    assert all(torch.isfinite(h).all() for h in out.hidden)
    for st in out.stats:
        for v in st.values():
            assert torch.isfinite(v).all()
        assert st["entropy"].min() >= -1e-6 and st["entropy"].max() <= 1 + 1e-5
        assert st["wmax"].max() <= 1 + 1e-6 and st["wmax"].mean() > 0.8  # condensed
    assert torch.isfinite(out.probs[0]).all()



def test_float32_entropy_of_frozen_rows_is_not_negative():
    """Frozen rows (exact entropy ~0) with logits ~1e3 in float32: the log Z + max - E z
    cancellation leaves a few 1e-5 below 0 per row unless clamped to [0, log n]; the
    reported entropy must lie in [0, 1] exactly (issue 13: -4.4e-5 at --qk-std 100)."""
    from sigprop.nn.attention import softmax_with_stats, visible_keys

    g = torch.Generator().manual_seed(0)
    T = 16
    z = (torch.randn(64, T, T, generator=g) * 300.0 + 1000.0).float()
    for causal in (False, True):
        n = visible_keys(T, causal, torch.float32, z.device)
        zz = z.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), torch.finfo(
            torch.float32).min) if causal else z
        _, st = softmax_with_stats(zz, n)
        assert (st["entropy"] >= 0).all() and (st["entropy"] <= 1).all()
        _, st_u = softmax_with_stats(torch.full((4, T, T), 1e3), n)  # uniform rows: exactly 1
        assert (st_u["entropy"] <= 1).all() and st_u["entropy"].min() > 1 - 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_float32_stats_match_float64_at_huge_scores(causal):
    """The float32 statistics (one softmax pass, entropy as log Z + max - E z) against the same
    weights in float64, at score std 100 where the entropy's cancellation is largest: the
    logits are ~300 in size, so float32 rounding (6e-8 relative) leaves errors of a few 1e-5
    nats per row before the division by log T ~ 4; 2e-5 is the bound checked (measured: 5e-7,
    since a condensed row's peak logit nearly cancels against the row maximum exactly)."""
    T = 64
    spec = ArchSpec(depth=1, d_model=64, heads=2, seq_len=T, beta=100 / math.sqrt(math.log(T)),
                    causal=causal)
    m64 = build(spec, n_seeds=2, seed=3, dtype=torch.float64)
    m32 = build(spec, n_seeds=2, seed=3, dtype=torch.float32)
    with torch.no_grad():
        for p32, p64 in zip(m32.parameters(), m64.parameters(), strict=True):
            p32.copy_(p64)  # identical weights up to float32 rounding
        x = unit_tokens((2, T), 64)
        s64 = m64.blocks[0].attn(x, return_stats=True).stats
        s32 = m32.blocks[0].attn(x.float(), return_stats=True).stats
    assert s64["wmax"].mean() > 0.5  # condensed: the regime where the cancellation bites
    for k in s64:
        assert torch.allclose(s32[k].double(), s64[k], atol=2e-5), k

# ------------------------------------------------------------------ agreement with the theory
@pytest.mark.parametrize("beta", [0.5, 3.0])
def test_one_post_ln_layer_agrees_with_finite_t_theory(beta):
    """docs/theory.md §2.3-2.6 at d = T = 256, one head, rho = 0.3, no residual, 4 seeds x 4
    sequences.

    Statistical error of the measured means (16 sequences): ~0.001 at beta = 0.5, ~0.01 for
    ipr / wmax / entropy and ~0.015 for the cosines at beta = 3 (the REM is not self-averaging
    above beta_c); finite-d corrections O(1/sqrt(d)) to the cosine. Measured at writing
    (meas / theory): beta = 0.5: ipr 0.0106 / 0.0101, cos p/q 0.988 / 0.989, layer-1 cos
    0.989 / 0.989; beta = 3: ipr 0.547 / 0.538, ipr_cross 0.028 / 0.025, entropy 0.192 / 0.196,
    wmax 0.665 / 0.659, cos p/q 0.469 / 0.469. The mean pairwise cosine after attention exceeds
    p/q at beta = 3 (0.497; ~0.03 systematic over 16 seeds x 4 sequences at writing): rows with
    large Y2 have large norms, so E[cos] != E[p]/E[q] when Y2 fluctuates from row to row, and the
    per-token LN passes E[cos] on; the layer-1 output shows it (0.613 vs propagate's 0.589),
    hence 0.05 for the mean cosines and 0.03 for everything else.
    """
    d = T = 256
    rho = 0.3
    spec = ArchSpec(depth=1, d_model=d, heads=1, seq_len=T, beta=beta, alpha_attn=0.0,
                    alpha_mlp=0.0, sigma_v2=1.0, sigma_w2=1.0, rho0=rho)
    m = build(spec, n_seeds=4, seed=0)
    x = rho_tokens(4, T, d, rho, seed=1).float()
    assert mean_cos(x).mean().item() == pytest.approx(rho, abs=1e-5)
    with torch.no_grad():
        att = m.blocks[0].attn(x, return_stats=True)
        out = m(x, return_stats=False)
    st = ta.attention_stats(spec.sigma_s, rho, T, d_head=spec.d_head, full=True)
    q_att, p_att = blocks.attention_map(1.0, rho, st, variant="softmax", var_v=1.0, var_b=0.0)
    meas = {k: v.double().mean().item() for k, v in att.stats.items()}
    assert meas["ipr"] == pytest.approx(float(st.y2), abs=0.03)
    assert meas["ipr_cross"] == pytest.approx(float(st.yx), abs=0.03)
    assert meas["entropy"] == pytest.approx(float(st.entropy), abs=0.03)
    assert meas["wmax"] == pytest.approx(float(st.wmax), abs=0.03)
    assert ratio_cos(att.out.double()).mean().item() == pytest.approx(p_att / q_att, abs=0.03)
    assert mean_cos(att.out.double()).mean().item() == pytest.approx(p_att / q_att, abs=0.05)
    traj = depth.propagate(spec)
    cos1 = traj[(traj["observable"] == "cos") & (traj["layer"] == 1)]["value"].item()
    assert mean_cos(out.hidden[1].double()).mean().item() == pytest.approx(cos1, abs=0.05)
    # the MLP half alone is exact given the measured post-LN input cosine (docs/theory.md §2.5)
    r1 = mean_cos(att.out.double()).mean().item()
    k_d, k_o = kernels.kernel("relu", 1.0, r1)
    assert mean_cos(out.hidden[1].double()).mean().item() == pytest.approx(k_o / k_d, abs=0.02)


# ------------------------------------------------------------------ foreign models
def test_init_foreign_on_tiny_bert():
    import transformers  # a declared dependency: fail loudly if missing
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=256,
                                  max_position_embeddings=64)
    model = transformers.BertModel(cfg).eval()
    beta, T = 1.5, 64
    done = init_foreign(model, "rem", q=["encoder.layer.*.attention.self.query"],
                        k=["encoder.layer.*.attention.self.key"],
                        v=["encoder.layer.*.attention.self.value"],
                        mlp_in=["encoder.layer.*.intermediate.dense"], beta=beta, seq_len=T,
                        std=0.05, seed=3)
    assert len(done) == 8 and done["encoder.layer.1.attention.self.key"] == "k"
    target = rem_qk_std(beta, T, 128)
    tol = 5 / math.sqrt(2 * 128 * 128)  # 5 x relative std of a sample std, 16384 draws
    for i in range(2):
        layer = model.encoder.layer[i]
        for lin in (layer.attention.self.query, layer.attention.self.key):
            assert lin.weight.std().item() == pytest.approx(target, rel=tol)
            assert lin.bias.abs().max().item() == 0.0
        assert layer.attention.self.value.weight.std().item() == pytest.approx(0.05, rel=tol)
    # untouched layers keep HF's own init (std 0.02)
    assert model.encoder.layer[0].output.dense.weight.std().item() == pytest.approx(0.02, rel=0.05)
    ids = torch.randint(0, 100, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = model(input_ids=ids).last_hidden_state
    assert hs.shape == (2, T, 128) and torch.isfinite(hs).all()
    with pytest.raises(KeyError):
        init_foreign(model, "hf", q=["no.such.module"])
    init_foreign(model, "xavier", mlp_out=["encoder.layer.0.output.dense"])
    w = model.encoder.layer[0].output.dense.weight
    assert w.std().item() == pytest.approx(math.sqrt(2 / (256 + 128)), rel=0.03)


def test_skip_is_the_residual_sum_to_rounding_and_differentiable():
    """``skip(x, branch, alpha)`` (the blocks' residual sum in one pass) equals the exact
    ``alpha x + branch`` within float32 rounding of its two terms (``eps (|alpha x| +
    |branch|)``, the bound of the two-pass expression) for a float alpha, alpha 1 and a
    per-slice tensor alpha; its gradients equal those of the two-pass expression in float64
    (1e-12)."""
    from sigprop.nn.model import skip

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, 16, generator=g)
    b = torch.randn(3, 4, 5, 16, generator=g)
    for alpha in (0.7, 1.0, 2.0, torch.tensor([0.2, 0.5, 2.0]).view(3, 1, 1, 1)):
        ref = (alpha * x.double() + b.double())
        got = skip(x, b, alpha).double()
        bound = torch.finfo(torch.float32).eps * ((alpha * x).double().abs() + b.double().abs())
        assert ((got - ref).abs() <= bound).all()
    xs, bs = x.double().requires_grad_(), b.double().requires_grad_()
    a = torch.tensor([0.2, 0.5, 2.0], dtype=torch.float64).view(3, 1, 1, 1).requires_grad_()
    w = torch.randn(3, 4, 5, 16, generator=g, dtype=torch.float64)
    for alpha in (0.7, a):
        inputs = (xs, bs) + ((a,) if alpha is a else ())
        g1 = torch.autograd.grad((skip(xs, bs, alpha) * w).sum(), inputs)
        g2 = torch.autograd.grad(((alpha * xs + bs) * w).sum(), inputs)
        for u, v in zip(g1, g2, strict=True):
            torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_rms_norm_derivatives_equal_those_of_its_composite():  # (torch.func's own warning)
    """``normalise(x, "rms")`` under autograd is a custom Function (one-expression gradient,
    issue 19); its value, gradient, second derivatives (r is an output, so double backward
    reaches it), forward-mode derivative and vmap equal those of the plain composite
    ``x / sqrt(mean(x^2) + eps)`` to float64 roundoff (1e-12), on rows of very different
    scales."""
    from sigprop.nn.model import LN_EPS, _RMSNorm, normalise

    def ref(z):
        return z * torch.rsqrt(z.square().mean(-1, keepdim=True) + LN_EPS)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * torch.tensor(
        [1e-2, 1.0, 30.0], dtype=torch.float64)[:, None, None]
    w = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    tol = dict(rtol=1e-12, atol=1e-12)
    xr = x.clone().requires_grad_()
    y = normalise(xr, "rms")
    assert y.grad_fn is not None and "RMSNorm" in type(y.grad_fn).__name__
    torch.testing.assert_close(y, ref(x), **tol)

    def grads(fn):
        z = x.clone().requires_grad_()
        (d1,) = torch.autograd.grad((fn(z).sin() * w).sum(), z, create_graph=True)
        (d2,) = torch.autograd.grad((d1 * w).sum(), z)
        return d1.detach(), d2

    for a, b in zip(grads(lambda z: normalise(z, "rms")), grads(ref), strict=True):
        torch.testing.assert_close(a, b, **tol)
    hess = torch.func.hessian(lambda z: (normalise(z, "rms").sin() * w[0, 0]).sum())(x[0, 0])
    torch.testing.assert_close(hess, torch.func.hessian(
        lambda z: (ref(z).sin() * w[0, 0]).sum())(x[0, 0]), **tol)
    _, t1 = torch.func.jvp(lambda z: _RMSNorm.apply(z, LN_EPS)[0], (x,), (w,))
    _, t2 = torch.func.jvp(ref, (x,), (w,))
    torch.testing.assert_close(t1, t2, **tol)
    torch.testing.assert_close(torch.func.vmap(lambda z: _RMSNorm.apply(z, LN_EPS)[0])(x),
                               ref(x), **tol)
