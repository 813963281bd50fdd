"""Unique ids, T=128, 4-layer shrunk llama: Gram theory gap vs width and K/V heads."""

import numpy as np
import torch
from common import (
    Probe,
    find_blocks,
    hf,
)

from sigprop.theory import gram

T = 128
ids = torch.stack([torch.randperm(1024, generator=torch.Generator().manual_seed(s))[:T]
                   for s in range(2)])
RUNS = ((1024, 16, 4, (0, 1, 2, 3)), (1024, 16, 16, (0, 1)), (2048, 32, 8, (0, 1)))
for hidden, heads, kv, seeds in RUNS:
    cfg = hf.shrink("llama-3.2-1b", layers=4, hidden=hidden, heads=heads, kv_heads=kv,
                    intermediate=4 * hidden, vocab=1024)
    spec = hf.spec_from_config(cfg, T)
    meas = []
    for seed in seeds:
        m = hf.model_at_init(cfg, seed=seed, attn_implementation="sdpa")
        fr = m.rotary_emb.inv_freq.double().numpy()
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
        with p, torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids))
        meas.append([float(h["cos"].double().mean()) for h in p.hidden_stats])
    meas = np.array(meas)
    th = gram.propagate_gram(spec, gram.input_gram(ids.numpy()), rope=fr).mean(axis=1)
    print(hidden, heads, kv, "meas", np.round(meas.mean(0), 3), "+-",
          np.round(meas.std(0, ddof=1) / np.sqrt(len(seeds)), 3), "gram", np.round(th, 3),
          flush=True)
