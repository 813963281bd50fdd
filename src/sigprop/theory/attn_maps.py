"""Heads whose map is not one softmax row (docs/theory.md §2.4.3, §2.4.7, §2.4.8): attention
sinks, sigmoid attention and differential attention, as the moments the block's attention map
takes (:func:`.blocks.attention_map`: ``y2`` = ``E sum_b w_ab^2``, ``yx`` = ``E sum_b w_ab
w_cb``, ``w2`` = ``E W_a^2``, ``wx`` = ``E W_a W_c`` with ``W_a = sum_b w_ab`` a row's mass).
NumPy float64, vectorised over any array of score stds and cosines.

**Sigmoid rows.** ``w_ab = sigmoid(s_ab - beta_n)``, ``beta_n = k log n - b0`` (the paper's
``b = -log n`` is ``k = 1, b0 = 0``). The scores ``sigma q_a . k_b / sqrt(d_head)`` have
queries and keys of ``d_head`` i.i.d. channels, each N(0, K) over the tokens (``K`` = 1 on
the diagonal, ``rho`` off it), so given the queries they are Gaussian with ``Cov(s_ab, s_cd
| q) = sigma^2 G_ac K_bd``, ``G_ac = q_a . q_c / d_head``. Every moment is then a sum of pair
terms ``F = E sigmoid(X - beta) sigmoid(Y - beta')`` (:func:`sigmoid_pair`, a 2-D
Gauss-Hermite sum), ``X, Y`` of stds ``sigma sqrt(G_aa)``, ``sigma sqrt(G_cc)``, averaged
over the queries' Gram (:func:`query_gram`): one row (n keys) has ``y2 = n E F(1)``, ``w2 =
n E F(1) + n (n-1) E F(rho)``; two rows sharing m keys, of n and n' keys, ``yx = m E F(r)``,
``wx = m E F(r) + (n n' - m) E F(rho r)`` with ``r = G_ac / sqrt(G_aa G_cc)``. ``d_head =
None``: ``G = K``, the scores jointly Gaussian with the REM's product covariance (§2.1).
Causal rows: the moments at the causal nodes of :mod:`.causal_positions` (bias ``k log t``
at the node t), pairs of rows as independent draws of two positions (the shorter row's
keys shared).

**Differential rows.** ``D = A1 - lambda A2`` with ``A1``, ``A2`` softmax rows of two
independent half-width score maps (``d_head / 2`` channels, the same score std); given the
tokens they are independent with mean ``1/n`` per key, so ``y2 = (1 + E lambda^2) Y2 - 2 E
lambda E[1/n]``, ``yx = (1 + E lambda^2) Yx - 2 E lambda E[1/n_long]`` (``Y2``, ``Yx`` the
REM tables at ``d_head / 2``; ``n_long`` the longer row of a causal pair) and every row
sums to ``1 - lambda``: ``w2 = wx = 1 - 2 E lambda + E lambda^2``.

Also here: value residual learning's mix and its stream cross term (§2.4.6, :class:`ValueMix`,
:func:`stream_cross`) and cross-attention over an encoder output (§2.8, :func:`cross_map`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit, roots_genlaguerre

from ..spec import SpecError
from . import rem, sink
from .attention import AttentionStats, attention_stats
from .causal_positions import causal_grid

__all__ = ["QueryGram", "diff_lambda_moments", "head_map_stats", "query_gram", "sigmoid_moments",
           "sigmoid_pair"]

#: Gauss-Hermite nodes per dimension of :func:`sigmoid_pair`
N_GH = 64
#: nodes of the chi^2 rules and of the normal of :func:`query_gram` (d_head finite; the
#: moments move by < 2e-4 relative from 4 to 20 nodes at d_head 8, < 1e-6 at 32)
N_CHI, N_U = 4, 4
#: points per chunk of :func:`sigmoid_pair` (temporaries ~ chunk x nodes floats)
_CHUNK = 1024


def _rule():
    x, w = hermegauss(N_GH)
    w = w / math.sqrt(2.0 * math.pi)
    ww = np.outer(w, w)
    keep = ww > 1e-17 * ww.max()
    z1, z2 = np.meshgrid(x, x, indexing="ij")
    return z1[keep], z2[keep], ww[keep]


_Z1, _Z2, _W = _rule()


def sigmoid_pair(sigma, r, beta1, beta2, sigma2=None):
    """``E sigmoid(X - beta1) sigmoid(Y - beta2)`` for ``(X, Y)`` zero-mean Gaussian of stds
    ``sigma`` and ``sigma2`` (default: ``sigma``), correlation ``r`` (clipped to [-1, 1]);
    broadcast over all arguments."""
    sigma2 = sigma if sigma2 is None else sigma2
    arrs = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64)
                                 for a in (sigma, r, beta1, beta2, sigma2)))
    shape, flat = arrs[0].shape, [a.ravel() for a in arrs]
    out = np.empty(flat[0].size)
    for i in range(0, out.size, _CHUNK):
        s, rr, b1, b2, s2 = (a[i:i + _CHUNK, None] for a in flat)
        rr = np.clip(rr, -1.0, 1.0)
        x = s * _Z1
        y = s2 * (rr * _Z1 + np.sqrt(1.0 - rr * rr) * _Z2)
        out[i:i + _CHUNK] = (expit(x - b1) * expit(y - b2)) @ _W
    return out.reshape(shape)


def _chi2_rule(k: int, n: int):
    """Nodes and weights (summing to 1) of ``chi^2_k / k``: generalised Gauss-Laguerre."""
    x, w = roots_genlaguerre(n, k / 2.0 - 1.0)
    return 2.0 * x / k, w / np.sum(w)


@dataclass(frozen=True, kw_only=True)
class QueryGram:
    """Quadrature of the normalised Gram of two queries at cosine ``rho``
    (:func:`query_gram`): ``gaa``, ``gcc``, ``gac`` and the weights ``w`` (summing to 1),
    each of shape ``rho.shape + (nodes,)``."""

    gaa: np.ndarray
    gcc: np.ndarray
    gac: np.ndarray
    w: np.ndarray


def query_gram(rho, d_head: int | None) -> QueryGram:
    """``(G_aa, G_cc, G_ac) = (|q_a|^2, |q_c|^2, q_a . q_c) / d_head`` of two queries whose
    ``d_head`` channels are i.i.d. N(0, [[1, rho], [rho, 1]]): ``q_c = rho q_a + sqrt(1 -
    rho^2) z``, so with ``A = |q_a|^2 ~ chi^2_d``, ``u = q_a . z / |q_a| ~ N(0, 1)`` and
    ``B = |z|^2 - u^2 ~ chi^2_(d-1)``, all independent (Bartlett), ``G_ac = rho A + sqrt(1 -
    rho^2) sqrt(A) u`` and ``G_cc = rho^2 A + 2 rho sqrt(1 - rho^2) sqrt(A) u + (1 - rho^2)
    (u^2 + B)`` (over d). ``d_head=None``: the one node ``(1, 1, rho)`` (d_head -> inf)."""
    rho = np.asarray(rho, dtype=np.float64)[..., None]
    if d_head is None:
        one = np.ones_like(rho)
        return QueryGram(gaa=one, gcc=one, gac=rho, w=one)
    d = int(d_head)
    a, wa = _chi2_rule(d, N_CHI)
    b, wb = _chi2_rule(d - 1, N_CHI) if d > 1 else (np.zeros(1), np.ones(1))
    u, wu = hermegauss(N_U)
    a, b, u = (x.ravel() for x in np.meshgrid(a, b * (d - 1.0) / d, u / math.sqrt(d),
                                                indexing="ij"))
    w = np.einsum("i,j,k->ijk", wa, wb, wu / np.sum(wu)).ravel()
    c = np.sqrt(1.0 - rho * rho)
    gac = rho * a + c * np.sqrt(a) * u
    gcc = rho * rho * a + 2.0 * rho * c * np.sqrt(a) * u + c * c * (u * u + b)
    return QueryGram(gaa=np.broadcast_to(a, gac.shape), gcc=gcc, gac=gac,
                     w=np.broadcast_to(w, gac.shape))


def sigmoid_moments(sigma_s, rho, T: int, bias, *, causal: bool = False,
                    d_head: int | None = None):
    """The row moments (:class:`~.sink.SinkStats`: ``y2, yx, w2, wx``, the same four a sink's
    map takes) of sigmoid rows (module docstring) with score std ``sigma_s`` on
    tokens at cosine ``rho`` (broadcast), ``bias = (k, b0)``: ``w = sigmoid(s + b0 - k log
    n)``, n the row's visible keys (T bidirectional, t at causal position t). ``d_head``:
    the scores are Gaussian given the queries, averaged over the queries' Gram
    (:func:`query_gram`); None: the scores Gaussian (``d_head -> inf``)."""
    k, b0 = (float(x) for x in bias)
    sig = np.asarray(sigma_s, dtype=np.float64)
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    sig, rho = np.broadcast_arrays(sig, rho)
    pts, inv = np.unique(np.stack([sig.ravel(), rho.ravel()], axis=-1), axis=0,
                         return_inverse=True)  # heads of one std: one evaluation
    if pts.shape[0] < sig.size:
        m = sigmoid_moments(pts[:, 0], pts[:, 1], T, bias, causal=causal, d_head=d_head)
        return sink.SinkStats(**{f: getattr(m, f)[inv.ravel()].reshape(sig.shape)
                                 for f in ("y2", "yx", "w2", "wx")})
    if causal:
        grid = causal_grid(int(T))
        t, wt = grid.nodes.astype(np.float64), grid.weights / np.sum(grid.weights)
    else:
        t, wt = np.array([float(T)]), np.array([1.0])
    beta = k * np.log(t) - b0
    g = query_gram(rho, d_head)  # (..., nodes)
    # one row: the score std sigma sqrt(G_aa), keys at correlation rho
    s1, r1 = (sig[..., None] * np.sqrt(g.gaa))[..., None], rho[..., None, None]
    f1 = np.sum(g.w[..., None] * sigmoid_pair(s1, 1.0, beta, beta), axis=-2)
    fr = np.sum(g.w[..., None] * sigmoid_pair(s1, r1, beta, beta), axis=-2)
    y2 = np.sum(wt * t * f1, axis=-1)
    w2 = np.sum(wt * (t * f1 + t * (t - 1.0) * fr), axis=-1)
    # two rows: one key at the queries' correlation G_ac / sqrt(G_aa G_cc), two keys rho times it
    sa = (sig[..., None] * np.sqrt(g.gaa))[..., None, None]
    sc = (sig[..., None] * np.sqrt(g.gcc))[..., None, None]
    rq = (g.gac / np.sqrt(g.gaa * g.gcc))[..., None, None]
    bi, bj = beta[:, None], beta[None, :]
    wg = g.w[..., None, None]
    fxr = np.sum(wg * sigmoid_pair(sa, rq, bi, bj, sc), axis=-3)
    fx2 = np.sum(wg * sigmoid_pair(sa, rq * rho[..., None, None, None], bi, bj, sc), axis=-3)
    m = np.minimum(t[:, None], t[None, :])  # the keys two rows share
    wij = wt[:, None] * wt[None, :]
    yx = np.sum(wij * m * fxr, axis=(-2, -1))
    wx = np.sum(wij * (m * fxr + (t[:, None] * t[None, :] - m) * fx2), axis=(-2, -1))
    return sink.SinkStats(y2=y2, yx=yx, w2=w2, wx=wx)


def diff_lambda_moments(lambda_init: float, lambda_std: float, d_half: int):
    """``(E lambda, E lambda^2)`` of ``lambda = exp(l1 . l2) - exp(l3 . l4) + lambda_init``,
    the four vectors of ``d_half`` entries N(0, lambda_std^2): the two exponentials have one
    law, so ``E lambda = lambda_init``; per entry ``E exp(u v) = (1 - s^4)^(-1/2)`` and ``E
    exp(2 u v) = (1 - 4 s^4)^(-1/2)``, so ``Var lambda = 2 [(1 - 4 s^4)^(-d/2) - (1 -
    s^4)^(-d)]`` (finite for ``s < 1/sqrt 2``)."""
    s4 = float(lambda_std) ** 4
    if 4.0 * s4 >= 1.0:
        raise SpecError("layers.diff_lambda", "lambda_std >= 1/sqrt 2: E lambda^2 is infinite")
    var = 2.0 * ((1.0 - 4.0 * s4) ** (-d_half / 2.0) - (1.0 - s4) ** (-float(d_half)))
    li = float(lambda_init)
    return li, li * li + max(var, 0.0)


def head_map_stats(bp, sig, rho, full: bool):
    """The block's attention statistics for heads with sinks (``bp.sink``), sigmoid rows
    (``bp.sigmoid_bias``) or differential rows (``bp.diff_lambda``): ``(for the map, to
    report)`` as :func:`.blocks.head_stats` returns them. The map takes each head's moments
    (module docstring; :func:`.sink.sink_stats`) averaged with the output shares
    ``bp.head_w``; the reported ipr, entropy, ... are plain head means of softmax rows at
    the same scores: a sink's renormalised rows (exact), sigmoid rows renormalised (``w /
    W``, close to the softmax while ``e^s << n``: ``sigmoid(s - log n) ~ e^s / n``), and a
    differential head's first map ``A1`` (at ``d_head / 2``)."""
    n = (np.size(bp.sink) if bp.sink is not None else
         np.size(bp.head_scale) if bp.head_scale is not None else
         np.size(bp.head_w) if bp.head_w is not None else 1)
    hs = np.ones(n) if bp.head_scale is None else np.asarray(bp.head_scale, dtype=np.float64)
    sg = np.asarray(sig, dtype=np.float64)[..., None] * hs
    rh = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)[..., None]
    d_rep = bp.d_head
    if bp.diff_lambda is not None and bp.d_head is not None:
        d_rep = bp.d_head // 2
    rep = attention_stats(sg, rh, bp.seq_len, d_head=d_rep, causal=bp.causal,
                          full=full)._replace(nodes=None)
    w = np.ones(n) if bp.head_w is None else np.asarray(bp.head_w, dtype=np.float64)
    w = np.broadcast_to(w, (n,)) / np.mean(w)

    def avg(x, weights):
        return None if x is None else np.mean(np.asarray(x) * weights, axis=-1)

    st = AttentionStats(*(avg(x, w) for x in rep))
    if bp.sink is not None:
        sk = sink.sink_stats(sg, rh, bp.sink, bp.seq_len, d_head=bp.d_head, causal=bp.causal)
        st = st._replace(y2=avg(sk.y2, w), yx=avg(sk.yx, w), w2=avg(sk.w2, w),
                         wx=avg(sk.wx, w))
    elif bp.sigmoid_bias is not None:
        sm = sigmoid_moments(sg, rh, bp.seq_len, bp.sigmoid_bias, causal=bp.causal,
                             d_head=bp.d_head)
        st = st._replace(y2=avg(sm.y2, w), yx=avg(sm.yx, w), w2=avg(sm.w2, w),
                         wx=avg(sm.wx, w))
    else:
        lam, lam2 = bp.diff_lambda
        mass2 = np.full(np.shape(st.y2), 1.0 - 2.0 * lam + lam2)
        st = st._replace(y2=(1.0 + lam2) * st.y2 - 2.0 * lam * st.inv_t,
                         yx=(1.0 + lam2) * st.yx - 2.0 * lam * st.inv_t_cross,
                         w2=mass2, wx=mass2)
    return st, AttentionStats(*(avg(x, 1.0) for x in rep))


@dataclass(frozen=True, kw_only=True)
class ValueMix:
    """A value-residual block's mix (§2.4.6): ``ls2`` = lambda_self^2, ``lf2`` =
    lambda_first^2, and the first block's value kernel ``(k1, c1)``."""

    ls2: float
    lf2: float
    k1: object
    c1: object


def value_first(bp) -> ValueMix | None:
    """The :class:`ValueMix` of a value-residual block's parameters ``bp``
    (:class:`~.blocks.BlockParams`; the ``first`` of :func:`~.blocks.attention_map`), or
    None without one."""
    if bp.value_mix is None:
        return None
    if bp.value_first is None:
        raise SpecError("layers.value_mix", "needs the first block's value kernel (carried "
                                            "by sigprop.theory.depth: propagate, final_cos)")
    ls, lf = bp.value_mix
    return ValueMix(ls2=ls * ls, lf2=lf * lf, k1=bp.value_first[0], c1=bp.value_first[1])


def first_weight(bp) -> float:
    """lambda_k, the weight with which block k adds its rows of the first block's values
    ``A_k V_1`` straight into the stream (no output projection, value residual learning
    §2.4.6): 1 for the first block (no ``value_mix``), ``lambda_first`` after it; 0 with an
    output projection (an independent ``W_O``)."""
    if bp.var_o is not None:
        return 0.0
    return 1.0 if bp.value_mix is None else float(bp.value_mix[1])


def stream_cross(bp, st: AttentionStats, u, variant: str):
    """``(dq, dp)``: twice the correlation ``E<x_a, O_c>/d = lambda u m1`` of the stream
    entering a value-residual block without an output projection (§2.4.6) with the block's
    attention output, times ``alpha_attn``. ``u``: the stream's share of ``V_1``, the first
    block's values (carried by :mod:`.depth`); ``m1 = c1 + (k1 - c1) E sum_b A_k,ab A_l,cb``
    with the rows of two blocks independent (``st.inv_t``; pairs ``st.inv_t_cross``).
    Centred rows: 0. Not derived, so 0: sinks, gates, sigmoid or differential rows,
    normalised heads or branches, Dynamic Tanh."""
    first = value_first(bp)
    lam = first_weight(bp)
    plain = all(x is None for x in (bp.sink, bp.gate, bp.sigmoid_bias, bp.diff_lambda,
                                    bp.head_norm2, bp.branch_gain2, bp.dyt))
    if first is None or u is None or lam == 0.0 or variant == "centred" or not plain:
        return 0.0, 0.0
    f = 2.0 * np.asarray(bp.alpha_attn, dtype=np.float64) * lam * np.asarray(u, np.float64)
    d1 = first.k1 - first.c1
    return f * (first.c1 + d1 * st.inv_t), f * (first.c1 + d1 * st.inv_t_cross)


def cross_map(qa, pa, bp):
    """(q, p) of a cross-attention branch over an encoder output (a decoder block, docs/theory.md
    §2.8): queries from the block's (normalised) state ``(qa, pa)``, keys and values from the
    memory at ``(q_m, rho_m)`` over ``T_m`` positions. A row is a REM over the T_m memory keys
    with variance ``v = sigma_c^2 qa q_m (1 - rho_m)``; two rows share the fraction
    ``rho = pa / qa`` of it (their queries' cosine), so ``Y2 = Y2(T_m, v)`` and ``Yx = Yx(T_m,
    v, rho)``; the values give ``s_v^2 [p_m + (q_m - p_m) Y]`` (docs/theory.md §2.4), times
    ``s_o^2``; the heads' tables (the last axis of ``sigma_s``) are averaged."""
    cr = bp.cross
    sig, var_v, var_o = cr.sigma_s, cr.var_v, cr.var_o
    T_m, q_m, r_m = cr.memory_len, cr.memory_q, cr.memory_rho
    qa, pa = np.asarray(qa, dtype=np.float64), np.asarray(pa, dtype=np.float64)
    rho = np.clip(np.where(qa > 0, pa / np.where(qa > 0, qa, 1.0), 1.0), 0.0, 1.0)
    v = (np.asarray(qa, dtype=np.float64)[..., None] * sig**2) * q_m * (1.0 - r_m)
    if T_m < 2:
        y2 = yx = np.ones(np.shape(rho))
    else:
        y2 = np.mean(rem.y2_table(int(T_m), bp.d_head)(v), axis=-1)
        yx = np.mean(rem.yx_table(int(T_m), bp.d_head)(v, rho[..., None]), axis=-1)
    p_m = r_m * q_m
    q_c = var_o * var_v * (p_m + (q_m - p_m) * y2)
    p_c = var_o * var_v * (p_m + (q_m - p_m) * yx)
    return q_c, p_c
