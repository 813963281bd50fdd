"""Full llama-3.2-1b (4 layers only, to save time), text ids: zero MLP / RoPE off vs Gram
theory (sampled attention) with the same ablation."""
import contextlib
import dataclasses

import numpy as np
import torch
from common import (
    Probe,
    find_blocks,
    hf,
    no_rope,
)

from sigprop.analysis.forward import text_token_ids
from sigprop.theory import gram
from sigprop.theory.blocks import BlockParams

T = 256
d = dict(hf.PRESETS["llama-3.2-1b"])
d["num_hidden_layers"] = 3
cfg = hf.load_config(d)
spec = hf.spec_from_config(cfg, T)
ids = text_token_ids(2, T, 4096, 0)
C0 = gram.input_gram(ids.numpy())
res = {}
for zm in (True, False):
    for rope in (False, True):
        out = []
        for s in (0, 1):
            m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=4096)
            fr = m.rotary_emb.inv_freq.double().numpy()
            if zm:
                with torch.no_grad():
                    for layer in m.layers:
                        layer.mlp.down_proj.weight.zero_()
            p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
            ctx = contextlib.nullcontext() if rope else no_rope()
            with ctx, p, torch.no_grad():
                m(input_ids=ids, attention_mask=torch.ones_like(ids))
            out.append([h["cos"].double().numpy().tolist() for h in p.hidden_stats])
            del m
        me = np.array(out).mean(axis=(0, 2))
        G = C0.copy()
        th = [gram.mean_cos(G).mean()]
        for layer in range(1, spec.depth + 1):
            bp = BlockParams.from_spec(spec, layer)
            if zm:
                bp = dataclasses.replace(bp, var_w_out=0.0)
            G = gram.block_gram(G, bp, rope=fr if rope else None)
            th.append(gram.mean_cos(G).mean())
        print(f"zero_mlp={zm} rope={rope} meas {np.round(me, 3)} per-seq-seed l1 "
              f"{np.round(np.array(out)[:, 1, :].ravel(), 3)}  gram {np.round(th, 3)}", flush=True)
