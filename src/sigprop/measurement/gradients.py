"""Query / key / value weight gradients at initialisation (docs/theory.md §1 ``grad_qk``,
``grad_v``).

noci22 §3.3 (Thm 3.2, Eqs. 17-18; docs/theory.md §4): at init, with tokens of correlation rho,
``E||dL/dW_Q||_F^2 ∝ (1 - rho)^2`` while ``E||dL/dW_V||_F^2 ∝ 1 + rho (n - 1)``, so the query and
key gradients vanish under rank collapse; gg25's gradients experiment measures the same norms
per layer. :func:`qkv_grad_norms` returns those squared Frobenius norms for any model whose
Q/K/V weights it can find (the same discovery as :mod:`sigprop.measurement.probe`) or that the
caller names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import trajectory as _traj
from .observables import summarise
from .probe import AttentionSite, Probe, find_attention, first_tensor

__all__ = ["MLMReadoutLoss", "qkv_grad_norms", "grads_to_trajectory"]


class MLMReadoutLoss:
    """Default MLM-style loss for models that output continuous hidden states.

    A fixed random linear readout ``W ~ N(0, 1/d)`` of shape ``(d, vocab_size)`` maps the final
    hidden states ``(..., T, d)`` to logits; a fraction ``mask_prob`` (15%, as BERT) of the
    positions is selected and scored by cross-entropy against uniformly random target ids
    (at least one position is always selected). Readout, positions and targets are drawn from
    a ``torch.Generator`` seeded with ``seed`` the first time a given shape is seen, so repeated
    calls — and two models of the same shape — see the same loss. No tokenizer or vocabulary is
    involved; only the scale and direction of the backpropagated signal matter at init.
    """

    def __init__(self, vocab_size: int = 32, mask_prob: float = 0.15, seed: int = 0):
        if not 0.0 < mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1] (got {mask_prob})")
        self.vocab_size, self.mask_prob, self.seed = vocab_size, mask_prob, seed
        self._cache: dict = {}

    def _draw(self, shape, device):
        key = (tuple(shape), str(device))
        if key not in self._cache:
            g = torch.Generator().manual_seed(self.seed)
            *lead, T, d = shape
            W = torch.randn(d, self.vocab_size, generator=g) / d ** 0.5
            pos = torch.rand(*lead, T, generator=g) < self.mask_prob
            pos.view(-1)[torch.randint(pos.numel(), (1,), generator=g)] = True
            tgt = torch.randint(self.vocab_size, (*lead, T), generator=g)
            self._cache[key] = (W.to(device), pos.to(device), tgt.to(device))
        return self._cache[key]

    def __call__(self, output) -> torch.Tensor:
        """Loss of the hidden states in ``output`` (a tensor, a tuple whose first tensor they
        are, or an object with ``last_hidden_state`` such as an HF base-model output)."""
        h = first_tensor(output)
        W, pos, tgt = self._draw(h.shape, h.device)
        logits = h[pos] @ W.to(h.dtype)
        return F.cross_entropy(logits, tgt[pos])


def _slice(module: nn.Module, grad: torch.Tensor, lo, hi) -> torch.Tensor:
    """Rows lo:hi of the output dimension; a (H, d_H) pair ``lo`` selects the per-head
    interleaved layout ``(H, 3, d_H)`` (GPT-NeoX), piece ``hi`` in {0, 1, 2}."""
    g = grad.T if hasattr(module, "nf") else grad  # HF Conv1D stores (in, out), Linear (out, in)
    if isinstance(lo, tuple):
        H, dh = lo
        return g.unflatten(0, (H, 3 * dh))[:, hi * dh: (hi + 1) * dh]
    return g[lo:hi]


def _auto_weights(model, layers):
    """Per layer {"q"|"k"|"v": (module, lo, hi) or None} from the attention sites."""
    out = []
    for name, block in layers:
        s: AttentionSite | None = find_attention(block, prefix=name)
        if s is None:
            raise ValueError(f"no attention projections found in block {name!r}")
        if s.fused == "per_head":
            hd = (s.n_heads, s.head_dim)
            out.append({"q": (s.q, hd, 0), "k": (s.q, hd, 1), "v": (s.q, hd, 2)})
        elif s.fused:
            nq, nk = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
            out.append({"q": (s.q, 0, nq), "k": (s.q, nq, nq + nk),
                        "v": (s.q, nq + nk, nq + 2 * nk)})
        else:
            out.append({"q": (s.q, None, None), "k": (s.k, None, None),
                        "v": None if s.v is None else (s.v, None, None)})
    return out


def qkv_grad_norms(model: nn.Module, inputs, loss_fn: Callable | None = None,
                   q: Sequence[str] | None = None, k: Sequence[str] | None = None,
                   v: Sequence[str] | None = None, *, layers=None,
                   eval_mode: bool = True) -> dict:
    """Squared Frobenius norms ``||dL/dW||_F^2`` of the Q, K, V projection weights, per layer.

    ``inputs``: a dict (``model(**inputs)``), a tuple (``model(*inputs)``) or one tensor. Use
    ``inputs_embeds`` (HF) or continuous inputs to control the token geometry. ``loss_fn``
    maps the raw model output to a scalar; default :class:`MLMReadoutLoss` (seed 0).
    ``q``/``k``/``v``: qualified names of the projection modules (their ``.weight`` is used),
    one per layer; when all are None they are found per block (``layers`` as for
    :class:`~sigprop.measurement.probe.Probe`, default :func:`find_blocks`), fused projections
    (GPT-2 ``c_attn``, GPT-NeoX ``query_key_value``) being split into parts. Gradients are taken
    with ``torch.autograd.grad`` (no ``.grad`` is touched) with the model temporarily in eval
    mode (no dropout) unless ``eval_mode=False``; biases are not included.

    Returns ``{"q": [...], "k": [...], "v": [...], "loss": float}`` (lists indexed by block;
    a missing projection gives NaN).
    """
    loss_fn = MLMReadoutLoss() if loss_fn is None else loss_fn
    named = dict(model.named_modules())
    if q is None and k is None and v is None:
        sites = _auto_weights(model, Probe._resolve_layers(model, layers))
    else:
        n = max(len(x) for x in (q, k, v) if x is not None)
        sites = [{key: (named[names[i]], None, None) if names is not None else None
                  for key, names in (("q", q), ("k", k), ("v", v))} for i in range(n)]
    params, slot, index = [], {}, []
    for li, site in enumerate(sites):
        for key, entry in site.items():
            if entry is not None:
                w = entry[0].weight
                if id(w) not in slot:
                    slot[id(w)] = len(params)
                    params.append(w)
                index.append((li, key, entry[0], slot[id(w)], entry[1], entry[2]))
    was_training = model.training
    if eval_mode:
        model.eval()
    try:
        with torch.enable_grad():
            out = model(**inputs) if isinstance(inputs, dict) else (
                model(*inputs) if isinstance(inputs, tuple) else model(inputs))
            loss = loss_fn(out)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
    finally:
        model.train(was_training)
    res = {key: [float("nan")] * len(sites) for key in ("q", "k", "v")}
    for li, key, mod, pi, lo, hi in index:
        g = grads[pi]
        if g is None:
            res[key][li] = 0.0
            continue
        if lo is not None:
            g = _slice(mod, g, lo, hi)
        res[key][li] = float(g.detach().double().pow(2).sum())
    res["loss"] = float(loss.detach())
    return res


def grads_to_trajectory(result: dict, spec=None, source: str = "measured"):
    """Trajectory rows from :func:`qkv_grad_norms` (or a list of results, one per seed).

    Block ``l`` (1-based, as in ``theory.depth.propagate``) gives ``grad_qk`` rows for W_Q and
    then W_K (extra column ``weight`` = ``"q"`` / ``"k"``; consumers that want one number per
    layer take the first, W_Q) and a ``grad_v`` row (``weight = "v"``). Mean and stderr over
    seeds (stderr NaN for one result).
    """
    results = [result] if isinstance(result, dict) else list(result)
    rows = []
    for li in range(len(results[0]["q"])):
        for key, name in (("q", "grad_qk"), ("k", "grad_qk"), ("v", "grad_v")):
            m, se = summarise([r[key][li] for r in results])
            rows.append(dict(layer=li + 1, observable=name, source=source, value=float(m),
                             stderr=float(se), weight=key))
    return _traj.make(rows, spec)
