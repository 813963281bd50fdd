"""The model-layer streaming kernel (sigprop.measurement.stream_model) against brute-force
attention in float64: causal rows with RoPE and grouped KV heads, bidirectional rows of several
lengths in one pass, sliding windows, several multipliers, outputs through W_O; the Gaussian
key/value source and fits."""

from __future__ import annotations

import math

import pytest
import torch

from sigprop.measurement import stream_model as sm

H, HKV, DH = 4, 2, 8


def _rope(dh=DH, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))

    def fn(p):
        f = torch.as_tensor(p).double()[:, None] * inv[None]
        e = torch.cat([f, f], -1)
        return e.cos(), e.sin()

    return fn


def _brute(q, pos, lo, hi, k, v, scale, mult, rope, w_o):
    """Per row: the softmax over keys lo..hi-1, its statistics and output, head by head."""
    g = H // HKV
    if rope is not None:
        c, s = rope(torch.arange(k.shape[0]))
        k = sm.apply_rope(k, c, s)
        c, s = rope(pos)
        q = sm.apply_rope(q, c, s)
    out = {"ipr": [], "entropy": [], "wmax": [], "spread": [], "out": []}
    for i in range(q.shape[0]):
        rows = {n: [] for n in ("ipr", "entropy", "wmax", "spread")}
        o = []
        for h in range(H):
            sc = (k[lo[i]:hi[i], h // g] @ q[i, h]) * scale
            a = torch.softmax(sc * mult[i], 0)
            n = len(a)
            rows["ipr"].append((a * a).sum())
            rows["wmax"].append(a.max())
            rows["entropy"].append(-(a * a.log()).sum() / math.log(n) if n > 1
                                   else torch.tensor(math.nan, dtype=torch.float64))
            rows["spread"].append(sc.max() - sc.mean())
            o.append(a @ v[lo[i]:hi[i], h // g])
        for name, val in rows.items():
            out[name].append(torch.stack(val))
        y = torch.cat(o)
        out["out"].append(y @ w_o if w_o is not None else y)
    return {name: torch.stack(val) for name, val in out.items()}


def _data(T, R, seed=0, causal=True):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, HKV, DH, generator=g, dtype=torch.float64)
    v = torch.randn(T, HKV, DH, generator=g, dtype=torch.float64)
    q = 1.7 * torch.randn(R, H, DH, generator=g, dtype=torch.float64)
    pos = torch.randperm(T, generator=g)[:R].sort().values
    return k, v, q, pos


def _check(res, ref, out_rows, tol=1e-10):
    for name in ("ipr", "wmax", "spread"):
        assert torch.allclose(getattr(res, name), ref[name], atol=tol, rtol=0), name
    ok = ~torch.isnan(ref["entropy"])
    assert torch.equal(ok, ~torch.isnan(res.entropy))
    assert torch.allclose(res.entropy[ok], ref["entropy"][ok], atol=tol, rtol=0)
    assert torch.allclose(res.out, ref["out"][out_rows], atol=tol, rtol=0)


@pytest.mark.parametrize("chunk,tile,workers", [(128, 50, 2), (1000, 512, 1), (64, 7, 2)])
def test_causal_rope_gqa_several_multipliers_match_brute_force(chunk, tile, workers):
    T, R = 700, 20
    k, v, q, pos = _data(T, R)
    lo, hi = torch.zeros(R, dtype=torch.long), pos + 1
    mults = [torch.ones(R, dtype=torch.float64), torch.linspace(0.5, 2.0, R).double()]
    w_o = torch.randn(H * DH, 5, dtype=torch.float64)
    out_rows = torch.tensor([0, 3, 7, 19])
    res = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), scale=DH ** -0.5,
                          multipliers=mults, rope=_rope(), out_rows=out_rows, w_o=w_o,
                          chunk=chunk, tile=tile, workers=workers)
    for r, m in zip(res, mults, strict=True):
        _check(r, _brute(q, pos, lo, hi, k, v, DH ** -0.5, m, _rope(), w_o), out_rows)


def test_bidirectional_lengths_and_windows_in_one_pass():
    """Rows of lengths 300 and 900 (keys [0, T)) and windowed causal rows: one pass each."""
    T = 900
    k, v, q, _ = _data(T, 12, seed=1)
    pos = torch.tensor([5, 100, 250, 299, 0, 10, 400, 600, 800, 850, 880, 899])
    lo = torch.tensor([0] * 4 + [0] * 8)
    hi = torch.tensor([300] * 4 + [900] * 8)
    mult = [torch.full((12,), 1.3, dtype=torch.float64)]
    res = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), scale=0.4, multipliers=mult,
                          chunk=256, tile=100, workers=2)[0]
    _check(res, _brute(q, pos, lo, hi, k, v, 0.4, mult[0], None, None), torch.arange(12))
    W = 64
    pos = torch.arange(0, 900, 75)
    lo, hi = (pos - W + 1).clamp_min(0), pos + 1
    res = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), scale=0.4, multipliers=mult,
                          rope=_rope(), chunk=200, tile=33, workers=2)[0]
    _check(res, _brute(q, pos, lo, hi, k, v, 0.4, mult[0], _rope(), None), torch.arange(12))


def test_rows_out_of_order_or_out_of_range_are_refused():
    k, v, q, pos = _data(50, 4)
    src = sm.TensorKV(k, v)
    with pytest.raises(ValueError, match="non-decreasing"):
        sm.stream_layer(q, pos, torch.zeros(4, dtype=torch.long), torch.tensor([5, 3, 9, 9]),
                        src, scale=1.0, multipliers=[1.0])
    with pytest.raises(ValueError, match="key ranges"):
        sm.stream_layer(q, pos, torch.zeros(4, dtype=torch.long), torch.tensor([5, 6, 7, 51]),
                        src, scale=1.0, multipliers=[1.0])


def test_apply_rope_matches_transformers_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 10, DH, generator=g, dtype=torch.float64)  # (B, H, T, dh)
    c, s = _rope()(torch.arange(10))
    ref, _ = apply_rotary_pos_emb(x, x, c[None], s[None])
    ours = sm.apply_rope(x[0].transpose(0, 1), c, s).transpose(0, 1)
    assert torch.allclose(ours, ref[0], atol=1e-14)
    # partial rotary: only the first 4 dims rotate
    c4, s4 = c[:, :4], s[:, :4]
    ours = sm.apply_rope(x[0].transpose(0, 1), c4, s4)
    assert torch.equal(ours[..., 4:], x[0].transpose(0, 1)[..., 4:])


@pytest.mark.parametrize("N,D", [(40, 12), (10, 30)])
def test_gaussian_fit_reproduces_the_sample_covariance(N, D):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, D, generator=g, dtype=torch.float64) @ torch.randn(
        D, D, generator=g, dtype=torch.float64) + 3.0
    f = sm.GaussianFit.from_samples(x)
    assert torch.allclose(f.mu, x.mean(0), atol=1e-12)
    assert torch.allclose(f.cov, torch.cov(x.T), atol=1e-9 * float(torch.cov(x.T).abs().max()))
    assert f.rank == min(N - 1, D)


def test_gaussian_kv_moments_and_chunk_invariance():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 2 * DH, generator=g, dtype=torch.float64) @ torch.randn(
        2 * DH, 2 * DH, generator=g, dtype=torch.float64)
    fit = sm.GaussianFit.from_samples(x)
    src = sm.GaussianKV(40000, fit, fit, 2, seed=9, dtype=torch.float64)
    k, v = src.chunk(0, 40000)
    a, b = src.chunk(1000, 1777), src.chunk(1777, 3000)
    # the same draws whatever the chunking (equal up to the matmul's blocking order)
    assert torch.allclose(torch.cat([a[0], b[0]]), k[1000:3000], rtol=1e-12, atol=1e-12)
    assert torch.allclose(torch.cat([a[1], b[1]]), v[1000:3000], rtol=1e-12, atol=1e-12)
    for draws in (k.reshape(40000, -1), v.reshape(40000, -1)):
        scale = float(fit.cov.diagonal().max())
        # 40000 draws: entries of the sample covariance within ~5/sqrt(40000) of their scale
        assert torch.allclose(torch.cov(draws.T), fit.cov, atol=0.03 * scale)
        assert torch.allclose(draws.mean(0), fit.mu, atol=0.03 * math.sqrt(scale))
    # keys are Gaussian (their tail decides condensation): fourth moment 3 sigma^4
    z = (k[:, 0, 0] - fit.mu[0]) / fit.cov[0, 0].sqrt()
    assert abs(float((z ** 4).mean()) - 3.0) < 0.15


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_stream_matches_the_cpu_stream():
    T, R = 3000, 12
    k, v, q, pos = _data(T, R, seed=6)
    lo, hi = torch.zeros(R, dtype=torch.long), pos + 1
    kw = dict(scale=DH ** -0.5, multipliers=[1.0, 0.7], rope=_rope(), chunk=512)
    cpu = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), **kw)
    gpu = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), device="cuda", **kw)
    for a, b in zip(cpu, gpu, strict=True):
        assert torch.allclose(a.ipr, b.ipr, atol=1e-10)
        assert torch.allclose(a.out, b.out, atol=1e-10)


def test_device_argument_on_cpu_is_the_default_path():
    T, R = 500, 6
    k, v, q, pos = _data(T, R, seed=7)
    lo, hi = torch.zeros(R, dtype=torch.long), pos + 1
    kw = dict(scale=0.5, multipliers=[1.0], chunk=128, workers=1)
    a = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), **kw)[0]
    b = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), device="cpu", **kw)[0]
    assert torch.equal(a.ipr, b.ipr) and torch.equal(a.out, b.out)


def test_head_batches_that_do_not_divide_a_group(monkeypatch):
    """Grouped heads are scored in batches bounded by the buffer size: any batch size gives
    the same statistics (here 3 heads per batch in groups of 4, and 1)."""
    T, R = 400, 10
    g = torch.Generator().manual_seed(8)
    k = torch.randn(T, 2, DH, generator=g, dtype=torch.float64)
    v = torch.randn(T, 2, DH, generator=g, dtype=torch.float64)
    q = 1.5 * torch.randn(R, 8, DH, generator=g, dtype=torch.float64)
    pos = torch.randperm(T, generator=g)[:R].sort().values
    lo, hi = torch.zeros(R, dtype=torch.long), pos + 1
    kw = dict(scale=DH ** -0.5, multipliers=[1.0, 0.6], rope=_rope(), chunk=100, tile=40)
    ref = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), **kw)
    for buf in (3 * R * 40, 1):
        monkeypatch.setattr(sm, "BUF", buf)
        got = sm.stream_layer(q, pos, lo, hi, sm.TensorKV(k, v), **kw)
        for a, b in zip(ref, got, strict=True):
            assert torch.allclose(a.ipr, b.ipr, atol=1e-12)
            assert torch.allclose(a.entropy, b.entropy, atol=1e-12, equal_nan=True)
            assert torch.allclose(a.out, b.out, atol=1e-12)
            assert torch.allclose(a.spread, b.spread, atol=1e-12)
