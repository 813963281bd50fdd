"""Measure full-size presets at init (T=256): per-layer mean cos for text ids and unique ids,
with RoPE and (RoPE models) without; saves results/<preset>.json (ids, inv_freq, cos)."""
import contextlib
import json
import sys
import time

import numpy as np
import torch
from common import (
    VOCAB,
    Probe,
    find_blocks,
    hf,
    no_rope,
)

from sigprop.analysis.forward import text_token_ids, vocab_at_init

preset = sys.argv[1]
T = 256
cfg = hf.load_config(preset)
vocab = min(VOCAB, cfg.vocab_size)

vocab = vocab_at_init(cfg, cfg.vocab_size)
txt = text_token_ids(2, T, vocab, 0)
g = np.random.default_rng(1000)
uni = torch.from_numpy(np.stack([g.permutation(np.arange(1, vocab))[:T] for _ in range(2)]))
res = {"preset": preset, "T": T, "ids_text": txt.tolist(), "ids_unique": uni.tolist()}
rope = hf.FAMILIES[cfg.model_type].positions == "rope"
runs = [("text", txt, None), ("unique", uni, None)]
if rope:
    runs += [("text_norope", txt, no_rope)]
t0 = time.time()
for name, ids, patch in runs:
    per_seed = []
    for s in (0, 1):
        m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=vocab)
        if rope and "inv_freq" not in res:
            res["inv_freq"] = m.rotary_emb.inv_freq.double().tolist()
            res["rope_scaling"] = float(getattr(m.rotary_emb, "attention_scaling", 1.0))
        p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
        ctx = patch() if patch else contextlib.nullcontext()
        kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if cfg.model_type == "bert":
            kw["token_type_ids"] = torch.zeros_like(ids)
        with ctx, p, torch.no_grad():
            m(**kw)
        per_seed.append([h["cos"].double().numpy().tolist() for h in p.hidden_stats])
        del m, p
        print(name, s, f"{time.time() - t0:.0f}s", flush=True)
    res[name] = per_seed  # [seed][layer][sequence]
json.dump(res, open(f"results/{preset}.json", "w"))
