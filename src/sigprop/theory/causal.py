"""The causal block's per-position work, vectorised over the query positions (docs/theory.md
§2.4 causal, :mod:`.fluct` causal rows).

A causal layer averages REM statistics over the :func:`.blocks._causal_nodes` positions (12 at
T = 512), each a row of t keys with its own tables (Y2, Yx, the LayerNorm factor r). Calling
each position's table in turn cost 12 Python-level spline calls per statistic and layer, and
:func:`.fluct.causal_pair_means` walked 256 position bins per grid entry: profiled on
``diagram.compute`` (256 x 256 grid, depth 60, post-LN softmax, T = 512) the causal diagram took
13.2 s against 0.50 s bidirectional (26x); 6.3 s of it in the pair means, 2.2 s in the causal
``attention_stats`` and 1.4 s of table calls in the LayerNorm average (which re-evaluated the
same Y2 and Yx tables a second time). With this module, same run against the code before it:
causal 2.7 s against 8.0 s before, bidirectional 0.24 s (11x, from 36x on that loaded run);
what is left is the per-position work itself (pair sums ~45%, tables ~25%, LayerNorm factor
~17%). Within 2x would need the position averages themselves tabulated per (T, d_head,
heads): Y2 in v, Yx in (v, rho) and the LayerNorm pair means in (v, rho, a0/b).

Two changes, outputs unchanged to float roundoff or within a stated bound:

* :func:`node_tables` / :func:`ln_nodes` evaluate every position's table in one pass. The
  tables of all T share their grid (:mod:`.rem_tables`, :func:`.fluct.ln_factor_table`), so
  one cell lookup serves all positions and the coefficients are gathered as one row per
  entry; the arithmetic per element is that of the single-table evaluators (bit for bit).
  Entries off the tables' grid (v > 1e4) go through the single-table functions.
* :func:`pair_means` sums the position bins of a segment between two nodes on at most
  :data:`VIRTUAL` virtual bins. Between nodes j and j+1 the bins' values are geometric
  interpolations, ``m(lam) = m_j exp(lam d_j)`` with ``lam`` in [0, 1], so each bin sum is a
  sum of exponentials ``sum_k w_k exp(lam_k a)``; interpolating ``exp(lam a)`` in lam at
  Chebyshev points turns it into the same sum over those points with pre-summed weights
  (the pair sums ``k < k'`` inside a segment into a Q x Q matrix). The interpolation error is
  at most ``2 exp(2 R) (R w / 4)^Q / Q!`` of each (positive) sum for ``|a| <= R`` and a
  segment of lam-width w <= 1: below 6e-11 at Q = 12, R = 2 (measured on the diagram: |a|
  <= 1.4). Entries with a larger exponent, or non-finite values, take the bin-by-bin sum of
  :func:`.fluct.causal_pair_means`. Segments with at most Q bins are summed bin by bin.
"""

from __future__ import annotations

import functools

import numpy as np

from . import fluct, rem_tables

#: virtual bins per segment of :func:`pair_means` (Chebyshev points in lam)
VIRTUAL = 12
#: largest exponent |a| (a log-ratio of adjacent nodes' values, or a sum of two) summed on
#: virtual bins; larger ones take the exact bin sums
EXP_BOUND = 2.0


@functools.lru_cache(maxsize=64)
def _y2_stack(ts: tuple, d_head):
    """The Y2 tables of rows of t keys, t in ``ts``, and their coefficients stacked."""
    tabs = [rem_tables.y2_table(t, d_head) for t in ts]

    def rows(key):
        return np.stack([t.parts[key] for t in tabs])[:, None]

    return (tabs, np.stack([t.parts["coef"] for t in tabs], axis=1),   # (4, K, cells)
            rows("y0"), rows("at_inf"), rows("p0"), rows("dp"))


@functools.lru_cache(maxsize=64)
def _yx_stack(ts: tuple, d_head):
    tabs = [rem_tables.yx_table(t, d_head) for t in ts]
    coef = np.stack([t.parts["coef"] for t in tabs], axis=-1)    # (4, 4, cells, K)
    return tabs, np.ascontiguousarray(coef.transpose(2, 0, 1, 3))  # (cells, 4, 4, K)


@functools.lru_cache(maxsize=64)
def _ln_stack(ts: tuple, d_head, heads):
    tabs = [fluct.ln_factor_table(t, d_head, heads) for t in ts]
    coef = np.stack([t.coef for t in tabs], axis=1)              # (4, K, 4, cells)
    cells = coef.shape[-1]
    return cells, np.ascontiguousarray(coef.transpose(1, 3, 0, 2)).reshape(len(ts) * cells,
                                                                           4, 4)


def _y2_nodes(v, ts, d_head):
    """Y2 of rows of t keys for every t in ``ts`` (all > 1) at the flat variances v: (K, E).
    Bit for bit the arithmetic of :func:`.rem_tables._table1d`'s evaluator."""
    tabs, coef, y0, a_inf, p0, dp = _y2_stack(tuple(ts), d_head)
    lv = tabs[0].parts["lv"]
    power = tabs[0].parts["power"]
    i, d = rem_tables._cell(lv, np.log(np.clip(v, np.exp(lv[0]), None)))
    c = coef[:, :, i]
    out = rem_tables._expit(((c[0] * d + c[1]) * d + c[2]) * d + c[3])
    low = v < np.exp(lv[0])
    if low.any():
        t = (v[low] / np.exp(lv[0])) ** power
        out[:, low] = (2 * p0 - dp) * t + (dp - p0) * t * t
    out = y0 + (a_inf - y0) * out
    high = v > np.exp(lv[-1]) * (1 + 1e-12)
    if high.any():  # off the grid: the single tables (extended table, large-v law)
        out[:, high] = np.stack([t(v[high]) for t in tabs])
    return out


def _yx_nodes(v, rho, ts, d_head, y2):
    """Yx of rows of t keys at (v, rho) given their Y2 (:func:`_y2_nodes`): (K, E). Bit for bit
    the arithmetic of :func:`.rem_tables._table2d`'s evaluator."""
    tabs, coef = _yx_stack(tuple(ts), d_head)
    parts = tabs[0].parts
    lv, vmin, vmax = parts["lv"], parts["vmin"], parts["vmax"]
    vc = np.clip(v, vmin, vmax)
    (i, dx), (j, dy) = (rem_tables._cell(lv, np.log(vc)),
                        rem_tables._cell(rem_tables._XI, rem_tables._xi(vc, rho)))
    g = np.take(coef, i * (rem_tables._XI.size - 1) + j, axis=0, mode="clip")  # (E,4,4,K)
    dx, dy, out = dx[:, None], dy[:, None], 0.0
    for a in range(4):
        ck = g[:, a]
        out = out * dx + ((ck[:, 0] * dy + ck[:, 1]) * dy + ck[:, 2]) * dy + ck[:, 3]
    inv = 1.0 / np.asarray(ts, dtype=np.float64)[:, None]
    out = inv + out.T * (y2 - inv)
    high = v > vmax * (1 + 1e-12)
    if high.any():
        out[:, high] = np.stack([t(v[high], rho[high]) for t in tabs])
    return out


def node_tables(v, rho, nodes, d_head):
    """``(Y2_t, Yx_t)`` at every node t (axis 0) for the flat row variances ``v`` and cosines
    ``rho`` (``rho`` clipped to [0, 1] as the tables do); t = 1 gives 1 (one visible key)."""
    v = np.asarray(v, dtype=np.float64)
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    k = np.asarray(nodes)
    y2, yx = np.ones((k.size, v.size)), np.ones((k.size, v.size))
    big = [int(t) for t in k if t > 1]
    if big and v.size:
        sel = k > 1
        y2[sel] = _y2_nodes(v, big, d_head)
        yx[sel] = _yx_nodes(v, rho, big, d_head, y2[sel])
    return y2, yx


def ln_nodes(v, kappa, nodes, d_head, heads):
    """The LayerNorm factor ``r_t(v, kappa_t)`` of :func:`.fluct.ln_factor` for every node
    (axis 0 of ``kappa``; ``v`` flat), bit for bit; 1 at t = 1."""
    k = np.asarray(nodes)
    out = np.ones(kappa.shape)
    big = [int(t) for t in k if t > 1]
    if not big or not v.size:
        return out
    sel = np.flatnonzero(k > 1)
    cells, coef = _ln_stack(tuple(big), d_head, heads)
    lv = np.clip(np.log(np.maximum(v, 1e-300)), fluct._LV[0], fluct._LV[-1])
    kap = np.clip(kappa[sel], 0.0, 1.0)
    i, dx = rem_tables._cell(fluct._LV, lv)
    j, dy = rem_tables._cell(fluct._KAPPA, kap)
    flat = np.arange(len(big))[:, None] * cells + i * (fluct._KAPPA.size - 1) + j
    g = np.take(coef, flat, axis=0, mode="clip")                 # (K, E, 4, 4)
    res = 0.0
    for a in range(4):
        ck = g[:, :, a]
        res = res * dx + ((ck[..., 0] * dy + ck[..., 1]) * dy + ck[..., 2]) * dy + ck[..., 3]
    out[sel] = np.maximum(res, 1.0)
    return out


def _cheb_basis(lam, lo, hi, q):
    """Chebyshev points of [lo, hi] and the Lagrange basis at ``lam``: (q,), (len(lam), q)."""
    x = 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos((2 * np.arange(q) + 1) * np.pi / (2 * q))
    basis = np.ones((lam.size, q))
    for i in range(q):
        for k in range(q):
            if k != i:
                basis[:, i] *= (lam - x[k]) / (x[i] - x[k])
    return x, basis


@functools.lru_cache(maxsize=32)
def _plan(T: int, nodes: tuple, q: int):
    """Per segment between adjacent nodes: virtual lam (J, q) and the weights of the sums of
    :func:`pair_means` (module docstring): ``wa`` (bin counts n), ``wc`` (n/g), ``wd`` (n g),
    ``we`` (n(n-1)/2), ``pair`` (J, q, q) for ``sum_{k<k'} n_k g_k f(lam_k) n_k'/g_k'
    h(lam_k')``. Padding points carry zero weight."""
    nd = np.asarray(nodes, dtype=np.float64)
    g, n = fluct._position_bins(T)
    idx = np.interp(np.log(g), np.log(nd), np.arange(nd.size, dtype=np.float64))
    seg = np.minimum(np.floor(idx).astype(int), nd.size - 2)
    lam = idx - seg
    J = nd.size - 1
    out = {k: np.zeros((J, q)) for k in ("lam", "wa", "wc", "wd", "we")}
    out["pair"] = np.zeros((J, q, q))
    for s in range(J):
        sel = seg == s
        ls, ns, gs = lam[sel], n[sel], g[sel]
        if ls.size <= q:  # bin by bin
            x, basis = np.pad(ls, (0, q - ls.size)), np.eye(ls.size, q)
        else:
            x, basis = _cheb_basis(ls, ls.min(), ls.max(), q)
        out["lam"][s] = x
        for key, w in (("wa", ns), ("wc", ns / gs), ("wd", ns * gs), ("we", 0.5 * ns * (ns - 1))):
            out[key][s] = w @ basis
        upper = np.triu(np.outer(ns * gs, ns / gs), 1)  # pairs k < k' (bins in order)
        out["pair"][s] = basis.T @ upper @ basis
    return out


def pair_means(nodes, m, yx, T: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`.fluct.causal_pair_means` (same arguments, same ``(P0, P1)``) on virtual bins
    (module docstring): relative error below 6e-11 per sum; entries outside the bound take
    the exact bin sums."""
    nodes = np.asarray(nodes, dtype=np.float64)
    m, yx = np.asarray(m, dtype=np.float64), np.asarray(yx, dtype=np.float64)
    if nodes.size < 2 or m.ndim < 1:
        return fluct.causal_pair_means(nodes, m, yx, T)
    shape = np.broadcast_shapes(m.shape, yx.shape)[1:]
    m2 = np.broadcast_to(m, (nodes.size,) + shape).reshape(nodes.size, -1)
    x2 = np.broadcast_to(yx, (nodes.size,) + shape).reshape(nodes.size, -1)
    pl = _plan(int(T), tuple(nodes.tolist()), VIRTUAL)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lm, lx = np.log(m2), np.log(x2)
        dm, dx = np.diff(lm, axis=0), np.diff(lx, axis=0)
        big = np.maximum(np.abs(2 * dm), np.maximum(np.abs(dx + dm), np.abs(dx + 2 * dm)))
        ok = np.isfinite(big).all(axis=0) & (big <= EXP_BOUND).all(axis=0)
        if not ok.all():
            lm, lx, dm, dx = lm[:, ok], lx[:, ok], dm[:, ok], dx[:, ok]
        J, q = pl["lam"].shape
        lam = pl["lam"][:, :, None]
        mv = np.exp(lm[:-1, None] + lam * dm[:, None])           # (J, q, E)
        xm = np.exp(lx[:-1, None] + lam * dx[:, None]) * mv
        flat_m, flat_xm = mv.reshape(J * q, -1), xm.reshape(J * q, -1)
        s1 = pl["wa"].ravel() @ flat_m
        s2 = pl["wa"].ravel() @ (flat_m * flat_m)
        c = np.matmul(pl["wc"][:, None, :], mv)[:, 0]             # (J, E)
        tail = np.cumsum(c[::-1], axis=0)[::-1] - c               # later segments only
        d = np.matmul(pl["wd"][:, None, :], xm)[:, 0]
        e = pl["we"].ravel() @ (flat_xm * flat_m)
        w = np.einsum("ie,ie->e", flat_xm, np.matmul(pl["pair"], mv).reshape(J * q, -1))
        pairs = float(T) * (T - 1)
        p0 = np.empty(m2.shape[1])
        p1 = np.empty(m2.shape[1])
        p0[ok] = (s1 * s1 - s2) / pairs
        p1[ok] = 2.0 * (np.einsum("je,je->e", d, tail) + w + e) / pairs
    if not ok.all():
        e0, e1 = fluct.causal_pair_means(nodes, m2[:, ~ok], x2[:, ~ok], T)
        p0[~ok], p1[~ok] = e0, e1
    return p0.reshape(shape), p1.reshape(shape)
