"""The causal block's per-position work, vectorised over the query positions (docs/theory.md
§2.4 causal, :mod:`.fluct` causal rows).

A causal layer averages REM statistics over the :func:`.blocks.causal_position_nodes`
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

Fourth step: the position averages tabulated (:data:`TABULATED`; the per-position path above
stays for entries off the tables and as the reference). Per (T, d_head[, heads]), built on
first use from the per-position path's own values, cached in memory (lru) and on disk (the
node values; the splines are refitted on load):

* the attention's averages, Y2 in ``u = log(v + V0)`` (1-D, spacing 0.05) and Yx in (u, xi)
  (41 x 161 nodes), xi the Yx tables' rho coordinate taken at max(v, 1e-2) as they do;
* the LayerNorm pair means at ``a0 + b = 1`` (they scale as 1 / (a0 + b)): log P0 in (u, z)
  (spacings 0.1 x 0.025) and ``G = P1 / (P0 Yx)`` in (u, xi, z) (0.2 x 1/20 x 0.25), with
  ``z = log((b + T a0) / (a0 + b))`` in [0, log T]: ~ (T-1) a0/b for small a0/b, ~ log(T
  a0/b) in between and analytic in b / (a0 + b) at the other end, so a0 = 0 and b = 0 both
  lie on the grid. Dividing by P0 Yx takes out most of P1's variation (the common LayerNorm
  factor r and the Yx step in rho): at the same nodes G interpolated to 3e-5 where P1
  itself erred by 1.6e-4 and log(P1) by 3e-4. Measured against the per-position values
  first: the output error was dominated by P0 in z (final cosines through 24 layers moved
  1.1e-6 at z spacing 0.1, 8.5e-8 at 0.05, 6e-9 at 0.025), so P0 got the fine z spacing.

``u`` puts v = 0 on the grid (the uniform limit; every average is analytic in v there) and
spans v to :data:`VMAX` = 8886, inside the REM tables' grid (to 1e4); a first version reached
1e4 + and took 300 s to build, because the top nodes went through the exact Yx quadrature of
the per-position path. Off the tables (v > VMAX or not finite, a0 < 0, b < 0) entries take the
per-position path, the LayerNorm reusing the attention's node tables for them. Uniform
attention is not tabulated (its pair sums alone are cheap), nor the ``full`` statistics
(entropy, wmax) that predict reports.

Measured (interpolation against the per-position path, 4000-20000 random entries over the
tables' whole domain, T 2..4096): Y2 and Yx averages <= 6.7e-6 relative, P0 <= 1e-4 and P1
<= 7e-5 for T <= 512 (at v ~ 1e3-1e4), P1 up to 8.8e-4 at T = 4096 where rho < 0.05 and P1 <
1e-3 P0, so the cosine ``c0 P0 + b P1`` moves by < 1e-6. One post-LN layer, 20000 random
(beta 1e-3..50, alpha 0.1..10, rho 0..1) states: the output cosine within 2e-7 for beta <=
3 and 9.7e-6 at worst (T 128, 1 head, beta 48, v near VMAX). Outputs, against this code with
``TABULATED = False``: 72 causal specs (T 2, 3, 16, 64, 512, 4096; 12, 4 and 1 heads; pre-
and post-LN; softmax and uniform), 6 (beta 1e-3..50, alpha 0.1..10, rho0 0..1) each, predict
trajectories of 20 layers: largest change 1.9e-7 (pre-LN and uniform: none, predict takes the
per-position ``full`` statistics); diagrams (post-LN T 512 / 64 / 4096, pre-LN T 512, 64 x
64 at depth 20 with rho_L, and the benchmark's 256 x 256 at depth 60): alpha_crit and the
regimes identical, rho_L within 1.7e-8, the own point's rho_L within 7e-9. Against the torch
stack (tests/theory/test_causal.py): one causal post-LN layer without residual at three (T,
heads, beta, rho_in) points, within 0.012 of 6 seeds x 2 sequences, as the per-position path
(the two differ by < 1e-7 there).

Cost. Building costs 0.5 s per (T, d_head, heads) (44k G nodes, 40k P0 nodes through the
per-position path, ~6 us each; T = 512, d_head 64, 12 heads); loading from disk 0.1-0.3 s, the
splines refitted by :func:`.rem_tables.notaknot` (NumPy: scipy.interpolate alone took 0.3-0.8 s to
import). The G coefficients take 20 MB (T 512) to 27 MB (T 4096) in memory, so at most 4 sets
are kept. Evaluated, the causal block is one 1-D, three 2-D and one 3-D cell lookup per entry
against the bidirectional block's 1-D and two 2-D ones. The benchmark (``sigprop bench
causal_diagram``, 256 x 256, depth 60; its warm-up builds or loads the tables, so the timed
figure is warm): 1.14x (0.57 s against 0.50 s). Same runs, this code alternated with
``TABULATED = False``, best of 3 on the loaded 2-core machine: bidirectional 0.39-0.42 s,
causal 0.53-0.66 s with the tables and 3.2-3.5 s without, ratio 1.24-1.58 against 6.9-8.4.
Cold (the first causal diagram of a process, bidirectional warm): 2.7x with the tables on disk,
4.4x where they are first built.
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
    """The positions of :func:`.blocks.causal_position_nodes` with the pair weights of
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


# ------------------------------------------------------------------ position-averaged tables
#: use the position-averaged tables (module docstring, fourth step); False restores the
#: per-position path everywhere (the reference the tables are tested against)
TABULATED = True
#: the tables' coordinate in v is ``u = log(v + V0)``: v = 0 lies on the grid (the uniform
#: limit, where every average is analytic in v)
V0 = 1e-3
#: the tables span u in [log V0, log V0 + U_SPAN] (every spacing below divides it), v up to
#: :data:`VMAX` = 8886, inside the REM tables' own grid (to 1e4); larger v take the
#: per-position path
U_SPAN = 16.0
VMAX = V0 * np.expm1(U_SPAN)
#: spacings: u of the attention's Y2 average (1-D), u and the LayerNorm coordinate z of the
#: 2-D tables (Yx average in (u, xi), P0 in (u, z)), and of the 3-D ratio G in (u, xi, z)
H_U1, H_U2, H_Z2, H_U3, H_Z3 = 0.05, 0.1, 0.025, 0.2, 0.25
#: nodes in xi (:func:`.rem_tables.xi_of_rho`, the Yx tables' coordinate for rho) of the 2-D and
#: 3-D tables
N_XI2, N_XI3 = 41, 21
_TAB_VERSION = "ctab-v2"  # bump when the nodes or what is tabulated change (node values only)


def _ugrid(h):
    return np.log(V0) + np.linspace(0.0, U_SPAN, int(round(U_SPAN / h)) + 1)


def _zgrid(T, h):
    top = np.log(T)
    return np.linspace(0.0, top, max(4, int(np.ceil(top / h)) + 1))


def _v_of_u(u):
    return np.maximum(np.exp(u) - V0, 0.0)


def _xi_of(v, rho):
    """The Yx tables' rho coordinate; below v = 1e-2 they hold their ratio at v = 1e-2, so
    the position averages depend on rho only through xi(max(v, 1e-2), rho)."""
    return rem_tables.xi_of_rho(np.maximum(v, 1e-2), rho)


def _z_of(a0, b, T):
    """``log((b + T a0) / (a0 + b))`` in [0, log T]: ~ (T - 1) a0 / b where a0 << b / T, ~
    log(T a0 / b) in between, and log(T - (T - 1) s), s = b / (a0 + b), where a0 >> b: the
    LayerNorm averages are smooth in z over the whole range of a0 / b, 0 and inf included."""
    return np.log((b + T * a0) / (a0 + b))


def _ln_exact(v, rho, a0, b, T, d_head, heads, y2n=None, yxn=None):
    """The per-position LayerNorm pair means ``(P0, P1)`` of :func:`.blocks._ln_fluct_cos_causal`
    (softmax rows) for flat entries; ``y2n``, ``yxn``: the node tables if already known."""

    nodes = causal_grid(int(T)).nodes
    if y2n is None:
        y2n, yxn = node_tables(v, rho, nodes, d_head)
    n_t = a0 + b * y2n
    ok = n_t > 0
    safe = np.where(ok, n_t, 1.0)
    r = ln_nodes(v, np.clip(a0 / safe, 0.0, 1.0), nodes, d_head, heads)
    m = np.where(ok, np.sqrt(r / safe), np.nan)
    return pair_means(nodes, m, yxn, T)


@dataclass(frozen=True, kw_only=True)
class _Entries:
    """Flat entries ``(v, rho)`` of a causal attention layer whose statistics a record
    holds; the LayerNorm average of the same block reuses them where its own entries are
    these (:meth:`covers`)."""

    v: np.ndarray
    rho: np.ndarray

    def covers(self, v, rho) -> bool:
        """Whether the record holds exactly the flat entries ``(v, rho)``."""
        return (self.v.shape == v.shape and np.array_equal(self.v, v)
                and np.array_equal(self.rho, rho))


@dataclass(frozen=True, kw_only=True)
class NodeTables(_Entries):
    """A causal attention layer's per-position statistics (:func:`att_exact`): ``y2``,
    ``yx`` (nodes x entries) of rows of t keys at each node t of :func:`causal_grid`, and
    their position averages ``y2_mean``, ``yx_mean`` (per entry)."""

    y2: np.ndarray
    yx: np.ndarray
    y2_mean: np.ndarray
    yx_mean: np.ndarray


@dataclass(frozen=True, kw_only=True)
class TabulatedNodes(_Entries):
    """A causal attention layer's statistics from the position averages' tables
    (:func:`tabulated_attention`): ``yx_mean`` (per entry), and the entries ``off`` the
    tables (indices), which went through the per-position path: their ``exact`` node
    tables (None when no entry is off)."""

    yx_mean: np.ndarray
    off: np.ndarray
    exact: NodeTables | None


def att_exact(v, rho, T, d_head) -> NodeTables:
    """The attention's node tables and position averages of :func:`.blocks.attention_stats`
    (causal, per position) for flat entries."""

    grid = causal_grid(int(T))
    y2n, yxn = node_tables(v, rho, grid.nodes, d_head)
    acc2, accx = 0.0, 0.0
    for i, (w, pw) in enumerate(zip(grid.weights, grid.pair, strict=True)):  # summed in order
        acc2 = acc2 + w * y2n[i]
        accx = accx + (w * pw) * yxn[i]
    return NodeTables(v=v, rho=rho, y2=y2n, yx=yxn, y2_mean=acc2, yx_mean=accx)


def _spline_axes(vals, grids):
    """Not-a-knot cubic spline coefficients of ``vals`` on the tensor grid ``grids`` as one row
    of 4^n polynomial coefficients per cell (cells in C order, powers highest first, the
    first axis's power outermost)."""
    c, n = vals, len(grids)
    for k, g in enumerate(grids):  # each pass prepends (power, cell) of axis k
        c = rem_tables.notaknot(g, c, 2 * k)
    # axes now (p_{n-1}, c_{n-1}, ..., p_0, c_0): cells first, then powers, axis 0 outermost
    cells = [2 * (n - 1 - k) + 1 for k in range(n)]
    powers = [2 * (n - 1 - k) for k in range(n)]
    return np.ascontiguousarray(c.transpose(cells + powers)).reshape(-1, 4**n)


@functools.lru_cache(maxsize=16)
def _att_tables(T: int, d_head):
    """The attention's position averages, tabulated: Y2 in u (1-D) and Yx in (u, xi)."""
    u1, u2, xi2 = _ugrid(H_U1), _ugrid(H_U2), np.linspace(0.0, 1.0, N_XI2)

    def build():
        y2 = att_exact(_v_of_u(u1), np.zeros_like(u1), T, d_head).y2_mean
        v = np.broadcast_to(_v_of_u(u2)[:, None], (u2.size, xi2.size))
        rho = rem_tables.rho_of_xi(np.maximum(v, 1e-2), xi2[None, :])
        yx = att_exact(v.ravel(), rho.ravel(), T, d_head).yx_mean
        return {"y2": y2, "yx": yx.reshape(v.shape)}

    z = rem_tables.disk_cached(f"{_TAB_VERSION}-att-T{T}-d{d_head}-U{U_SPAN:g}-h{H_U1:g}-"
                                f"{H_U2:g}-{N_XI2}", build)
    return {"u1": u1, "c1": _spline_axes(z["y2"], [u1]), "u2": u2, "xi2": xi2,
            "c2": _spline_axes(z["yx"], [u2, xi2])}


@functools.lru_cache(maxsize=4)
def _ln_tables(T: int, d_head, heads: int):
    """The LayerNorm pair means, tabulated at a0 + b = 1: log P0 in (u, z) and
    G = P1 / (P0 Yx) in (u, xi, z), Yx the attention's position average."""
    u2, z2 = _ugrid(H_U2), _zgrid(T, H_Z2)
    u3, xi3, z3 = _ugrid(H_U3), np.linspace(0.0, 1.0, N_XI3), _zgrid(T, H_Z3)

    def build():
        a0 = (np.exp(z2) - 1.0) / (T - 1)
        v, a = np.broadcast_arrays(_v_of_u(u2)[:, None], a0[None, :])
        p0 = _ln_exact(v.ravel(), np.zeros(v.size), a.ravel(), 1.0 - a.ravel(), T, d_head,
                       heads)[0]
        v, xi, a = np.broadcast_arrays(_v_of_u(u3)[:, None, None], xi3[None, :, None],
                                       ((np.exp(z3) - 1.0) / (T - 1))[None, None, :])
        rho = rem_tables.rho_of_xi(np.maximum(v, 1e-2), xi)
        vf, rf, af = v.ravel(), rho.ravel(), a.ravel()
        att = att_exact(vf, rf, T, d_head)
        q0, q1 = _ln_exact(vf, rf, af, 1.0 - af, T, d_head, heads, att.y2, att.yx)
        return {"p0": np.log(p0).reshape(u2.size, z2.size),
                "g": (q1 / (q0 * att.yx_mean)).reshape(v.shape)}

    z = rem_tables.disk_cached(f"{_TAB_VERSION}-ln-T{T}-d{d_head}-h{heads}-U{U_SPAN:g}-"
                                f"{H_U2:g}-{H_Z2:g}-{H_U3:g}-{N_XI3}-{H_Z3:g}", build)
    return {"u2": u2, "z2": z2, "c0": _spline_axes(z["p0"], [u2, z2]),
            "u3": u3, "xi3": xi3, "z3": z3, "cg": _spline_axes(z["g"], [u3, xi3, z3])}


def _horner(g, ds):
    """Sum the gathered cell polynomials ``g`` (E, 4^n) at the offsets ``ds`` (n arrays of
    E; the first axis outermost), innermost axis first (Horner's rule per axis)."""
    out = g.reshape((g.shape[0],) + (4,) * len(ds))
    for d in ds[::-1]:
        d = d.reshape((-1,) + (1,) * (out.ndim - 2))
        out = ((out[..., 0] * d + out[..., 1]) * d + out[..., 2]) * d + out[..., 3]
    return out


def tabulated_attention(v, rho, T: int, d_head):
    """Position averages ``(Y2, Yx, ok)`` of a causal softmax layer from the tables, flat
    entries; ``ok`` False (values unset) where v is outside [0, :data:`VMAX`] or v or rho is
    not finite."""
    tab = _att_tables(int(T), d_head)
    ok = (v >= 0.0) & (v <= VMAX) & np.isfinite(rho)
    vs = np.where(ok, v, 0.0)
    u = np.log(vs + V0)
    i1, d1 = rem_tables.grid_cell(tab["u1"], u)
    y2 = _horner(tab["c1"][i1], (d1,))
    i2, d2 = rem_tables.grid_cell(tab["u2"], u)
    j2, e2 = rem_tables.grid_cell(tab["xi2"], _xi_of(vs, rho))
    yx = _horner(tab["c2"][i2 * (tab["xi2"].size - 1) + j2], (d2, e2))
    return y2, yx, ok


def tabulated_ln(v, rho, a0, b, yx, T: int, d_head, heads):
    """The LayerNorm pair means ``(P0, P1, ok)`` of :func:`_ln_exact` from the tables, flat
    entries, ``yx`` the attention's Yx average at (v, rho) (:func:`tabulated_attention`);
    ``ok`` False (values unset) outside the tables (v as there, a0 < 0, b < 0, a0 + b not
    positive or not finite)."""
    tab = _ln_tables(int(T), d_head, int(heads))
    s = a0 + b
    ok = ((v >= 0.0) & (v <= VMAX) & np.isfinite(rho) & (a0 >= 0.0) & (b >= 0.0) & (s > 0.0)
          & np.isfinite(s))
    vs, ss = np.where(ok, v, 0.0), np.where(ok, s, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(ok, _z_of(a0, b, T), 0.0)
    u = np.log(vs + V0)
    i2, d2 = rem_tables.grid_cell(tab["u2"], u)
    l2, e2 = rem_tables.grid_cell(tab["z2"], z)
    p0 = np.exp(_horner(tab["c0"][i2 * (tab["z2"].size - 1) + l2], (d2, e2))) / ss
    i3, d3 = rem_tables.grid_cell(tab["u3"], u)
    j3, x3 = rem_tables.grid_cell(tab["xi3"], _xi_of(vs, rho))
    l3, e3 = rem_tables.grid_cell(tab["z3"], z)
    cell = (i3 * (tab["xi3"].size - 1) + j3) * (tab["z3"].size - 1) + l3
    p1 = _horner(tab["cg"][cell], (d3, x3, e3)) * p0 * yx
    return p0, p1, ok


def ln_off_tables(v, rho, a0, b, p0, p1, ok, T: int, d_head, heads,
                  att: TabulatedNodes | None = None):
    """Fill ``p0``, ``p1`` (in place, returned) where ``ok`` is False with the per-position
    pair means (:func:`_ln_exact`). ``att``: the attention's statistics of the same flat v
    and rho, whose node tables of the entries it took through the per-position path are
    reused rather than evaluated again (beyond the tables' v the Yx tables are exact
    quadrature, ~1 ms per entry and node)."""

    bad = np.flatnonzero(~ok)
    nodes = causal_grid(int(T)).nodes
    y2n, yxn = np.empty((nodes.size, bad.size)), np.empty((nodes.size, bad.size))
    have = np.zeros(bad.size, bool)
    if att is not None and att.off.size:
        loc = np.full(v.size, -1)
        loc[att.off] = np.arange(att.off.size)
        at = loc[bad]
        have = at >= 0
        y2n[:, have], yxn[:, have] = att.exact.y2[:, at[have]], att.exact.yx[:, at[have]]
    if not have.all():
        rest = bad[~have]
        y2n[:, ~have], yxn[:, ~have] = node_tables(v[rest], rho[rest], nodes, d_head)
    p0[bad], p1[bad] = _ln_exact(v[bad], rho[bad], a0[bad], b[bad], T, d_head, heads, y2n, yxn)
    return p0, p1
