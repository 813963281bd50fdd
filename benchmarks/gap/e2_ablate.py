"""Ablations on the small llama config: zero W_Q (uniform causal attention) and/or zero the
MLP down projection; Gram theory with the same ablation."""
import dataclasses

import numpy as np
import torch
from common import (
    VOCAB,
    Probe,
    find_blocks,
    hf,
    ids_text,
    ids_unique,
    llama_small,
)

from sigprop.theory import gram
from sigprop.theory.blocks import BlockParams

T = 256
cfg = llama_small()
spec = hf.spec_from_config(cfg, T)


def measure_ablate(ids, zero_q, zero_mlp, seeds=(0, 1)):
    out = []
    for s in seeds:
        m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=VOCAB)
        with torch.no_grad():
            for layer in m.layers:
                if zero_q:
                    layer.self_attn.q_proj.weight.zero_()
                if zero_mlp:
                    layer.mlp.down_proj.weight.zero_()
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
        with p, torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids))
        out.append([float(h["cos"].double().mean()) for h in p.hidden_stats])
    return np.mean(out, axis=0)


def theory_ablate(C0, zero_q, zero_mlp):
    G = C0.copy()
    out = [gram.mean_cos(G)]
    for layer in range(1, spec.depth + 1):
        bp = BlockParams.from_spec(spec, layer)
        if zero_q:
            bp = dataclasses.replace(bp, sigma_s0=0.0)
        if zero_mlp:
            bp = dataclasses.replace(bp, var_w_out=0.0)
        G = gram.block_gram(G, bp)
        out.append(gram.mean_cos(G))
    return np.stack(out).mean(axis=1)


for name, ids in (("unique", ids_unique(2, T)), ("text", ids_text(2, T))):
    C0 = gram.input_gram(ids.numpy())
    for zq, zm in ((True, True), (True, False), (False, True)):
        me = measure_ablate(ids, zq, zm)
        th = theory_ablate(C0, zq, zm)
        print(f"{name} zero_q={zq} zero_mlp={zm}")
        print("  meas ", " ".join(f"{x:.3f}" for x in me))
        print("  gram ", " ".join(f"{x:.3f}" for x in th))
