"""Lower bounds on attention entropy from the weights and the inputs (docs/fixes.md, "bounds").

Zhai et al. (ICML 2023, Thm 3.1): a head whose logits are ``Z = X W X^T`` (``W = W_Q W_K^T``
times the score scale; biases folded in by appending a constant 1 to each input) has, in
every row, an attention entropy of at least

    ``H_min(n, s) = log(1 + (n - 1) b) + s sqrt(n (n - 1)) b / (1 + (n - 1) b)``,
    ``b = exp(-s sqrt(n / (n - 1)))``, ``s = ||W||_2 ||X X^T||_2``

for ``n`` visible keys. Why, in our words: a row of ``Z`` has Euclidean norm at most
``||Z||_2 <= s``, so its centred logits do too; among logit vectors of a given centred norm
the entropy is lowest for one spike against ``n - 1`` equal values, whose gap is
``s sqrt(n/(n-1))``; that spike's entropy is ``H_min``. (Capping the logits, as soft-capping
does, only shortens the vector: the bound still holds.)

The bound needs logits of the form ``X W X^T``: rotary embeddings (a rotation between q and k
that depends on the positions), q/k norms and additive position biases break it, and those
heads get NaN. Each row's bound is normalised by ``log n`` and averaged over the rows with at
least two keys, as :func:`.observables.entropy` normalises the measured entropy, so the two
compare directly (every row's bound is below its entropy, hence so is the average).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .probe_sites import AttentionSite

__all__ = ["BoundRecorder", "entropy_floor", "head_bounds", "rope_free"]


def entropy_floor(n, s) -> np.ndarray:
    """``H_min(n, s)`` in nats (module docstring), vectorised, float64; ``n >= 2`` keys,
    ``s >= 0``. Computed in log space: no overflow at any ``s``."""
    n = np.asarray(n, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    gap = s * np.sqrt(n / (n - 1.0))
    lb = np.log(n - 1.0) - gap                 # log((n - 1) b)
    head = np.logaddexp(0.0, lb)               # log(1 + (n - 1) b)
    return head + np.exp(lb - head) * gap


def _weight_rows(mod: nn.Module, sl, head: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W (d, dh), b (dh,)) of one head's projection: x -> x W + b."""
    w = mod.weight
    conv = type(mod).__name__ == "Conv1D"  # GPT-2 stores (in, out)
    if conv:
        w = w if sl is None else w[:, sl[0]:sl[1]]
        w = w[:, head]
    else:
        w = (w if sl is None else w[sl[0]:sl[1]])[head].t()
    b = getattr(mod, "bias", None)
    if b is not None:
        b = (b if sl is None else b[sl[0]:sl[1]])[head]
    return w.detach().double(), None if b is None else b.detach().double()


def _augmented(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``[W; b]`` (d + 1, dh): the projection of ``[x, 1]``."""
    row = torch.zeros(1, w.shape[1], dtype=w.dtype) if b is None else b[None]
    return torch.cat([w, row], dim=0)


def _qk_targets(site: AttentionSite):
    """((W_Q module, out slice), (W_K module, out slice)) or None (interleaved heads)."""
    if site.fused is None:
        return (site.q, None), (site.k, None)
    if site.fused != "concat":
        return None
    nq, nk = site.n_heads * site.head_dim, site.n_kv_heads * site.head_dim
    return (site.q, (0, nq)), (site.q, (nq, nq + nk))


def _head_norms(site: AttentionSite, key_bias: bool = True) -> np.ndarray | None:
    """Per head ``||W_Q^h W_K^h^T||_2`` times the score scale, biases folded in (module
    docstring), from the two (d_head x d_head) Gram matrices of the (d + 1, d_head) maps
    (cheaper than their QR; the 1e-9 covers the eigen-solvers' roundoff)."""
    tg = _qk_targets(site)
    if tg is None:
        return None
    H, dh = site.n_heads, site.head_dim
    rep = max(H // max(site.n_kv_heads, 1), 1)
    qa = torch.stack([_augmented(*_weight_rows(*tg[0], slice(h * dh, (h + 1) * dh)))
                      for h in range(H)])
    ka = torch.stack([_augmented(*_weight_rows(*tg[1], slice((h // rep) * dh,
                                                               (h // rep + 1) * dh)))
                      for h in range(H)])
    if not key_bias:  # centred keys: the key bias adds the same logit to a whole row
        ka = ka[:, :-1]
    # ||A B^T||_2^2 = top eigenvalue of Gb^1/2 Ga Gb^1/2 (G = the d_head x d_head Grams)
    ga, gb = qa.transpose(1, 2) @ qa, ka.transpose(1, 2) @ ka
    w, v = torch.linalg.eigh(gb)
    half = (v * w.clamp_min(0).sqrt().unsqueeze(-2)) @ v.transpose(1, 2)
    top = torch.linalg.eigvalsh(half @ ga @ half)[:, -1].clamp_min(0)
    return top.sqrt().numpy() * (1.0 + 1e-9) * site.scale


def _top(x: torch.Tensor) -> np.ndarray:
    """Per sequence the largest eigenvalue of the smaller Gram matrix of ``x`` (B, T, d):
    Lanczos (:func:`.observables.top_eigenvalue`; a full ``eigvalsh`` of bert-base's 512 x
    512 Grams made ``diagnose`` 1.5x slower), the exact solve where it does not converge."""
    from ._threads import cpu_settings
    from .observables import top_eigenvalue

    x = x.float()  # the Gram in float32 on every thread, its top eigenvalue in float64
    g = x.transpose(1, 2) @ x if x.shape[-1] < x.shape[-2] else x @ x.transpose(1, 2)
    with cpu_settings(threads=1):
        top = top_eigenvalue(g.double()) * (1.0 + 1e-5)  # float32 Gram: a safe upper side
    bad = torch.isnan(top)
    if bool(bad.any()):
        top[bad] = torch.linalg.eigvalsh(g[bad].double())[:, -1] * (1.0 + 1e-5)
    return top.numpy()


def _augment(x: torch.Tensor) -> torch.Tensor:
    """``[x, 1]`` in float64: the input of the projections with biases folded in."""
    B, T, _ = x.shape
    return torch.cat([x.double(), torch.ones(B, T, 1, dtype=torch.float64)], dim=-1)


def _centre(x: torch.Tensor) -> torch.Tensor:
    return x.double() - x.double().mean(dim=1, keepdim=True)


@torch.no_grad()
def head_bounds(site: AttentionSite, x: torch.Tensor, causal: bool, tops=None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per head, Zhai et al.'s normalised entropy floor for the attention inputs ``x``
    (B, T, d) and our centred refinement of it (mean over sequences; NaN for every head when
    the site has q/k norms or interleaved fused heads).

    The refinement: softmax ignores a constant added to a row, so a row's centred logits are
    ``x_i W (x_j - mean_k x_k)`` over its keys, of norm at most ``||x_i|| ||W_Q W_K^T||_2
    ||X_c||_2`` with ``X_c`` the keys minus their mean (a causal row's keys are a subset: its
    own centring can only shorten them). ``||X X^T||_2`` of Zhai et al.'s statement carries
    the tokens' shared direction, ~``rho T d``, which ``X_c`` drops."""
    H = site.n_heads
    sw = None if site.q_post is not None else _head_norms(site)
    if sw is None:
        return np.full(H, np.nan), np.full(H, np.nan)
    sc = _head_norms(site, key_bias=False)
    B, T, _ = x.shape
    xa = _augment(x)
    # ||X X^T||_2 and ||X_c||_2^2 per sequence (``tops``: computed for many layers at once)
    sx, sc2 = tops if tops is not None else (_top(xa), _top(_centre(x)))
    sc_x = np.sqrt(np.maximum(sc2, 0.0))
    rows = xa.norm(dim=-1).numpy()                                      # (B, T) ||x_i||
    n = (np.arange(1, T + 1) if causal else np.full(T, T)).astype(np.float64)
    keep = n >= 2
    n = n[keep]
    zhai = entropy_floor(n[None, None, :], sw[:, None, None] * sx[None, :, None])
    s_row = sc[:, None, None] * (sc_x[:, None] * rows[:, keep])[None]   # (H, B, T')
    centred = entropy_floor(n[None, None, :], s_row)
    norm = np.log(n)[None, None, :]
    return (zhai / norm).mean(axis=(1, 2)), (centred / norm).mean(axis=(1, 2))


class BoundRecorder:
    """Records each block's attention input (the input of its W_Q) during one forward pass
    and turns it into per-head entropy floors: ``with BoundRecorder(sites, causal) as r:
    model(...)``, then ``r.bounds()`` -> per block ``(zhai, centred)`` arrays over heads
    (None where the block has no site; :func:`head_bounds`). Use only on models whose
    logits are ``X W X^T`` (:func:`rope_free`)."""

    def __init__(self, sites, causal: bool):
        self.sites, self.causal = list(sites), causal
        self.inputs: list[torch.Tensor | None] = [None] * len(self.sites)
        self._handles = []

    def __enter__(self):
        for i, site in enumerate(self.sites):
            if site is None:
                continue

            def grab(_m, args, i=i):
                if self.inputs[i] is None and args and torch.is_tensor(args[0]):
                    self.inputs[i] = args[0].detach()
            self._handles.append(site.q.register_forward_pre_hook(grab))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def bounds(self) -> list[tuple[np.ndarray, np.ndarray] | None]:
        idx = [i for i, (s, x) in enumerate(zip(self.sites, self.inputs, strict=True))
               if s is not None and x is not None]
        out: list = [None] * len(self.sites)
        if not idx:
            return out
        for i in idx:  # (one batch over the layers measured slower: 2.0x against 1.8x the
            out[i] = head_bounds(self.sites[i], self.inputs[i], self.causal)  # bare run)
        return out


def rope_free(module: nn.Module) -> bool:
    """True unless the model applies rotary embeddings or a position bias inside attention
    (``position_embeddings`` passed to the module, or a relative-position / ALiBi table)."""
    cfg = getattr(module, "config", None)
    if cfg is not None and (getattr(cfg, "rope_theta", None) is not None
                            or getattr(cfg, "rope_parameters", None)
                            or getattr(cfg, "position_embedding_type", "absolute")
                            not in ("absolute", None)
                            or getattr(cfg, "alibi", False)):
        return False
    return not any("rotary" in n or "relative_attention_bias" in n
                   for n, _ in module.named_modules())

