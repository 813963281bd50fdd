"""The causal block's per-position work, vectorised over the query positions (docs/theory.md
§2.4 causal, :mod:`.fluct` causal rows).

A causal layer averages REM statistics over the :func:`.attention.causal_position_nodes`
positions (12 at T = 512), each a row of t keys with its own tables (Y2, Yx, the LayerNorm
factor r). Calling each position's table in turn cost 12 Python-level spline calls per
statistic and layer, and
:func:`.fluct.causal_pair_means` walked 256 position bins per grid entry: profiled on
``diagram.compute`` (256 x 256 grid, depth 60, post-LN softmax, T = 512) the causal diagram took
13.2 s against 0.50 s bidirectional (26x); 6.3 s of it in the pair means, 2.2 s in the causal
``attention_stats`` and 1.4 s of table calls in the LayerNorm average (which re-evaluated the
same Y2 and Yx tables a second time). With this module, same run against the code before it:
causal 2.7 s against 8.0 s before, bidirectional 0.24 s (11x, from 36x on that loaded run);
what is left is the per-position work itself (pair sums ~45%, tables ~25%, LayerNorm factor
~17%). Within 2x would need the position averages themselves tabulated per (T, d_head,
heads): Y2 in v, Yx in (v, rho) and the LayerNorm pair means in (v, rho, a0/b).

Second step: the per-entry work runs on at most :data:`CHUNK` entries at a time. The
diagram hands ~1300 entries per block (up to 1830), and at that size the temporaries (the
(K, E, 16) coefficient gathers, 2.6 MB; the (J, q, E) virtual bins, 1.4 MB) were allocated
and returned to the system on every call: glibc trims the heap once more than twice its mmap
threshold lies free, so each new temporary page-faulted in again. Measured on 42 of the
diagram's pair sums (x10): 1.42 s in one pass, 0.67 s in chunks of 256, 0.66 s of 512, 1.19 s
of 1024; the one-pass code with ``MALLOC_TRIM_THRESHOLD_`` raised took 0.52 s, so the page
faults, not the arithmetic, were most of it (the gathers went from 0.47 s to 0.07 s). Chunks
change no arithmetic per entry (each entry is independent). Also: the pair sums' temporaries
are reused in place (8% of them), Yx sums its cell polynomial as one matmul
(:func:`_powers`, 5% of the diagram) and :func:`causal_grid` caches the positions.
Same run, 256 x 256, depth 60: causal 2.40 s -> 1.50 s against 0.22 s bidirectional (10.7x ->
6.7x). Profiled then: pair sums 33%, Y2/Yx tables 28%, LayerNorm factor 18%, the rest small
-array overhead of 420 block calls. The per-position tables alone (11 positions x 3 tables per
entry) cost ~3x the whole bidirectional diagram, so 2x needs the position averages tabulated
(first paragraph). A probe of that, measured: the LayerNorm pair mean P0 as a bicubic in
(log v, log1p(k T) / log1p(1e4 T)), k = a0/b, has largest relative errors 6e-5 / 4e-6 / 2e-7
at spacings (0.1, 1/40) / (0.05, 1/80) / (0.025, 1/160) (fourth order; a linear coordinate in
k/(1+k) erred by O(1) at small k, where (k + Y2_t)^-1/2 turns over at k ~ 1/t); P1 adds the
rho axis on top, ~3e6 nodes at that spacing.

Two changes of the first step, outputs unchanged to float roundoff or within a stated bound:

* :func:`node_tables` / :func:`ln_nodes` evaluate every position's table in one pass. The
  tables of all T share their grid (:mod:`.rem_tables`, :func:`.fluct.ln_factor_table`), so
  one cell lookup serves all positions and the coefficients are gathered as one row per
  entry; the arithmetic per element is that of the single-table evaluators (bit for bit;
  since the second step Yx sums its cell polynomial by :func:`_powers`, and since the
  third step Y2 takes its logistic as ``1 / (1 + exp(-x))``, equal to roundoff).
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
  :func:`.fluct.causal_pair_means`. Segments with at most Q bins are summed bin by bin
  (since the third step, the leading run of them as lone bins, without padding).

Third step (outputs unchanged to roundoff). Profiled first (cProfile, the benchmark's
``diagram.compute``, 256 x 256, depth 60, post-LN softmax T 512): 2.31 s, of it the pair sums
0.78 s, the node tables 0.73 s (Y2 0.29 s, Yx 0.37 s), the LayerNorm factor 0.43 s; the diagram
hands a block 1830 entries at most, 541k entry-layers in all, and no two of them share
(v, rho, a0/b) (532k distinct), so deduplicating across the grid has nothing to remove.
Timed on one block call of 1830 entries (ms, before -> after, old and new alternated):

* pair sums 1.78 -> 1.33-1.38: a segment with at most Q bins was padded to Q virtual points
  with zero weight; at T = 512 the first five segments hold 16 bins, so 44 of 132 exponentials
  per entry were of padding. The leading run of such segments now goes as lone bins (each its
  own group for the sums over later positions: 88 points); the later-groups sum is one
  product with a triangular matrix (``np.cumsum`` along axis 0 of the (G, E) group sums
  took 22 us per chunk, the product 3 us).
* Y2 at the nodes 0.63 -> 0.39 (node tables 1.25 -> 1.10): the logistic as
  ``1 / (1 + exp(-x))`` (roundoff, 3e-15 relative) instead of ``exp(-logaddexp(0, -x))``,
  whose logaddexp cost 15 ns per element.

Tried and dropped: the LayerNorm factor's bicubic summed by :func:`_powers` and an einsum
(235 us per chunk against 170 us for Horner's rule; the stacking of the powers costs more
than the passes it saves), the pair sums' groups as dense (G, P) weight products or
``np.add.reduceat`` (slower than the per-segment products at these sizes). Same run, the
benchmark's diagram, best of 3 with the code before this step swapped in alternately
(a loaded 2-core machine, load average ~3.5): bidirectional 0.23 s, causal 1.62-1.65 s before
and 1.38-1.50 s after, ratio 7.1 -> 6.1-6.5 (two runs). The outputs: on 72 causal specs (T 2,
3, 16, 64, 512, 4096; 12, 4 and 1 heads; pre- and post-LN; softmax and uniform) over beta
1e-3..50, alpha 0.1..10 and rho0 0..1, 20 predict trajectories and the diagram at 64 x 64
(depth 20, with rho_L) and 256 x 256 (depth 60), the largest change is 4.8e-15, NaN and
infinite entries the same.

What remains, and why 2x is not reached this way: per 384-entry chunk, the pair sums ~280 us,
the LayerNorm factor 170 us, Yx 130 us and Y2 ~80 us at the nodes, against ~130 us for the
whole bidirectional block per chunk; within 2x the causal block may spend ~260 us per chunk
on everything, less than the three node tables alone (~380 us). Every per-node table is a gather of
its cell coefficients and a polynomial, with numpy's fixed cost per call on arrays of a few
thousand elements, so no rearrangement of the per-node work gets there: it needs the position
averages tabulated (first and second paragraphs), with O(1) lookups per entry. The attention
averages are cheap to tabulate (Y2 in v, Yx in (v, rho)), but the LayerNorm average also needs
P1 in (v, rho, a0/b), a three-dimensional table: at the probe's accuracy (P0 to 2e-7 at
spacing (0.025, 1/160), where 1e-6 on the outputs after 60 layers wants ~1e-8 per layer)
that is ~3e6 nodes, each a full per-position evaluation (~2 us), so
seconds to build and ~1.5 GB as tricubic coefficients; not within the in-memory build budget.

The position averages are now tabulated (:mod:`.causal`, fourth step); this per-position path
builds those tables, serves the entries off them and stays the reference they are tested
against.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import fluct, rem_tables

#: virtual bins per segment of :func:`pair_means` (Chebyshev points in lam)
VIRTUAL = 12
#: entries per pass of the per-entry work (:func:`node_tables`, :func:`ln_nodes`,
#: :func:`pair_means`): bounds each temporary to ~0.5 MB (module docstring, second step;
#: 384 and 512 measured alike, 256 and 1024 slower)
CHUNK = 384
#: largest exponent |a| (a log-ratio of adjacent nodes' values, or a sum of two) summed on
#: virtual bins; larger ones take the exact bin sums
EXP_BOUND = 2.0


#: number of query positions sampled (log-spaced) for causal statistics
CAUSAL_POSITIONS = 12


@dataclass(frozen=True, kw_only=True)
class CausalGrid:
    """The query positions a causal layer is averaged over (:func:`causal_grid`), read-only:
    ``nodes`` (log-spaced t, the number of visible keys), ``weights`` (the share of the T
    positions each node stands for), ``pair`` (the pair bracket of
    :func:`causal_pair_weights` at the nodes) and ``inv_cross`` (``E_pairs[1/b]``)."""

    nodes: np.ndarray
    weights: np.ndarray
    pair: np.ndarray
    inv_cross: float


@functools.lru_cache(maxsize=64)
def causal_grid(T: int, k: int = CAUSAL_POSITIONS) -> CausalGrid:
    """The positions of :func:`.attention.causal_position_nodes` with the pair weights of
    :func:`causal_pair_weights`, read-only and cached per (T, k): a causal block asked for
    them three times per call (geomspace, unique, a cumsum over T): 0.19 s of the causal
    diagram's 4.2 s under cProfile (~4%)."""
    nodes = np.unique(np.round(np.geomspace(1, T, min(k, T))).astype(int)).astype(float)
    edges = np.concatenate([[0.5], 0.5 * (nodes[1:] + nodes[:-1]), [T + 0.5]])
    weights = np.diff(edges) / T
    pair, inv_cross = causal_pair_weights(T, nodes)
    for a in (nodes, weights, pair):
        a.setflags(write=False)
    return CausalGrid(nodes=nodes, weights=weights, pair=pair, inv_cross=inv_cross)


def causal_pair_weights(T: int, nodes: np.ndarray) -> tuple[np.ndarray, float]:
    """Causal cross term (docs/theory.md §2.4 causal). Rows a < b share the first a keys; by key
    exchangeability row b puts mass a/b on them in expectation, so (neglecting the correlation
    of that mass with its shape) ``E sum_c A_ac A_bc = (a/b) Yx(N=a)``. Averaged over pairs:
    ``Yx_causal = sum_a (1/T) [2 a S(a) / (T-1)] Yx(a)`` with ``S(a) = sum_{b>a} 1/b``.
    Returns the bracket at the nodes (multiplying each node's position share) and
    ``E_pairs[1/b] = 2 (T - H_T) / (T (T-1))`` (uniform attention: Yx = 1/b)."""
    harmonic = np.cumsum(1.0 / np.arange(1, T + 1))
    S = harmonic[-1] - harmonic[nodes.astype(int) - 1]
    return 2.0 * nodes * S / (T - 1), float(2.0 * (T - harmonic[-1]) / (T * (T - 1)))


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


def _powers(dx, dy):
    """``dx^a dy^b`` for a, b = 3..0 (highest first, the order of the bicubic coefficients),
    flattened to the last axis (16). The bicubic cell polynomials are summed as one product
    with these rather than by Horner's rule: one matmul or einsum instead of 32 array passes
    (a (384, 16, 11) chunk: 75 us against 136 us, measured); the sums differ from Horner's
    by roundoff (1e-16 relative; :func:`node_tables` is tested against the single tables at
    1e-13)."""
    px = np.stack([dx**3, dx * dx, dx, np.ones_like(dx)], axis=-1)
    py = np.stack([dy**3, dy * dy, dy, np.ones_like(dy)], axis=-1)
    shape = np.broadcast_shapes(np.shape(dx), np.shape(dy))
    return (px[..., :, None] * py[..., None, :]).reshape(*shape, 16)


def _y2_nodes(v, ts, d_head):
    """Y2 of rows of t keys for every t in ``ts`` (all > 1) at the flat variances v: (K, E).
    The arithmetic of :func:`.rem_tables._table1d`'s evaluator but for the logistic function,
    taken as ``1 / (1 + exp(-x))`` rather than :func:`.rem_tables._expit`'s ``exp(-logaddexp(0,
    -x))``: equal to roundoff (3e-15 relative, measured), and logaddexp was a third of this
    function's time (47 of 150 us per chunk of 384 entries)."""
    tabs, coef, y0, a_inf, p0, dp = _y2_stack(tuple(ts), d_head)
    lv = tabs[0].parts["lv"]
    power = tabs[0].parts["power"]
    i, d = rem_tables.grid_cell(lv, np.log(np.clip(v, np.exp(lv[0]), None)))
    c = coef[:, :, i]
    with np.errstate(over="ignore"):  # exp(-x) -> inf gives 0, the logistic's limit
        out = 1.0 / (1.0 + np.exp(-(((c[0] * d + c[1]) * d + c[2]) * d + c[3])))
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
    """Yx of rows of t keys at (v, rho) given their Y2 (:func:`_y2_nodes`): (K, E). The
    arithmetic of :func:`.rem_tables._table2d`'s evaluator, its cell polynomial summed by
    :func:`_powers` (equal to roundoff)."""
    tabs, coef = _yx_stack(tuple(ts), d_head)
    parts = tabs[0].parts
    lv, vmin, vmax = parts["lv"], parts["vmin"], parts["vmax"]
    vc = np.clip(v, vmin, vmax)
    (i, dx), (j, dy) = (rem_tables.grid_cell(lv, np.log(vc)),
                        rem_tables.grid_cell(rem_tables.XI_NODES, rem_tables.xi_of_rho(vc, rho)))
    g = np.take(coef, i * (rem_tables.XI_NODES.size - 1) + j, axis=0, mode="clip")  # (E,4,4,K)
    out = np.matmul(_powers(dx, dy)[:, None, :], g.reshape(v.size, 16, -1))[:, 0]
    inv = 1.0 / np.asarray(ts, dtype=np.float64)[:, None]
    out = inv + out.T * (y2 - inv)
    high = v > vmax * (1 + 1e-12)
    if high.any():
        out[:, high] = np.stack([t(v[high], rho[high]) for t in tabs])
    return out


def node_tables(v, rho, nodes, d_head):
    """``(Y2_t, Yx_t)`` at every node t (axis 0) for the flat row variances ``v`` and cosines
    ``rho`` (``rho`` clipped to [0, 1] as the tables do); t = 1 gives 1 (one visible key)."""
    v = np.asarray(v, dtype=np.float64).ravel()
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0).ravel()
    k = np.asarray(nodes)
    y2, yx = np.ones((k.size, v.size)), np.ones((k.size, v.size))
    big = [int(t) for t in k if t > 1]
    if big and v.size:
        sel = np.flatnonzero(k > 1)
        for lo in range(0, v.size, CHUNK):
            part = slice(lo, lo + CHUNK)
            y2s = _y2_nodes(v[part], big, d_head)
            y2[sel, part] = y2s
            yx[sel, part] = _yx_nodes(v[part], rho[part], big, d_head, y2s)
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
    base = np.arange(len(big))[:, None] * cells
    for lo in range(0, v.size, CHUNK):
        part = slice(lo, lo + CHUNK)
        lv = np.clip(np.log(np.maximum(v[part], 1e-300)), fluct.LOGV_NODES[0], fluct.LOGV_NODES[-1])
        kap = np.clip(kappa[sel, part], 0.0, 1.0)
        i, dx = rem_tables.grid_cell(fluct.LOGV_NODES, lv)
        j, dy = rem_tables.grid_cell(fluct.KAPPA_NODES, kap)
        g = np.take(coef, base + i * (fluct.KAPPA_NODES.size - 1) + j, axis=0,
                    mode="clip")                                     # (K, E, 4, 4)
        res = 0.0
        for a in range(4):
            ck = g[:, :, a]
            res = res * dx + ((ck[..., 0] * dy + ck[..., 1]) * dy + ck[..., 2]) * dy + ck[..., 3]
        out[sel, part] = np.maximum(res, 1.0)
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
    """The points of :func:`pair_means` (module docstring). The leading segments between
    adjacent nodes with at most q bins are summed bin by bin, each bin its own point
    (``b*``: segment ``bseg``, exact ``blam``); every later segment is one group of q points
    (``lam``, (J', q)), Chebyshev in lam, or its bins padded with zero weight where it has
    at most q. Weights per point: ``wa`` (bin counts n), ``wc`` (n/g), ``wd`` (n g), ``we``
    (n(n-1)/2); ``pair`` (J', q, q) for the pairs inside a group, ``sum_{k<k'} n_k g_k
    f(lam_k) n_k'/g_k' h(lam_k')``; ``upper`` sums the later groups (a lone bin is a group)."""
    nd = np.asarray(nodes, dtype=np.float64)
    g, n = fluct.position_bins(T)
    idx = np.interp(np.log(g), np.log(nd), np.arange(nd.size, dtype=np.float64))
    seg = np.minimum(np.floor(idx).astype(int), nd.size - 2)
    lam = idx - seg
    J = nd.size - 1
    counts = np.bincount(seg, minlength=J)
    first = int(np.argmax(counts > q)) if (counts > q).any() else J  # the leading short run
    lone = seg < first
    out = {"first": first, "bseg": seg[lone], "blam": lam[lone], "bwa": n[lone],
           "bwc": n[lone] / g[lone], "bwd": n[lone] * g[lone],
           "bwe": 0.5 * n[lone] * (n[lone] - 1)}
    out.update({k: np.zeros((J - first, q)) for k in ("lam", "wa", "wc", "wd", "we")})
    out["pair"] = np.zeros((J - first, q, q))
    for s in range(first, J):
        sel = seg == s
        ls, ns, gs = lam[sel], n[sel], g[sel]
        if ls.size <= q:  # bin by bin
            x, basis = np.pad(ls, (0, q - ls.size)), np.eye(ls.size, q)
        else:
            x, basis = _cheb_basis(ls, ls.min(), ls.max(), q)
        out["lam"][s - first] = x
        for key, w in (("wa", ns), ("wc", ns / gs), ("wd", ns * gs), ("we", 0.5 * ns * (ns - 1))):
            out[key][s - first] = w @ basis
        upper = np.triu(np.outer(ns * gs, ns / gs), 1)  # pairs k < k' (bins in order)
        out["pair"][s - first] = basis.T @ upper @ basis
    groups = int(lone.sum()) + J - first
    out["upper"] = np.triu(np.ones((groups, groups)), 1)
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
    p0, p1 = np.empty(m2.shape[1]), np.empty(m2.shape[1])
    for lo in range(0, m2.shape[1], CHUNK):
        part = slice(lo, lo + CHUNK)
        p0[part], p1[part] = _pair_means_flat(nodes, m2[:, part], x2[:, part], T, pl)
    return p0.reshape(shape), p1.reshape(shape)


def _pair_means_flat(nodes, m2, x2, T, pl):
    """:func:`pair_means` of flat (K, E) node values."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lm, lx = np.log(m2), np.log(x2)
        dm, dx = lm[1:] - lm[:-1], lx[1:] - lx[:-1]
        dx += dm                                                  # now the exponent of x m
        big = np.maximum(np.abs(2 * dm), np.maximum(np.abs(dx), np.abs(dx + dm)))
        ok = big.max(axis=0) <= EXP_BOUND                         # False for NaN as well
        lx += lm                                                  # log(x m)
        if not ok.all():
            lm, lx, dm, dx = lm[:, ok], lx[:, ok], dm[:, ok], dx[:, ok]
        s0, bseg, blam = pl["first"], pl["bseg"], pl["blam"][:, None]
        mb = blam * dm[bseg]                                      # lone bins (B, E)
        mb += lm[bseg]
        np.exp(mb, out=mb)
        xb = blam * dx[bseg]
        xb += lx[bseg]
        np.exp(xb, out=xb)
        J, q = pl["lam"].shape
        lam = pl["lam"][:, :, None]
        mv = lam * dm[s0:, None]                                  # groups (J', q, E)
        mv += lm[s0:-1, None]
        np.exp(mv, out=mv)
        xm = lam * dx[s0:, None]
        xm += lx[s0:-1, None]
        np.exp(xm, out=xm)
        E = mv.shape[2]
        flat_m, flat_xm = mv.reshape(J * q, E), xm.reshape(J * q, E)
        s1 = pl["wa"].ravel() @ flat_m + pl["bwa"] @ mb
        c = np.concatenate([pl["bwc"][:, None] * mb,
                            np.matmul(pl["wc"][:, None, :], mv)[:, 0]])   # (G, E)
        d = np.concatenate([pl["bwd"][:, None] * xb,
                            np.matmul(pl["wd"][:, None, :], xm)[:, 0]])
        w = np.einsum("ie,ie->e", flat_xm, np.matmul(pl["pair"], mv).reshape(J * q, E))
        flat_xm *= flat_m                                         # x m^2
        xb *= mb
        e = pl["we"].ravel() @ flat_xm + pl["bwe"] @ xb
        flat_m *= flat_m                                          # m^2
        mb *= mb
        s2 = pl["wa"].ravel() @ flat_m + pl["bwa"] @ mb
        tail = pl["upper"] @ c                                    # later groups only
        pairs = float(T) * (T - 1)
        p0 = np.empty(m2.shape[1])
        p1 = np.empty(m2.shape[1])
        p0[ok] = (s1 * s1 - s2) / pairs
        p1[ok] = 2.0 * (np.einsum("je,je->e", d, tail) + w + e) / pairs
    if not ok.all():
        e0, e1 = fluct.causal_pair_means(nodes, m2[:, ~ok], x2[:, ~ok], T)
        p0[~ok], p1[~ok] = e0, e1
    return p0, p1
