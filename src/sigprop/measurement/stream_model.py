"""One real attention layer streamed over long contexts: sampled query rows against keys and
values served chunk by chunk, with the layer's own rotary embedding at the true positions,
grouped KV heads, per-row key ranges and several logit multipliers at once.

This is the model-side twin of :mod:`.streaming` (which streams an idealised layer drawn from a
spec). Same online softmax: per row a and head h, each tile of visible keys contributes, relative
to its own maximum ``m``, ``S1 = sum e^{s-m}``, ``S2 = sum e^{2(s-m)}``, ``SX = sum e^{s-m}(s-m)``
and ``O = sum e^{s-m} v_b``, merged exactly in float64 (``streaming._reduce``). Neither the
T x T map nor the T x d keys exist at any time.

What differs:

* keys and values come from a :class:`KVSource` already projected (``(c, H_kv, d_H)``, after the
  layer's key norm if it has one, before RoPE): :class:`TensorKV` holds real projections,
  :class:`GaussianKV` draws them from a fitted mean and covariance per block of positions;
* RoPE: ``rope(positions) -> (cos, sin)`` is the model's own rotary module evaluated at the
  chunk's positions (HF rotate-half convention, partial rotary on the first ``cos.shape[-1]``
  dimensions of each head), applied to queries at their positions and keys at theirs;
* row ``a`` sees keys ``lo[a] <= b < hi[a]``: causal rows ``[0, a]``, a sliding window
  ``[a - W + 1, a]``, a bidirectional row of a length-T context ``[0, T)``. Rows are ordered so
  that ``hi`` and ``lo`` are both non-decreasing, so the rows a tile touches are a contiguous
  range; one pass over the longest context serves every length at once;
* a running sum of the raw logits gives the score spread ``max_b s_ab - mean_b s_ab`` per row and
  head (how far the largest score stands above the rest: grows like ``sqrt(2 log n)`` for random
  scores, stays bounded for a fixed geometry), read from the first multiplier's maximum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .stream_inputs import BLOCK, GeneratedTokens, block_seed
from .streaming import NEG
from .threads import run_workers, take_each

RopeFn = Callable[[Tensor], tuple[Tensor, Tensor]]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF ``apply_rotary_pos_emb`` (rotate-half) on ``x (n, heads, d_H)`` with ``cos, sin (n,
    r)``, ``r <= d_H`` rotated dimensions (partial rotary leaves the rest as is)."""
    r = cos.shape[-1]
    c, s = (t[:, None, :].to(device=x.device, dtype=x.dtype) for t in (cos, sin))
    xr = x[..., :r]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    out = xr * c + torch.cat((-x2, x1), dim=-1) * s
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:]), dim=-1)


# ------------------------------------------------------------------------------------ sources
class KVSource:
    """Pre-RoPE keys ``(c, H_kv, d_H)`` and values ``(c, H_kv, d_V)`` of positions
    ``start..stop-1``, deterministic, in ``dtype``."""

    n: int
    dtype: torch.dtype

    def chunk(self, start: int, stop: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class TensorKV(KVSource):
    """Real projections held in memory: ``k (T, H_kv, d_H)``, ``v (T, H_kv, d_V)``."""

    def __init__(self, k: Tensor, v: Tensor):
        if k.dim() != 3 or v.dim() != 3 or k.shape[:2] != v.shape[:2]:
            raise ValueError("k, v must be (T, H_kv, d) with the same T and H_kv")
        self.k, self.v, self.n, self.dtype = k, v, k.shape[0], k.dtype

    def chunk(self, start, stop):
        return self.k[start:stop], self.v[start:stop]


@dataclass
class GaussianFit:
    """Mean ``mu (D,)`` and factor ``F (r, D)`` with ``F^T F`` = the covariance of a set of
    vectors (float64): draws are ``mu + z F`` with ``z`` of unit variance per coordinate."""

    mu: Tensor
    F: Tensor

    @classmethod
    def from_samples(cls, x: Tensor, rtol: float = 1e-9) -> GaussianFit:
        """Fit ``(N, D)`` samples: the empirical mean and covariance (``N - 1`` denominator),
        factored by an eigen-decomposition; directions with eigenvalue below ``rtol`` times the
        largest are dropped (a covariance of N samples has rank at most N - 1)."""
        x = x.double().reshape(x.shape[0], -1)
        mu = x.mean(0)
        xc = x - mu
        n = max(x.shape[0] - 1, 1)
        if x.shape[0] <= x.shape[1]:  # rank < N: factor through the samples' Gram matrix
            lam, u = torch.linalg.eigh(xc @ xc.T / n)
            keep = lam > rtol * max(float(lam[-1]), 1e-300)
            F = u[:, keep].T @ xc / math.sqrt(n)
        else:
            lam, u = torch.linalg.eigh(xc.T @ xc / n)
            keep = lam > rtol * max(float(lam[-1]), 1e-300)
            F = torch.sqrt(lam[keep])[:, None] * u[:, keep].T
        return cls(mu, F.contiguous())

    @property
    def cov(self) -> Tensor:
        return self.F.T @ self.F

    @property
    def rank(self) -> int:
        return self.F.shape[0]


#: elements of one score buffer (float32: 16 MB): bounds the heads batched per product
BUF = 1 << 22

_LUT = GeneratedTokens._LUT  # byte -> its eight bits as +-1


def random_signs(seed: int, salt: int, block: int, rows: int, width: int,
                 dtype: torch.dtype) -> Tensor:
    """``(rows, width)`` independent signs, seeded by ``(seed, salt, block)`` (a byte gives
    eight through a lookup table: ~4x cheaper than Gaussian draws)."""
    per_row = -(-width // 8)
    g = torch.Generator().manual_seed(block_seed(seed, block, salt))
    bits = torch.randint(0, 256, (rows * per_row,), dtype=torch.uint8, generator=g)
    e = torch.index_select(_LUT.to(dtype), 0, bits.int()).view(rows, 8 * per_row)
    return e[:, :width]


def random_normal(seed: int, salt: int, block: int, rows: int, width: int,
                  dtype: torch.dtype, device: str | torch.device = "cpu") -> Tensor:
    """``(rows, width)`` independent standard normals, seeded by ``(seed, salt, block)`` (on a
    GPU from that device's generator: reproducible there, other numbers than on the CPU)."""
    g = torch.Generator(device=device).manual_seed(block_seed(seed, block, salt))
    return torch.randn(rows, width, generator=g, dtype=dtype, device=device)


class GaussianKV(KVSource):
    """Keys and values drawn per position as ``mu + z F`` from a :class:`GaussianFit` each
    (independent draws for keys and values). Keys: ``z`` standard normal, so the scores of a
    query are exactly Gaussian across keys -- the tail decides condensation, and a sum of a few
    dozen random signs (a low-rank key fit) has a visibly lighter tail than a Gaussian (measured
    entropy at T = 16k off by 0.07 at beta ~ 1.9). Values: ``z`` random signs (~4x cheaper; the
    output averages many values, where only the first two moments matter). ``k_post``: a key
    norm applied to the drawn keys (the fit then describes the projections before it).
    Block ``b`` of ``BLOCK`` positions is seeded by ``(seed, salt, b)``: any chunk is generated
    identically whatever the chunk size, and a length-T context is the first T positions of a
    longer one."""

    def __init__(self, n: int, k_fit: GaussianFit, v_fit: GaussianFit, kv_heads: int, *,
                 seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu",
                 k_post: Callable[[Tensor], Tensor] | None = None):
        self.n, self.dtype, self.seed, self.kv_heads = int(n), dtype, seed, kv_heads
        self.k_post = k_post
        self.device = torch.device(device)
        self.fits = [(f.mu.to(self.device, dtype), f.F.to(self.device, dtype))
                     for f in (k_fit, v_fit)]

    def _draw(self, which: int, start: int, stop: int) -> Tensor:
        mu, F = self.fits[which]
        b0, b1 = start // BLOCK, -(-stop // BLOCK)
        if which == 0 or self.device.type != "cpu":
            z = torch.cat([random_normal(self.seed, 11 + which, b, BLOCK, F.shape[0],
                                         self.dtype, self.device) for b in range(b0, b1)])
        else:
            z = torch.cat([random_signs(self.seed, 11 + which, b, BLOCK, F.shape[0],
                                        self.dtype) for b in range(b0, b1)])
        z = z[start - b0 * BLOCK: stop - b0 * BLOCK]
        return torch.addmm(mu, z, F).view(stop - start, self.kv_heads, -1)

    def chunk(self, start, stop):
        k = self._draw(0, start, stop)
        if self.k_post is not None:  # a key norm (Qwen3, OLMo 2): draws land on its sphere
            k = self.k_post(k)
        return k, self._draw(1, start, stop)


class EmpiricalKV(KVSource):
    """Keys and values resampled from measured pairs: position ``b`` holds the pair
    ``(k_i, v_i)`` of a pool ``k (N, H_kv, d_H)``, ``v (N, H_kv, d_V)``, ``i`` drawn
    uniformly per position (block ``b`` of ``BLOCK`` positions seeded by ``(seed, salt, b)``,
    as :class:`GaussianKV`). The scores of a query then follow the measured keys' own law --
    its tails, outlier dimensions and clusters -- rather than a Gaussian of the same two
    moments; what it leaves out is how the keys depend on position and on each other."""

    def __init__(self, n: int, k: Tensor, v: Tensor, *, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if k.dim() != 3 or v.dim() != 3 or k.shape[:2] != v.shape[:2] or k.shape[0] < 1:
            raise ValueError("k, v must be (N, H_kv, d) with the same N >= 1 and H_kv")
        self.n, self.dtype, self.seed = int(n), dtype, seed
        self.device = torch.device(device)
        self.k, self.v = k.to(self.device, dtype), v.to(self.device, dtype)

    def chunk(self, start, stop):
        b0, b1 = start // BLOCK, -(-stop // BLOCK)
        idx = torch.cat([torch.randint(0, self.k.shape[0], (BLOCK,), generator=torch.Generator()
                                       .manual_seed(block_seed(self.seed, b, 17)))
                         for b in range(b0, b1)])[start - b0 * BLOCK: stop - b0 * BLOCK]
        idx = idx.to(self.device)
        return self.k[idx], self.v[idx]


class PinnedKV(KVSource):
    """Another source with the first positions replaced by given keys and values
    (``k (P, H_kv, d_H)``, ``v (P, H_kv, d_V)`` at positions ``0 .. P-1``): a trained model's
    sink (its first token's key) is one vector, not a draw of the Gaussian that describes the
    other positions."""

    def __init__(self, base: KVSource, k: Tensor, v: Tensor):
        self.base, self.n, self.dtype = base, base.n, base.dtype
        self.device = getattr(base, "device", torch.device("cpu"))
        self.k = k.to(self.device, self.dtype)
        self.v = v.to(self.device, self.dtype)

    def chunk(self, start, stop):
        k, v = self.base.chunk(start, stop)
        P = self.k.shape[0]
        if start < P:
            k, v = k.clone(), v.clone()
            k[:P - start] = self.k[start:min(P, stop)]
            v[:P - start] = self.v[start:min(P, stop)]
        return k, v


# ------------------------------------------------------------------------------------ kernel
def _reduce(m, s1, s2, sx, o, out_rows):
    """Exact log-sum-exp merge along dim 0 of partial states (float64), each part's sums
    relative to its own maximum ``m``; ``o`` holds only the rows ``out_rows``."""
    mn = m.amax(dim=0)
    dm = m - mn
    a = torch.exp(dm)
    return (mn, (a * s1).sum(0), (a * a * s2).sum(0), (a * (sx + s1 * dm)).sum(0),
            (a[..., out_rows, None] * o).sum(0))


@dataclass
class LayerResult:
    """Per row (in the order given) and head: ``ipr``, normalised ``entropy`` (NaN with one
    key), ``wmax``, ``log_z``, ``spread`` (max minus mean raw logit), all ``(R, H)`` float64;
    ``out`` ``(R_out, d_out)`` float64, the layer output of the rows ``out_rows`` (after the
    output projection when given)."""

    ipr: Tensor
    entropy: Tensor
    wmax: Tensor
    log_z: Tensor
    spread: Tensor
    out: Tensor | None


class _Job:
    def __init__(self, q, pos, lo, hi, source, mults, rope, scale, out_rows, chunk, tile,
                 device):
        R, H, dh = q.shape
        dt = source.dtype
        self.dev = device
        q = q.to(device)
        self.source, self.rope, self.chunk, self.tile = source, rope, chunk, tile
        self.lo, self.hi, self.R, self.H, self.K = lo, hi, R, H, mults.shape[0]
        if rope is not None:
            cos, sin = rope(pos)
            q = apply_rope(q.to(dt), cos, sin)
        self.q = (q.to(dt) * scale).transpose(0, 1).contiguous()  # (H, R, dh)
        self.fold = self.K == 1
        if self.fold:
            self.q = self.q * mults[0].to(device, dt)[None, :, None]
        self.mults = mults.to(device, dt)
        self.m0 = mults[0].double()
        self.out_mask = torch.zeros(R, dtype=torch.bool)
        self.out_mask[out_rows] = True
        self.out_rows = out_rows
        self.out_rows_dev = out_rows.to(device)

    def new_state(self, dv):
        K, H, R = self.K, self.H, self.R
        z = torch.zeros(K, H, R, dtype=torch.float64, device=self.dev)
        return [z.clone() - 1e300, z.clone(), z.clone(), z.clone(),
                torch.zeros(K, H, len(self.out_rows), dv, dtype=torch.float64, device=self.dev),
                torch.zeros(H, R, dtype=torch.float64, device=self.dev)]

    def run_chunk(self, start: int, state: list | None, bufs: dict):
        src, dt, K, H = self.source, self.source.dtype, self.K, self.H
        stop = min(src.n, start + self.chunk)
        k, v = src.chunk(start, stop)
        k, v = k.to(self.dev), v.to(self.dev)
        if self.rope is not None:
            cos, sin = self.rope(torch.arange(start, stop))
            k = apply_rope(k, cos, sin)
        hkv = k.shape[1]
        group = H // hkv
        k = k.transpose(0, 1).contiguous()  # (H_kv, c, dh)
        v = v.transpose(0, 1).contiguous()
        dv = v.shape[-1]
        if state is None:
            state = self.new_state(dv)
        nt = -(-(stop - start) // self.tile)
        ro = len(self.out_rows)
        dev = self.dev
        cm = torch.full((K, H, nt, self.R), NEG, dtype=dt, device=dev)
        c1, c2, cx = (torch.zeros(K, H, nt, self.R, dtype=dt, device=dev) for _ in range(3))
        co = torch.zeros(K, H, nt, ro, dv, dtype=dt, device=dev)
        csum = torch.zeros(H, nt, self.R, dtype=dt, device=dev)
        for j in range(nt):
            t0, t1 = start + j * self.tile, min(stop, start + (j + 1) * self.tile)
            i0 = int(torch.searchsorted(self.hi, t0, right=True))  # first row with hi > t0
            i1 = int(torch.searchsorted(self.lo, t1, right=False))  # rows with lo < t1
            if i1 <= i0:
                continue
            c, ra = t1 - t0, i1 - i0
            lo, hi = self.lo[i0:i1], self.hi[i0:i1]
            need = bool((hi < t1).any() or (lo > t0).any())
            keys = torch.arange(t0, t1)
            mask = ((keys[None, :] >= hi[:, None]) | (keys[None, :] < lo[:, None])).to(dev) \
                if need else None
            osel = self.out_mask[i0:i1]
            o_idx = torch.nonzero(osel).flatten()
            o_dst = torch.searchsorted(self.out_rows, o_idx + i0).to(dev)
            o_idx = o_idx.to(dev)
            ks = slice(t0 - start, t1 - start)
            # the heads of one KV group share the keys: one batched product per group (in
            # batches of hb heads, so that a buffer holds at most BUF elements)
            hb = max(1, min(group, BUF // max(1, ra * c)))
            for h0, g in ((h, h // group) for gg in range(hkv)
                          for h in range(gg * group, (gg + 1) * group, hb)):
                h1 = min(h0 + hb, (g + 1) * group)
                G = h1 - h0
                s = bufs["s"][:G * ra * c].view(G, ra, c)
                torch.matmul(self.q[h0:h1, i0:i1], k[g, ks].T, out=s)
                if mask is not None:
                    s.masked_fill_(mask, 0.0)
                csum[h0:h1, j, i0:i1] = s.sum(2)
                for kk in range(K):
                    if self.fold:
                        t = s
                    else:
                        t = torch.mul(s, self.mults[kk, i0:i1, None],
                                      out=bufs["t"][:G * ra * c].view(G, ra, c))
                    if mask is not None:
                        t.masked_fill_(mask, NEG)
                    mc = torch.amax(t, dim=2)
                    cm[kk, h0:h1, j, i0:i1] = mc
                    t.sub_(mc[..., None])
                    p = torch.exp(t, out=bufs["p"][:G * ra * c].view(G, ra, c))
                    c1[kk, h0:h1, j, i0:i1] = p.sum(2)
                    c2[kk, h0:h1, j, i0:i1] = torch.linalg.vecdot(p, p)
                    if mask is not None:  # 0 * NEG would be fine; keep t finite anyway
                        t.masked_fill_(mask, 0.0)
                    cx[kk, h0:h1, j, i0:i1] = torch.linalg.vecdot(p, t)
                    if len(o_idx):
                        co[kk, h0:h1, j, o_dst] = p[:, o_idx] @ v[g, ks]
        # rows not touched by a tile keep m = NEG and sums 0: harmless in the merge
        parts = [torch.cat([a[None], b.double().movedim(2, 0)]) for a, b in
                 zip(state[:5], (cm, c1, c2, cx, co), strict=True)]
        state[:5] = _reduce(*parts, self.out_rows_dev)
        state[5] = state[5] + csum.double().sum(1)
        return state


def stream_layer(q: Tensor, pos: Tensor, lo: Tensor, hi: Tensor, source: KVSource, *,
                 scale: float, multipliers: Tensor | Sequence, rope: RopeFn | None = None,
                 out_rows: Tensor | None = None, w_o: Tensor | None = None,
                 b_o: Tensor | None = None, chunk: int = 8192, tile: int = 512,
                 workers: int | None = None, device: str | torch.device | None = None,
                 on_chunk: Callable[[int], None] | None = None) -> list[LayerResult]:
    """Attention statistics of query rows ``q (R, H, d_H)`` (pre-RoPE, at positions ``pos``)
    over the keys ``lo[a] <= b < hi[a]`` of ``source``, one :class:`LayerResult` per row of
    ``multipliers`` (``(K, R)``: the logits are ``scale * q.k`` times it). Rows must be ordered
    with ``lo`` and ``hi`` non-decreasing. ``out_rows``: rows whose output ``sum_b A_ab v_b``
    (then ``@ w_o + b_o``) is formed (default all). Threads take whole chunks (as in
    :func:`.streaming.stream_attention`); ``device``: where the chunk work runs (``"cuda"``: one
    worker, the source should draw there too); ``on_chunk(keys)`` after each chunk."""
    R = q.shape[0]
    pos, lo, hi = (torch.as_tensor(t, dtype=torch.long) for t in (pos, lo, hi))
    if not (len(pos) == len(lo) == len(hi) == R):
        raise ValueError("q, pos, lo and hi need one entry per row")
    if R and (bool((lo[1:] < lo[:-1]).any()) or bool((hi[1:] < hi[:-1]).any())):
        raise ValueError("rows must be ordered with lo and hi non-decreasing")
    if R and (int(lo.min()) < 0 or int(hi.max()) > source.n or bool((hi <= lo).any())):
        raise ValueError(f"key ranges must satisfy 0 <= lo < hi <= {source.n}")
    mults = torch.stack([torch.as_tensor(np.asarray(m, dtype=np.float64)).expand(R)
                         for m in multipliers])
    out_rows = torch.arange(R) if out_rows is None else torch.as_tensor(
        out_rows, dtype=torch.long).sort().values
    dev = torch.device(device or "cpu")
    job = _Job(q, pos, lo, hi, source, mults, rope, scale, out_rows, chunk, tile, dev)
    last = int(hi.max())
    starts = iter(range(0, last, chunk))
    # a GPU takes the chunks one after another (its own parallelism is inside each matmul)
    workers = 1 if dev.type != "cpu" else max(1, int(workers or torch.get_num_threads()))
    import threading

    lock, results, errors = threading.Lock(), [], []

    def work():
        state = None
        cap = max(max(1, min(tile, source.n)) * R, min(BUF, max(1, min(tile, source.n)) * R
                                                      * q.shape[1]))
        bufs = {k: torch.empty(cap, dtype=source.dtype, device=dev) for k in "stp"}

        def step(start):
            nonlocal state
            state = job.run_chunk(start, state, bufs)
            if on_chunk is not None:
                with lock:
                    on_chunk(min(start + chunk, last) - start)

        take_each(starts, lock, errors, step)
        if state is not None:
            with lock:
                results.append(state)

    run_workers(work, workers, flush_denormal=True)
    if errors:
        raise errors[0]
    m, s1, s2, sx, o = (t.cpu() for t in _reduce(
        *[torch.stack(p) for p in zip(*[r[:5] for r in results], strict=True)],
        job.out_rows_dev))
    ssum = sum(r[5] for r in results).cpu()
    n_keys = (hi - lo).double()
    # raw logits' mean and max: the first multiplier's maximum over its (positive) multiplier
    m0 = job.m0
    raw_sum = ssum / m0[None, :] if job.fold else ssum
    spread = (m[0] / m0[None, :] - raw_sum / n_keys[None, :]).T
    out = []
    for kk in range(job.K):
        ent = (torch.log(s1[kk]) - sx[kk] / s1[kk]) / torch.log(n_keys)[None, :]
        ent = torch.where(n_keys[None, :] > 1, ent, torch.full_like(ent, math.nan)).T
        heads = o[kk] / s1[kk][:, out_rows, None]  # (H, R_out, dv)
        y = heads.transpose(0, 1).reshape(len(out_rows), -1)
        if w_o is not None:
            y = y @ w_o.double()
            if b_o is not None:
                y = y + b_o.double()
        out.append(LayerResult((s2[kk] / s1[kk] ** 2).T, ent, (1.0 / s1[kk]).T,
                               (m[kk] + torch.log(s1[kk])).T, spread, y))
    return out
