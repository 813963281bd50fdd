"""Monte Carlo of one causal softmax attention layer on a known input geometry (text token
identity / unique tokens): E[A C A^T] vs the Gram theory's exchangeable and correlated forms,
and the layer-1 cosine G1 = C0 + S * att (S = var_o var_v / q0, llama-3.2-1b: 1681)."""
import numpy as np
from common import ids_text, ids_unique

from sigprop.theory import gram

T, d, dh, sig = 256, 512, 64, 0.82
S = 0.82 * 0.82 / 4e-4
rng = np.random.default_rng(0)


def mc(C0, X, draws=24, rope_f=None):
    acc = np.zeros((T, T))
    mask = np.tril(np.ones((T, T), bool))
    for _ in range(draws):
        Wq = rng.standard_normal((d, dh)) * np.sqrt(sig / d)  # sigma_q sigma_k d = sig
        Wk = rng.standard_normal((d, dh)) * np.sqrt(sig / d)
        q, k = X @ Wq * np.sqrt(d), X @ Wk * np.sqrt(d)  # |x|^2 = d
        if rope_f is not None:
            pos = np.arange(T)[:, None] * rope_f[None, :]
            c, s = np.cos(pos), np.sin(pos)
            def rot(z, c=c, s=s):
                z1, z2 = z[:, :dh // 2], z[:, dh // 2:]
                return np.concatenate([z1 * c - z2 * s, z2 * c + z1 * s], 1)
            q, k = rot(q), rot(k)
        sc = q @ k.T / np.sqrt(dh)
        sc = np.where(mask, sc, -np.inf)
        A = np.exp(sc - sc.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
        acc += A @ C0 @ A.T
    return acc / draws


for name, ids in (("unique", ids_unique(1, T)[0].numpy()), ("text", ids_text(1, T)[0].numpy())):
    # token embeddings: random unit vectors per token type (expected C0 = identity of ids)
    types = {t: rng.standard_normal(d) for t in np.unique(ids)}
    X = np.stack([types[t] for t in ids])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    C0x = X @ X.T  # actual geometry used by MC
    for rope in (None, 1 / 500000 ** (np.arange(0, dh, 2) / dh)):
        att_mc = mc(C0x, X, rope_f=rope)
        R = None if rope is None else gram.rope_corr(rope, T)
        att_c = gram.attention_gram_corr(C0x, sig, causal=True, rope_r=R)
        att_e = gram.attention_gram(C0x, sig, causal=True, d_head=dh,
                                    rope=None if R is None else gram.rope_gamma_from_r(R))
        att_t = {pw: gram.attention_gram_tilt(C0x, sig, causal=True, rope_r=R, power=pw)
                 for pw in ((1, 1), (2, 1), (2, 2))}
        import time
        t0 = time.time()
        att_s = gram.attention_gram_sampled(C0x, sig, causal=True, d_head=dh, inv_freq=rope)
        ts = time.time() - t0
        att_u = gram.attention_gram(C0x, sig, causal=True, fluct=False)
        def l1(att, C0x=C0x):
            return float(gram.mean_cos(C0x + S * att))
        tilts = " ".join(f"tilt{k} {l1(v):.3f}" for k, v in att_t.items())
        print(f"{name} rope={rope is not None}: layer-1 cos (attention only) MC {l1(att_mc):.3f}"
              f" sampled {l1(att_s):.3f} ({ts:.1f}s) corr {l1(att_c):.3f} " + tilts +
              f"  exch {l1(att_e):.3f}  unif {l1(att_u):.3f};"
              f"  mean diag att MC {np.diag(att_mc).mean():.4f} corr {np.diag(att_c).mean():.4f}"
              f" exch {np.diag(att_e).mean():.4f} tilt21 {np.diag(att_t[(2, 1)]).mean():.4f}",
              flush=True)
