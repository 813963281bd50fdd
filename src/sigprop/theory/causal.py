"""The causal block's position averages, tabulated (docs/theory.md §2.4 causal, :mod:`.fluct`
causal rows). A causal layer averages REM statistics over the query positions of
:func:`.causal_positions.causal_grid`, each a row of t keys with its own tables;
:mod:`.causal_positions` evaluates them per position (its docstring: the first three steps of
making that fast, and why a 2x bound needed the averages themselves tabulated). This module
holds those tables and the records of a layer's statistics that the LayerNorm average of the
same block reuses (:class:`NodeTables`, :class:`TabulatedNodes`).

Fourth step: the position averages tabulated (:data:`TABULATED`; the per-position path of
:mod:`.causal_positions` stays for entries off the tables and as the reference). Per (T,
d_head[, heads]), built on first use from the per-position path's own values, cached in memory
(lru) and on disk (the node values; the splines are refitted on load):

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
4.4x where they are first built."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import rem_tables
from .causal_positions import causal_grid, ln_nodes, node_tables, pair_means

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
    """The attention's node tables and position averages of :func:`.attention.attention_stats`
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
