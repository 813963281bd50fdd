"""More seeds for the text input (the layer-1 cosine's seed scatter is ~0.03 on LLaMA):
seeds 0..N-1, 2 sequences each; saves results/<preset>_textN.json ([seed][layer][seq])."""
import json
import sys
import time

import torch
from common import (
    Probe,
    find_blocks,
    hf,
)

from sigprop.analysis.forward import text_token_ids, vocab_at_init

preset, N = sys.argv[1], int(sys.argv[2])
T = 256
cfg = hf.load_config(preset)
vocab = vocab_at_init(cfg, cfg.vocab_size)
ids = text_token_ids(2, T, vocab, 0)
out, t0 = [], time.time()
for s in range(N):
    m = hf.model_at_init(cfg, seed=s, attn_implementation="sdpa", vocab_size=vocab)
    p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=False)
    with p, torch.no_grad():
        m(input_ids=ids, attention_mask=torch.ones_like(ids))
    out.append([h["cos"].double().numpy().tolist() for h in p.hidden_stats])
    del m, p
    print(preset, s, f"{time.time() - t0:.0f}s", flush=True)
    json.dump({"preset": preset, "text": out}, open(f"results/{preset}_text{N}.json", "w"))
