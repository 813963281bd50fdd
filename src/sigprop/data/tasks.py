"""Synthetic tasks of the seeds' training experiments.

* ``reverse`` (noci22 Appendix C.1): a sequence of ``T`` symbols (noci22: 20 digits 0-9) is
  mapped to the same symbols in reverse order; a per-position classification.
* ``heaviside`` (mindthegap A.3): isometric inputs ``X0`` (``T <= d`` orthonormal rows, scaled
  to ``|x|^2 = d``) and the entrywise Heaviside target ``H(X0) = 1[X0 > 0]``, fitted with a
  mean squared error (mindthegap trains attention-only encoders on 50 such points).
"""

from __future__ import annotations

import math

import torch


def reverse_batch(count: int, seq_len: int, n_symbols: int,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` of shape (count, seq_len): uniform symbols and their reversal."""
    x = torch.randint(0, n_symbols, (count, seq_len), generator=gen)
    return x, x.flip(-1)


def isometric_inputs(count: int, seq_len: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """(count, T, d) float32: each sequence has orthonormal rows times sqrt(d) (needs T <= d)."""
    if seq_len > d:
        raise ValueError(f"isometric inputs need seq_len <= d_model (got {seq_len} > {d})")
    g = torch.randn(count, d, seq_len, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)  # (count, d, T), orthonormal columns
    return (math.sqrt(d) * q.transpose(1, 2)).float()


def heaviside_data(count: int, seq_len: int, d: int,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X0, H(X0))``, both (count, T, d)."""
    x = isometric_inputs(count, seq_len, d, gen)
    return x, (x > 0).float()
