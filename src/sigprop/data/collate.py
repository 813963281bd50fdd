"""Batches for language-model training: windows of a token stream, BERT's MLM masking and
causal-LM shifting (gg25 A.1: masking probability 0.15).

All randomness comes from a ``torch.Generator`` passed in, so a run is reproducible.
"""

from __future__ import annotations

import numpy as np
import torch

IGNORE = -100  #: label of positions that do not count in the loss (torch's cross_entropy)
N_SPECIAL = 5  #: ids 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK] (data.tokenizer.SPECIAL_TOKENS)


def _starts(n_tokens: int, width: int, count: int, gen: torch.Generator | None) -> torch.Tensor:
    if n_tokens < width:
        raise ValueError(f"the corpus has {n_tokens} tokens, fewer than one window of {width}; "
                         "use more documents or a shorter --seq-len")
    if gen is None:  # consecutive, non-overlapping windows (evaluation)
        count = min(count, n_tokens // width)
        return torch.arange(count) * width
    return torch.randint(0, n_tokens - width + 1, (count,), generator=gen)


def lm_windows(stream: np.ndarray, count: int, seq_len: int, *, cls_id: int | None,
               gen: torch.Generator | None, extra: int = 0) -> torch.Tensor:
    """``(count, seq_len + extra)`` windows of the stream at random offsets (``gen``) or
    consecutive ones (``gen=None``, at most as many as fit). With ``cls_id`` the first column
    is ``[CLS]`` followed by ``seq_len - 1`` stream tokens (BERT's input layout)."""
    body = seq_len - (cls_id is not None) + extra
    s = torch.from_numpy(np.ascontiguousarray(stream))
    starts = _starts(len(s), body, count, gen)
    w = s[starts[:, None] + torch.arange(body)]
    if cls_id is not None:
        w = torch.cat([torch.full((len(w), 1), cls_id, dtype=w.dtype), w], dim=1)
    return w


def mlm_mask(ids: torch.Tensor, vocab_size: int, gen: torch.Generator, *, prob: float = 0.15,
             n_special: int = N_SPECIAL, mask_id: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking: each non-special token is chosen with probability ``prob``; a chosen
    token becomes ``[MASK]`` (80%), a random non-special token (10%) or stays (10%).
    Returns ``(inputs, labels)`` with labels = the original id at chosen positions and
    :data:`IGNORE` elsewhere. A batch in which no token was chosen (short sequences, e.g.
    T = 2) gets each sequence's lowest-draw token chosen instead, so its loss is defined;
    batches with a chosen token are untouched."""
    if not 0 < prob < 1:
        raise ValueError(f"masking probability must be in (0, 1) (got {prob})")
    u = torch.rand(ids.shape, generator=gen)
    how = torch.rand(ids.shape, generator=gen)
    rnd = torch.randint(n_special, vocab_size, ids.shape, generator=gen, dtype=ids.dtype)
    chosen = (u < prob) & (ids >= n_special)
    if not bool(chosen.any()):
        eligible = ids >= n_special
        first = torch.where(eligible, u, torch.full_like(u, 2.0)).argmin(dim=-1, keepdim=True)
        chosen = torch.zeros_like(chosen).scatter_(-1, first, True) & eligible
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    inputs = torch.where(chosen & (how < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (how >= 0.8) & (how < 0.9), rnd, inputs)
    return inputs, labels


def clm_pair(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal-LM ``(inputs, labels)`` from windows of ``T + 1`` tokens: labels are the next
    token of every input position."""
    return windows[:, :-1], windows[:, 1:]


def unigram_logp(train: np.ndarray, vocab_size: int) -> np.ndarray:
    """Log-probabilities (V,) of the add-one smoothed unigram distribution of the training
    stream: the context-free predictor of :func:`unigram_loss`, and the readout bias of
    :mod:`sigprop.training.loop` with ``bias_init="unigram"``."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    return np.log(counts / counts.sum())


def unigram_loss(train: np.ndarray, labels: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats) of the non-ignored ``labels`` under the unigram distribution of the
    training stream (add-one smoothed): the loss of a model that predicts token frequencies
    and ignores the context (the learned / stuck baseline of :mod:`sigprop.training.loop`)."""
    return label_nll(unigram_logp(train, vocab_size), labels)


def label_nll(logp: np.ndarray, labels: torch.Tensor) -> float:
    """Mean negative log-probability (nats) of the non-ignored ``labels`` under the fixed
    distribution ``logp`` (V,)."""
    lab = labels[labels != IGNORE].numpy()
    if lab.size == 0:
        raise ValueError("no labelled positions")
    return float(-logp[lab].mean())
