"""Learned attention sinks ("off-by-one softmax", gpt-oss) in the finite-T REM
(docs/theory.md §2.4.3). NumPy/SciPy, float64.

A head with sink logit ``sigma`` weights key b of a row by ``w_b = e^{s_b} / (e^sigma + Z)``,
``Z = sum_b e^{s_b}``; the sink carries no value, so the output is the ordinary attention
output times the row's mass ``W = Z / (e^sigma + Z) = 1 - p0``. The renormalised weights
``w / W`` are the ordinary softmax: the sink changes no row statistic of the distribution
over keys, only how much of it reaches the output.

Scores of a row are ``s_b = c + e_b``: ``e_b`` i.i.d. ``N(0, v)`` with ``v = sigma_s^2 (1 -
rho)`` (the REM of §2.1) and a part ``c ~ N(0, v_c)``, ``v_c = sigma_s^2 rho``, common to the
row's keys. ``c`` cancels in the ordinary softmax but not against the fixed sink: the row sees
the sink at ``sigma - c``. With ``1/(e^lam + Z)^k`` written as a Laplace integral and ``t =
e^{-u}`` (as in :mod:`.rem_finite`), for n keys:

* ``E W   = n int a1 g0^(n-1) S du``,
* ``Y2s   = E sum_b w_b^2 = n int a2 g0^(n-1) S du``,
* ``E W^2 = Y2s + n (n-1) int a1^2 g0^(n-2) S du``,

with the kernels ``a1, a2, g0 = 1 - m`` of :mod:`.rem_finite` at variance v and the sink
factor ``S(u) = E_c exp(-e^{sigma - c - u}) = 1 - m_{v_c}(u - sigma)`` (the same kernel at
variance ``v_c``; c is symmetric). No sink (sigma -> -inf) gives ``E W = E W^2 = 1``,
``Y2s = Y2``. These are exact in the REM; with ``d_head`` they are averaged over the
``chi2(d_head)/d_head`` spread of the query norm, which scales v and v_c together.

Two rows a != c (:func:`sink_stats`) are approximated: their masses' covariance is taken as
``rho Var W`` (exact at rho = 0, independent rows, and at rho = 1, identical rows) and the
shared-key overlap as ``E[W_a W_c] Yx`` (mass independent of the shape of the row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import rem_tables
from .causal_positions import causal_grid, pair_means
from .rem_finite import chi_nodes, linear_grid, row_terms, score_bracket, tpow

__all__ = ["SinkStats", "sink_moments", "sink_stats"]

#: u-nodes of the sink integrals (the range reaches ~30 past the sink logit)
N_U = 240
#: points per chunk of the quadrature
_CHUNK = 64


def _core(v, vc, s, n):
    """``(E W, E W^2, Y2s)`` for flat arrays (n >= 1, v >= 0)."""
    sig = np.sqrt(v)
    lo, hi = score_bracket(sig, n)
    hi = np.maximum(hi, s + 4.0 * np.sqrt(vc) + 30.0)
    lo = np.minimum(lo, hi - 1.0)
    u, w = linear_grid(lo, hi, N_U)
    f = row_terms(u, sig, ("a1", "a2", "m"))
    sink = 1.0 - row_terms(u - s[:, None], np.sqrt(vc), ("m",))["m"]
    nn = n[:, None]
    g1 = tpow(f["m"], nn - 1) * sink
    g2 = np.where(nn >= 2, tpow(f["m"], np.maximum(nn - 2, 0)), 0.0) * sink
    w1 = n * np.sum(w * f["a1"] * g1, axis=1)
    y2s = n * np.sum(w * f["a2"] * g1, axis=1)
    w2 = y2s + n * (n - 1) * np.sum(w * f["a1"] ** 2 * g2, axis=1)
    return np.clip(w1, 0.0, 1.0), np.clip(w2, 0.0, 1.0), np.clip(y2s, 0.0, 1.0)


def sink_moments(v, v_common, sink, n, d_head: int | None = None):
    """``(E W, E W^2, Y2s)`` of a row of ``n`` keys with i.i.d. scores of variance ``v``, a
    row-common score part of variance ``v_common`` and a sink logit ``sink`` (module
    docstring); broadcast over all arguments. ``d_head``: averaged over the chi2 query-norm
    spread (v and v_common scaled together)."""
    arrs = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64)
                                 for a in (v, v_common, sink, n)))
    shape = arrs[0].shape
    flat = [a.ravel() for a in arrs]
    if np.any(~(flat[3] >= 1)) or np.any(~(flat[0] >= 0)) or np.any(~(flat[1] >= 0)):
        raise ValueError("need n >= 1 and variances >= 0")
    if d_head is not None:
        chi, wc = chi_nodes(int(d_head))
        flat = [np.multiply.outer(flat[0], chi).ravel(), np.multiply.outer(flat[1], chi).ravel(),
                np.repeat(flat[2], chi.size), np.repeat(flat[3], chi.size)]
    out = np.empty((3, flat[0].size))
    for i in range(0, flat[0].size, _CHUNK):
        sl = slice(i, i + _CHUNK)
        out[:, sl] = _core(*(a[sl] for a in flat))
    if d_head is not None:
        out = out.reshape(3, -1, chi.size) @ wc
    return tuple(x.reshape(shape) for x in out)


def _pair_mass(w1a, w2a, w1c, w2c, rho):
    """``E[W_a W_c] ~ E W_a E W_c + rho sd_a sd_c`` (module docstring)."""
    sda = np.sqrt(np.maximum(w2a - w1a**2, 0.0))
    sdc = np.sqrt(np.maximum(w2c - w1c**2, 0.0))
    return w1a * w1c + rho * sda * sdc


@dataclass(frozen=True, kw_only=True)
class SinkStats:
    """The moments of a head with a sink that its attention map takes (:func:`sink_stats`):
    ``y2`` = ``E sum_b w_ab^2``, ``yx`` = ``E sum_b w_ab w_cb`` (rows a != c), ``w2`` = ``E
    W_a^2`` and ``wx`` = ``E W_a W_c`` (the rows' masses on the keys)."""

    y2: np.ndarray
    yx: np.ndarray
    w2: np.ndarray
    wx: np.ndarray


def sink_stats(sigma_s, rho, sink, T: int, *, d_head: int | None = None,
               causal: bool = False) -> SinkStats:
    """What the attention map of a head with a sink needs (docs/theory.md §2.4.3), for scores
    of std ``sigma_s`` on tokens at cosine ``rho`` (broadcast with ``sink``). Causal rows: the
    query at position t sees t keys, so every moment is position-dependent; they are
    evaluated at the causal nodes of :mod:`.causal_positions` and averaged over positions
    (pairs a < c: row c's mass on the a shared keys taken as (a/c) of its mass, as in
    §2.4.1)."""
    sigma_s = np.asarray(sigma_s, dtype=np.float64)
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    sigma_s, rho, sink = np.broadcast_arrays(sigma_s, rho, np.asarray(sink, dtype=np.float64))
    v, vc = sigma_s**2 * (1.0 - rho), sigma_s**2 * rho
    if not causal:
        w1, w2, y2s = sink_moments(v, vc, sink, T, d_head)
        wx = _pair_mass(w1, w2, w1, w2, rho)
        yxs = wx * rem_tables.yx_table(T, d_head)(v, rho)
        return SinkStats(y2=y2s, yx=yxs, w2=w2, wx=wx)
    grid = causal_grid(int(T))
    nodes, weights = grid.nodes, grid.weights
    k = nodes.reshape((-1,) + (1,) * v.ndim)
    w1, w2, y2s = sink_moments(v[None], vc[None], sink[None], k, d_head)
    yx = np.stack([np.ones(v.shape) if t < 2 else rem_tables.yx_table(int(t), d_head)(v, rho)
                   for t in nodes])
    wq = weights.reshape(k.shape)
    y2s_avg, w2_avg = np.sum(wq * y2s, axis=0), np.sum(wq * w2, axis=0)
    sd = np.sqrt(np.maximum(w2 - w1**2, 0.0))
    tiny = 1e-300  # pair_means works in logs: keep its node values positive
    p0m, p1m = pair_means(nodes, np.maximum(w1, tiny), yx, int(T))
    p0s, p1s = pair_means(nodes, np.maximum(sd, tiny), yx, int(T))
    return SinkStats(y2=y2s_avg, yx=p1m + rho * p1s, w2=w2_avg, wx=p0m + rho * p0s)
