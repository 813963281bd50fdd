"""mimetic: attention weights drawn so that each head's ``W_Q W_K^T`` is close to
``alpha1 Z1 + beta1 I`` and the layer's ``W_V W_O`` to ``alpha2 Z2 - beta2 I`` (Z with
i.i.d. N(0, 1/d) entries), the structure trained attention layers show (Trockman & Kolter,
ICML 2023; docs/fixes.md). Each target is factorised by its SVD, ``U S V^T = (U S^1/2)
(S^1/2 V^T)``, and the factors cut to the projection's width: per head ``d_head`` columns
for Q/K (rank ``d_head``), the value width for V/O. Defaults alpha1 = beta1 = 0.7, alpha2 =
beta2 = 0.4 (the values a public re-implementation uses and the paper reports for ViTs).
Drawn with its own ``seed``.

Theory: measured only (the identity part correlates each token's score with itself; the REM
assumes independent scores).
"""

from __future__ import annotations

import math

import torch

from .base import Method, Param, register
from .parts import need, weight_of


def _factors(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(left, right)`` with ``A = left @ right^T`` for a batch of square matrices, by their
    SVD in float32 (an initialisation needs no more; ~4x faster than float64: the 48-layer
    BERT's 624 SVDs of 768 x 768 took 2 min in float64, one at a time)."""
    U, S, Vh = torch.linalg.svd(A.float())
    r = S.sqrt().unsqueeze(-2)
    return U * r, Vh.transpose(-1, -2) * r


@register
class Mimetic(Method):
    name = "mimetic"
    params = (Param("alpha1", "noise in W_Q W_K^T", 0.7, lo=0.0, hi=100.0),
              Param("beta1", "identity in W_Q W_K^T", 0.7, lo=-100.0, hi=100.0),
              Param("alpha2", "noise in W_V W_O", 0.4, lo=0.0, hi=100.0),
              Param("beta2", "minus identity in W_V W_O", 0.4, lo=-100.0, hi=100.0),
              Param("seed", "seed of the draws", 0.0, lo=0.0, hi=2.0**31))

    @torch.no_grad()
    def apply(self, model, parts, params, ctx, effect):
        gen = torch.Generator().manual_seed(int(params["seed"]))
        a1, b1, a2, b2 = (params[k] for k in ("alpha1", "beta1", "alpha2", "beta2"))
        for p in parts:
            (tq,), (tk,), (tv,) = need(p, "q", self.name), need(p, "k", self.name), \
                need(p, "v", self.name)
            wq, wk, wv = weight_of(tq), weight_of(tk), weight_of(tv)  # (out, in) views
            d, dh = wq.shape[1], p.head_dim
            eye = torch.eye(d, dtype=torch.float64)
            kv_heads = wk.shape[0] // dh
            z = torch.randn(p.heads + 1, d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
            z[:-1] = a1 * z[:-1] + b1 * eye          # per head: the Q/K targets
            z[-1] = a2 * z[-1] - b2 * eye             # the layer's V/O target
            left, right = _factors(z)
            for h in range(p.heads):
                wq[h * dh:(h + 1) * dh].copy_(left[h, :, :dh].t())
                g = h * kv_heads // p.heads  # grouped K/V heads: the group's first head sets K
                if h == g * p.heads // kv_heads:
                    wk[g * dh:(g + 1) * dh].copy_(right[h, :, :dh].t())
            left, right = left[-1], right[-1]
            width = wv.shape[0]                       # value width (kv heads x d_head)
            wv.copy_(left[:, :width].t())
            wo = weight_of((need(p, "o", self.name), None, 0))  # (d, heads x d_head)
            rep = wo.shape[1] // width                # query heads per value head (GQA)
            for h in range(wo.shape[1] // dh):        # each head reads its group's values
                g = (h // rep) * dh
                wo[:, h * dh:(h + 1) * dh].copy_(right[:, g:g + dh] / rep)
            for t in (tq, tk, tv):
                _zero_bias(t)
        effect.measured_only.append("mimetic: structured Q/K (identity part) is outside the "
                                    "REM's independent scores")
        return [f"W_Q W_K^T ~ {a1:.3g} Z + {b1:.3g} I per head, W_V W_O ~ {a2:.3g} Z - "
                f"{b2:.3g} I (SVD factors, seed {int(params['seed'])})"]


def _zero_bias(t):
    m, sl, _ = t
    b = getattr(m, "bias", None)
    if b is not None:
        (b if sl is None else b.narrow(0, sl[0], sl[1] - sl[0])).zero_()
