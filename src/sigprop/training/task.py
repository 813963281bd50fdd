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

from ..spec import ArchSpec, SpecError

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
                 head_bias: np.ndarray | None = None, alphas: Sequence[float] | None = None):
        super().__init__()
        from ..nn.model import SigpropTransformer

        nb = _groups(betas, alphas)
        S = config.seeds
        self.spec, self.vocab, self.n_slices = spec, vocab, S * nb
        init_spec = spec if betas is None else replace(spec, beta=1.0, qk_std=None)
        base = SigpropTransformer(init_spec, S, config.seed, dtype=dtype, embeddings=vocab)
        if nb == 1 and betas is None:
            self.body = base
        else:  # repeat the seeds for every group, then rescale Q/K: std ~ sqrt(beta)
            self.body = SigpropTransformer(spec, S * nb, config.seed, init=None, dtype=dtype,
                                           embeddings=vocab) if nb > 1 else base
            with torch.no_grad():
                if nb > 1:
                    src = dict(base.named_parameters())
                    for name, p in self.body.named_parameters():
                        p.copy_(src[name].repeat(nb, *([1] * (p.dim() - 1))))
                if betas is not None:
                    scale = torch.tensor(betas, dtype=torch.float64).clamp_min(0).sqrt()
                    scale = scale.repeat_interleave(S).to(dtype)
                    for name, p in self.body.named_parameters():
                        if name.endswith(("attn.w_q", "attn.w_k")):
                            p.mul_(scale.view(-1, 1, 1))
        #: per-slice alpha_attn (slices,) when ``alphas`` is given (group i, seed j at slice
        #: ``i * seeds + j``); not saved in checkpoints (the spec and the grid say it)
        a = None if alphas is None else torch.tensor(
            [float(x) for x in alphas], dtype=dtype).repeat_interleave(S)
        self.register_buffer("slice_alpha", a, persistent=False)
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
        if not config.value_bias:
            for blk in self.body.blocks:
                blk.attn.b_v.requires_grad_(False)
                blk.attn.b_v.data.zero_()
        self.train_alpha = bool(config.train_alpha)
        if self.train_alpha:  # (slices, blocks): 2-D, so AdamW leaves them undecayed
            if spec.parallel:
                raise SpecError("train_alpha", "needs sequential blocks (a parallel block has "
                                               "one residual strength)")
            shape = (S * nb, spec.depth)
            a0 = torch.full(shape, float(spec.alpha_attn), dtype=dtype) if alphas is None \
                else self.slice_alpha[:, None].expand(shape).clone()
            self.alpha_attn = nn.Parameter(a0)
            self.alpha_mlp = nn.Parameter(torch.full(shape, float(spec.alpha_mlp), dtype=dtype))
        #: residual strengths that differ between slices: the blocks run through _block
        self._sliced = self.train_alpha or alphas is not None
        self._attn_specs = [blk.attn.spec for blk in self.body.blocks]
        self.tau: float | None = None

    def set_temperature(self, tau: float) -> None:
        """Multiply every attention layer's logits by ``tau`` (noci22 Eq. 45; the spec's own
        score scaling must be ``none`` or ``tau``, whose parameter ``tau`` replaces)."""
        if tau == self.tau:
            return
        for blk, sp in zip(self.body.blocks, self._attn_specs, strict=True):
            blk.attn.spec = replace(sp, scaling="tau", scaling_param=float(tau))
        self.tau = float(tau)

    def _alphas(self, i: int):
        """Block ``i``'s residual strengths: the spec's floats, or (S, 1, 1, 1) trained ones,
        or the per-slice ``alphas`` (alpha_attn; alpha_mlp stays the spec's)."""
        if self.train_alpha:
            return (self.alpha_attn[:, i].view(-1, 1, 1, 1),
                    self.alpha_mlp[:, i].view(-1, 1, 1, 1))
        if self.slice_alpha is not None:
            return self.slice_alpha.view(-1, 1, 1, 1), self.spec.alpha_mlp
        return self.spec.alpha_attn, self.spec.alpha_mlp

    def trace(self, x: Tensor) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
        """Hidden states (L+1 tensors (S, B, T, d)) and per-block attention statistics, as
        :class:`SigpropTransformer` returns them, with the trained residual strengths."""
        if not self._sliced:
            out = self.body(x, return_hidden=True, return_stats=True)
            return out.hidden, out.stats
        h = self.body._inputs(x)
        hidden, stats = [h], []
        for i, blk in enumerate(self.body.blocks):
            h, st = _block(blk, h, *self._alphas(i), stats=True)
            hidden.append(h)
            stats.append(st)
        return hidden, stats

    def features(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """Output features (S, B, T, d), or (S, N, d) at the N positions where ``keep``
        (B, T) is True: the last block then runs its attention for every query (keys and
        values need all tokens) but its residual, LN and MLP only at the kept positions,
        which is exact (they act per position) and ~2x cheaper for MLM's 15%."""
        from ..nn.model import normalise

        if keep is None and not self._sliced:
            out = self.body(x, return_hidden=False, return_stats=False).output
        else:
            out = self.body._inputs(x)
            last = len(self.body.blocks) - 1
            for i, blk in enumerate(self.body.blocks):
                if i < last and not self._sliced:
                    out, _ = blk(out)
                else:
                    out, _ = _block(blk, out, *self._alphas(i), keep=keep if i == last else None)
        return normalise(out, self.spec.ln_kind) if self.spec.norm == "pre" else out

    def logits(self, h: Tensor) -> Tensor:
        """(S, N, d) features -> (S, N, V) logits."""
        if self.tie:
            return torch.baddbmm(self.head_b.unsqueeze(1), h,
                                 self.body.tok_emb.transpose(1, 2) / self.spec.d_model)
        return torch.baddbmm(self.head_b.unsqueeze(1), h, self.head_w)


def _groups(betas: Sequence[float] | None, alphas: Sequence[float] | None) -> int:
    """Number of slice groups: ``betas`` and ``alphas`` (when both are given, of equal
    length: group ``i`` is the point ``(alphas[i], betas[i])``)."""
    if betas is not None and alphas is not None and len(betas) != len(alphas):
        raise ValueError(f"betas and alphas pair up point by point: give as many of each "
                         f"(got {len(betas)} and {len(alphas)})")
    for name, v in (("betas", betas), ("alphas", alphas)):
        if v is not None and len(v) == 0:
            raise ValueError(f"{name} must not be empty")
    return len(betas) if betas is not None else (len(alphas) if alphas is not None else 1)


def _block(blk, x: Tensor, a_att, a_mlp, keep: Tensor | None = None, stats: bool = False):
    """:class:`sigprop.nn.model.BatchedBlock`'s forward (all four placements) with residual
    strengths ``a_att``, ``a_mlp`` (floats or (S, 1, 1, 1) tensors). ``keep`` (B, T): after
    the attention only the kept positions go on, returned as (S, N, d). Returns ``(x, stats)``
    (the attention's row statistics when ``stats``)."""
    from ..nn.model import skip

    sp, ln = blk.spec, blk._ln
    sel = (lambda z: z) if keep is None else (lambda z: z[:, keep].unsqueeze(1))
    if sp.parallel:
        h = ln(x) if sp.norm == "pre" else x
        att = blk.attn(h, return_stats=stats)
        z = sel(skip(x, att.out, a_att)) + blk.mlp(sel(h))
        z = ln(z) if sp.norm == "post" else z
    elif sp.norm == "pre":
        att = blk.attn(ln(x), return_stats=stats)
        z = sel(skip(x, att.out, a_att))
        z = skip(z, blk.mlp(ln(z)), a_mlp)
    else:
        att = blk.attn(x, return_stats=stats)
        z = sel(skip(x, att.out, a_att))
        if sp.norm == "post":
            z = ln(z)
            z = ln(skip(z, blk.mlp(z), a_mlp))
        else:
            z = skip(z, blk.mlp(z), a_mlp)
    return (z if keep is None else z.squeeze(1)), att.stats


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
