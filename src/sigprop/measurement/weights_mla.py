"""Multi-head latent attention (DeepSeek-V2/V3's MLA, docs/theory.md §2.4.5) for the weight
reader (:mod:`.weights`): finding the module from its projections and config
(:func:`find_mla`) and its per-head score stds and value norms from its low-rank maps
(:func:`mla_scores`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .probe_sites import AttentionSite
from .weight_maps import is_norm, matrix, norm_gains, norm_width


@dataclass
class MLASite(AttentionSite):
    """A multi-head latent attention module (DeepSeek-V2/V3's MLA, docs/theory.md §2.4.5), in
    :class:`AttentionSite`'s terms for the reader's call-order logic: ``q`` the query map
    reading the model width (the low-rank ``q_a`` map, or the full query map where there is
    no query rank), ``k`` the joint ``[latent | k_rope]`` down-projection, ``v`` the latent's
    up-projection to per-head ``[k_nope | v]``, ``head_dim`` the query / key width
    ``nope + rope`` (the canonical logit scale is ``1/sqrt(nope + rope)``), ``n_kv_heads ==
    n_heads`` (the up-projection is per head). The rest is MLA's own."""

    q_b: nn.Module | None = None  # the query up-projection (None: no query rank)
    q_norm: nn.Module | None = None  # the RMSNorm between the query maps
    kv_norm: nn.Module | None = None  # the RMSNorm of the key / value latent
    o: nn.Module | None = None  # the output projection (H v_head_dim -> width)
    nope: int = 0  # qk_nope_head_dim
    rope: int = 0  # qk_rope_head_dim
    v_head_dim: int = 0
    q_rank: int | None = None  # q_lora_rank
    kv_rank: int = 0  # kv_lora_rank


def _int_attr(srcs, name: str, lo: int = 1) -> int | None:
    for o in srcs:
        v = getattr(o, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= lo:
            return int(v)
    return None


def _has_attr(srcs, name: str) -> bool:
    return any(o is not None and hasattr(o, name) for o in srcs)


def find_mla(block: nn.Module, prefix: str = "") -> MLASite | None:
    """The first module of ``block`` that is a multi-head latent attention: it (or its
    ``config``) states ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
    ``v_head_dim``, a head count and ``q_lora_rank`` (an int, or None: a full query map), and
    its own linear maps have the shapes these fix (the down-projection ``width -> kv_rank +
    rope``, the up-projection ``kv_rank -> H (nope + v)``, the query maps, the output ``H v ->
    width``; a name saying ``kv`` or ``q`` settles a tie between equal shapes), with one
    normalisation of the latent's width (and one of the query rank's). None where there is
    none. Nothing here names a model class: the projections and the config say what it is."""
    for name, m in block.named_modules():
        srcs = [m, getattr(m, "config", None)]
        r = _int_attr(srcs, "kv_lora_rank")
        rope = _int_attr(srcs, "qk_rope_head_dim")
        nope = _int_attr(srcs, "qk_nope_head_dim", lo=0)
        dv = _int_attr(srcs, "v_head_dim")
        H = _int_attr(srcs, "num_heads") or _int_attr(srcs, "num_attention_heads")
        if None in (r, rope, nope, dv, H) or not _has_attr(srcs, "q_lora_rank"):
            continue
        rq = _int_attr(srcs, "q_lora_rank")
        lin = [(n, c, matrix(c)[0].shape) for n, c in m.named_children()
               if matrix(c) is not None]

        def pick(out_f, in_f, hint, lin=lin):  # the map of this shape, a named one first
            got = [(n, c) for n, c, (o, i) in lin if o == out_f and i == in_f]
            got.sort(key=lambda nc: hint not in nc[0].lower())
            return got[0][1] if got else None

        dqk = nope + rope
        outs = sorted(((n, c) for n, c, (_, i) in lin if i == H * dv),
                      key=lambda x: not x[0].lower().startswith("o"))
        if not outs:
            continue
        o = outs[0][1]
        d = matrix(o)[0].shape[0]
        kv_a, kv_b = pick(r + rope, d, "kv"), pick(H * (nope + dv), r, "kv")
        if rq is not None:
            q, q_b = pick(rq, d, "q"), pick(H * dqk, rq, "q")
        else:
            q, q_b = pick(H * dqk, d, "q"), None
        if None in (kv_a, kv_b, q) or q is kv_a or q_b is kv_b or (rq is not None
                                                                   and q_b is None):
            continue
        norms = [(n, c) for n, c in m.named_children() if is_norm(c)]
        kv_norm = sorted((x for x in norms if norm_width(x[1]) == r),
                         key=lambda x: "kv" not in x[0].lower())
        q_norm = sorted((x for x in norms if norm_width(x[1]) == rq and x not in kv_norm[:1]),
                        key=lambda x: "q" not in x[0].lower()) if rq is not None else []
        if not kv_norm or (rq is not None and not q_norm):
            continue
        scale = getattr(m, "scaling", None)
        scale = float(scale) if isinstance(scale, float | int) and scale > 0 else dqk ** -0.5
        return MLASite(m, q, kv_a, kv_b, H, H, dqk, scale, bool(getattr(m, "is_causal", False)),
                       name=f"{prefix}.{name}".strip("."), q_b=q_b,
                       q_norm=q_norm[0][1] if q_norm else None, kv_norm=kv_norm[0][1], o=o,
                       nope=nope, rope=rope, v_head_dim=dv, q_rank=rq, kv_rank=r)
    return None


def mla_scores(s: MLASite, G: torch.Tensor):
    """``(sigma_s per head, |V_h G|_F^2 per head, value bias or None)`` of a multi-head
    latent attention (docs/theory.md §2.4.5). Each RMSNorm inside is a constant divisor
    (its output's RMS concentrates, relative spread ~sqrt(2 / rank)): the latent ``z =
    g * (A x + b) / rho`` with ``rho^2 = (|A G|_F^2 + |b|^2) / rank`` its mean square
    over isotropic inputs with q = 1. Then head h's query ``Q_h x + b_h`` and key ``K_h
    x``, ``K_h = [U_h^nope A_kv / rho_kv ; W_rope]`` (the rope rows shared by all heads,
    their bias cancelling in the softmax as a key bias does), are linear, and
    ``sigma_s,h^2 = (|G Q_h^T K_h G|_F^2 + b_h^T K_h G^2 K_h^T b_h) / (nope + rope)``,
    formed from ``(nope + rope)``-square Gram matrices through the latents (never a
    width-square one); RoPE is left out as in
    :meth:`.weights.WeightReader._scores`."""
    H, nope, rope, dv, r = s.n_heads, s.nope, s.rope, s.v_head_dim, s.kv_rank
    G2 = G.square()

    def f64(t):
        return None if t is None else t.to(torch.float64).cpu()

    def gains(norm, width):
        g = None if norm is None else norm_gains(norm, width)
        return torch.ones(width, dtype=torch.float64) if g is None else torch.as_tensor(g)

    def latent(W, b, norm):  # (D g / rho: up-projection column scales, A G^2 A^T, b)
        width = W.shape[0]
        rho2 = (float((W.square() * G2).sum()) + (0.0 if b is None else float(b.square()
                                                                               .sum())))
        rho2 /= width
        return gains(norm, width) / math.sqrt(max(rho2, 1e-300)), (W * G2) @ W.T

    Wa, ba = (f64(t) for t in matrix(s.k))
    Wlat, blat, Wpe = Wa[:r], None if ba is None else ba[:r], Wa[r:]
    col, Mkv = latent(Wlat, blat, s.kv_norm)
    Wb, bb = (f64(t) for t in matrix(s.v))
    U = (Wb * col).unflatten(0, (H, nope + dv))  # (H, nope + v, r)
    Uk, Uv = U[:, :nope], U[:, nope:]
    # the keys' Gram per head: [[nope-nope, nope-rope], [rope-nope, rope-rope]]
    C = (Wlat * G2) @ Wpe.T  # (r, rope)
    kk_nn = Uk @ Mkv @ Uk.transpose(-1, -2)
    kk_nr = Uk @ C
    kk_rr = ((Wpe * G2) @ Wpe.T).expand(H, rope, rope)
    KK = torch.cat([torch.cat([kk_nn, kk_nr], -1),
                    torch.cat([kk_nr.transpose(-1, -2), kk_rr], -1)], -2)
    Wq, bq = (f64(t) for t in matrix(s.q))
    if s.q_b is not None:  # x -> q_a -> RMSNorm -> q_b
        qcol, Mq = latent(Wq, bq, s.q_norm)
        Wqb, bqb = (f64(t) for t in matrix(s.q_b))
        P = (Wqb * qcol).unflatten(0, (H, nope + rope))  # (H, nope + rope, q_rank)
        QQ = P @ Mq @ P.transpose(-1, -2)
        bqh = None if bq is None else P @ bq
        if bqb is not None:
            bqb = bqb.unflatten(0, (H, nope + rope))
            bqh = bqb if bqh is None else bqh + bqb
    else:  # one query map of the width
        A = (Wq * G).unflatten(0, (H, nope + rope))
        QQ = A @ A.transpose(-1, -2)
        bqh = None if bq is None else bq.unflatten(0, (H, nope + rope))
    fro = (QQ * KK).sum((-1, -2))
    if bqh is not None:
        fro = fro + torch.einsum("hi,hij,hj->h", bqh, KK, bqh)
    sig = np.sqrt(np.maximum(fro.numpy(), 0.0) / (nope + rope))
    vn = torch.einsum("hir,rs,his->h", Uv, Mkv, Uv)  # |U_h^v A_kv G|_F^2 / rho^2
    bv = None if blat is None else (Uv @ blat).flatten()
    if bb is not None:
        bbv = bb.unflatten(0, (H, nope + dv))[:, nope:].flatten()
        bv = bbv if bv is None else bv + bbv
    return sig, vn, bv
