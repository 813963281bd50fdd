"""Tokens at a prescribed pairwise cosine ``rho``: the one generator of the theory's
correlated input (docs/theory.md §2.1), for measurement and for the reproduced papers.

:func:`rho_tokens` draws ``T`` tokens of width ``d`` (``n_seq`` sequences of them on request)
from a seed or a NumPy ``Generator``, under one of two laws:

``law="exact"``
    ``x_a = sqrt(d) (sqrt(rho) u + sqrt(1 - rho) e_a)`` with ``u, e_1 .. e_T`` orthonormal (the
    rows of a sign-fixed Gaussian QR, ``u`` first), so ``|x_a|^2 = d`` and every pairwise
    cosine is exactly ``rho`` when ``T + 1 <= d``. For ``T + 1 > d`` the ``e_a`` are random
    unit vectors orthogonal to ``u``: cosines ``rho + O((1 - rho) / sqrt d)``, mean ``rho``
    up to ``O(1 / sqrt(d T))``. One QR per sequence, sequences drawn one after the other.

``law="gaussian"``
    Every coordinate i.i.d. over the ``d`` dimensions with the ``T`` tokens jointly
    ``N(0, var [(1 - rho) I_T + rho 1 1^T])``: ``x_a = sqrt(var (1 - rho)) z_a + sqrt(var rho)
    u`` with ``z_a, u ~ N(0, I_d)``, all ``z`` drawn before ``u``. Cosines are ``rho`` in
    expectation (the law of ``x W`` for exact tokens and Gaussian ``W``, and noci22's A.2
    input).

The draws are those of the generators they replace (``measurement.inputs.rho_tokens``, gg25's
correlated rows, noci22's Gaussian tokens), number for number for the same seed.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["LAWS", "rho_tokens"]

#: The laws :func:`rho_tokens` draws from.
LAWS = ("exact", "gaussian")


def rho_tokens(T: int, d: int, rho: float, seed: int | np.random.Generator = 0, *,
               n_seq: int | None = None, law: str = "exact", var: float = 1.0) -> np.ndarray:
    """``T`` tokens of width ``d`` at pairwise cosine ``rho`` (float64): shape ``(T, d)``, or
    ``(n_seq, T, d)`` when ``n_seq`` is given. ``seed``: an int or a NumPy ``Generator`` (drawn
    from in place, so consecutive calls continue its stream). ``law``: ``"exact"`` (orthonormal
    construction, ``|x|^2 = d``) or ``"gaussian"`` (Gaussian law of variance ``var`` per
    coordinate); see the module docstring for both. ``0 <= rho <= 1``."""
    if law not in LAWS:
        raise ValueError(f"law must be one of {', '.join(LAWS)} (got {law!r})")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1] (got {rho!r})")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if law == "gaussian":
        lead = () if n_seq is None else (n_seq,)
        z = rng.standard_normal((*lead, T, d))
        u = rng.standard_normal((*lead, 1, d))
        return math.sqrt(var * (1.0 - rho)) * z + math.sqrt(var * rho) * u
    out = np.empty((1 if n_seq is None else n_seq, T, d))
    for i in range(out.shape[0]):
        if T + 1 <= d:
            basis = _orthonormal(rng, d, T + 1)
            u, e = basis[0], basis[1:]
        else:
            u = _orthonormal(rng, d, 1)[0]
            e = rng.standard_normal((T, d))
            e -= np.outer(e @ u, u)
            e /= np.linalg.norm(e, axis=1, keepdims=True)
        out[i] = math.sqrt(d) * (math.sqrt(rho) * u + math.sqrt(1.0 - rho) * e)
    return out[0] if n_seq is None else out


def _orthonormal(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """``k`` orthonormal vectors in R^d (k <= d): the rows of Q from a Gaussian QR, signs fixed
    by R's diagonal (Haar-distributed)."""
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return (q * np.sign(np.diag(r))).T
