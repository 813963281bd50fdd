"""Attention probabilities recomputed from captured Q/K, and the per-head statistics of
probability maps: the part of :class:`~sigprop.measurement.probe.Probe` that works on attention
maps (a mixin reading the probe's settings ``dtype``, ``rope``, ``spectral``, ``keep_probs``,
``model_has_rope`` and writing ``info``).

``softmax(q k^T * scale + mask)``: grouped-query KV heads are repeated as HF ``repeat_kv``
does; mask: the module's ``attention_mask`` argument (bool or 0/1 integer "visible", or
additive float) and a causal triangle when its ``is_causal`` (or ``causal=``) holds.
``T x Tk`` maps are formed in chunks of heads and reduced at once.

RoPE: ``position_embeddings = (cos, sin)`` received by the attention module (HF LLaMA family,
GPT-NeoX) are applied in HF's ``rotate_half`` convention (partial rotary on the first
``cos.shape[-1]`` dims), making the recomputation exact. A model with a rotary module whose
attention gets no ``(cos, sin)`` is recomputed without RoPE and flagged (``info["rope"] ==
"missing"``, ``info["approximate"]``); so is an ``alibi`` / ``position_bias`` argument (BLOOM,
T5), which is not added (``info["bias"] == "missing"``).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from . import observables as obs
from .probe_sites import AttentionSite


def _heads(t: torch.Tensor, n: int, dh: int) -> torch.Tensor:
    """(..., T, n*dh) or (..., T, n, dh) -> (..., n, T, dh)."""
    if not (t.ndim >= 4 and tuple(t.shape[-2:]) == (n, dh)):
        t = t.unflatten(-1, (n, dh))
    return t.movedim(-2, -3)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF ``apply_rotary_pos_emb`` (rotate-half convention) on the first ``cos.shape[-1]`` dims."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((xr * cos + rotated * sin, rest), dim=-1)


def _score_rms(sc: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Per head: the root mean square of the logits ``q.k * scale`` over visible pairs of
    distinct tokens, before any position bias -- the measured score std sigma_s
    (docs/theory.md §2.1: for inputs with q = 1 its expectation over the weights is sigma_s
    whatever the tokens' cosine)."""
    T, Tk = sc.shape[-2], sc.shape[-1]
    keep = torch.ones(T, Tk, dtype=torch.bool, device=sc.device)
    if T == Tk:
        keep &= ~torch.eye(T, dtype=torch.bool, device=sc.device)
    if allowed is not None:
        keep = keep & allowed
    w = keep.to(sc.dtype)
    n = w.sum((-1, -2)).clamp_min(1.0)
    return ((sc * sc) * w).sum((-1, -2)).div(n).sqrt()


class _RecomputeMixin:
    """Masks, statistics and recomputation of attention probabilities (methods of ``Probe``)."""

    def _mask(self, s, mask, T, Tk, device):
        """(allowed bool (..., T, Tk) or None, additive finite bias or None)."""
        allowed, bias = None, None
        if s.causal:
            allowed = torch.ones(T, Tk, dtype=torch.bool, device=device).tril(Tk - T)
        if torch.is_tensor(mask) and mask.ndim >= 2:
            mask = mask[..., -T:, :Tk] if mask.shape[-2] >= T else mask[..., :Tk]
            if mask.dtype == torch.bool:
                vis = mask
            elif not mask.dtype.is_floating_point:  # 0/1 integer mask (DeBERTa-v2)
                vis = mask != 0
            else:
                vis = mask > torch.finfo(mask.dtype).min / 2
                bias = mask.to(self.dtype).masked_fill(~vis, 0.0)
                bias = None if not bias.any() else bias
            allowed = vis if allowed is None else allowed & vis
        return allowed, bias

    def _stats(self, A, logp, allowed):
        out = {"ipr": obs.ipr(A), "ipr_cross": obs.ipr_cross(A), "wmax": obs.wmax(A)}
        keys = None if allowed is None else allowed.sum(-1)
        if logp is None:
            out["entropy"] = obs.entropy(A, n_keys=keys)
        else:
            h = obs.row_entropy_from_log_probs(logp, allowed)
            if keys is None:
                keys = torch.full(A.shape[-2:-1], A.shape[-1], device=A.device)
            out["entropy"] = obs.normalised_row_mean(h, keys)
        if self.spectral:
            out["gap"], out["s2_sqrtT"] = obs.gap(A)
        if self.keep_probs:
            out["_probs"] = A.float()
        return out

    def _recompute(self, i, s: AttentionSite, pend, scores_only: bool = False):
        """Statistics of ``softmax(q k^T scale + mask)`` from the captured q, k;
        ``scores_only``: just the per-head score RMS ``sigma_s`` (no softmax)."""
        q = _heads(pend["q"].detach().to(self.dtype), s.n_heads, s.head_dim)
        k = _heads(pend["k"].detach().to(self.dtype), s.n_kv_heads, s.head_dim)
        pos, rope = pend.get("pos"), "none"
        if self.rope and isinstance(pos, tuple | list) and len(pos) == 2:
            cos, sin = (t.detach().to(self.dtype).unsqueeze(-3) for t in pos)
            q, k, rope = _rope(q, cos, sin), _rope(k, cos, sin), "applied"
        elif self.model_has_rope:
            rope = "missing"
        if s.n_kv_heads != s.n_heads:
            k = k.repeat_interleave(s.n_heads // s.n_kv_heads, dim=-3)
        T, Tk = q.shape[-2], k.shape[-2]
        allowed, bias = self._mask(s, pend.get("mask"), T, Tk, q.device)
        lead = q[..., 0, 0, 0].numel()
        chunk = max(1, 2**24 // max(1, lead * T * Tk))
        parts = defaultdict(list)
        for h0 in range(0, s.n_heads, chunk):
            sc = q[..., h0:h0 + chunk, :, :] @ k[..., h0:h0 + chunk, :, :].transpose(-1, -2)
            sc = sc * s.scale
            parts["sigma_s"].append(_score_rms(sc, allowed))
            if scores_only:
                continue
            if bias is not None:
                sc = sc + bias
            if allowed is not None:  # finfo.min as HF eager: a fully masked row stays finite
                sc = sc.masked_fill(~allowed, torch.finfo(sc.dtype).min)
            logp = torch.log_softmax(sc, dim=-1)
            for key, v in self._stats(logp.exp(), logp, allowed).items():
                parts[key].append(v)
        if scores_only:
            return {"sigma_s": torch.cat(parts["sigma_s"], dim=-1)}
        bias_missing = bool(pend.get("bias"))
        self.info[i].update(source="recomputed", rope=rope, bias="missing" if bias_missing
                            else None, approximate=rope == "missing" or bias_missing)
        return {key: torch.cat(v, dim=-3 if key == "_probs" else -1) for key, v in parts.items()}
