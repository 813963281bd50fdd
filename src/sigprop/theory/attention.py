"""The row statistics of one attention layer (docs/theory.md §2.1-2.4): softmax rows as REMs
(the T -> inf limit or the exact finite-T tables, bidirectional or averaged over the causal
positions), uniform rows and the identity. :mod:`.blocks` turns them into the block's map of
(q, p); the LayerNorm average of a causal block reuses the per-position statistics they
carry (``AttentionStats.nodes``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import causal as causal_nodes
from . import rem
from .causal_positions import CAUSAL_POSITIONS, causal_grid


class AttentionStats(NamedTuple):
    """Row statistics of one attention layer (docs/theory.md §1): ``y2`` = ipr, ``yx`` = ipr_cross,
    normalised ``entropy``, ``wmax``; ``inv_t`` = E[1/#keys of a row] and ``inv_t_cross`` =
    E[1/#keys of the longer row of a pair] (both 1/T without a mask, 0 in the T -> inf
    limit): what centred attention subtracts from ``y2`` and ``yx``. ``nodes`` (causal
    finite T, one score std per row): the flat entries' statistics at the causal positions
    (:class:`.causal.NodeTables`), or with the position-averaged tables
    (:data:`.causal.TABULATED`) their Yx average and the entries off the tables
    (:class:`.causal.TabulatedNodes`), which the LayerNorm average of the same block reuses
    (:func:`.blocks._ln_fluct_cos_causal`). ``w2``, ``wx`` (attention sinks,
    docs/theory.md §2.4.3; None without): ``E W_a^2`` and ``E W_a W_c`` of the rows' masses on
    the keys, which the map's mean terms carry (``y2``, ``yx`` are then the sinked rows'
    ``E sum_b w_ab^2`` and ``E sum_b w_ab w_cb``)."""

    y2: np.ndarray
    yx: np.ndarray
    entropy: np.ndarray | None
    wmax: np.ndarray | None
    inv_t: np.ndarray
    inv_t_cross: np.ndarray
    nodes: causal_nodes.NodeTables | causal_nodes.TabulatedNodes | None = None
    w2: np.ndarray | None = None
    wx: np.ndarray | None = None


def causal_position_nodes(T: int, k: int = CAUSAL_POSITIONS) -> tuple[np.ndarray, np.ndarray]:
    """Log-spaced query positions t (number of visible keys) and the share of the T positions
    each node stands for (docs/theory.md §2.4 causal: the query at t is a REM with N = t keys)."""
    grid = causal_grid(int(T), int(k))
    return grid.nodes.copy(), grid.weights.copy()


def finite_stats(v, rho, n, d_head, full):
    y2 = rem.y2_table(n, d_head)(v)
    yx = rem.yx_table(n, d_head)(v, rho)
    ent = rem.entropy_table(n, d_head)(v) if full else None
    wm = rem.wmax_table(n, d_head)(v) if full else None
    return y2, yx, ent, wm


def attention_stats(sigma_s, rho, T: int, *, d_head: int | None = None, causal: bool = False,
                    asymptotic: bool = False, full: bool = False) -> AttentionStats:
    """Statistics of softmax attention with score std ``sigma_s`` on tokens at cosine ``rho``.

    A row is a REM with i.i.d. energies of variance ``v = sigma_s^2 (1 - rho)`` (docs/theory.md
    §2.1).
    ``asymptotic``: the T -> inf REM (§2.2) with ``beta = sigma_s / sqrt(log T)``; otherwise the
    exact finite-T expectations of §2.3 (tabulated per T), averaged over the chi2(d_head) spread
    of query norms when ``d_head`` is given. ``causal``: averaged over query positions, the query
    at position t seeing t keys (docs/theory.md §2.4). ``full`` adds entropy and wmax.
    """
    sigma_s = np.asarray(sigma_s, dtype=np.float64)
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    if asymptotic:
        beta = sigma_s / math.sqrt(math.log(T))
        shape = np.broadcast(beta, rho).shape
        ent = rem.entropy_asymptotic(beta, rho) if full else None
        wm = rem.wmax_asymptotic(beta, rho) if full else None
        zero = np.zeros(shape)
        return AttentionStats(rem.y2_asymptotic(beta, rho), zero, ent, wm, zero, zero)
    v = sigma_s**2 * (1.0 - rho)
    if not causal:
        y2, yx, ent, wm = finite_stats(v, rho, T, d_head, full)
        inv = np.full(np.shape(y2), 1.0 / T)
        return AttentionStats(y2, yx, ent, wm, inv, inv)
    grid = causal_grid(int(T))
    acc = [0.0, 0.0, 0.0, 0.0]
    extra = None
    if not full:
        vb, rb = np.broadcast_arrays(v, rho)
        vf, rf = vb.ravel(), rb.ravel()
    if not full and causal_nodes.TABULATED and T >= 2:  # the position averages' tables
        y2f, yxf, ok = causal_nodes.tabulated_attention(vf, rf, int(T), d_head)
        off = np.flatnonzero(~ok)
        exact = None
        if off.size:  # off the tables: every position's tables (kept for the LayerNorm)
            exact = causal_nodes.att_exact(vf[off], rf[off], int(T), d_head)
            y2f[off], yxf[off] = exact.y2_mean, exact.yx_mean
        acc[0], acc[1] = y2f.reshape(vb.shape), yxf.reshape(vb.shape)
        extra = causal_nodes.TabulatedNodes(v=vf, rho=rf, yx_mean=yxf, off=off, exact=exact)
    elif not full:  # every position's tables in one pass (:mod:`.causal_positions`), in order
        extra = causal_nodes.att_exact(vf, rf, int(T), d_head)
        acc[0], acc[1] = extra.y2_mean.reshape(vb.shape), extra.yx_mean.reshape(vb.shape)
    for t, w, pw in zip(grid.nodes, grid.weights, grid.pair, strict=True):
        if not full:
            break
        if t == 1:  # a single visible key: weight 1 on it
            vals = (np.ones_like(v), np.ones_like(v), np.ones_like(v), np.ones_like(v))
        else:
            vals = finite_stats(v, rho, int(t), d_head, full)
        for i, val in enumerate(vals):
            if val is not None:
                acc[i] = acc[i] + (w * pw if i == 1 else w) * val
    shape = np.shape(acc[0])
    # What centred attention subtracts, on the same nodes as y2 and yx: at uniform weights
    # (Y2(t) = Yx(t) = 1/t) the centred terms then vanish exactly and the cross term stays
    # below the diagonal one, p <= q (the exact harmonic sum of causal_pair_weights differs
    # from the node sum by the node discretisation, which made p > q at small beta).
    return AttentionStats(acc[0], acc[1], acc[2] if full else None, acc[3] if full else None,
                          np.full(shape, float(np.sum(grid.weights / grid.nodes))),
                          np.full(shape, float(np.sum(grid.weights * grid.pair / grid.nodes))),
                          extra)


def uniform_stats(shape, T: int, *, causal: bool = False, asymptotic: bool = False):
    """Uniform attention (noci22 Assumption 3.1): every weight 1/#keys."""
    if asymptotic:
        inv = inv_cross = 0.0
    elif causal:
        grid = causal_grid(int(T))
        inv, inv_cross = float(np.sum(grid.weights / grid.nodes)), grid.inv_cross
    else:
        inv = inv_cross = 1.0 / T
    arr, cross = np.full(shape, inv), np.full(shape, inv_cross)
    return AttentionStats(arr, cross, np.ones(shape), arr, arr, cross)


def identity_stats(shape) -> AttentionStats:
    """Each token attends only to itself (shaped attention at init, docs/fixes.md): a one-hot
    row on the diagonal, ``Y2 = 1``, and two rows never share their key, ``Yx = 0``; the
    attention output is each token's own value, so ``q_att = s_v^2 q`` and ``p_att = s_v^2
    p``."""
    one, zero = np.ones(shape), np.zeros(shape)
    return AttentionStats(one, zero, zero, one, zero, zero)
