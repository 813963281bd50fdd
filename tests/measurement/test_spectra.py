"""Matrix-free spectra (measure/spectra.py) against dense torch.linalg at small T, float64."""

import math

import pytest
import torch

from sigprop.measurement import spectra as sp
from sigprop.measurement import stream_inputs as si
from sigprop.measurement import streaming as st
from sigprop.spec import ArchSpec


@pytest.fixture(autouse=True)
def _single_thread_lapack():
    """Dense references single-threaded: threaded LAPACK on the shared 2-core machine was
    many times slower (measure.observables._lapack); the operators use their own threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def attention_op(T, *, causal=False, centred=False, beta=1.0, d=128, heads=2, seed=0):
    spec = ArchSpec(d_model=d, heads=heads, beta=beta, seq_len=256)
    w = st.LayerWeights.from_spec(spec, seed, torch.float64)
    x = si.token_source("rho", T, d, rho=0.1, seed=seed, dtype=torch.float64).chunk(0, T)
    return sp.AttentionOperator.from_weights(x, w, 1, causal=causal, centred=centred,
                                             block=64, workers=2)


def dense_of(op):
    """The dense matrix the operator stands for, built independently with torch.softmax."""
    T = op.shape[0]
    s = op.q @ op.k.T
    if op.causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    a = torch.softmax(s, dim=-1)
    if op.centred:
        vis = torch.ones(T, T, dtype=torch.float64)
        vis = vis.tril() if op.causal else vis
        a = a - vis / vis.sum(dim=1, keepdim=True)
    return a


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("centred", [False, True])
def test_attention_operator_products(causal, centred):
    # exact algebra in float64 (blocked rows, threads): 1e-12 covers summation order only
    op = attention_op(300, causal=causal, centred=centred)
    a = dense_of(op)
    v = torch.randn(300, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(op.matmat(v), a @ v, atol=1e-12, rtol=0)
    assert torch.allclose(op.rmatmat(v), a.T @ v, atol=1e-12, rtol=0)
    assert torch.allclose(op.gram(v), a.T @ (a @ v), atol=1e-12, rtol=0)
    g, w = op.gram_mat(v)
    assert torch.allclose(w, a @ v, atol=1e-12, rtol=0)
    assert torch.allclose(g, a.T @ (a @ v), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal,centred", [(False, False), (True, True)])
def test_top_singular_values_attention(causal, centred):
    # block Krylov at the defaults resolved a key-query head at T = 4096 to 2e-8 (module
    # docstring); T = 512 has larger relative gaps; 1e-7 leaves margin for other seeds
    op = attention_op(512, causal=causal, centred=centred)
    dense = torch.linalg.svdvals(dense_of(op))[:5]
    got = sp.top_singular_values(op, 5)
    assert torch.allclose(got, dense, rtol=1e-7, atol=0)
    assert torch.allclose(op.to_dense(), dense_of(op), atol=1e-14, rtol=0)


def test_top_singular_values_flat_bulk():
    # The hard case: the quarter-circle edge of a centred softmax of i.i.d. N(0, 1) logits
    # (docs/theory.md §5), consecutive top values ~1% apart. Measured 7e-6 at T = 2048 with
    # n_iter = 12; at T = 1024 the gaps are larger, so 1e-4 is a safe bound. Plain power
    # iteration with the same passes is far off, which the last assertion shows (>1e-3).
    T = 1024
    z = torch.randn(T, T, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a = torch.softmax(z, dim=-1) - 1.0 / T
    dense = torch.linalg.svdvals(a)[:5]
    got = sp.top_singular_values(sp.DenseOperator(a), 5, n_iter=12)
    assert float(((got - dense) / dense).abs().max()) < 1e-4
    # sqrt(T) s1 sits near the bulk edge 2 sigma_A = 2 sqrt(e - 1) (finite-T excess ~30%)
    assert 2.3 < math.sqrt(T) * float(got[0]) < 4.0
    y = torch.randn(T, 15, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for _ in range(12):
        y = torch.linalg.qr(a.T @ (a @ y)).Q
    power = torch.linalg.svdvals(a @ y)[:5]
    assert float(((power - dense) / dense).abs().max()) > 1e-3


@pytest.mark.parametrize("side", ["tokens", "features"])
def test_covariance_top_eigenvalues(side):
    # symmetric PSD: eigenvalues = singular values; X of rank 48 < T so X X^T is singular
    x = torch.randn(400, 48, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x[:, 0] += 3.0  # a dominant direction, as in correlated tokens
    op = sp.CovarianceOperator(x, side)
    m = x @ x.T if side == "tokens" else x.T @ x
    dense = torch.linalg.eigvalsh(m).flip(0)[:5]
    assert torch.allclose(sp.top_eigenvalues(op, 5), dense, rtol=1e-10, atol=0)
    assert torch.allclose(sp.top_singular_values(op, 5), dense, rtol=1e-10, atol=0)


def test_top_eigenvalues_arnoldi():
    # Perron root of a row-stochastic attention matrix is exactly 1 and isolated
    op = attention_op(512, beta=1.5)
    lam = sp.top_eigenvalues(op, 1)
    assert abs(complex(lam[0]) - 1.0) < 1e-10
    # planted outliers 3 and -2 over a small non-normal bulk (radius ~0.3): Arnoldi finds
    # isolated eigenvalues to near machine precision (tolerance 1e-8)
    n = 400
    g = torch.Generator().manual_seed(5)
    bulk = 0.3 * torch.randn(n, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    u = torch.linalg.qr(torch.randn(n, 2, generator=g, dtype=torch.float64)).Q
    m = bulk + u @ torch.diag(torch.tensor([3.0, -2.0], dtype=torch.float64)) @ u.T
    dense = torch.linalg.eigvals(m)
    dense = dense[dense.abs().argsort(descending=True)][:2]
    got = sp.top_eigenvalues(sp.DenseOperator(m), 2)
    assert torch.allclose(got, dense, atol=1e-8, rtol=0)


def test_bad_k():
    op = sp.DenseOperator(torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="k must be"):
        sp.top_singular_values(op, 0)
    with pytest.raises(ValueError, match="square"):
        sp.top_eigenvalues(sp.DenseOperator(torch.ones(3, 4, dtype=torch.float64)), 1)
