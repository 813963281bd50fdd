"""Inputs of :mod:`sigprop.measurement.streaming`: tokens served chunk by chunk (a real tensor or
tokens generated deterministically per block of positions) and seeded i.i.d. REM scores.

Everything is drawn per block of ``BLOCK`` positions from a generator seeded by ``(seed,
block)``, so what a row or key sees does not depend on the chunk size used to stream it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from . import inputs as _inputs

#: rows per deterministic generator block (tokens and REM scores)
BLOCK = 256


def block_seed(seed: int, block: int, salt: int = 0) -> int:
    """A 32-bit torch seed per (seed, salt, block): torch's CPU generator keeps only the low
    32 bits of a seed, so the parts are mixed by NumPy's SeedSequence instead of shifted."""
    ss = np.random.SeedSequence([int(seed), int(salt), int(block)])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


# --------------------------------------------------------------------------------- inputs
class TokenSource:
    """``n`` tokens of width ``d``: ``chunk(start, stop)`` -> (stop - start, d) and
    ``rows(idx)`` -> (len(idx), d), in ``dtype``; both deterministic."""

    n: int
    d: int
    dtype: torch.dtype

    def chunk(self, start: int, stop: int) -> Tensor:
        raise NotImplementedError

    def rows(self, idx: Tensor) -> Tensor:
        raise NotImplementedError


class TensorTokens(TokenSource):
    """Tokens held in memory (real inputs, small T): a (T, d) tensor."""

    def __init__(self, x: Tensor, dtype: torch.dtype | None = None):
        if x.dim() != 2:
            raise ValueError(f"tokens must have shape (T, d), got {tuple(x.shape)}")
        self.dtype = dtype or x.dtype
        self.x = x.to(self.dtype)
        self.n, self.d = x.shape

    def chunk(self, start: int, stop: int) -> Tensor:
        return self.x[start:stop]

    def rows(self, idx: Tensor) -> Tensor:
        return self.x[idx]


class GeneratedTokens(TokenSource):
    """``x_a = sqrt(d) (sqrt(rho) u + sqrt(1 - rho) e_a)``: ``e_a`` a random sign vector
    ``{-1, 1}^d`` with its component along the shared random unit vector u removed, normalised
    (``rho = 0``: the sign vector itself, ``|x|^2 = d`` exactly, no u). Pairwise cosines are
    ``rho + O((1 - rho)/sqrt d)`` with mean ``rho``, as in the T > d branch of
    :func:`sigprop.measurement.inputs.rho_tokens`; signs instead of Gaussians because they are ~4x
    cheaper to draw (a byte gives eight) and the keys ``x W_K`` are sums of d terms either way.
    Block ``k`` of ``BLOCK`` rows comes from a generator seeded by ``(seed, k)``, so any chunk
    or row is generated on its own, identically for every chunk size and dtype."""

    _LUT = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).float() * 2.0 - 1.0

    def __init__(self, n: int, d: int, rho: float = 0.0, seed: int = 0, *,
                 dtype: torch.dtype = torch.float32):
        self.n, self.d, self.rho, self.seed, self.dtype = int(n), int(d), float(rho), seed, dtype
        self.lut = self._LUT.to(dtype)
        self.u = None
        if self.rho > 0:
            g = torch.Generator().manual_seed(block_seed(seed, 0, salt=1))
            u = torch.randn(self.d, generator=g, dtype=torch.float64)
            self.u = (u / u.norm()).to(dtype)

    def _blocks(self, b0: int, b1: int) -> Tensor:
        """Sign vectors of blocks ``b0..b1-1``: random bytes through a bit lookup table."""
        per_row = -(-self.d // 8)
        nb = BLOCK * per_row
        bits = torch.empty((b1 - b0) * nb, dtype=torch.uint8)
        for i, b in enumerate(range(b0, b1)):
            g = torch.Generator().manual_seed(block_seed(self.seed, b))
            torch.randint(0, 256, (nb,), dtype=torch.uint8, generator=g,
                          out=bits[i * nb:(i + 1) * nb])
        e = torch.index_select(self.lut, 0, bits.int()).view(-1, 8 * per_row)
        return e if self.d == 8 * per_row else e[:, :self.d]

    def _finish(self, e: Tensor) -> Tensor:
        if self.u is None:
            return e
        e.addr_(e @ self.u, self.u, alpha=-1.0)
        e *= math.sqrt(self.d * (1.0 - self.rho)) / e.norm(dim=1, keepdim=True)
        e += math.sqrt(self.d * self.rho) * self.u
        return e

    def chunk(self, start: int, stop: int) -> Tensor:
        b0, b1 = start // BLOCK, -(-stop // BLOCK)
        e = self._blocks(b0, b1)[start - b0 * BLOCK:stop - b0 * BLOCK]
        return self._finish(e.contiguous())

    def rows(self, idx: Tensor) -> Tensor:
        idx = torch.as_tensor(idx, dtype=torch.long)
        out = torch.empty(len(idx), self.d, dtype=self.dtype)
        blocks = idx // BLOCK
        for b in torch.unique(blocks).tolist():
            sel = blocks == b
            out[sel] = self._blocks(b, b + 1)[idx[sel] - b * BLOCK]
        return self._finish(out)


def token_source(kind: str, n: int, d: int, *, rho: float = 0.0, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> TokenSource:
    """Inputs for ``kind`` in rho | isometric | rem (the REM's values use rho tokens). Where
    the exact constructions of :mod:`.inputs` fit (T + 1 <= d for rho, T <= d for isometric)
    they are used, as in ``sigprop measure``; longer inputs are :class:`GeneratedTokens`."""
    if kind in ("rho", "rem"):
        if n + 1 <= d:
            return TensorTokens(_inputs.rho_tokens(1, n, d, rho, seed)[0], dtype)
        return GeneratedTokens(n, d, rho, seed, dtype=dtype)
    if kind == "isometric":
        if n <= d:
            return TensorTokens(_inputs.isometric_tokens(1, n, d, seed)[0], dtype)
        return GeneratedTokens(n, d, 0.0, seed, dtype=dtype)
    raise ValueError(f"input must be rho, isometric or rem (got {kind!r})")


def rem_scores(seed: int, heads: int, rows: int, start: int, stop: int,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """i.i.d. N(0, 1) REM logits (heads, rows, stop - start) for keys ``start..stop-1``: key
    block k (``BLOCK`` keys, all heads and rows) from a generator seeded by ``(seed, k)``, so
    the draws do not depend on the chunk size (drawn in float32, then cast to ``dtype``)."""
    b0, b1 = start // BLOCK, -(-stop // BLOCK)
    out = torch.empty(heads, rows, (b1 - b0) * BLOCK, dtype=torch.float32)
    for i, b in enumerate(range(b0, b1)):
        g = torch.Generator().manual_seed(block_seed(seed, b, salt=2))
        # drawn contiguous, then copied: normal_ on a strided view fills in another order
        out[:, :, i * BLOCK:(i + 1) * BLOCK] = torch.randn(heads, rows, BLOCK, generator=g)
    return out[:, :, start - b0 * BLOCK:stop - b0 * BLOCK].to(dtype)
