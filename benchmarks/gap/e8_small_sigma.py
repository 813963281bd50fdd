"""Small llama config with init std 0.04 (sigma_s = 0.82 as full llama-3.2-1b): text vs
unique, RoPE on/off, zero MLP on/off; Gram theory."""
import contextlib
import dataclasses
import sys

import numpy as np
import torch
from common import (
    VOCAB,
    Probe,
    find_blocks,
    hf,
    ids_text,
    llama_small,
    no_rope,
)

from sigprop.theory import gram
from sigprop.theory.blocks import BlockParams

T = 256
hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 512
std = (0.82 / hidden) ** 0.5
cfg = llama_small(hidden=hidden, heads=hidden // 64, kv=max(hidden // 256, 1), layers=3,
                  inter=4 * hidden, initializer_range=std)
spec = hf.spec_from_config(cfg, T)
print("sigma_s", spec.sigma_s)
m0 = hf.model_at_init(cfg, seed=0, attn_implementation="sdpa", vocab_size=VOCAB)
FR = m0.rotary_emb.inv_freq.double().numpy()
del m0


def meas(ids, zero_mlp, patch, seeds=(0, 1, 2, 3)):
    out = []
    for s in seeds:
        m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=VOCAB)
        if zero_mlp:
            with torch.no_grad():
                for layer in m.layers:
                    layer.mlp.down_proj.weight.zero_()
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
        ctx = patch() if patch else contextlib.nullcontext()
        with ctx, p, torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids))
        out.append([float(h["cos"].double().mean()) for h in p.hidden_stats])
    return np.mean(out, 0)


def th(C0, zero_mlp, sig=None, attn="corr", rope=None):
    G = C0.copy()
    out = [gram.mean_cos(G).mean()]
    for layer in range(1, spec.depth + 1):
        bp = BlockParams.from_spec(spec, layer)
        if zero_mlp:
            bp = dataclasses.replace(bp, var_w_out=0.0)
        if sig is not None:
            bp = dataclasses.replace(bp, sigma_s0=sig)
        G = gram.block_gram(G, bp, attn=attn, rope=rope)
        out.append(gram.mean_cos(G).mean())
    return np.array(out)


for name, ids in (("text", ids_text(2, T)),):
    C0 = gram.input_gram(ids.numpy())
    for zm in (True, False):
        print(f"{name} zero_mlp={zm}")
        print("  meas rope  ", np.round(meas(ids, zm, None), 3))
        print("  meas norope", np.round(meas(ids, zm, no_rope), 3))
        print("  gram exch  ", np.round(th(C0, zm, attn="exch"), 3))
        print("  gram corr  ", np.round(th(C0, zm, attn="corr"), 3))
        print("  gram samp  ", np.round(th(C0, zm, attn="sampled"), 3))
        print("  gram s+rope", np.round(th(C0, zm, attn="sampled", rope=FR), 3))
        print("  gram unif  ", np.round(th(C0, zm, 0.0), 3), flush=True)
