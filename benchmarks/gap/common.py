"""Shared helpers for the decoder-gap experiments (benchmarks/gap/)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

torch.set_num_threads(1)

from sigprop import models as hf  # noqa: E402
from sigprop.measurement.inputs import text_ids  # noqa: E402
from sigprop.measurement.probe import Probe, find_blocks  # noqa: E402
from sigprop.theory import depth  # noqa: E402

VOCAB = 4096


def llama_small(hidden=512, layers=8, heads=8, kv=2, inter=1376, base="llama-3.2-1b", **kw):
    d = dict(hf.PRESETS[base])
    d = hf.presets.shrink(d, layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
                          intermediate=inter, vocab=VOCAB)
    d.update(kw)
    return d


def ids_text(n, T, seed=0, vocab=VOCAB):
    ids, _ = text_ids(n, T, seed)
    return torch.remainder(ids, vocab)


def ids_unique(n, T, seed=0, vocab=VOCAB):
    g = np.random.default_rng(1000 + seed)
    return torch.from_numpy(np.stack([g.permutation(vocab)[:T] for _ in range(n)]))


@contextlib.contextmanager
def no_rope():
    """Monkeypatch apply_rotary_pos_emb to identity in llama/mistral/qwen2 modules."""
    import importlib
    saved = []
    for name in ("llama", "mistral", "qwen2"):
        m = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        saved.append((m, m.apply_rotary_pos_emb))
        m.apply_rotary_pos_emb = lambda q, k, cos, sin, *a, **kw: (q, k)
    try:
        yield
    finally:
        for m, f in saved:
            m.apply_rotary_pos_emb = f


def measure(config, ids, seeds=(0, 1), keep=False, patch=None):
    """Per-layer mean pairwise cos (mean over seeds x sequences) of the block outputs;
    returns (cos array (L+1,), list of hidden (L+1) tensors of the last seed if keep)."""
    out, hid = [], None
    for s in seeds:
        m = hf.model_at_init(config, seed=s, attn_implementation="sdpa", vocab_size=VOCAB)
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=keep)
        ctx = patch() if patch else contextlib.nullcontext()
        with ctx, p, torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids))
        out.append(np.array([float(h["cos"].double().mean()) for h in p.hidden_stats]))
        if keep:
            hid = [h.double() for h in p.hidden]
        del m
    return np.mean(out, axis=0), hid


def theory(config, T, rho0):
    spec = hf.spec_from_config(config, T)
    tr = depth.propagate(spec, rho0=float(min(max(rho0, 0.0), 1.0)))
    c = tr[tr.observable == "cos"].sort_values("layer")["value"].to_numpy()
    return c, spec


def pair_cos_matrix(h):
    """(T, T) mean over batch of the pair cosine matrix of hidden (B, T, d)."""
    u = h / h.norm(dim=-1, keepdim=True)
    return (u @ u.transpose(-1, -2)).mean(0).numpy()
