"""gg25's shared constants, simulators and helpers: the paper's variances and BERT-base's
effective beta, the single-head simulator :func:`head_sweep` (queries, keys and values of
tokens at cosine rho drawn from their exact law), the transition read-out :func:`crossing`,
and small bits the items share (trajectory columns by layer, the figure's axes)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...measurement.rho_tokens import rho_tokens
from ..core import mean_se

__all__ = ["GG25_VARS", "BETA_HF", "SQRT2", "BETAS16", "BETAS13", "BETAS11", "at", "crossing",
           "head_sweep", "sweep_records"]

#: gg25's weight and bias variances (Fig. 1(d, e), A.1): sigma_v^2 = sigma_w^2 = 0.2,
#: sigma_b^2 = 4e-4 (docs/theory.md §2.6)
GG25_VARS = dict(sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4)
#: gg25 B.1: a HuggingFace BERT-base initialisation (std 0.02, d = 768, T = 512) has
#: beta_eff = 0.02^2 * 768 / sqrt(log 512)
BETA_HF = 0.02**2 * 768 / math.sqrt(math.log(512))
SQRT2 = math.sqrt(2.0)
#: default beta grids of the one-head sweeps
BETAS16 = tuple(float(b) for b in np.round(np.linspace(0.25, 4.0, 16), 4))
BETAS13 = tuple(float(b) for b in np.round(np.linspace(0.25, 4.0, 13), 4))
BETAS11 = tuple(float(b) for b in np.round(np.linspace(0.25, 5.0, 11), 4))


def at(traj, obs: str, source: str | None = None) -> np.ndarray:
    """Values of ``obs`` ordered by layer (optionally one source): rows (layer, value,
    stderr)."""
    df = traj[traj["observable"] == obs]
    if source is not None:
        df = df[df["source"] == source]
    return df.sort_values("layer")[["layer", "value", "stderr"]].to_numpy(dtype=float)


def crossing(x, y, level) -> float:
    """First x at which the decreasing curve y reaches ``level`` (linear interpolation);
    NaN when it never does, ``x[0]`` when it starts below."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    below = np.flatnonzero(y <= level)
    if not below.size:
        return float("nan")
    i = int(below[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (x[i] - x[i - 1]) * (y[i - 1] - level) / (y[i - 1] - y[i]))


# --------------------------------------------------------------------------------------------
# the single-head simulator


def _head_stats(out: dict, idx: tuple, A: np.ndarray, logp: np.ndarray, G: np.ndarray,
                T: int) -> None:
    """Fill ``out[...][idx]`` with one head's row and output statistics (see
    :func:`head_sweep`)."""
    off = T * (T - 1)
    nrm = np.sqrt(np.diag(G))
    col = A.sum(axis=0)
    sq = float((A * A).sum())
    out["y2"][idx] = sq / T
    out["yx"][idx] = (col @ col - sq) / off
    out["entropy"][idx] = float(-(A * logp).sum()) / (T * math.log(T))
    out["wmax"][idx] = float(A.max(axis=1).mean())
    out["q_att"][idx] = float(np.trace(G)) / T
    out["p_att"][idx] = float(G.sum() - np.trace(G)) / off
    C = G / nrm[:, None] / nrm[None, :]
    out["cos"][idx] = float(C.sum() - np.trace(C)) / off


def head_sweep(betas, rhos, T: int, d_head: int, d_v: int | None, seeds: int, seed: int = 0,
               keep_eigs: bool = False) -> dict:
    """One softmax head on tokens at cosine rho, scores ``beta sqrt(log T) q.k / sqrt(d_H)``
    (gg25 Eq. 11). Values: ``x W_V`` with ``W_V ~ N(0, 1/d)`` of width ``d_v``; ``d_v=None``
    takes the tokens themselves as values, exactly at cosine rho (an orthogonal W_V), so
    the outputs' Gram matrix is ``(1 - rho) A A^T + rho`` without value noise.

    One draw of queries, keys and values per (rho, seed) serves every beta (the score scale
    only multiplies the logits). Returns arrays of shape (n_beta, n_rho, seeds): ``y2`` (mean
    row sum of squared weights), ``yx`` (mean over row pairs of the weights' overlap),
    ``entropy`` (row entropy / log T), ``wmax``, ``q_att`` = mean |o_a|^2 / d_v, ``p_att`` =
    mean <o_a, o_c> / d_v (a != c), ``cos`` = mean pairwise cosine of the outputs; with
    ``keep_eigs`` also ``eigs`` (n_beta, n_rho, seeds, T) complex eigenvalues of A.
    """
    betas = np.asarray(betas, dtype=np.float64)
    rhos = np.asarray(rhos, dtype=np.float64)
    rng = np.random.default_rng(seed)
    shape = (betas.size, rhos.size, seeds)
    out = {k: np.empty(shape) for k in ("y2", "yx", "entropy", "wmax", "q_att", "p_att",
                                       "cos")}
    if keep_eigs:
        out["eigs"] = np.empty(shape + (T,), dtype=complex)
    sig = betas * math.sqrt(math.log(T))
    for j, rho in enumerate(rhos):
        for s in range(seeds):
            Q = rho_tokens(T, d_head, rho, rng, law="gaussian")
            K = rho_tokens(T, d_head, rho, rng, law="gaussian")
            V = None if d_v is None else rho_tokens(T, d_v, rho, rng, law="gaussian")
            s0 = Q @ K.T / math.sqrt(d_head)
            for i, sg in enumerate(sig):   # one (T, T) at a time: T up to a few thousand
                logit = sg * s0
                logit -= logit.max(axis=1, keepdims=True)
                logz = np.log(np.exp(logit).sum(axis=1, keepdims=True))
                logp = logit - logz
                A = np.exp(logp)
                if V is None:
                    G = (1.0 - rho) * (A @ A.T) + rho
                else:
                    O = A @ V
                    G = O @ O.T / d_v
                _head_stats(out, (i, j, s), A, logp, G, T)
                if keep_eigs:
                    out["eigs"][i, j, s] = np.linalg.eigvals(A)
    return out


def sweep_records(sw: dict, betas, rhos, T: int, names: Sequence[str]) -> list[dict]:
    """:func:`head_sweep`'s observables ``names`` as measured records (mean and standard error
    over seeds) at every (beta, rho_in)."""
    recs = []
    for name in names:
        m, e = mean_se(sw[name])
        for i, b in enumerate(betas):
            for j, r in enumerate(rhos):
                recs.append(dict(observable=name, source="measured", value=m[i, j],
                                 stderr=e[i, j], beta=float(b), rho_in=float(r), T=T))
    return recs
