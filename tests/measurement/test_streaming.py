"""Streaming attention statistics (measure/streaming.py) against the dense T x T computation.

The dense reference is the existing :class:`sigprop.nn.attention.BatchedAttention` (its
``scores`` and ``forward``) with the same spec, seed and inputs, followed by a plain
``torch.softmax`` over full rows: independent of the online-softmax code under test.
"""

import math

import pytest
import torch

from sigprop.measurement import observables as obs
from sigprop.measurement import stream_inputs as si
from sigprop.measurement import streaming as st
from sigprop.nn.attention import BatchedAttention
from sigprop.nn.init import init_batched
from sigprop.spec import ArchSpec, score_multiplier


@pytest.fixture(autouse=True)
def _single_thread():
    """Dense references single-threaded: two-thread ops stalled on the shared 2-core machine
    (see measure.streaming.stream_attention); the streaming code uses its own threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def dense_rows(spec, x, rows, dtype, *, logits=None):
    """Per-row (ipr, entropy, wmax) as (R, H) and the layer output rows (R, d), densely."""
    attn = init_batched(BatchedAttention(spec, 1, dtype), "spec", 0, spec=spec)
    T = x.shape[0]
    with torch.no_grad():
        s = attn.scores(x.to(dtype)[None])[0, 0] if logits is None else logits
        out = attn(x.to(dtype)[None]).out[0, 0]
    s = s.double()
    if spec.causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    A = torch.softmax(s, dim=-1)[:, rows]                      # (H, R, T)
    n = (rows + 1) if spec.causal else torch.full_like(rows, T)
    ent = -torch.xlogy(A, A).sum(-1) / torch.log(n.double())
    return A.pow(2).sum(-1).T, ent.T, A.amax(-1).T, out[rows].double()


def rel(a, b):
    ok = ~torch.isnan(b)
    return float(((a - b).abs()[ok] / b.abs()[ok]).max())


def sample_rows(T, R, seed=0):
    rows = torch.randperm(T, generator=torch.Generator().manual_seed(seed))[:R]
    return torch.cat([torch.tensor([0, 1, T - 1]), rows]).unique()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", ["softmax", "centred", "uniform"])
def test_stream_equals_dense_float64(causal, attention):
    # float64 throughout: the online softmax is exact algebra, so only summation order differs
    # (~1e-15); 1e-11 leaves room and is far below the 1e-5 the issue asks for. Chunk 700 and
    # tile 128 put chunk, tile and generator-block (256) boundaries at different places.
    spec = ArchSpec(d_model=64, heads=4, beta=1.5, seq_len=256, causal=causal,
                    attention=attention, sigma_b2=0.01)
    T = 3000
    src = si.token_source("rho", T, 64, rho=0.2, seed=1, dtype=torch.float64)
    rows = sample_rows(T, 40)
    w = st.LayerWeights.from_spec(spec, 0, torch.float64)
    r = st.stream_attention(src, w, rows, causal=causal, variant=attention, chunk=700,
                            tile=128, workers=2)[0]
    x = src.chunk(0, T)
    if attention == "uniform":
        ipr, ent, wm, out = dense_rows(spec, x, rows, torch.float64,
                                       logits=torch.zeros(spec.heads, T, T))
    else:
        ipr, ent, wm, out = dense_rows(spec, x, rows, torch.float64)
    assert rel(r.ipr, ipr) < 1e-11 and rel(r.wmax, wm) < 1e-11
    assert rel(r.entropy, ent) < 1e-11
    assert float((r.out - out).abs().max() / out.abs().max()) < 1e-11
    assert torch.equal(r.n_keys, rows + 1 if causal else torch.full_like(rows, T))
    if causal:  # the first row sees one key: entropy undefined (NaN), as obs.entropy skips it
        assert math.isnan(float(r.entropy[0, 0])) and float(r.ipr[0, 0]) == pytest.approx(1.0)


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_stream_float32_matches_dense_at_4096(beta):
    # The acceptance: <= 1e-5 relative at T <= 4096. Both sides float32 with the same
    # weights and tokens; they differ only by the float32 rounding of logits summed in another
    # order (measured ~1e-6). (At beta = 3 entropies of strongly condensed rows differ by ~1e-4
    # relative between *any* two float32 computations, dense float32 vs float64 included.)
    spec = ArchSpec(d_model=128, heads=2, beta=beta, seq_len=512)
    T = 4096
    src = si.token_source("rho", T, 128, rho=0.1, seed=1)
    rows = torch.arange(0, T, 16)
    r = st.stream_attention(src, st.LayerWeights.from_spec(spec, 0), rows, chunk=1000,
                            workers=2)[0]
    ipr, ent, wm, out = dense_rows(spec, src.chunk(0, T), rows, torch.float32)
    assert rel(r.ipr, ipr) < 1e-5 and rel(r.entropy, ent) < 1e-5 and rel(r.wmax, wm) < 1e-5
    assert float((r.out - out).abs().max() / out.abs().max()) < 1e-5


def test_stream_multipliers_and_causal_log_n():
    # Several length scalings in one pass must equal separate dense runs: log-n applied per
    # causal row (n = t visible keys, as BatchedAttention does) and a constant multiplier.
    T = 1500
    src = si.token_source("rho", T, 32, rho=0.0, seed=2, dtype=torch.float64)
    rows = sample_rows(T, 30, seed=3)
    base = ArchSpec(d_model=32, heads=2, beta=1.0, seq_len=128, causal=True)
    logn = base.replace(scaling="log-n", scaling_param=128.0)
    w = st.LayerWeights.from_spec(base, 0, torch.float64)
    m_logn = score_multiplier("log-n", (rows + 1).numpy(), 128.0)
    res = st.stream_attention(src, w, rows, causal=True, multipliers=[1.0, m_logn, 1.7],
                              chunk=512)
    x = src.chunk(0, T)
    for r, spec, logits_scale in ((res[0], base, None), (res[1], logn, None),
                                  (res[2], base, 1.7)):
        logits = None
        if logits_scale is not None:
            attn = init_batched(BatchedAttention(base, 1, torch.float64), "spec", 0, spec=base)
            with torch.no_grad():
                logits = attn.scores(x[None])[0, 0] * logits_scale
        ipr, ent, wm, _ = dense_rows(spec, x, rows, torch.float64, logits=logits)
        assert rel(r.ipr, ipr) < 1e-11 and rel(r.entropy, ent) < 1e-11
        assert rel(r.wmax, wm) < 1e-11


def test_stream_rem_equals_dense():
    # i.i.d. REM logits: the dense reference softmaxes the same draws assembled over all keys;
    # the draws are per key block, so they do not depend on the chunk size (1000 vs 300).
    T, H, sigma = 2000, 3, 2.5
    src = si.token_source("rem", T, 48, seed=4, dtype=torch.float64)
    rows = sample_rows(T, 25, seed=5)
    spec = ArchSpec(d_model=48, heads=H, beta=1.0, seq_len=128)
    w = st.LayerWeights.from_spec(spec, 0, torch.float64)
    z = st.rem_scores(7, H, len(rows), 0, T, torch.float64)        # (H, R, T)
    A = torch.softmax(sigma * z, dim=-1)
    for chunk in (1000, 300):
        r = st.stream_attention(src, w, rows, rem_std=sigma, seed=7, chunk=chunk)[0]
        assert rel(r.ipr, A.pow(2).sum(-1).T) < 1e-11
        assert rel(r.wmax, A.amax(-1).T) < 1e-11
        assert rel(r.entropy, (-torch.xlogy(A, A).sum(-1) / math.log(T)).T) < 1e-11


def test_generated_tokens_geometry_and_determinism():
    # |x|^2 = d exactly; mean pairwise cosine rho up to O((1-rho)/sqrt(d T)) ~ 1e-4 here
    # (tolerance 3e-3); rows() and chunk() give the same tokens (float32 rounding).
    for rho in (0.0, 0.3):
        src = si.GeneratedTokens(3000, 100, rho, seed=3)
        x = src.chunk(0, 3000)
        assert float(obs.mean_q(x)) == pytest.approx(1.0, abs=1e-5)
        assert float(obs.mean_cos(x)) == pytest.approx(rho, abs=3e-3)
        idx = torch.tensor([7, 2999, 300, 1024])
        assert torch.allclose(src.rows(idx), x[idx], atol=1e-5)
        assert torch.allclose(src.chunk(250, 700), x[250:700], atol=1e-5)
    other = si.GeneratedTokens(3000, 100, 0.0, seed=4).chunk(0, 256)
    assert not torch.allclose(other, si.GeneratedTokens(3000, 100, 0.0, seed=3).chunk(0, 256))


def test_stream_bad_rows():
    src = si.token_source("rho", 100, 16)
    w = st.LayerWeights.from_spec(ArchSpec(d_model=16, heads=2), 0)
    with pytest.raises(ValueError, match="rows"):
        st.stream_attention(src, w, [5, 100])
    with pytest.raises(ValueError, match="variant"):
        st.stream_attention(src, w, [5], variant="flash")
