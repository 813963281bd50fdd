"""Step 4, the theory of a layer at length T from the moments its reference pass measured
(docs/theory.md §2.3-2.4, §3.3): per head the REM energy variance over keys
``v_h = scale^2 E_a[q_a^T C_k q_a]`` plus, with RoPE, the variance of the rotating mean-key
term over the row's window; the finite-T tables and the T -> infinity limit; the output
cosine from the value moments through W_O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...measurement import stream_model as sm
from .capture import LayerFit


def _blocks(mat: torch.Tensor, n: int, w: int) -> torch.Tensor:
    """Diagonal blocks ``(n, w, w)`` of an ``(n w, n w)`` matrix."""
    idx = torch.arange(n)
    return mat.view(n, w, n, w)[idx, :, idx, :]


#: query draws over which the theory averages (quantiles of a head's score variance matter)
THEORY_QUERIES = 128


@dataclass
class LayerMoments:
    """The theory's view of one layer (float64 NumPy). Per drawn query ``a`` and head ``h``:
    ``v_fluct (Q, H)`` the variance over keys of its scores from the keys' covariance, ``amp
    (Q, H, P)`` the squared amplitude per RoPE plane of its score against the mean key (a term
    that rotates with the distance, so it adds variance over a window of keys), ``theta (P,)``
    the plane frequencies; ``rho (H,)`` the fraction of the score variance two rows share (their
    queries' common mean); the output-cosine terms ``m2 = |E out|^2`` and ``V (H, H)`` (value
    fluctuations through W_O)."""

    v_fluct: np.ndarray
    rho: np.ndarray
    amp: np.ndarray
    theta: np.ndarray
    m2: float
    V: np.ndarray

    def variance(self, n) -> np.ndarray:
        """``(Q, H)``: each query's score variance over a window of ``n`` keys."""
        if self.theta.size == 0:
            return self.v_fluct
        half = 0.5 * self.theta
        with np.errstate(invalid="ignore", divide="ignore"):
            dk = np.where(np.abs(np.sin(half)) < 1e-300, 1.0,
                          np.sin(n * half) / (n * np.sin(half)))
        return self.v_fluct + np.sum(self.amp * 0.5 * (1.0 - dk**2), axis=-1)


def moments(f: LayerFit, n_queries: int = THEORY_QUERIES, seed: int = 0) -> LayerMoments:
    """The theory's inputs from a layer's fits (module docstring, step 4). The queries are
    drawn from the query fit, so the REM tables are averaged over the real spread of query
    norms and directions (instead of docs/theory.md §2.3's chi2(d_H) model of it)."""
    H, Hkv, dh, g = f.heads, f.kv_heads, f.head_dim, f.group
    c2 = f.scale ** 2 * (f.rope_gain ** 4 if f.rope is not None else 1.0)
    kv_of = torch.arange(H) // g
    Ck = _blocks(f.k.cov, Hkv, dh)[kv_of]  # (H, dh, dh)
    mq = f.q.mu.view(H, dh)
    mk = f.k.mu.view(Hkv, dh)[kv_of]
    g = f.q_gen or f.q
    z = sm.random_normal(seed, 51, f.index, n_queries, g.rank, torch.float64)
    qs = (g.mu + z @ g.F).view(n_queries, H, dh)
    if f.q_norm is not None and f.q_gen is not None:
        qs = f.q_norm(qs)
    vfl = c2 * torch.einsum("ahi,hij,ahj->ah", qs, Ck, qs)
    shared = c2 * torch.einsum("hi,hij,hj->h", mq, Ck, mq)
    mean_v = vfl.mean(0)
    rho = torch.where(mean_v > 0, shared / mean_v.clamp_min(1e-300),
                      torch.zeros_like(mean_v)).clamp(0.0, 1.0)
    if f.rope is not None and f.inv_freq is not None and f.rope_dims:
        r = f.rope_dims
        P = r // 2
        eq = qs[..., :P] ** 2 + qs[..., P:r] ** 2  # (Q, H, P)
        ek = mk[:, :P] ** 2 + mk[:, P:r] ** 2  # (H, P)
        amp = (c2 * eq * ek).numpy()
        theta = np.asarray(f.inv_freq[:P], dtype=np.float64)
    else:
        amp, theta = np.zeros((n_queries, H, 0)), np.zeros(0)
    # output: E out = mu_v (per query head) @ W_O + b_O; fluctuations per pair of heads
    dv = f.v.mu.numel() // Hkv
    mv = f.v.mu.view(Hkv, dv)[kv_of].reshape(-1)
    Cv = f.v.cov.view(Hkv, dv, Hkv, dv)[kv_of][:, :, kv_of].reshape(H * dv, H * dv)
    if f.w_o is not None:
        wo = f.w_o.double()
        mean = mv @ wo + (f.b_o.double() if f.b_o is not None else 0.0)
        G = wo @ wo.T
    else:
        mean, G = mv, torch.eye(H * dv, dtype=torch.float64)
    V = (Cv * G).view(H, dv, H, dv).sum((1, 3))
    return LayerMoments(vfl.numpy(), rho.numpy(), amp, theta, float(mean @ mean), V.numpy())


def _nodes(T: int, causal: bool):
    from ...theory import attention, causal_positions

    if not causal:
        return np.array([float(T)]), np.array([1.0]), np.array([1.0]), 1.0 / T, 1.0 / T
    nodes, w = attention.causal_position_nodes(T)
    pair, inv_cross = causal_positions.causal_pair_weights(T, nodes)
    return nodes, w, pair, float(np.sum(w / nodes)), float(inv_cross)


def _out_cos_theory(mom: LayerMoments, nodes, w, y2, yx, window: int | None) -> np.ndarray:
    """Mean pairwise cosine of the layer outputs (as measured: a mean of cosines, not a ratio
    of means). Row at node a: ``|out|^2 = m2 + sum_h V_hh Y2_h(a) + off / n_a`` (``off``: the
    cross-head value terms at the uniform level); a pair of rows (a <= b) shares ``ov`` keys
    and ``<out_a, out_b> = m2 + (ov / n_b) sum_h V_hh Yx_h(a) + off ov / (n_a n_b)``
    (docs/theory.md §2.4's causal pair rule, with a window's overlap)."""
    off = mom.V.sum() - np.trace(mom.V)
    diag = np.diag(mom.V)
    nodes = np.asarray(nodes, dtype=np.float64)
    n = np.minimum(nodes, window) if window else nodes
    lo = nodes - n
    q = mom.m2 + y2 @ diag + off / n[:, None]  # (nodes, C)
    a = np.minimum.outer(np.arange(len(nodes)), np.arange(len(nodes)))
    bi = np.maximum.outer(np.arange(len(nodes)), np.arange(len(nodes)))
    ov = np.maximum(0.0, nodes[a] - lo[bi])
    share = ov / n[bi]
    pa = (yx @ diag)[a]  # (nodes, nodes, C)
    p = mom.m2 + share[..., None] * pa + (off * ov / (n[a] * n[bi]))[..., None]
    cos = p / np.sqrt(q[:, None, :] * q[None, :, :])
    return np.einsum("i,j,ijc->c", w, w, cos)


def layer_theory(mom: LayerMoments, T: int, mult: Callable[[np.ndarray], np.ndarray], *,
                 causal: bool, window: int | None, d_head: int,
                 extra: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Head-mean ipr, entropy, wmax and the output cosine of a layer at length ``T`` with the
    logit multiplier ``mult(n)`` (finite-T REM tables, docs/theory.md §2.3; causal rows averaged
    over log-spaced positions, §2.4; a sliding window caps a row's keys). ``extra``: an array
    of constant multipliers broadcast in front (the recommendation search): every output then
    has that leading shape. Also ``asym_*``: the T -> infinity limit (beta = sigma/sqrt(log n))."""
    from ...theory import attention, rem

    nodes, w, pair, inv_t, inv_cross = _nodes(T, causal)
    c = np.ones(1) if extra is None else np.asarray(extra, dtype=np.float64)
    per = {k: [] for k in ("ipr", "yx", "entropy", "wmax")}
    for t in nodes:
        n = min(t, window) if window else t
        if n <= 1:
            vals = {k: np.ones(c.shape + mom.rho.shape) for k in per}
        else:
            var = mom.variance(n) * (float(mult(np.array(n))) * c[:, None, None]) ** 2
            rho = np.broadcast_to(mom.rho, var.shape)
            stats = attention.finite_stats(var, rho, int(n), None, True)
            vals = dict(zip(("ipr", "yx", "entropy", "wmax"),
                            (np.mean(x, axis=-2) for x in stats), strict=True))
        for k in per:
            per[k].append(vals[k])
    per = {k: np.stack(v) for k, v in per.items()}  # (nodes, C, H)
    out = {k: np.mean(np.tensordot(w, per[k], axes=(0, 0)), axis=-1)
           for k in ("ipr", "entropy", "wmax")}
    out["cos"] = _out_cos_theory(mom, nodes, w, per["ipr"], per["yx"], window)
    # T -> infinity: beta = sigma / sqrt(log T) at the longest row
    nT = min(T, window) if window else T
    var = mom.variance(nT) * (float(mult(np.array(nT))) * c[:, None, None]) ** 2
    rho = np.broadcast_to(mom.rho, var.shape)
    sig = np.sqrt(var / np.maximum(1.0 - rho, 1e-12))
    beta = sig / math.sqrt(math.log(max(nT, 2)))
    out["asym_ipr"] = np.mean(rem.y2_asymptotic(beta, rho), axis=(-2, -1))
    out["asym_entropy"] = np.mean(rem.entropy_asymptotic(beta, rho), axis=(-2, -1))
    out["asym_wmax"] = np.mean(rem.wmax_asymptotic(beta, rho), axis=(-2, -1))
    out["sigma_s"] = np.sqrt(np.mean(sig**2, axis=(-2, -1)))
    out["beta"] = out["sigma_s"] / math.sqrt(math.log(max(nT, 2)))
    if extra is None:
        out = {k: np.asarray(v).reshape(()) if np.size(v) == 1 else v for k, v in out.items()}
    return out

