"""Input sequences for measurement (docs/architecture.md measure/): orthonormal tokens
(mindthegap), tokens at a prescribed cosine (gg25 Fig. 3) and real text through embeddings.

Continuous inputs are scaled so every token has ``|x|^2 = d`` (q = 1, the theory's layer-0
state after LayerNorm)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .rho_tokens import rho_tokens as rho_tokens_of

INPUTS = ("rho", "isometric", "text")


def _orthonormal(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """k orthonormal vectors in R^d (k <= d): rows of Q from a Gaussian QR."""
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return (q * np.sign(np.diag(r))).T


def rho_tokens(n_seq: int, T: int, d: int, rho: float, seed: int = 0) -> torch.Tensor:
    """(n_seq, T, d) tokens with pairwise cosine ``rho`` and ``|x|^2 = d``: the exact law of
    :func:`sigprop.measurement.rho_tokens.rho_tokens` (exact when T + 1 <= d), as a tensor."""
    return torch.from_numpy(rho_tokens_of(T, d, rho, seed, n_seq=n_seq))


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
