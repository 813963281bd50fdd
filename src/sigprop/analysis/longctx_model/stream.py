"""Steps 2 and 3, input geometry and streaming: per layer, keys and values at every position
drawn from a Gaussian with the mean and covariance of its reference pass (queries of the
sampled rows likewise; the ``resampled`` input model instead draws measured queries and
(key, value) pairs of the reference pass, :class:`~sigprop.measurement.stream_model.
EmpiricalKV`), streamed by :func:`sigprop.measurement.stream_model.stream_layer`
over the longest length with the model's rotary module at the true positions; rows of every
length in the same pass (a length-T context is the first T positions of the longest one),
every scaling on the same scores. Each length's measured rows are set beside the theory of
:func:`.theory.layer_theory` (:func:`stream_layer_lengths`).

What the Gaussian leaves out: the dependence of hidden states on position and on the context
length itself (checked against real forward passes in ``tests/test_longctx_model.py``, and on
trained weights by :mod:`.real` on every run). On real text the first token's key and value
(a trained model's sink) are kept as measured (:class:`~sigprop.measurement.stream_model.
PinnedKV`); outlier dimensions are kept by the fits' own mean and full covariance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...measurement import stream_model as sm
from .capture import LayerFit
from .scaling import Scaling
from .theory import LayerMoments, layer_theory


@dataclass
class Rows:
    """Sampled query rows of every length, ordered for ``stream_layer`` (``lo`` and ``hi``
    non-decreasing): ``pos``, ``lo``, ``hi``, ``group`` (index into ``lengths``) and the rows
    whose outputs are formed (``out``)."""

    lengths: list[int]
    pos: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    group: torch.Tensor
    out: torch.Tensor

    @property
    def n_keys(self) -> np.ndarray:
        return (self.hi - self.lo).numpy().astype(np.float64)

    def select(self, g: int) -> Rows:
        """The rows of one length (for a pass of its own)."""
        sel = torch.nonzero(self.group == g).flatten()
        out = torch.nonzero(torch.isin(sel, self.out)).flatten()
        return Rows([self.lengths[g]], self.pos[sel], self.lo[sel], self.hi[sel],
                    torch.zeros(len(sel), dtype=torch.long), out)


def sample_rows(lengths: Sequence[int], queries: int, out_queries: int, *, causal: bool,
                window: int | None, seed: int) -> Rows:
    """``min(queries, T)`` distinct positions per length T, uniform in ``[0, T)`` (seeded by
    ``(seed, T)``); causal rows see ``[max(0, a - W + 1), a]``, others ``[0, T)``."""
    pos, lo, hi, grp, out = [], [], [], [], []
    for g, T in enumerate(lengths):
        R = min(queries, T)
        gen = torch.Generator().manual_seed(sm.block_seed(seed, T, 31))
        p = (torch.randperm(T, generator=gen)[:R] if T <= 2**24 else
             torch.randint(0, T, (R,), generator=gen)).sort().values
        flag = torch.zeros(R, dtype=torch.bool)
        flag[torch.randperm(R, generator=gen)[:min(out_queries, R)]] = True
        if causal:
            h = p + 1
            lw = (p - window + 1).clamp_min(0) if window else torch.zeros_like(p)
        else:
            h = torch.full_like(p, T)
            lw = torch.zeros_like(p)
        pos.append(p)
        lo.append(lw)
        hi.append(h)
        grp.append(torch.full_like(p, g))
        out.append(flag)
    pos, lo, hi, grp, out = (torch.cat(x) for x in (pos, lo, hi, grp, out))
    order = torch.from_numpy(np.lexsort((lo.numpy(), hi.numpy())))
    pos, lo, hi, grp, out = (x[order] for x in (pos, lo, hi, grp, out))
    return Rows(list(lengths), pos, lo, hi, grp, torch.nonzero(out).flatten())


def _queries(fit: LayerFit, n: int, seed: int) -> torch.Tensor:
    """``(n, H, d_H)`` pre-RoPE queries drawn from the layer's query fit."""
    if fit.pool_q is not None:  # the resampled input model: measured queries
        g = torch.Generator().manual_seed(sm.block_seed(seed, fit.index, 23))
        return fit.pool_q[torch.randint(0, fit.pool_q.shape[0], (n,), generator=g)].double()
    g = fit.q_gen or fit.q
    z = sm.random_normal(seed, 21, fit.index, n, g.rank, torch.float64)
    q = (g.mu + z @ g.F).view(n, fit.heads, fit.head_dim)
    return fit.q_norm(q) if fit.q_norm is not None and fit.q_gen is not None else q


def stream_fit(fit: LayerFit, rows: Rows, scalings: Sequence[Scaling], *, seed: int,
               chunk: int, workers: int | None, dtype=torch.float32, device: str = "cpu",
               on_chunk: Callable[[int], None] | None = None) -> list[sm.LayerResult]:
    """Stream one layer's rows under every scaling (one pass, or one per length when the
    rotary frequencies depend on the context length)."""
    layer_seed = sm.block_seed(seed, fit.index, 41)
    if fit.length_dependent_rope and len(rows.lengths) > 1:
        parts = [stream_fit(fit, rows.select(g), scalings, seed=seed, chunk=chunk,
                            workers=workers, dtype=dtype, device=device, on_chunk=on_chunk)
                 for g in range(len(rows.lengths))]
        return [_merge([p[k] for p in parts], rows) for k in range(len(scalings))]
    n_max = max(rows.lengths)
    q = _queries(fit, len(rows.pos), layer_seed)
    if fit.pool_k is not None:  # the resampled input model: measured (key, value) pairs
        src = sm.EmpiricalKV(n_max, fit.pool_k, fit.pool_v, seed=layer_seed, dtype=dtype,
                             device=device)
    else:
        src = sm.GaussianKV(n_max, fit.k_gen or fit.k, fit.v, fit.kv_heads, seed=layer_seed,
                            dtype=dtype, device=device,
                            k_post=fit.k_norm if fit.k_gen is not None else None)
    if fit.first_k is not None:  # real text: the first token's key and value as measured
        src = sm.PinnedKV(src, fit.first_k[None], fit.first_v[None])
    mults = [s.mult(rows.n_keys) for s in scalings]
    rope = None
    if fit.rope is not None:
        rope = fit.rope(n_max if fit.length_dependent_rope else None)
    return sm.stream_layer(q, rows.pos, rows.lo, rows.hi, src, scale=fit.scale,
                           multipliers=mults, rope=rope, out_rows=rows.out, w_o=fit.w_o,
                           b_o=fit.b_o, chunk=chunk, workers=workers, device=device,
                           on_chunk=on_chunk)


def _merge(parts: list[sm.LayerResult], rows: Rows) -> sm.LayerResult:
    """Results of per-length passes back in the order of ``rows``."""
    idx = [torch.nonzero(rows.group == g).flatten() for g in range(len(parts))]
    R = len(rows.pos)

    def put(name):
        first = getattr(parts[0], name)
        out = torch.empty((R,) + tuple(first.shape[1:]), dtype=first.dtype)
        for i, p in zip(idx, parts, strict=True):
            out[i] = getattr(p, name)
        return out

    outs = torch.cat([p.out for p in parts])
    order = torch.cat([i[torch.isin(i, rows.out)] for i in idx])
    final = torch.empty_like(outs)
    final[torch.searchsorted(rows.out, order)] = outs
    return sm.LayerResult(put("ipr"), put("entropy"), put("wmax"), put("log_z"),
                          put("spread"), final)

def stream_flops(f: LayerFit, rows: Rows, n_scalings: int) -> float:
    """Matrix-multiply flops of one layer's pass: drawing keys and values (``2 rank D`` per
    position), scores (``2 H d_H`` per visible key and row), value sums of the output rows
    (``2 H d_V`` per visible key, per scaling). The elementwise softmax work is not counted."""
    n_max = max(rows.lengths)
    gen = 2.0 * n_max * (f.k.rank * f.k.mu.numel() + f.v.rank * f.v.mu.numel())
    nk = rows.n_keys
    scores = 2.0 * f.heads * f.head_dim * float(nk.sum())
    dv = f.v.mu.numel() // f.kv_heads
    outs = 2.0 * f.heads * dv * float(nk[rows.out.numpy()].sum()) * n_scalings
    return gen + scores + outs


def value_at(df, layer: int, obs: str, scaling: str, T: int) -> float:
    """The ``value`` of one row of a long-context trajectory (``layer``, ``observable``,
    ``scaling``, ``seq_len``), NaN where there is none."""
    x = df[(df.layer == layer) & (df.observable == obs) & (df.scaling == scaling)
           & (df.seq_len == T)]["value"]
    return float(x.iloc[0]) if len(x) else math.nan


def row_stats(values: torch.Tensor) -> tuple[float, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return math.nan, math.nan
    err = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
    return float(v.mean()), err


def out_cos(out: torch.Tensor) -> tuple[float, float]:
    """Mean pairwise cosine of the output rows, stderr from the per-row means."""
    if out.shape[0] < 2:
        return math.nan, math.nan
    u = out / out.norm(dim=1, keepdim=True).clamp_min(1e-300)
    G = u @ u.T
    n = G.shape[0]
    per_row = (G.sum(1) - G.diagonal()) / (n - 1)
    return float(per_row.mean()), float(per_row.std() / math.sqrt(n))


def _spread_exponent(lengths: list[int], spread: list[float]) -> float | None:
    """Slope of log(spread) against log(log T): ~0.5-0.6 for random (REM) scores, ~0 when
    the largest score stays bounded (a fixed geometry)."""
    pts = [(math.log(math.log(T)), math.log(s)) for T, s in zip(lengths, spread, strict=True)
           if T > 2 and s > 0 and math.isfinite(s)]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < 0.1:
        return None
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


@dataclass
class LayerStream:
    """One layer streamed at every length: its rows of the trajectory, its summary row
    (:func:`stream_layer_lengths`), the seconds the stream took and its matmul flops."""

    records: list[dict]
    layer: dict
    seconds: float
    flops: float


def _theory_records(th: dict, cols: dict, observables: Sequence[str]) -> list[dict]:
    """``theory`` rows of ``observables`` and, except for the output cosine, their
    ``theory_asymptotic`` rows."""
    out = []
    for obs in observables:
        out.append(dict(observable=obs, source="theory", value=float(th[obs]), **cols))
        if obs != "cos":
            out.append(dict(observable=obs, source="theory_asymptotic",
                            value=float(th["asym_" + obs]), **cols))
    return out


def _length_records(f: LayerFit, mom: LayerMoments, T: int, rows: Rows, g: int,
                    streamed: Sequence[Scaling], results: list[sm.LayerResult],
                    theory_only: Sequence[Scaling]) -> tuple[list[dict], float]:
    """The rows of one layer at one length ``T`` (group ``g`` of ``rows``): per streamed
    scaling the measured ipr, entropy, wmax (head mean, stderr over rows) and output cosine
    beside their theory; theory rows of the scalings that were not streamed; the measured
    score spread of the model as it is. Also returns that spread."""
    sel = (rows.group == g)
    osel = sel[rows.out]
    base = dict(layer=f.index, seq_len=T)
    records: list[dict] = []

    def theory(s: Scaling) -> tuple[dict, dict]:
        th = layer_theory(mom, T, s.mult, causal=f.causal, window=f.window, d_head=f.head_dim)
        return th, dict(scaling=s.label, sigma_s=float(th["sigma_s"]),
                        beta=float(th["beta"]), **base)

    for s, r in zip(streamed, results, strict=True):
        th, cols = theory(s)
        for obs in ("ipr", "entropy", "wmax"):
            v, e = row_stats(getattr(r, obs)[sel].nanmean(dim=1))
            records.append(dict(observable=obs, source="measured", value=v, stderr=e, **cols))
            records += _theory_records(th, cols, (obs,))
        v, e = out_cos(r.out[osel])
        records.append(dict(observable="cos", source="measured", value=v, stderr=e, **cols))
        records += _theory_records(th, cols, ("cos",))
    for s in theory_only:
        th, cols = theory(s)
        records += _theory_records(th, cols, ("ipr", "entropy", "wmax", "cos"))
    v, e = row_stats(results[0].spread[sel].nanmean(dim=1))
    records.append(dict(observable="spread", source="measured", value=v, stderr=e,
                        scaling=streamed[0].label, **base))
    return records, v


def stream_layer_lengths(f: LayerFit, mom: LayerMoments, lengths: Sequence[int],
                         streamed: Sequence[Scaling], theory_only: Sequence[Scaling], *,
                         queries: int, out_queries: int, seed: int, chunk: int,
                         workers: int | None, device: str,
                         on_progress: Callable[[int], None] | None) -> LayerStream:
    """One layer at every length: ``queries`` sampled rows per length (``out_queries`` of
    them form the layer output), streamed under every scaling of ``streamed`` (the first is
    the model as it is), with the theory of those and of ``theory_only`` beside them, and the
    layer's summary row (token cosine, clpr25's gamma_c, the model check, the growth
    exponent of the largest score)."""
    rows = sample_rows(lengths, queries, out_queries, causal=f.causal, window=f.window,
                       seed=seed)
    t0 = time.perf_counter()
    results = stream_fit(f, rows, streamed, seed=seed, chunk=chunk, workers=workers,
                         device=device, on_chunk=on_progress)
    seconds = time.perf_counter() - t0
    records: list[dict] = []
    spread = []
    for g, T in enumerate(lengths):
        recs, v = _length_records(f, mom, T, rows, g, streamed, results, theory_only)
        records += recs
        spread.append(v)
    layer = dict(layer=f.index, name=f.name, heads=f.heads, kv_heads=f.kv_heads,
                 causal=f.causal, window=f.window, rope=f.rope is not None, rho=f.rho,
                 model_check=f.check, gamma_c=1.0 / (1.0 - f.rho) if f.rho < 1 else math.inf,
                 spread_exponent=_spread_exponent(list(lengths), spread))
    return LayerStream(records, layer, seconds, stream_flops(f, rows, len(streamed)))
