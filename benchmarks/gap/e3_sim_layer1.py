"""Direct numpy simulation of layer 1 of a pre-LN causal stack with uniform attention, no MLP,
unique tokens: expected-Gram prediction vs per-pair mean cosine, as d grows."""
import numpy as np

from sigprop.theory import gram

T, q0, s = 256, 4e-4, 0.04
for d in (128, 512, 2048):
    rng = np.random.default_rng(0)
    cs = []
    for _ in range(3):
        e = rng.standard_normal((T, d)) * np.sqrt(q0)
        x = e / np.sqrt((e**2).mean(1, keepdims=True))
        Wv = rng.standard_normal((d, d)) * np.sqrt(0.2 / d)
        Wo = rng.standard_normal((d, d)) * np.sqrt(0.2 / d)
        v = x @ Wv
        o = np.cumsum(v, 0) / np.arange(1, T + 1)[:, None]
        r = e + o @ Wo
        G = r @ r.T
        cs.append(gram.mean_cos(G))
    print(d, np.mean(cs))
a = np.arange(1, T + 1.0)
S = s / q0
G = np.minimum.outer(a, a) / np.outer(a, a) * S + np.eye(T)
print("theory", gram.mean_cos(G))
