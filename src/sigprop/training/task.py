"""The model that :mod:`sigprop.training.loop` trains: the batched sigprop stack plus a task
readout.

:class:`TaskModel` holds ``config.seeds`` initialisations (times the betas trained side by
side); :func:`slice_losses` gives each slice's loss, so the summed loss yields every slice its own
gradient (see :mod:`sigprop.training.loop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec import ArchSpec

if TYPE_CHECKING:
    from .config import TrainConfig

HEAD_SEED = 7919  #: offset of the readout's seed from the body's


class TaskModel(nn.Module):
    """:class:`SigpropTransformer` (``body``) plus, for token tasks, a linear readout to the
    vocabulary: ``logits = h W + b`` with ``W ~ N(0, 1/d^2)`` (S, d, V), so initial logits
    have std ``1/sqrt(d)`` for ``|h|^2 = d``, or, with ``tie``, ``h E^T / d`` with the token
    embeddings ``E``. A pre-LN body's output is normalised first (GPT-2's final LN).
    ``head_bias`` (V,): the initial ``b`` of every slice (default zeros), e.g. the log unigram
    frequencies (``TrainConfig.bias_init``); with it the expected initial cross-entropy is the
    unigram one plus about ``sigma^2 (1 - sum p^2) / 2 <= 1/(2d)`` nats (second order in the
    logit noise of std ``sigma = 1/sqrt(d)``)."""

    def __init__(self, spec: ArchSpec, config: TrainConfig, vocab: int | None,
                 betas: Sequence[float] | None = None, dtype=torch.float32,
                 head_bias: np.ndarray | None = None):
        super().__init__()
        from ..nn.model import SigpropTransformer

        S, nb = config.seeds, (1 if betas is None else len(betas))
        self.spec, self.vocab, self.n_slices = spec, vocab, S * nb
        init_spec = spec if betas is None else replace(spec, beta=1.0, qk_std=None)
        base = SigpropTransformer(init_spec, S, config.seed, dtype=dtype, embeddings=vocab)
        if nb == 1:
            self.body = base
        else:  # repeat the seeds for every beta, then rescale Q/K: std ~ sqrt(beta)
            self.body = SigpropTransformer(spec, S * nb, config.seed, init=None, dtype=dtype,
                                           embeddings=vocab)
            scale = torch.tensor(betas, dtype=torch.float64).clamp_min(0).sqrt()
            scale = scale.repeat_interleave(S).to(dtype)
            with torch.no_grad():
                src = dict(base.named_parameters())
                for name, p in self.body.named_parameters():
                    p.copy_(src[name].repeat(nb, *([1] * (p.dim() - 1))))
                    if name.endswith(("attn.w_q", "attn.w_k")):
                        p.mul_(scale.view(-1, 1, 1))
        self.tie = config.tie and vocab is not None
        if vocab is not None and not self.tie:
            d = spec.d_model  # slice i from seed + i, as the body (independent of S)
            w = torch.stack([torch.randn(d, vocab, dtype=torch.float64, generator=torch.Generator()
                                         .manual_seed(config.seed + i + HEAD_SEED)) / d
                             for i in range(S)])
            self.head_w = nn.Parameter(w.repeat(nb, 1, 1).to(dtype))
        if vocab is not None:
            b0 = torch.zeros(vocab, dtype=dtype) if head_bias is None else \
                torch.as_tensor(np.asarray(head_bias, dtype=np.float64)).to(dtype)
            if b0.shape != (vocab,):
                raise ValueError(f"head_bias must have shape ({vocab},) (got {tuple(b0.shape)})")
            self.head_b = nn.Parameter(b0.expand(S * nb, vocab).clone())
        if config.attention_only:
            for blk in self.body.blocks:
                for p in blk.mlp.parameters():
                    p.requires_grad_(False)
                    p.data.zero_()

    def features(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """Output features (S, B, T, d), or (S, N, d) at the N positions where ``keep``
        (B, T) is True: the last block then runs its attention for every query (keys and
        values need all tokens) but its residual, LN and MLP only at the kept positions,
        which is exact (they act per position) and ~2x cheaper for MLM's 15%."""
        from ..nn.model import normalise

        if keep is None:
            out = self.body(x, return_hidden=False, return_stats=False).output
        else:
            out = self.body._inputs(x)
            for blk in self.body.blocks[:-1]:
                out, _ = blk(out)
            out = _last_block(self.body.blocks[-1], out, keep)
        return normalise(out, self.spec.ln_kind) if self.spec.norm == "pre" else out

    def logits(self, h: Tensor) -> Tensor:
        """(S, N, d) features -> (S, N, V) logits."""
        if self.tie:
            return torch.baddbmm(self.head_b.unsqueeze(1), h,
                                 self.body.tok_emb.transpose(1, 2) / self.spec.d_model)
        return torch.baddbmm(self.head_b.unsqueeze(1), h, self.head_w)


def _last_block(blk, x: Tensor, keep: Tensor) -> Tensor:
    """:class:`sigprop.nn.model.BatchedBlock`'s forward restricted to ``keep`` after the
    attention (same three placements); returns (S, N, d)."""
    sp, ln = blk.spec, blk._ln
    a_att, a_mlp = sp.alpha_attn, sp.alpha_mlp
    if sp.norm == "pre":
        z = (a_att * x + blk.attn(ln(x)).out)[:, keep].unsqueeze(1)
        return (a_mlp * z + blk.mlp(ln(z))).squeeze(1)
    z = (a_att * x + blk.attn(x).out)[:, keep].unsqueeze(1)
    if sp.norm == "post":
        z = ln(z)
        return ln(a_mlp * z + blk.mlp(z)).squeeze(1)
    return (a_mlp * z + blk.mlp(z)).squeeze(1)


def slice_losses(model: TaskModel, task: str, x: Tensor, y: Tensor) -> Tensor:
    """Per-slice mean loss, shape (S,): cross-entropy over labelled positions (labels != -100)
    for token tasks, mean squared error for ``heaviside``."""
    from ..data.collate import IGNORE

    if task == "heaviside":
        h = model.features(x)
        return (h - y.unsqueeze(0)).square().mean(dim=(1, 2, 3))
    keep = y != IGNORE
    logits = model.logits(model.features(x, keep))  # (S, N, V)
    S = logits.shape[0]
    target = y[keep].unsqueeze(0).expand(S, -1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none")
    return ce.view(S, -1).mean(dim=1)
