"""Heads whose map is not one softmax row (docs/theory.md §2.4.3, §2.4.7, §2.4.8): attention
sinks, sigmoid attention and differential attention, as the moments the block's attention map
takes (:func:`.blocks.attention_map`: ``y2`` = ``E sum_b w_ab^2``, ``yx`` = ``E sum_b w_ab
w_cb``, ``w2`` = ``E W_a^2``, ``wx`` = ``E W_a W_c`` with ``W_a = sum_b w_ab`` a row's mass).
NumPy float64, vectorised over any array of score stds and cosines.

**Sigmoid rows.** ``w_ab = sigmoid(s_ab - beta_n)``, ``beta_n = k log n - b0`` (the paper's
``b = -log n`` is ``k = 1, b0 = 0``). The scores are taken jointly Gaussian with the product
covariance of the REM (§2.1): ``Cov(s_ab, s_cd) = sigma^2 K_ac K_bd``, ``K`` = 1 on the
diagonal and ``rho`` off it. Every moment is then a sum of pair terms ``F(r) = E sigmoid(X -
beta) sigmoid(Y - beta')``, ``(X, Y)`` of variance ``sigma^2`` and correlation ``r``: one row
(n keys) has ``y2 = n F(1)``, ``w2 = n F(1) + n (n-1) F(rho)``; two rows sharing m keys, of
n and n' keys, ``yx = m F(rho)``, ``wx = m F(rho) + (n n' - m) F(rho^2)``. ``F`` is a 2-D
Gauss-Hermite sum. Not included: the chi2 spread of the query norms at finite ``d_head``
(the scores are Gaussian given the queries, not unconditionally) and the non-Gaussian tails
of ``q . k``. Causal rows: the moments at the causal nodes of :mod:`.causal_positions`
(bias ``k log t`` at the node t), pairs of rows as independent draws of two positions (the
shorter row's keys shared).

**Differential rows.** ``D = A1 - lambda A2`` with ``A1``, ``A2`` softmax rows of two
independent half-width score maps (``d_head / 2`` channels, the same score std); given the
tokens they are independent with mean ``1/n`` per key, so ``y2 = (1 + E lambda^2) Y2 - 2 E
lambda E[1/n]``, ``yx = (1 + E lambda^2) Yx - 2 E lambda E[1/n_long]`` (``Y2``, ``Yx`` the
REM tables at ``d_head / 2``; ``n_long`` the longer row of a causal pair) and every row
sums to ``1 - lambda``: ``w2 = wx = 1 - 2 E lambda + E lambda^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit

from ..spec import SpecError
from . import sink
from .attention import AttentionStats, attention_stats
from .causal_positions import causal_grid

__all__ = ["diff_lambda_moments", "head_map_stats", "sigmoid_moments", "sigmoid_pair"]

#: Gauss-Hermite nodes per dimension of :func:`sigmoid_pair`
N_GH = 64
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


def sigmoid_pair(sigma, r, beta1, beta2):
    """``E sigmoid(X - beta1) sigmoid(Y - beta2)`` for ``(X, Y)`` zero-mean Gaussian, both of
    std ``sigma``, correlation ``r`` (clipped to [-1, 1]); broadcast over all arguments."""
    arrs = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64)
                                 for a in (sigma, r, beta1, beta2)))
    shape, flat = arrs[0].shape, [a.ravel() for a in arrs]
    out = np.empty(flat[0].size)
    for i in range(0, out.size, _CHUNK):
        s, rr, b1, b2 = (a[i:i + _CHUNK, None] for a in flat)
        rr = np.clip(rr, -1.0, 1.0)
        x = s * _Z1
        y = s * (rr * _Z1 + np.sqrt(1.0 - rr * rr) * _Z2)
        out[i:i + _CHUNK] = (expit(x - b1) * expit(y - b2)) @ _W
    return out.reshape(shape)


def sigmoid_moments(sigma_s, rho, T: int, bias, *, causal: bool = False):
    """The row moments (:class:`~.sink.SinkStats`: ``y2, yx, w2, wx``, the same four a sink's
    map takes) of sigmoid rows (module docstring) with score std ``sigma_s`` on
    tokens at cosine ``rho`` (broadcast), ``bias = (k, b0)``: ``w = sigmoid(s + b0 - k log
    n)``, n the row's visible keys (T bidirectional, t at causal position t)."""
    k, b0 = (float(x) for x in bias)
    sig = np.asarray(sigma_s, dtype=np.float64)
    rho = np.clip(np.asarray(rho, dtype=np.float64), 0.0, 1.0)
    sig, rho = np.broadcast_arrays(sig, rho)
    if causal:
        grid = causal_grid(int(T))
        t, wt = grid.nodes.astype(np.float64), grid.weights / np.sum(grid.weights)
    else:
        t, wt = np.array([float(T)]), np.array([1.0])
    beta = k * np.log(t) - b0
    s1, r1 = sig[..., None], rho[..., None]
    f1 = sigmoid_pair(s1, 1.0, beta, beta)
    fr = sigmoid_pair(s1, r1, beta, beta)
    y2 = np.sum(wt * t * f1, axis=-1)
    w2 = np.sum(wt * (t * f1 + t * (t - 1.0) * fr), axis=-1)
    s2, r2 = sig[..., None, None], rho[..., None, None]
    bi, bj = beta[:, None], beta[None, :]
    m = np.minimum(t[:, None], t[None, :])  # the keys two rows share
    wij = wt[:, None] * wt[None, :]
    fxr = sigmoid_pair(s2, r2, bi, bj)
    fx2 = sigmoid_pair(s2, r2 * r2, bi, bj)
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
        sm = sigmoid_moments(sg, rh, bp.seq_len, bp.sigmoid_bias, causal=bp.causal)
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
