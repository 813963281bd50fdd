"""Input sequences for measurement (docs/architecture.md measure/): orthonormal tokens
(mindthegap), tokens at a prescribed cosine (gg25 Fig. 3) and real text through embeddings.

Continuous inputs are scaled so every token has ``|x|^2 = d`` (q = 1, the theory's layer-0
state after LayerNorm)."""

from __future__ import annotations

import math

import numpy as np
import torch

INPUTS = ("rho", "isometric", "text")


def _orthonormal(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """k orthonormal vectors in R^d (k <= d): rows of Q from a Gaussian QR."""
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return (q * np.sign(np.diag(r))).T


def rho_tokens(n_seq: int, T: int, d: int, rho: float, seed: int = 0) -> torch.Tensor:
    """(n_seq, T, d) tokens with pairwise cosine ``rho`` and ``|x|^2 = d``:
    ``x_a = sqrt(d) (sqrt(rho) u + sqrt(1 - rho) e_a)`` with u, e_a orthonormal, which is exact
    when T + 1 <= d. For T + 1 > d the e_a are random unit vectors orthogonal to u, so pairwise
    cosines are rho + O((1 - rho)/sqrt(d)) and their mean is rho up to O(1/sqrt(d T))."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_seq, T, d))
    for i in range(n_seq):
        if T + 1 <= d:
            basis = _orthonormal(rng, d, T + 1)
            u, e = basis[0], basis[1:]
        else:
            u = _orthonormal(rng, d, 1)[0]
            e = rng.standard_normal((T, d))
            e -= np.outer(e @ u, u)
            e /= np.linalg.norm(e, axis=1, keepdims=True)
        out[i] = math.sqrt(d) * (math.sqrt(rho) * u + math.sqrt(1.0 - rho) * e)
    return torch.from_numpy(out)


def isometric_tokens(n_seq: int, T: int, d: int, seed: int = 0) -> torch.Tensor:
    """Orthonormal tokens times sqrt(d) (mindthegap's X_0, rows orthonormal; needs T <= d,
    otherwise random unit directions: pairwise cosines O(1/sqrt(d)))."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_seq, T, d))
    for i in range(n_seq):
        if T <= d:
            out[i] = _orthonormal(rng, d, T)
        else:
            e = rng.standard_normal((T, d))
            out[i] = e / np.linalg.norm(e, axis=1, keepdims=True)
    return torch.from_numpy(math.sqrt(d) * out)


def text_ids(n_seq: int, T: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """Token ids (n_seq, T) of the built-in generated text and the vocabulary size."""
    from ..data.tiny import token_batch

    ids, vocab = token_batch(n_seq, T, seed)
    return torch.from_numpy(ids), vocab
