"""Observables of docs/theory.md §1 as pure tensor functions.

Every function is batched over arbitrary leading dimensions:

* hidden states ``x`` have shape ``(..., T, d)`` (``T`` tokens of width ``d``) and the
  functions return shape ``(...)``;
* attention probabilities ``A`` have shape ``(..., T, Tk)`` with rows (queries) summing to 1;
  causal rows carry zeros above the diagonal. Returns have shape ``(...)``.

Nothing here changes dtype: pass float64 for validation-grade accuracy. None of the
functions produces NaN for well-formed input (zero rows of ``x`` give cosine 0; ``0 log 0``
is 0). The only NaNs are documented: pairwise statistics of a single token, an entropy with no
row having two or more keys, and ``summarise``'s standard error from a single sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "mean_cos", "mean_q", "kept", "ipr", "ipr_cross", "entropy", "entropy_from_logits", "wmax",
    "stable_rank", "top_eigenvalue", "gap", "summarise",
]


# --------------------------------------------------------------------------------------------
# Hidden-state observables
# --------------------------------------------------------------------------------------------
def mean_cos(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Mean pairwise cosine over tokens ``a != a'`` (docs/theory.md §1 ``cos``; gg25's rho).

    Computed from the Gram matrix ``G`` of the unit-normalised rows ``u_a = x_a / |x_a|``
    without forming it: ``sum_{a,a'} G = |sum_a u_a|^2`` and ``sum_a G_aa = sum_a |u_a|^2``
    (1 per nonzero row), so ``cos = (|sum_a u_a|^2 - trace G) / (T (T - 1))``. ``sum_a u_a``
    is the row vector of inverse norms times ``x`` (one matrix-vector product per sequence),
    so ``x`` is read twice (norms, product) and no (..., T, d) temporary is written: on the
    engine's hidden states (issue 19) the unit rows cost two passes more over memory than the
    whole statistic now does. Zero rows count as cosine 0 with every other token. Undefined
    (NaN) for ``T < 2``. The exact value lies in [-1/(T-1), 1]; the float32 rounding of
    near-parallel rows (1 + 2e-7) is clamped back into that range.
    """
    T = x.shape[-2]
    if T < 2:
        return torch.full(x.shape[:-2], float("nan"), dtype=x.dtype, device=x.device)
    norms = torch.linalg.vector_norm(x, dim=-1)
    inv = 1.0 / norms.clamp_min(eps)
    total = torch.matmul(inv.unsqueeze(-2), x).squeeze(-2).square().sum(dim=-1)
    diag = (norms * inv).square().sum(dim=-1)
    return ((total - diag) / (T * (T - 1))).clamp(-1.0 / (T - 1), 1.0)


def kept(x0: torch.Tensor, x: torch.Tensor, eps: float = 1e-30) -> torch.Tensor:
    """How much of each token's own part of the input a later state still carries: the mean
    over tokens of the cosine between ``x0_a - mean_b x0_b`` and ``x_a - mean_b x_b`` (each
    token minus its sequence's mean), per sequence; ``x0``, ``x`` (..., T, d), float64 sums.
    1 for an identity stack; ~0 when the depth has replaced the tokens' own directions by
    others (docs/fixes.md, "Training the fixes"); 0 for a row that is exactly its
    sequence's mean (complete rank collapse). Undefined (NaN) for ``T < 2``."""
    if x.shape[-2] < 2:
        return torch.full(x.shape[:-2], float("nan"), dtype=torch.float64, device=x.device)
    a, b = (t - t.mean(dim=-2, keepdim=True) for t in (x0.double(), x.double()))
    num = torch.linalg.vecdot(a, b)
    den = (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1))
    return (num / den.clamp_min(eps)).clamp(-1.0, 1.0).mean(dim=-1)


def mean_q(x: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of ``|x_a|^2 / d`` (docs/theory.md §1 ``q``: squared norm per dimension)."""
    return x.pow(2).mean(dim=-1).mean(dim=-1)


def _lapack(fn, a: torch.Tensor) -> torch.Tensor:
    """Run a LAPACK routine single-threaded on CPU tensors: threaded CPU LAPACK next to
    torch's (still spinning) OpenMP pool was measured ~80x slower (eigvalsh of 2 x 512 x 512:
    2.9 s vs 0.04 s) on a 2-core machine once transformers was imported."""
    if a.device.type != "cpu":
        return fn(a)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(a)
    finally:
        torch.set_num_threads(n)


#: Gram matrices up to this size go straight to eigvalsh (Lanczos gains nothing there)
LANCZOS_MIN = 64


def top_eigenvalue(G: torch.Tensor, steps: int = 64, check: int = 8,
                  rtol: float | None = None) -> torch.Tensor:
    """Largest eigenvalue of each symmetric positive semi-definite matrix ``G`` (..., n, n),
    by Lanczos with full reorthogonalisation in float64 from a fixed start vector; NaN where
    the Ritz residual ``|beta_k s_k|`` (a bound on the distance from the top Ritz value to an
    eigenvalue) is not below ``rtol * theta`` after ``steps`` steps (``rtol``: 1e-6 for
    float32 input, 1e-12 for float64, unless given), which :func:`stable_rank` hands to
    ``eigvalsh``.

    Hidden states at init have one dominant direction: bert-base's and GPT-2's 2 x 512 x 512
    Grams converged in 8 steps (16 for GPT-2's embeddings) to 1e-15 relative of eigvalsh's top
    eigenvalue; an isotropic Gaussian X (the slowest case: a Marchenko-Pastur edge) needs ~48
    steps at 1e-6 and ~64 at 1e-12. On CPU the iteration runs in NumPy: each step is a
    handful of small products, and NumPy's per-call cost is a third of torch's (a 2 x 512 x
    512 batch: ~0.25 ms a step against ~0.6 ms)."""
    if rtol is None:
        rtol = 1e-12 if G.dtype == torch.float64 else 1e-6
    gen = torch.Generator().manual_seed(0)
    v0 = torch.randn(G.shape[-1], generator=gen, dtype=torch.float64)
    if G.device.type == "cpu":
        from .threads import numpy_blas_single

        g = G.detach().to(torch.float64).numpy()
        with numpy_blas_single():
            return torch.from_numpy(_lanczos_np(g, v0.numpy(), steps, check, rtol))
    return _lanczos_torch(G.to(torch.float64), v0.to(G.device), steps, check, rtol)


def _lanczos_np(G, v0, steps: int, check: int, rtol: float):
    import numpy as np

    lead, n = G.shape[:-2], G.shape[-1]
    m = min(steps, n)
    V = np.zeros(lead + (m + 1, n))
    V[..., 0, :] = v0 / np.linalg.norm(v0)
    a = np.zeros(lead + (m,))
    b = np.zeros_like(a)
    top = np.full(lead, np.nan)
    ok = np.zeros(lead, dtype=bool)
    for j in range(m):
        w = (G @ V[..., j, :, None])[..., 0]
        a[..., j] = (w * V[..., j, :]).sum(-1)
        basis = V[..., : j + 1, :]
        for _ in range(2):  # twice is enough (Kahan-Parlett)
            w = w - ((basis @ w[..., None]) * basis).sum(-2)
        b[..., j] = np.sqrt((w * w).sum(-1))
        V[..., j + 1, :] = w / np.maximum(b[..., j, None], np.finfo(np.float64).tiny)
        if (j + 1) % check and j + 1 < m:
            continue
        k = j + 1
        tri = np.zeros(lead + (k, k))
        idx = np.arange(k)
        tri[..., idx, idx] = a[..., :k]
        tri[..., idx[:-1], idx[1:]] = b[..., : k - 1]
        tri[..., idx[1:], idx[:-1]] = b[..., : k - 1]
        theta, s = np.linalg.eigh(tri)
        top, res = theta[..., -1], np.abs(b[..., j] * s[..., -1, -1])
        ok = res <= rtol * np.abs(top)
        if bool(ok.all()):
            return np.asarray(top, dtype=np.float64)
    return np.where(ok, top, np.nan)


def _lanczos_torch(G: torch.Tensor, v0: torch.Tensor, steps: int, check: int, rtol: float):
    lead, n = G.shape[:-2], G.shape[-1]
    m = min(steps, n)
    V = torch.zeros(*lead, m + 1, n, dtype=torch.float64, device=G.device)
    V[..., 0, :] = v0 / v0.norm()
    a = torch.zeros(*lead, m, dtype=torch.float64, device=G.device)
    b = torch.zeros_like(a)
    top = torch.full(lead, math.nan, dtype=torch.float64, device=G.device)
    ok = torch.zeros(lead, dtype=torch.bool, device=G.device)
    for j in range(m):
        w = (G @ V[..., j, :].unsqueeze(-1)).squeeze(-1)
        a[..., j] = (w * V[..., j, :]).sum(-1)
        basis = V[..., : j + 1, :]
        for _ in range(2):
            w = w - ((basis @ w.unsqueeze(-1)) * basis).sum(-2)
        b[..., j] = w.norm(dim=-1)
        V[..., j + 1, :] = w / b[..., j, None].clamp_min(torch.finfo(torch.float64).tiny)
        if (j + 1) % check and j + 1 < m:
            continue
        k = j + 1
        off = b[..., : k - 1]
        tri = torch.diag_embed(a[..., :k]) + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
        theta, s = torch.linalg.eigh(tri)
        top, res = theta[..., -1], (b[..., j] * s[..., -1, -1]).abs()
        ok = res <= rtol * top.abs()
        if bool(ok.all()):
            return top
    return torch.where(ok, top, torch.nan)


def stable_rank(x: torch.Tensor, lanczos: bool = False) -> torch.Tensor:
    """Stable rank of the (uncentred) token covariance ``X X^T`` (mindthegap Eq. 4; docs/theory.md
    §5).

    ``sr(X X^T) = ||X X^T||_F^2 / ||X X^T||_2^2 = sum_i s_i^4 / max_i s_i^4`` with ``s_i`` the
    singular values of ``X`` (shape ``(..., T, d)``). Ranges from 1 (rank one) to
    ``min(T, d)`` (all singular values equal). Returns NaN-free 0 only for ``X = 0``.
    The eigenvalues ``s_i^2`` come from ``eigvalsh`` of the smaller Gram matrix (``X X^T`` or
    ``X^T X``), which is several times faster than an SVD of ``X``. ``lanczos=True`` (the
    probe's hidden states): the numerator is that Gram's squared Frobenius norm and the top
    eigenvalue comes from :func:`top_eigenvalue`, with ``eigvalsh`` where Lanczos did not
    converge or the Gram is at most :data:`LANCZOS_MIN` wide (not the default: on isotropic
    states, deep in a healthy stack, Lanczos may run its 64 steps before falling back).
    """
    T, d = x.shape[-2], x.shape[-1]
    gram = x @ x.transpose(-1, -2) if T <= d else x.transpose(-1, -2) @ x
    n = gram.shape[-1]
    top = top_eigenvalue(gram) if lanczos and n > LANCZOS_MIN else None
    if top is None or not bool(torch.isfinite(top).all()):
        lam = _lapack(torch.linalg.eigvalsh, gram).clamp_min(0.0)
        lam2 = lam.pow(2)
        top2 = lam2.amax(dim=-1)
        fro2 = lam2.sum(dim=-1)
    else:
        top2 = top.to(gram.dtype).clamp_min(0.0).pow(2)
        fro2 = gram.square().sum((-1, -2))
    return torch.where(top2 > 0, fro2 / top2.clamp_min(torch.finfo(gram.dtype).tiny),
                       torch.zeros_like(top2))


# --------------------------------------------------------------------------------------------
# Attention-matrix observables
# --------------------------------------------------------------------------------------------
def ipr(A: torch.Tensor) -> torch.Tensor:
    """Inverse participation ratio ``Y2 = sum_b A_ab^2``, mean over query rows a (gg25 Eq. 12).

    Uniform rows over ``n`` keys give ``1/n``; a one-hot row gives 1. Causal rows are all
    included (the first row, with one key, contributes 1).
    """
    return A.pow(2).sum(dim=-1).mean(dim=-1)


def ipr_cross(A: torch.Tensor) -> torch.Tensor:
    """Cross overlap ``Yx = sum_b A_ab A_a'b``, mean over ordered pairs ``a != a'`` (docs/theory.md
    §1).

    With column sums ``c_b = sum_a A_ab``: ``sum_{a != a'} sum_b A_ab A_a'b = |c|^2 - sum A^2``,
    so the cost is ``O(T Tk)`` instead of ``O(T^2 Tk)``. Undefined (NaN) for ``T < 2`` rows.
    """
    T = A.shape[-2]
    if T < 2:
        return torch.full(A.shape[:-2], float("nan"), dtype=A.dtype, device=A.device)
    col = A.sum(dim=-2)
    return (col.pow(2).sum(dim=-1) - A.pow(2).sum(dim=(-1, -2))) / (T * (T - 1))


def _row_keys(T: int, Tk: int, causal: bool, n_keys, device) -> torch.Tensor:
    if n_keys is not None:
        return torch.as_tensor(n_keys, device=device)
    if causal:
        # query t (0-based) of a causal map sees the keys 0..t + (Tk - T) (KV prefix included)
        return torch.arange(1, T + 1, device=device) + (Tk - T)
    return torch.full((T,), Tk, device=device)


def normalised_row_mean(h: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``h / log(keys)``, skipping rows with fewer than two keys.

    ``h`` has shape ``(..., T)``; ``keys`` broadcasts to it. NaN only if no row has two keys.
    """
    keys = torch.broadcast_to(keys.to(h.dtype), h.shape)
    valid = keys > 1.5
    norm = torch.where(valid, torch.log(keys.clamp_min(2.0)), torch.ones_like(keys))
    ratio = torch.where(valid, h / norm, torch.zeros_like(h))
    count = valid.sum(dim=-1).to(h.dtype)
    return ratio.sum(dim=-1) / count  # NaN only when no row has two keys (documented)


def entropy(A: torch.Tensor, causal: bool = False, n_keys=None, alog=None) -> torch.Tensor:
    """Normalised row entropy ``H(A_a) / log(#keys of row a)``, mean over rows (docs/theory.md §1).

    ``H = -sum_b A_ab log A_ab`` with ``0 log 0 = 0`` (``torch.xlogy``), so exact zeros (causal
    masks, underflow) are harmless. ``#keys``: ``Tk`` for full attention; ``t`` for the t-th
    (1-based) row when ``causal``; or an explicit ``n_keys`` tensor broadcastable to
    ``(..., T)`` (e.g. from a padding mask). Rows with a single key (entropy 0 / log 1) are
    skipped. 1 means uniform attention, 0 one-hot attention. ``alog``: the terms
    ``xlogy(A, A)`` when the caller has formed them already (the probe's anatomy shares them).
    """
    T, Tk = A.shape[-2], A.shape[-1]
    h = -(torch.xlogy(A, A) if alog is None else alog).sum(dim=-1)
    return normalised_row_mean(h, _row_keys(T, Tk, causal, n_keys, A.device))


def row_entropy_from_log_probs(logp: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Row entropies ``-sum_b p_b log p_b`` (unnormalised) from log-probabilities.

    Entries with ``logp = -inf`` or ``allowed = False`` contribute exactly 0.
    """
    finite = torch.isfinite(logp) if allowed is None else allowed & torch.isfinite(logp)
    safe = logp.masked_fill(~finite, 0.0)
    return -(safe.exp() * safe).masked_fill(~finite, 0.0).sum(dim=-1)


def entropy_from_logits(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Normalised row entropy of ``softmax(scores)`` computed via ``log_softmax`` (docs/theory.md
    §1).

    ``mask`` (bool, broadcastable to ``scores``; True = key visible) restricts each row and sets
    its ``#keys``. Stable for arbitrarily large scores: ``p log p`` is evaluated as
    ``exp(logp) * logp`` with finite ``logp``, which underflows to an exact 0 instead of
    ``0 * inf``. Rows with fewer than two visible keys are skipped, as in :func:`entropy`.
    """
    if mask is None:
        logp = torch.log_softmax(scores, dim=-1)
        keys = torch.full(scores.shape[-2:-1], scores.shape[-1], device=scores.device)
        h = row_entropy_from_log_probs(logp, None)
    else:
        mask = torch.broadcast_to(mask.to(torch.bool), scores.shape)
        logp = torch.log_softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        keys = mask.sum(dim=-1)
        h = row_entropy_from_log_probs(logp, mask)
    return normalised_row_mean(h, keys)


def wmax(A: torch.Tensor) -> torch.Tensor:
    """Largest attention weight ``max_b A_ab``, mean over rows a (deshpande26 Eq. 4)."""
    return A.amax(dim=-1).mean(dim=-1)


def gap(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectral gap statistics of an attention matrix (mindthegap Thm 2; docs/theory.md §5).

    Returns ``(s1(A) - s2(A), s2(sqrt(T) A))`` from ``torch.linalg.svdvals`` (``T`` = number of
    query rows). For a random Markov matrix ``s1 -> 1`` and ``s2(sqrt(T) A) -> 2 sigma_A``;
    a uniform ``A = 11^T / T`` gives ``(1, 0)``. Cost ``O(T^3)`` per matrix.
    """
    s = _lapack(torch.linalg.svdvals, A)
    T = A.shape[-2]
    return s[..., 0] - s[..., 1], math.sqrt(T) * s[..., 1]


# --------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------
def summarise(values, dims: int | Sequence[int] | None = None):
    """Mean and standard error over the sample dimensions ``dims`` (default: all).

    ``stderr = std(ddof=1) / sqrt(n)`` with ``n`` the number of samples reduced over (seeds x
    sequences). With ``n = 1`` the standard error is undefined and returned as NaN (no
    warning); :func:`sigprop.trajectory.to_rows` turns it into JSON ``null``. Returns two
    tensors of the remaining shape (0-d when every dimension is reduced); inputs may be
    tensors, arrays or lists. NaN samples (e.g. an undefined entropy) are ignored.
    """
    v = torch.as_tensor(values)
    if not v.is_floating_point():
        v = v.to(torch.float64)
    if dims is None:
        dims = tuple(range(v.ndim))
    elif isinstance(dims, int):
        dims = (dims,)
    dims = tuple(d % v.ndim for d in dims) if v.ndim else ()
    keep = [d for d in range(v.ndim) if d not in dims]
    flat = v.permute(*keep, *dims).reshape(*[v.shape[d] for d in keep], -1)
    ok = ~torch.isnan(flat)
    n = ok.sum(dim=-1).to(v.dtype)
    mean = torch.where(ok, flat, 0.0).sum(dim=-1) / n
    dev = torch.where(ok, flat - mean.unsqueeze(-1), 0.0)
    var = dev.pow(2).sum(dim=-1) / (n - 1).clamp_min(1.0)
    nan = torch.full_like(mean, float("nan"))
    stderr = torch.where(n > 1, (var / n.clamp_min(1.0)).sqrt(), nan)
    return mean, stderr
