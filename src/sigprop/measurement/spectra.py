"""Matrix-free spectra of attention matrices and token covariances (docs/theory.md §5, mindthegap).

An operator exposes ``shape``, ``matmat(V)`` (= M V), ``rmatmat(U)`` (= M^T U), ``gram(V)``
(= M^T M V) and ``gram_mat(V)`` (= (M^T M V, M V), one pass where the operator can fuse it).
Three operators:

* :class:`DenseOperator` — a held matrix (tests, small T);
* :class:`AttentionOperator` — ``A = softmax(q k^T)`` of one head, optionally causal and/or
  centred (``A - U``, U uniform over each row's visible keys, docs/theory.md §2.4), computed in
  blocks
  of query rows on the fly: memory O(block T + T b) for b vectors, never T x T;
* :class:`CovarianceOperator` — ``X X^T`` (T x T, tokens) or ``X^T X`` (d x d, features).

:func:`top_singular_values`: randomised block Krylov (Musco & Musco 2015): the Krylov space
``[W, (M^T M) W, ..., (M^T M)^q W]`` of a seeded Gaussian block W (b = k + oversample
columns), orthonormalised block by block (twice, for stability), then Rayleigh-Ritz: the
singular values of ``M Q``, whose blocks are by-products of the passes. Cost: q + 1 passes
over M. Unlike plain power iteration it
converges at the rate of a Chebyshev polynomial of degree q in M^T M, so singular values at
the edge of a flat random-matrix bulk come out accurately. Measured relative error of s1..s5
against dense ``svdvals`` (float64): at the defaults (b = k + 10, q = 8) 2e-8 for a key-query
attention head at T = 4096 (q = 12: 1e-14); float32 at T = 16384, 5e-6 (float32 rounding);
the hardest case tried, the flat quarter-circle edge of a centred softmax of i.i.d. N(0, 1)
logits at T = 2048, needs more: q = 6: 5e-3, q = 12: 7e-6, q = 20: 5e-11. Raise ``n_iter``
for flatter spectra.

:func:`top_eigenvalues`: symmetric operators -> the same block Krylov space of M itself with
Rayleigh-Ritz (Lanczos-like); non-symmetric (attention) -> Arnoldi with full
reorthogonalisation from a seeded start, the k largest-modulus Ritz values. Arnoldi resolves
isolated eigenvalues (the Perron root 1 of a row-stochastic A, outliers such as mindthegap's
Fig. 7 count of ``|lambda| > 0.5``) to ~1e-10; eigenvalues inside the circular-law disc
(radius ``sigma_A / sqrt(T)``, docs/theory.md §5) have no gaps and are *not* resolved individually.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .threads import cpu_settings, run_workers


class DenseOperator:
    """A held (m, n) matrix."""

    def __init__(self, a: Tensor):
        self.a = a
        self.shape = tuple(a.shape)
        self.dtype = a.dtype

    def matmat(self, v: Tensor) -> Tensor:
        return self.a @ v

    def rmatmat(self, u: Tensor) -> Tensor:
        return self.a.T @ u

    def gram(self, v: Tensor) -> Tensor:
        return self.gram_mat(v)[0]

    def gram_mat(self, v: Tensor) -> tuple[Tensor, Tensor]:
        w = self.a @ v
        return self.a.T @ w, w


class CovarianceOperator:
    """``X X^T`` (``side="tokens"``, T x T) or ``X^T X`` (``side="features"``, d x d) of a
    (T, d) matrix X, applied as two thin products (the stable-rank matrix of mindthegap Eq. 4
    and docs/theory.md §1 is ``X X^T``; both sides share their non-zero eigenvalues)."""

    def __init__(self, x: Tensor, side: str = "tokens"):
        if side not in ("tokens", "features"):
            raise ValueError(f"side must be tokens or features (got {side!r})")
        self.x = x if side == "tokens" else x.T
        n = self.x.shape[0]
        self.shape, self.dtype, self.symmetric = (n, n), x.dtype, True

    def matmat(self, v: Tensor) -> Tensor:
        return self.x @ (self.x.T @ v)

    rmatmat = matmat

    def gram(self, v: Tensor) -> Tensor:
        return self.gram_mat(v)[0]

    def gram_mat(self, v: Tensor) -> tuple[Tensor, Tensor]:
        w = self.matmat(v)
        return self.matmat(w), w


class AttentionOperator:
    """``A = softmax(q k^T)`` (T_q x T_k) of one head, rows computed ``block`` at a time.

    ``q`` (T_q, d_h) must already carry the score scale (``1/sqrt(d_h)`` and any length
    multiplier), ``k`` (T_k, d_h). ``causal``: row i sees keys ``0..i`` (needs T_q = T_k).
    ``centred``: ``A - U`` with ``U_ij = 1/#visible keys of row i`` on the visible keys
    (docs/theory.md §2.4). Products accumulate in the dtype of q (float64 for validation);
    ``workers`` threads share the row blocks (default ``torch.get_num_threads()``).
    """

    def __init__(self, q: Tensor, k: Tensor, *, causal: bool = False, centred: bool = False,
                 block: int = 64, workers: int | None = None):
        if causal and q.shape[0] != k.shape[0]:
            raise ValueError("causal attention needs as many queries as keys")
        self.q, self.k, self.causal, self.centred = q, k.to(q.dtype), causal, centred
        self.block = max(1, int(block))
        self.workers = max(1, int(workers or torch.get_num_threads()))
        self.shape, self.dtype = (q.shape[0], k.shape[0]), q.dtype
        self.symmetric = False

    @classmethod
    def from_weights(cls, x: Tensor, weights, head: int = 0, multiplier: float = 1.0,
                     **kw) -> AttentionOperator:
        """Head ``head`` of a :class:`sigprop.measurement.streaming.LayerWeights` on tokens x."""
        dh = x.shape[1] // weights.heads
        hs = slice(head * dh, (head + 1) * dh)
        q = (x @ weights.w_q.to(x.dtype)[:, hs]) * (multiplier / math.sqrt(dh))
        return cls(q, x @ weights.w_k.to(x.dtype)[:, hs], **kw)

    def _scores(self, i0: int, q: Tensor, k: Tensor):
        """Rows ``i0..i1-1`` of ``q k^T`` (causal: future keys -inf, columns cut at i1)."""
        i1 = min(self.shape[0], i0 + self.block)
        s = q[i0:i1] @ (k[:i1] if self.causal else k).T
        if self.causal:
            s[:, i0:].masked_fill_(torch.ones(i1 - i0, i1 - i0, dtype=torch.bool).triu(1),
                                   -math.inf)
        return slice(i0, i1), s

    def _prepare(self) -> None:
        """One pass for each row's log-sum-exp ``l_i``; afterwards the queries carry ``-l_i``
        as an extra column against a column of ones in the keys, so one matmul and one exp
        give the normalised rows ``A = exp(q k^T - l)`` (no max, sum or scaling passes)."""
        if getattr(self, "_qa", None) is not None:
            return

        def fn(i0, out):
            rs, sc = self._scores(i0, self.q, self.k)
            m = sc.amax(dim=1, keepdim=True)
            out[rs, 0] = (m + torch.log(sc.sub_(m).exp_().sum(dim=1, keepdim=True)))[:, 0]

        lse = self._pass(fn, torch.zeros(self.shape[0], 1, dtype=self.dtype))
        one = torch.ones(self.shape[1], 1, dtype=self.dtype)
        self._qa, self._ka = torch.cat([self.q, -lse], 1), torch.cat([self.k, one], 1)

    def to_dense(self) -> Tensor:
        """The matrix itself (T_q x T_k; small T, benchmarks)."""
        _check_memory(self, 1, 0, dense=True)
        self._prepare()
        a = torch.empty(self.shape, dtype=self.dtype)
        for i0 in range(0, self.shape[0], self.block):
            rs, rows = self._block(i0)
            a[rs] = 0.0
            a[rs, :rows.shape[1]] = rows
        return a - self._u_mat(torch.eye(self.shape[1], dtype=self.dtype)) if self.centred \
            else a

    def _block(self, i0: int):
        """(row slice, the rows of A)."""
        rs, sc = self._scores(i0, self._qa, self._ka)
        return rs, sc.exp_()

    def _pass(self, fn, out: Tensor) -> Tensor:
        """Run ``fn(i0, out)`` for every row block start; ``workers`` threads take blocks,
        each adding into its own copy of ``out`` (summed at the end), with torch's intra-op
        pool at one thread meanwhile (restored): as in :mod:`.streaming`, two-thread
        elementwise ops stalled on a shared 2-core machine."""
        import threading

        starts = iter(range(0, self.shape[0], self.block))
        lock, parts, errors = threading.Lock(), [], []

        def work():
            mine = torch.zeros_like(out)
            try:
                while not errors:
                    with lock:
                        i0 = next(starts, None)
                    if i0 is None:
                        break
                    fn(i0, mine)
            except BaseException as err:
                errors.append(err)
            with lock:
                parts.append(mine)

        run_workers(work, self.workers)
        if errors:
            raise errors[0]
        return sum(parts[1:], parts[0])

    def _u_mat(self, v: Tensor) -> Tensor:
        """U V: the mean of V over each row's visible keys."""
        if self.causal:
            return v.cumsum(dim=0) / torch.arange(1, v.shape[0] + 1, dtype=v.dtype)[:, None]
        return v.mean(dim=0, keepdim=True).expand(self.shape[0], -1)

    def _u_rmat(self, u: Tensor) -> Tensor:
        """U^T W: column j collects W_i / #keys(i) over the rows i that see key j."""
        if self.causal:
            w = u / torch.arange(1, u.shape[0] + 1, dtype=u.dtype)[:, None]
            return w.flip(0).cumsum(dim=0).flip(0)
        return (u.sum(dim=0, keepdim=True) / self.shape[1]).expand(self.shape[1], -1)

    def matmat(self, v: Tensor) -> Tensor:
        def fn(i0, out):
            rs, a = self._block(i0)
            out[rs] = a @ v[:a.shape[1]]

        self._prepare()

        out = self._pass(fn, torch.zeros(self.shape[0], v.shape[1], dtype=v.dtype))
        return out - self._u_mat(v) if self.centred else out

    def rmatmat(self, u: Tensor) -> Tensor:
        def fn(i0, out):
            rs, a = self._block(i0)
            out[:a.shape[1]] += a.T @ u[rs]

        self._prepare()

        out = self._pass(fn, torch.zeros(self.shape[1], u.shape[1], dtype=u.dtype))
        return out - self._u_rmat(u) if self.centred else out

    def gram(self, v: Tensor) -> Tensor:
        return self.gram_mat(v)[0]

    def gram_mat(self, v: Tensor) -> tuple[Tensor, Tensor]:
        """``(M^T M V, M V)`` in one pass over the row blocks (M = A; two for A - U, whose
        U^T needs every row of (A - U) V first)."""
        if self.centred:
            w = self.matmat(v)
            return self.rmatmat(w), w
        nk = self.shape[1]

        def fn(i0, out):  # rows [:nk] accumulate M^T W, rows nk + rs hold W = M V
            rs, a = self._block(i0)
            w = a @ v[:a.shape[1]]
            out[nk + rs.start:nk + rs.stop] = w
            out[:a.shape[1]] += a.T @ w

        self._prepare()

        out = self._pass(fn, torch.zeros(nk + self.shape[0], v.shape[1], dtype=v.dtype))
        return out[:nk], out[nk:]


# ------------------------------------------------------------------------------ algorithms
def _orth(y: Tensor, basis: list[Tensor]) -> Tensor:
    """Orthonormal columns spanning the part of y outside the previous blocks: two rounds of
    block Gram-Schmidt and QR, dropping directions with ``|R_jj| <= 1e-10 max |R|`` (the Krylov
    space has saturated or become invariant), so the basis stays orthonormal."""
    for _ in range(2):
        for b in basis:
            y = y - b @ (b.T @ y)
        q, r = torch.linalg.qr(y)
        d = r.diagonal().abs()
        y = q[:, d > 1e-10 * max(float(d.max()) if d.numel() else 0.0, 1e-300)]
    return y


#: dense linear algebra on thin matrices runs with torch at one thread
#: (``cpu_settings(threads=1)``): next to the operator's worker threads, torch's two-thread
#: pool made a 2048 x 195 svdvals take 4.5 s on the shared 2-core machine (see also
#: measure.observables._lapack)


def _gaussian(n: int, b: int, seed: int, dtype) -> Tensor:
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(n, b, generator=g, dtype=torch.float64).to(dtype)


def _check_k(op, k: int) -> None:
    if not 1 <= k <= min(op.shape):
        raise ValueError(f"k must be in [1, {min(op.shape)}] (got {k})")


def _check_memory(op, width: int, n_iter: int, dense: bool = False) -> None:
    """Refuse (``SpecError``) a run that would not fit in memory
    (:func:`sigprop.measurement.memory.check`, ``spectra`` model)."""
    from . import memory

    dt = getattr(op, "dtype", torch.float64)
    memory.check("spectra", seq_len=op.shape[0], n_keys=op.shape[1], width=width,
                 n_iter=n_iter, block=getattr(op, "block", 64),
                 workers=getattr(op, "workers", 1), dense=dense,
                 d_head=op.q.shape[1] if hasattr(op, "q") else 0,
                 centred=getattr(op, "centred", False),
                 dtype_bytes=torch.finfo(dt).bits // 8, shrink={"n_iter": 1})


def top_singular_values(op, k: int = 5, *, oversample: int = 10, n_iter: int = 8,
                        seed: int = 0) -> Tensor:
    """The k largest singular values of ``op`` (descending, float64) by randomised block
    Krylov with ``n_iter`` + 1 passes over the operator (module docstring for accuracy)."""
    _check_k(op, k)
    n = op.shape[1]
    b = min(k + oversample, n)
    _check_memory(op, b, n_iter)
    with cpu_settings(threads=1):
        block = _orth(_gaussian(n, b, seed, op.dtype), [])
        basis, images = [block], []  # images: M applied to each basis block, from the passes
        for _ in range(n_iter):
            if sum(x.shape[1] for x in basis) >= n:
                break
            g, w = op.gram_mat(block)
            images.append(w)
            block = _orth(g, basis)
            if block.shape[1] == 0:
                break
            basis.append(block)
        if len(images) < len(basis):
            images.append(op.matmat(basis[-1]))
        mq = torch.cat(images, dim=1).double()
        # singular values of the thin M Q through its small triangular factor
        s = torch.linalg.svdvals(torch.linalg.qr(mq).R)
    return s[:k]


def top_eigenvalues(op, k: int = 5, *, n_iter: int | None = None, seed: int = 0) -> Tensor:
    """The k largest-modulus eigenvalues of ``op``: real and descending for symmetric
    operators (``op.symmetric``; block Krylov + Rayleigh-Ritz, ``n_iter`` default 12),
    complex by decreasing modulus otherwise (Arnoldi, ``n_iter`` default 40 steps)."""
    _check_k(op, k)
    if op.shape[0] != op.shape[1]:
        raise ValueError("eigenvalues need a square operator")
    _check_memory(op, k + 10 if getattr(op, "symmetric", False) else 1,
                  (12 if n_iter is None else n_iter) if getattr(op, "symmetric", False)
                  else (40 if n_iter is None else n_iter))
    with cpu_settings(threads=1):
        return _eigenvalues(op, k, n_iter, seed)


def _eigenvalues(op, k, n_iter, seed):
    n = op.shape[0]
    if getattr(op, "symmetric", False):
        b = min(k + 10, n)
        basis = [_orth(_gaussian(n, b, seed, op.dtype), [])]
        for _ in range(12 if n_iter is None else n_iter):
            if sum(x.shape[1] for x in basis) >= n:
                break
            basis.append(_orth(op.matmat(basis[-1]), basis))
        q = torch.cat(basis, dim=1).double()
        h = q.T @ op.matmat(q.to(op.dtype)).double()
        return torch.linalg.eigvalsh(0.5 * (h + h.T)).flip(0)[:k]
    m = min(40 if n_iter is None else n_iter, n)
    v = torch.zeros(n, m + 1, dtype=torch.float64)
    h = torch.zeros(m + 1, m, dtype=torch.float64)
    x = _gaussian(n, 1, seed, torch.float64)[:, 0]
    v[:, 0] = x / x.norm()
    steps = m
    for j in range(m):
        w = op.matmat(v[:, j:j + 1].to(op.dtype)).double()[:, 0]
        for _ in range(2):  # full reorthogonalisation
            c = v[:, :j + 1].T @ w
            w = w - v[:, :j + 1] @ c
            h[:j + 1, j] += c
        h[j + 1, j] = w.norm()
        if h[j + 1, j] < 1e-12 * h[:j + 1, j].norm():
            steps = j + 1  # invariant subspace: Ritz values are exact
            break
        v[:, j + 1] = w / h[j + 1, j]
    ev = torch.linalg.eigvals(h[:steps, :steps])
    return ev[torch.argsort(ev.abs(), descending=True)][:k]
