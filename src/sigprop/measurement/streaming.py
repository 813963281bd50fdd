"""Attention statistics of sampled query rows at context lengths where T x T cannot exist.

docs/theory.md §1 observables (ipr, entropy, wmax, the attention output for ``cos``) of R sampled
query
rows of one attention layer, with the keys streamed in chunks through an online softmax
(running max and log-sum-exp merges, as in flash attention). Memory is O(chunk d + R chunk)
plus the weights: neither the T x T map nor the T x d keys/values are ever held.

Per row a and head h, with logits ``s_b`` (the key-query scores of docs/theory.md §2.1 times the
row's
length-scaling multiplier, docs/theory.md §3.2) over the visible keys, each chunk contributes,
relative
to its own maximum ``m``, ``S1 = sum e^{s-m}``, ``S2 = sum e^{2(s-m)}``, ``SX = sum e^{s-m}
(s-m)`` and ``O = sum e^{s-m} v_b``; chunks merge exactly in float64. At the end (``m`` the
row's maximum):

    ipr = S2 / S1^2,   wmax = 1 / S1,   entropy = (log S1 - SX / S1) / log(#keys),
    out = O / S1 (+ value bias),

both entropy terms being non-negative (no cancellation). Chunk work runs in the input dtype
(float32 by default: float32 matmuls at full BLAS rate) and the accumulators in float64.

Inputs (:mod:`.stream_inputs`): a :class:`TokenSource` gives the tokens chunk by chunk: a real
``(T, d)`` tensor (:class:`TensorTokens`) or tokens generated deterministically from ``(seed,
block)`` (:class:`GeneratedTokens`, docs/theory.md §1 homogeneous geometry, ``|x|^2 = d``).
``rem=True``
replaces the key-query logits by i.i.d. ``N(0, 1)`` draws per (head, row, key) (times the
row's score std), seeded per block of keys: the pure REM of docs/theory.md §2.3.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .stream_inputs import (
    TokenSource,
    rem_scores,
)
from .threads import run_workers, take_each

NEG = -1e30  # masked logits: exp underflows to exactly 0 and 0 * NEG = 0 (no NaN)
VARIANTS = ("softmax", "centred", "uniform")


# -------------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    """One attention layer acting as ``x @ W`` (heads = column blocks of ``d / heads``):
    ``w_q, w_k, w_v`` (d, d), value bias ``b_v`` (d,), optional ``w_o`` (d, d), ``b_o`` (d,)."""

    w_q: Tensor
    w_k: Tensor
    w_v: Tensor
    b_v: Tensor
    heads: int
    w_o: Tensor | None = None
    b_o: Tensor | None = None

    @classmethod
    def from_spec(cls, spec, seed: int = 0, dtype: torch.dtype = torch.float32) -> LayerWeights:
        """The first attention layer of ``spec`` drawn as ``sigprop measure`` draws it
        (:class:`sigprop.nn.attention.BatchedAttention` + ``init_batched(scheme="spec")``):
        Q/K std ``spec.rem_qk_std()`` (score std ``spec.sigma_s`` at ``spec.seq_len``)."""
        from ..nn.attention import BatchedAttention
        from ..nn.init import init_batched

        attn = init_batched(BatchedAttention(spec, 1, dtype), "spec", seed, spec=spec)
        p = {n: t.detach()[0] for n, t in attn.named_parameters()}
        return cls(p["w_q"], p["w_k"], p["w_v"], p["b_v"], spec.heads, p.get("w_o"),
                   p.get("b_o"))


@dataclass
class StreamResult:
    """Per sampled row (ascending positions ``rows``, ``n_keys`` visible keys each): ``ipr``,
    ``entropy`` (normalised; NaN for a row with one key), ``wmax``, ``log_z`` (log-sum-exp of
    the row's logits), all (R, H) float64, and ``out`` (R, d) float64, the layer's output
    (after W_O when present) for the row."""

    rows: Tensor
    n_keys: Tensor
    ipr: Tensor
    entropy: Tensor
    wmax: Tensor
    log_z: Tensor
    out: Tensor


def _reduce(m, s1, s2, sx, o):
    """Exact log-sum-exp merge of partial states along dim 0 (float64): each part holds sums
    relative to its own reference ``m`` (empty parts: ``s1 = 0`` and ``m`` very negative)."""
    mn = m.amax(dim=0)
    dm = m - mn
    a = torch.exp(dm)
    return (mn, (a * s1).sum(0), (a * a * s2).sum(0), (a * (sx + s1 * dm)).sum(0),
            (a[..., None] * o).sum(0))


class _Job:
    """Shared read-only inputs of one streaming run and the per-chunk work."""

    def __init__(self, source, weights, rows, mults, causal, rem, seed, chunk, tile, centred):
        self.source, self.rows, self.mults, self.causal = source, rows, mults, causal
        self.centred = centred
        self.rem, self.seed, self.chunk, self.tile = rem, seed, chunk, tile
        dt, d, H = source.dtype, source.d, weights.heads
        self.H, self.dh, self.R, self.K = H, d // H, len(rows), len(mults)
        self.fold = self.K == 1 and not rem  # the single multiplier folded into the queries
        w = {k: getattr(weights, k).to(dt) for k in ("w_q", "w_k", "w_v")}
        if rem:
            self.w_kv = w["w_v"]
        else:
            q = (source.rows(rows) @ w["w_q"]).view(self.R, H, self.dh).transpose(0, 1)
            q = q / math.sqrt(self.dh)
            self.q = (q * mults[0].to(dt)[None, :, None] if self.fold else q).contiguous()
            self.w_kv = torch.cat([w["w_k"], w["w_v"]], dim=1)
        self.mults_dt = mults.to(dt)

    def new_state(self):
        K, H, R = self.K, self.H, self.R
        z = torch.zeros(K, H, R, dtype=torch.float64)
        return [z.clone() - 1e300, z.clone(), z.clone(), z.clone(),
                torch.zeros(K, H, R, self.dh, dtype=torch.float64)]

    def run_chunk(self, start: int, state: list, bufs: dict):
        """Project one chunk of keys, score it tile by tile, fold it into ``state``; returns
        the chunk's value sum and, for causal rows ending in it, their partial value sums."""
        src, rows, dt, K, H, dh = self.source, self.rows, self.source.dtype, self.K, self.H, \
            self.dh
        stop = min(src.n, start + self.chunk)
        kv = src.chunk(start, stop) @ self.w_kv
        vv = kv[:, -src.d:]
        z = rem_scores(self.seed, H, self.R, start, stop, dt) if self.rem else None
        nt = -(-(stop - start) // self.tile)
        cm = torch.full((K, H, nt, self.R), NEG, dtype=dt)
        c1, c2, cx = (torch.zeros(K, H, nt, self.R, dtype=dt) for _ in range(3))
        co = torch.zeros(K, H, nt, self.R, dh, dtype=dt)
        for j in range(nt):
            t0, t1 = start + j * self.tile, min(stop, start + (j + 1) * self.tile)
            c = t1 - t0
            i0 = int(torch.searchsorted(rows, t0)) if self.causal else 0
            if i0 == self.R:
                break
            i1 = int(torch.searchsorted(rows, t1 - 1)) if self.causal else 0
            ra = self.R - i0
            mask = (torch.arange(t0, t1)[None, :] > rows[i0:i1, None]) if i1 > i0 else None
            ks = slice(t0 - start, t1 - start)
            for h in range(H):
                hs = slice(h * dh, (h + 1) * dh)
                s = bufs["s"][:ra * c].view(ra, c)  # contiguous views of flat buffers
                if z is None:
                    torch.matmul(self.q[h, i0:], kv[ks, hs].T, out=s)
                for k in range(K):
                    if self.fold:
                        t = s
                    else:
                        t = torch.mul(z[h, i0:, ks] if z is not None else s,
                                      self.mults_dt[k, i0:, None],
                                      out=bufs["t"][:ra * c].view(ra, c))
                    if mask is not None:
                        t[:i1 - i0].masked_fill_(mask, NEG)
                    mc = torch.amax(t, dim=1, out=cm[k, h, j, i0:])
                    t.sub_(mc[:, None])
                    p = torch.exp(t, out=bufs["p"][:ra * c].view(ra, c))
                    torch.sum(p, dim=1, out=c1[k, h, j, i0:])
                    torch.linalg.vecdot(p, p, out=c2[k, h, j, i0:])
                    torch.linalg.vecdot(p, t, out=cx[k, h, j, i0:])
                    torch.matmul(p, vv[ks, hs], out=co[k, h, j, i0:])
        parts = [torch.cat([a[None], b.double().movedim(2, 0)]) for a, b in
                 zip(state, (cm, c1, c2, cx, co), strict=True)]
        state[:] = _reduce(*parts)
        if not self.centred:
            return stop, None, None
        vsum = vv.double().sum(dim=0)
        partial = None
        if self.causal:  # value sums from the chunk start to each row ending in the chunk
            a, b = int(torch.searchsorted(rows, start)), int(torch.searchsorted(rows, stop))
            if b > a:
                partial = (a, b, vv.double().cumsum(dim=0)[rows[a:b] - start])
        return stop, vsum, partial


def stream_attention(source: TokenSource, weights: LayerWeights, rows, *,
                     multipliers: Sequence = (1.0,), causal: bool = False,
                     variant: str = "softmax", rem_std: float | None = None, chunk: int = 8192,
                     tile: int = 512, seed: int = 0, workers: int | None = None,
                     on_chunk: Callable[[int], None] | None = None) -> list[StreamResult]:
    """Attention statistics of the query rows ``rows`` (positions in ``source``) over all of
    ``source``'s keys (causal: keys ``0..row``), streamed ``chunk`` keys at a time.

    ``multipliers``: one entry per length scaling to evaluate on the same keys and values (a
    float or an (R,) per-row array, e.g. ``score_multiplier(kind, n_keys)`` for causal rows);
    the logits are ``q.k / sqrt(d_H)`` times it (docs/theory.md §2.1, §3.2). Returns one
    :class:`StreamResult` per entry. ``rem_std``: REM logits ``rem_std * z`` with
    ``z = rem_scores(seed, ...)`` instead of key-query ones (values stay ``x W_V``).
    ``variant``: ``softmax``; ``centred`` (A - 11^T/n over the visible keys, docs/theory.md §2.4);
    ``uniform`` (zero logits). ``on_chunk(keys_done)`` is called after every chunk.

    Parallelism: ``workers`` threads (default ``torch.get_num_threads()``) take whole chunks,
    each with torch's intra-op pool set to one thread for the run (restored afterwards): a
    2-core machine shared with other jobs made every two-thread elementwise op wait ~15 ms for
    its partner thread. Scores are processed in ``tile``-key tiles that stay in L2 cache.
    Denormals are flushed to zero during the run (a weight below 1e-38 of the row's largest is
    an exact 0 in float32 anyway; denormal arithmetic was ~100x slower).
    """
    import threading

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)} (got {variant!r})")
    T, d = source.n, source.d
    rows = torch.as_tensor(rows, dtype=torch.long).sort().values
    R = len(rows)
    if R < 1 or int(rows[0]) < 0 or int(rows[-1]) >= T:
        raise ValueError(f"rows must be positions in [0, {T - 1}]")
    if chunk < 1 or tile < 1:
        raise ValueError("chunk and tile must be positive")
    n_keys = rows + 1 if causal else torch.full((R,), T, dtype=torch.long)
    mults = torch.stack([torch.as_tensor(m, dtype=torch.float64).expand(R)
                         for m in multipliers]) * (0.0 if variant == "uniform" else 1.0)
    if rem_std is not None:
        mults = mults * float(rem_std)
    workers = max(1, int(workers or torch.get_num_threads()))
    job = _Job(source, weights, rows, mults, causal, rem_std is not None, seed, chunk, tile,
               variant == "centred")
    last = int(rows[-1]) + 1 if causal else T
    starts = iter(range(0, last, chunk))
    lock, results, errors = threading.Lock(), [], []
    vsums, partials = {}, []

    def work():
        state = job.new_state()
        cap = max(1, min(tile, T)) * R
        bufs = {k: torch.empty(cap, dtype=source.dtype) for k in "stp"}

        def step(start):
            stop, vsum, partial = job.run_chunk(start, state, bufs)
            with lock:
                vsums[start] = vsum
                if partial is not None:
                    partials.append(partial)
                if on_chunk is not None:
                    on_chunk(stop)

        take_each(starts, lock, errors, step)
        with lock:
            results.append(state)

    run_workers(work, workers, flush_denormal=True)
    if errors:
        raise errors[0]
    m, s1, s2, sx, o = _reduce(*[torch.stack(p) for p in zip(*results, strict=True)])
    vmean = torch.zeros(R, d, dtype=torch.float64)
    if variant == "centred":
        keys = sorted(vsums)
        if causal:
            before = torch.cumsum(torch.stack([vsums[k] for k in keys]), 0) \
                - torch.stack([vsums[k] for k in keys])
            offset = dict(zip(keys, before, strict=True))
            for a, b, part in partials:
                vmean[a:b] = part + offset[(int(rows[a]) // chunk) * chunk]
            vmean /= n_keys[:, None]
        else:
            vmean[:] = sum(vsums[k] for k in keys) / T
    return [_finish(rows, n_keys, m[k], s1[k], s2[k], sx[k], o[k], weights, variant, vmean)
            for k in range(job.K)]


def _finish(rows, n_keys, m, s1, s2, sx, o, weights: LayerWeights, variant, vmean):
    """Row statistics and layer outputs from the merged state (module docstring)."""
    H, R = s1.shape
    logn = torch.log(n_keys.double())
    ent = (torch.log(s1) - sx / s1) / logn
    ent = torch.where(n_keys > 1, ent, torch.full_like(ent, math.nan)).T
    out = (o / s1[..., None]).transpose(0, 1).reshape(R, -1)
    out = out - vmean if variant == "centred" else out + weights.b_v.double()
    if weights.w_o is not None:
        out = out @ weights.w_o.double() + weights.b_o.double()
    return StreamResult(rows, n_keys, (s2 / s1**2).T, ent, (1.0 / s1).T,
                        (m + torch.log(s1)).T, out)
