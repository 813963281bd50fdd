"""HF small llama, zero W_Q and MLP, unique ids: per-position norm and cos vs expected Gram."""

import numpy as np
import torch
from common import (
    VOCAB,
    Probe,
    find_blocks,
    hf,
    ids_unique,
    llama_small,
    pair_cos_matrix,
)

from sigprop.theory import gram

T = 256
cfg = llama_small()
ids = ids_unique(2, T)
m = hf.model_at_init(cfg, seed=0, attn_implementation="sdpa", vocab_size=VOCAB)
with torch.no_grad():
    for layer in m.layers:
        layer.self_attn.q_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
p = Probe(m, layers=find_blocks(m), attention=None, keep_hidden=True)
with p, torch.no_grad():
    m(input_ids=ids, attention_mask=torch.ones_like(ids))
h0, h1 = p.hidden[0].double(), p.hidden[1].double()
print("q0 per dim", float(h0.pow(2).mean()))
q1 = h1.pow(2).mean(-1).mean(0).numpy() / float(h0.pow(2).mean())
a = np.arange(1, T + 1.0)
S = 0.2 * 0.2 / 4e-4
print("q1/q0 at pos 1,2,4,16,256 meas", q1[[0, 1, 3, 15, 255]])
print("               theory       ", (1 + S / a)[[0, 1, 3, 15, 255]])
C = pair_cos_matrix(h1)
G = np.minimum.outer(a, a) / np.outer(a, a) * S + np.eye(T)
Ct = gram.normalise(G)
for (i, j) in ((0, 1), (0, 15), (3, 15), (15, 63), (63, 255), (0, 255), (127, 255)):
    print(i + 1, j + 1, f"meas {C[i, j]:.3f} th {Ct[i, j]:.3f}")
print("mean cos meas", gram.mean_cos(C), "theory", gram.mean_cos(G))
o = (h1 - h0)[0]
def c(i, j): return float(o[i] @ o[j] / (o[i].norm() * o[j].norm()))
print("attn-branch cos 1-2", c(0, 1), "4-16", c(3, 15), "16-64", c(15, 63))
# values directly
att = m.layers[0].self_attn
x = m.layers[0].input_layernorm(h0[0].float()).double().detach()
v = x @ att.v_proj.weight.double().detach().T
print("v shape", v.shape, "v cos 1-2", float(v[0] @ v[1] / v[0].norm() / v[1].norm()))
print("x cos 1-2", float(x[0] @ x[1] / x[0].norm() / x[1].norm()),
      "x cos mean", gram.mean_cos((x @ x.T).numpy()))
print("emb cos mean", gram.mean_cos((h0[0] @ h0[0].T).numpy()))
