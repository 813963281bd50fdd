"""Gram theory vs homogeneous theory vs measurement, small llama config (text and unique)."""
import time

from common import (
    hf,
    ids_text,
    ids_unique,
    llama_small,
    measure,
    theory,
)

from sigprop.theory import gram

T = 256
cfg = llama_small()
spec = hf.spec_from_config(cfg, T)
for name, ids in (("unique", ids_unique(2, T)), ("text", ids_text(2, T))):
    meas, _ = measure(cfg, ids)
    C0 = gram.input_gram(ids.numpy())
    t0 = time.time()
    g = gram.propagate_gram(spec, C0).mean(axis=1)
    gu = gram.propagate_gram(spec, C0, fluct=False).mean(axis=1)
    t1 = time.time() - t0
    hom, _ = theory(cfg, T, meas[0])
    print(name, f"gram {t1:.1f}s; token-pair fraction", gram.token_classes(ids.numpy()))
    print(" l  meas   gram  gram_unif  homog")
    for l in range(len(meas)):
        print(f"{l:2d} {meas[l]:.3f}  {g[l]:.3f}  {gu[l]:.3f}  {hom[l]:.3f}")
