"""Layer-1..3 gap vs width / kv heads (zero W_Q, zero MLP; unique ids): finite-width check."""
import dataclasses

import numpy as np
import torch
from common import (
    VOCAB,
    Probe,
    find_blocks,
    hf,
    ids_unique,
    llama_small,
)

from sigprop.theory import gram
from sigprop.theory.blocks import BlockParams

T = 256
ids = ids_unique(2, T)
C0 = gram.input_gram(ids.numpy())
for hidden, heads, kv in ((512, 8, 2), (512, 8, 8), (1024, 16, 4), (2048, 32, 8)):
    cfg = llama_small(hidden=hidden, heads=heads, kv=kv, layers=3, inter=4 * hidden)
    spec = hf.spec_from_config(cfg, T)
    out = []
    for s in (0, 1):
        m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=VOCAB)
        with torch.no_grad():
            for layer in m.layers:
                layer.self_attn.q_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
        with p, torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids))
        out.append([float(h["cos"].double().mean()) for h in p.hidden_stats])
    G = C0.copy()
    th = [0.0]
    for layer in range(1, 4):
        bp = dataclasses.replace(BlockParams.from_spec(spec, layer), sigma_s0=0.0, var_w_out=0.0)
        G = gram.block_gram(G, bp)
        th.append(float(gram.mean_cos(G).mean()))
    print(hidden, heads, kv, "meas", np.round(np.mean(out, 0), 3), "gram", np.round(th, 3),
          flush=True)
