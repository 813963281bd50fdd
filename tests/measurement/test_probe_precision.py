"""The probe's statistics in float32 (what ``diagnose`` uses) against float64, and the chunked
one-exponential attention statistics against the textbook formulas.

Why float32 is enough: the model itself runs in float32, so its activations (and the q, k the
probe recomputes scores from) carry float32 rounding whatever precision the statistics are
taken in. Each statistic is a mean of O(T) bounded terms summed pairwise, whose float32
relative error is ~log2(T) x 6e-8 (~1e-6 at T = 512); the stable rank's top eigenvalue comes
from a backward-stable eigvalsh (error <= eps |G|). The tolerance claimed is **1e-5 relative**
for every per-layer, per-head statistic (10x above the largest difference seen, 1.7e-6 on the
stable rank), and ``diagnose`` reaches the same verdict with every row within it.
"""

from __future__ import annotations

import math

import pytest
import torch

from sigprop.measurement import observables as obs
from sigprop.measurement.probe import Probe
from sigprop.measurement.probe_recompute import _score_rms_gram, softmax_stats
from sigprop.models import model_at_init, shrink
from sigprop.models.presets import PRESETS

REL = 1e-5  # the claimed float32 tolerance (module docstring)


def _reference(sc: torch.Tensor, allowed: torch.Tensor | None):
    """The textbook float64 statistics: log-softmax, then the observables' functions."""
    sc = sc.double()
    if allowed is not None:
        sc = sc.masked_fill(~allowed, torch.finfo(sc.dtype).min)
    logp = torch.log_softmax(sc, -1)
    A = logp.exp()
    keys = None if allowed is None else allowed.sum(-1)
    return {"ipr": obs.ipr(A), "ipr_cross": obs.ipr_cross(A), "wmax": obs.wmax(A),
            "entropy": obs.entropy(A, n_keys=keys)}


@pytest.mark.parametrize("std", [0.5, 5.0, 100.0])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_stats_match_the_textbook_formulas(std, masked):
    """Unmasked and causal + padded (one query row fully masked, kept finite as HF eager
    does) maps from diffuse (std 0.5) to frozen (std 100, |z| ~ 300) rows: float64 within
    1e-12; float32 within 1e-5 relative, the entropy within 1e-5 absolute (its cancellation
    at |z| ~ 300: ~1e-5 nats over log T ~ 4 nats)."""
    g = torch.Generator().manual_seed(1)
    T = 64
    sc = torch.randn(3, 4, T, T, generator=g, dtype=torch.float64) * std
    allowed = None
    if masked:
        allowed = torch.ones(T, T, dtype=torch.bool).tril().expand(3, 4, T, T).clone()
        allowed[1, :, :, -5:] = False  # padded keys
        allowed[2, :, 0, :] = False  # a query that sees nothing
    ref = _reference(sc, allowed)
    keys = None if allowed is None else allowed.sum(-1)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, REL)):
        z = sc.to(dtype)
        if allowed is not None:
            z = z.masked_fill(~allowed, torch.finfo(dtype).min)
        got, A = softmax_stats(z.clone(), keys, want_probs=True)
        for k, v in ref.items():
            err = (got[k].double() - v).abs().max().item()
            scale = 1.0 if k == "entropy" else v.abs().max().item()
            assert err <= tol * scale, (dtype, k, err)
        # the probabilities against float64 softmax of the same (rounded) logits
        want = torch.softmax(z.double(), -1)
        assert (A.double() - want).abs().max().item() <= (1e-12 if dtype == torch.float64
                                                           else 1e-6)


def test_score_rms_from_gram_matrices():
    """sigma_s from Q^T Q and K^T K equals the RMS over pairs of distinct tokens of the
    formed scores (T = Tk: the diagonal left out; T != Tk: every pair)."""
    g = torch.Generator().manual_seed(2)
    for T, Tk in ((32, 32), (8, 40)):
        q = torch.randn(2, 3, T, 16, generator=g, dtype=torch.float64)
        k = torch.randn(2, 3, Tk, 16, generator=g, dtype=torch.float64) * 2.0
        sc = q @ k.transpose(-1, -2) * 0.25
        keep = torch.ones(T, Tk, dtype=torch.bool)
        if T == Tk:
            keep &= ~torch.eye(T, dtype=torch.bool)
        want = (sc.square() * keep).sum((-1, -2)).div(keep.sum()).sqrt()
        torch.testing.assert_close(_score_rms_gram(q, k, 0.25), want, rtol=1e-12, atol=0)


def _probe(model, ids, dtype, **kw):
    p = Probe(model, keep_hidden=False, dtype=dtype, **kw)
    with p, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return p


@pytest.mark.parametrize("preset,impl,probs", [
    ("bert-base-uncased", "sdpa", "auto"),  # bidirectional, recomputed (Gram sigma_s)
    ("gpt2", "sdpa", "auto"),  # causal, fused q | k | v
    ("llama-3.2-1b", "sdpa", "auto"),  # RoPE, grouped-query KV
    ("bert-base-uncased", "eager", "auto"),  # the returned probabilities
])
def test_float32_statistics_within_claimed_tolerance(preset, impl, probs):
    """Every statistic of every layer and head: float32 within 1e-5 relative of float64
    (module docstring), on the same float32 model and inputs, T = 128."""
    cfg = shrink(PRESETS[preset])
    m = model_at_init(cfg, seed=3, attn_implementation=impl, vocab_size=512)
    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(4))
    a, b = _probe(m, ids, torch.float64, probs=probs), _probe(m, ids, torch.float32,
                                                                probs=probs)
    assert [i["source"] for i in a.info] == [i["source"] for i in b.info]
    pairs = list(zip(a.attention_stats, b.attention_stats, strict=True)) + list(
        zip(a.hidden_stats, b.hidden_stats, strict=True))
    for x, y in pairs:
        assert set(x) == set(y)
        for k in x:
            assert y[k].dtype == torch.float32
            err = ((y[k].double() - x[k]).abs() / x[k].abs().clamp_min(1e-30)).max().item()
            assert err <= REL, (k, err)


@pytest.mark.slow  # >10 s; in `make test-slow`
def test_diagnose_float32_matches_float64(monkeypatch):
    """``diagnose`` with float32 statistics (its default) against float64: the same verdict,
    first failing layer and heads, every trajectory and per-head row within 1e-5 relative."""
    from sigprop.analysis import diagnose as dg

    cfg = shrink(PRESETS["gpt2"])
    got = dg.diagnose(cfg, seq_len=96, seeds=2, sequences=2)
    monkeypatch.setattr(dg, "STATS_DTYPE", "float64")
    want = dg.diagnose(cfg, seq_len=96, seeds=2, sequences=2)
    assert (got.verdict, got.first_failing_layer, got.failing_heads) == (
        want.verdict, want.first_failing_layer, want.failing_heads)
    for a, b in ((got.trajectory, want.trajectory), (got.heads, want.heads)):
        assert len(a) == len(b)
        va, vb = a["value"].to_numpy(), b["value"].to_numpy()
        ok = [math.isclose(x, y, rel_tol=REL, abs_tol=1e-12) or (x != x and y != y)
              for x, y in zip(va, vb, strict=True)]
        assert all(ok), [(r, x, y) for r, x, y, o in zip(a.itertuples(), va, vb, ok,
                                                        strict=True) if not o][:3]


def test_stable_rank_lanczos_matches_eigvalsh():
    """The stable rank from Lanczos' top eigenvalue and the Gram's Frobenius norm against
    every eigenvalue from eigvalsh in float64: a dominant direction (hidden states at init),
    an isotropic Gaussian (the slowest convergence), rank one, a mix of both in one batch,
    and zero. float64 within 1e-10, float32 within 1e-5 relative (the claimed tolerance)."""
    g = torch.Generator().manual_seed(5)
    T, d = 200, 96
    iso = torch.randn(T, d, generator=g, dtype=torch.float64)
    common = iso + 3.0 * torch.randn(1, d, generator=g, dtype=torch.float64)
    rank1 = torch.randn(T, 1, generator=g, dtype=torch.float64) * torch.randn(
        1, d, generator=g, dtype=torch.float64)
    for x in (common, iso, rank1, torch.stack([common, iso, rank1])):
        gram = x.transpose(-1, -2) @ x
        lam = torch.linalg.eigvalsh(gram).clamp_min(0)
        want = lam.square().sum(-1) / lam.amax(-1).square()
        torch.testing.assert_close(obs.stable_rank(x, lanczos=True), want, rtol=1e-10, atol=0)
        got32 = obs.stable_rank(x.float(), lanczos=True).double()
        torch.testing.assert_close(got32, want, rtol=REL, atol=0)
    assert obs.stable_rank(torch.zeros(2, T, d), lanczos=True).tolist() == [0.0, 0.0]
    top = obs.top_eigenvalue(common.T @ common)
    assert math.isclose(top.item(), torch.linalg.eigvalsh(common.T @ common)[-1].item(),
                        rel_tol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_chunks_on_two_workers_equal_one_thread_bit_for_bit(causal):
    """The recomputed statistics with the chunks shared among two worker threads are the
    same tensors, bit for bit and in the same order, as on one thread (each chunk's
    arithmetic is the same; only who runs it changes), with probabilities kept too."""
    cfg = shrink(PRESETS["gpt2" if causal else "bert-base-uncased"], layers=1, hidden=64,
                 heads=4, intermediate=128, vocab=200)
    p = Probe(model_at_init(cfg, seed=0), keep_probs=True)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, 4, 40, 16, generator=g) for _ in range(2))
    allowed = torch.ones(40, 40, dtype=torch.bool).tril() if causal else None
    import sigprop.measurement.probe_recompute as pr

    old = pr.CHUNK
    pr.CHUNK = 40 * 40  # one head per chunk: 12 chunks to share
    try:
        one = p._chunked(q, k, 0.25, allowed, None, (3,), False, workers=1)
        two = p._chunked(q, k, 0.25, allowed, None, (3,), False, workers=2)
    finally:
        pr.CHUNK = old
    assert one.keys() == two.keys() and "_probs" in one
    for key in one:
        assert torch.equal(one[key], two[key]), key


def test_map_tasks_keeps_order_and_reraises_a_worker_error():
    """The worker pool behind the recompute: results in task order on two workers, and an
    error raised in either worker reaches the caller (not a None result left behind)."""
    from sigprop.measurement.threads import map_tasks

    assert map_tasks(lambda a, b: a * b, [(i, i + 1) for i in range(9)], 2) == \
        [i * (i + 1) for i in range(9)]

    def fail_on_5(i):
        if i == 5:
            raise ValueError("task 5")
        return i

    with pytest.raises(ValueError, match="task 5"):
        map_tasks(fail_on_5, [(i,) for i in range(9)], 2)
