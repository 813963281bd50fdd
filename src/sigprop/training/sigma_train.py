"""sigma-reparam as a training-time reparametrisation (Zhai et al. 2023): ``W = gamma W /
sigma(W)`` on W_Q and W_K, for the provoked-instability experiment
(:mod:`sigprop.training.instability`). The registry's ``sigma-reparam`` method rescales the
weights once, at init; this keeps the rescale on through training."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SigmaReparam", "install_sigma_reparam"]


class SigmaReparam(nn.Module):
    """``W -> gamma W / sigma(W)`` on one block of a weight (Zhai et al. 2023): the ``hi -
    lo`` entries from ``lo`` along ``axis`` (a projection's output rows: a whole
    ``nn.Linear``, or W_Q's / W_K's columns of GPT-2's fused ``Conv1D``); ``gamma`` a trained
    scalar (1 at init), ``sigma`` the block's spectral norm by power iteration (``u`` kept
    between calls, one iteration per training forward, the gradient flowing through ``u^T W
    v`` as in their code)."""

    def __init__(self, weight: torch.Tensor, lo: int, hi: int, axis: int, seed: int = 0):
        super().__init__()
        self.lo, self.hi, self.axis = int(lo), int(hi), int(axis)
        w = self._block(weight.detach())
        g = torch.Generator().manual_seed(seed)
        u = torch.randn(w.shape[0], generator=g, dtype=weight.dtype)
        for _ in range(100):  # a converged u at init
            u = nn.functional.normalize(w @ nn.functional.normalize(w.t() @ u, dim=0), dim=0)
        self.register_buffer("u", u)
        self.gain = nn.Parameter(torch.ones((), dtype=weight.dtype))

    def _block(self, w: torch.Tensor) -> torch.Tensor:
        return w.narrow(self.axis, self.lo, self.hi - self.lo)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        b = self._block(w)
        with torch.no_grad():
            v = nn.functional.normalize(b.t() @ self.u, dim=0)
            u = nn.functional.normalize(b @ v, dim=0)
            if self.training:
                self.u.copy_(u)
        new = self.gain * b / (u @ (b @ v))
        if (self.lo, self.hi) == (0, w.shape[self.axis]):
            return new
        return torch.cat([w.narrow(self.axis, 0, self.lo), new,
                          w.narrow(self.axis, self.hi, w.shape[self.axis] - self.hi)],
                         dim=self.axis)


def install_sigma_reparam(model: nn.Module, seed: int) -> list[str]:
    """``W = gamma W / sigma(W)`` (:class:`SigmaReparam`) on the W_Q and W_K of every block
    of ``model`` (torch's ``parametrize``; GPT-2's fused ``Conv1D``: the Q and K columns
    only), seeded ``seed + 2 block + (0: q, 1: k)``; returns the names of the parts done."""
    from torch.nn.utils import parametrize
    from transformers.pytorch_utils import Conv1D

    from ..models.methods.parts import block_parts, need

    todo = []  # every target first: a parametrised module is no longer found as a block's
    for i, p in enumerate(block_parts(model)):
        for j, role in enumerate(("q", "k")):
            for m, sl, ax in need(p, role, "sigma-reparam"):
                ax = 1 if isinstance(m, Conv1D) else ax
                lo, hi = sl if sl is not None else (0, m.weight.shape[ax])
                todo.append((m, lo, hi, ax, seed + 2 * i + j, f"{p.name}.{role}"))
    out = []
    for m, lo, hi, ax, s, name in todo:
        parametrize.register_parametrization(m, "weight", SigmaReparam(m.weight, lo, hi, ax, s))
        out.append(name)
    return out
