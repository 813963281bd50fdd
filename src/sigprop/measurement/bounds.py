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
from .threads import cpu_settings

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


def _head_maps(mod: nn.Module, sl, heads: int, dh: int) -> torch.Tensor:
    """(heads, dh, d + 1) float64: per head the rows of the projection ``[x, 1] -> x W + b``
    of ``mod`` restricted to output features ``sl`` (None: all), heads contiguous, the bias
    as the last column (zero without a bias)."""
    w = mod.weight.detach().cpu()  # small float64 solves: on the CPU wherever the model runs
    if type(mod).__name__ == "Conv1D":  # GPT-2's Conv1D stores (in, out), Linear (out, in)
        w = w.t()
    if sl is not None:
        w = w[sl[0]:sl[1]]
    b = getattr(mod, "bias", None)
    if b is None:
        b = torch.zeros(w.shape[0], dtype=w.dtype)
    else:
        b = (b.detach() if sl is None else b.detach()[sl[0]:sl[1]]).cpu()
    wa = torch.cat([w, b[:, None]], dim=1).double()             # (heads * dh, d + 1)
    return wa.reshape(heads, dh, wa.shape[1])


def _qk_targets(site: AttentionSite):
    """((W_Q module, out slice), (W_K module, out slice)) or None (interleaved heads)."""
    if site.fused is None:
        return (site.q, None), (site.k, None)
    if site.fused != "concat":
        return None
    nq, nk = site.n_heads * site.head_dim, site.n_kv_heads * site.head_dim
    return (site.q, (0, nq)), (site.q, (nq, nq + nk))


def _head_norms(site: AttentionSite) -> tuple[np.ndarray, np.ndarray] | None:
    """Per head ``||W_Q^h W_K^h^T||_2`` times the score scale, biases folded in (module
    docstring), with and without the key bias (centred keys: the key bias adds the same logit
    to a whole row). With ``A``, ``B`` the (d_head, d + 1) maps of a head, the logit map is
    ``A^T B`` and ``||A^T B||_2^2`` is the top eigenvalue of ``Ga Gb`` with the d_head x
    d_head Grams ``Ga = A A^T``, ``Gb = B B^T``, taken as that of ``L^T Ga L`` with
    ``Gb = L L^T`` (cheaper than a QR of the maps; the 1e-9 covers the solvers' roundoff,
    ~1e-14); dropping the key bias subtracts its outer product from ``Gb``."""
    tg = _qk_targets(site)
    if tg is None:
        return None
    H, dh = site.n_heads, site.head_dim
    rep = max(H // max(site.n_kv_heads, 1), 1)
    qa = _head_maps(*tg[0], H, dh)
    ka = _head_maps(*tg[1], max(H // rep, 1), dh)
    ka = ka.repeat_interleave(rep, dim=0) if rep > 1 else ka
    ga = qa @ qa.transpose(1, 2)
    gb = ka @ ka.transpose(1, 2)
    kb = ka[..., -1]                                            # the key bias
    gb = torch.cat([gb, gb - kb[:, :, None] * kb[:, None, :]])  # (2H, dh, dh)
    ga = ga.repeat(2, 1, 1)
    with cpu_settings(threads=1):  # small LAPACK calls: threads only cost (observables._lapack)
        # Gb = L L^T: Ga Gb is similar to L^T Ga L (a Cholesky: 1/12 the cost of the
        # eigendecomposition that gives Gb^1/2); a singular Gb (a zero or rank-deficient W_K)
        # fails it and takes Gb^1/2 from eigh
        low, info = torch.linalg.cholesky_ex(gb)
        m = low.transpose(1, 2) @ ga @ low
        bad = info != 0
        if bool(bad.any()):
            w, v = torch.linalg.eigh(gb[bad])
            half = (v * w.clamp_min(0).sqrt().unsqueeze(-2)) @ v.transpose(1, 2)
            m[bad] = half @ ga[bad] @ half
        top = torch.linalg.eigvalsh(m)[:, -1].clamp_min(0)
    top = top.sqrt().numpy() * (1.0 + 1e-9) * site.scale
    return top[:H], top[H:]


def _tops(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sequence of ``x`` (B, T, d): the largest eigenvalue of ``[x, 1][x, 1]^T`` (Zhai et
    al.'s ``||X X^T||_2`` with the biases folded in), that of ``X_c X_c^T`` (the keys minus
    their mean), and the rows' norms ``||[x_i, 1]||`` (B, T).

    One float32 Gram, of ``x - mu`` with the token mean ``mu`` summed in float64 (so the
    tokens' shared direction, ``1/(1 - cos)`` times the rest, is removed before rounding;
    what rounding leaves of it is a constant row, removed exactly by centring the Gram,
    ``P G P``, in float64). The uncentred Gram follows exactly, ``x = X_c + 1 mu^T``: over
    tokens (T <= d) ``G = G_c + u 1^T + 1 u^T + (|mu|^2 + 1) 1 1^T`` with ``u = X_c mu``,
    over channels ``[[G_c + T mu mu^T, T mu], [T mu^T, T]]``. The top eigenvalues by
    Lanczos to 1e-6 relative (:func:`.observables.top_eigenvalue`; a full ``eigvalsh`` of
    bert-base's 512 x 512 Grams made ``diagnose`` 1.5x slower), raised by 1e-4 to stay above
    the exact value (the float32 Gram's rounding: ~sqrt(d) x 6e-8 of ``|x_i| |x_j|`` per
    entry, ~2e-5 of the top eigenvalue by Weyl's inequality for bert-base's isotropic
    centred states); the exact solve where Lanczos does not converge. The row norms
    ``||[x_i, 1]||`` summed in float32 (~1e-7 relative), raised by 1e-6."""
    from .observables import top_eigenvalue

    B, T, d = x.shape
    x = x.float()
    mu = x.double().sum(dim=1) / T  # (B, d); sum(dtype=float64) measured 1.7x slower
    c32 = x - mu.float()[:, None]
    mu2 = (mu * mu).sum(-1)                                    # (B,)
    if T <= d + 1:
        gc = (c32 @ c32.transpose(1, 2)).double()
        gc = gc - gc.mean(dim=1, keepdim=True)
        gc = gc - gc.mean(dim=2, keepdim=True)
        u = (c32 @ mu.float()[:, :, None])[..., 0].double()   # (B, T)
        u = u - u.mean(dim=1, keepdim=True)
        g = gc + u[:, :, None] + u[:, None, :] + (mu2 + 1.0)[:, None, None]
    else:
        gc = (c32.transpose(1, 2) @ c32).double()
        r = c32.sum(dim=1, dtype=torch.float64)                # the rounding's leftover mean
        gc = gc - r[:, :, None] * r[:, None, :] / T
        g = torch.zeros(B, d + 1, d + 1, dtype=torch.float64)
        g[:, :d, :d] = gc + T * mu[:, :, None] * mu[:, None, :]
        g[:, :d, d] = g[:, d, :d] = T * mu
        g[:, d, d] = T
    rows = torch.linalg.vecdot(x, x).double().add(1.0).sqrt().numpy() * (1.0 + 1e-6)
    out = []
    with cpu_settings(threads=1):
        for m in (g, gc):
            top = top_eigenvalue(m, rtol=1e-6) * (1.0 + 1e-4)
            bad = torch.isnan(top)
            if bool(bad.any()):
                top[bad] = torch.linalg.eigvalsh(m[bad])[:, -1] * (1.0 + 1e-4)
            out.append(top.numpy())
    return out[0], out[1], rows


@torch.no_grad()
def head_bounds(site: AttentionSite, x: torch.Tensor, causal: bool
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
    plain = all(torch.is_tensor(getattr(m, "weight", None)) for m in (site.q, site.k))
    norms = None if site.q_post is not None or not plain else _head_norms(site)
    if norms is None:
        return np.full(H, np.nan), np.full(H, np.nan)
    sw, sc = norms
    T = x.shape[1]
    sx, sc2, rows = _tops(x.cpu())  # ||X X^T||_2, ||X_c||_2^2 and the row norms, per sequence
    sc_x = np.sqrt(np.maximum(sc2, 0.0))
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
        # one block at a time (a batch over the blocks measured slower: 2.0x against 1.8x the
        # bare run, its Lanczos steps set by the slowest block)
        return [None if s is None or x is None else self._one(s, x)
                for s, x in zip(self.sites, self.inputs, strict=True)]

    def _one(self, s, x):
        """One block's floors; None where its input is not (B, T, d) tokens (a vision tower
        over flattened patches gives (T, d): one sequence) or the floor cannot be formed."""
        if x.dim() == 2:
            x = x.unsqueeze(0)
        if x.dim() != 3 or x.shape[1] < 2:
            return None
        try:
            return head_bounds(s, x, self.causal)
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            return None


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


def with_bound_rows(heads, bounds):
    """``heads`` plus, per layer and head, rows ``entropy_bound`` (Zhai et al.'s floor) and
    ``entropy_bound_centred`` (its centred refinement), source ``bound``, averaged over the
    recorded seeds (the bounds this module records per draw)."""
    import pandas as pd

    got = [b for b in bounds if b is not None]
    if not got or not len(heads):
        return heads
    rows = []
    for i in range(len(got[0])):
        per = [b[i] for b in got if b[i] is not None]
        for k, name in enumerate(("entropy_bound", "entropy_bound_centred")):
            if not per:
                continue
            val = np.mean(np.stack([p[k] for p in per]), axis=0)
            rows += [{"layer": i + 1, "head": h, "observable": name, "source": "bound",
                      "value": float(v)} for h, v in enumerate(val) if np.isfinite(v)]
    if not rows:
        return heads
    return pd.concat([heads, pd.DataFrame(rows)], ignore_index=True)
