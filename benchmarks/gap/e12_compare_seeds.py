"""Many-seed text measurement (e11) vs homogeneous theory and Gram theory (sampled attention,
RoPE): per-layer table and worst gaps."""
import glob
import json
import sys

import numpy as np
from e7_compare import WEIGHTS, hom

from sigprop import models as hf
from sigprop.theory import gram

for preset in sys.argv[1:]:
    base = json.load(open(f"results/{preset}.json"))
    f = sorted(glob.glob(f"results/{preset}_text*.json"))[-1]
    r = json.load(open(f))
    a = np.array(r["text"])  # seed, layer, seq
    per_seed = a.mean(axis=2)
    meas, se = per_seed.mean(0), per_seed.std(0, ddof=1) / np.sqrt(len(per_seed))
    T = base["T"]
    cfg = hf.load_config(preset)
    spec = hf.spec_from_config(cfg, T)
    wt, wp, ws = WEIGHTS[cfg.model_type]
    ids = np.array(base["ids_text"])
    C0 = gram.input_gram(ids, w_token=wt, w_position=wp, w_shared=ws)
    fr = np.array(base["inv_freq"]) if "inv_freq" in base else None
    g = gram.propagate_gram(spec, C0, rope=fr).mean(axis=1)
    gc = gram.propagate_gram(spec, C0, rope=fr, attn="corr").mean(axis=1)
    h = hom(spec, meas[0])
    print(f"{preset}: text, {len(per_seed)} seeds x {a.shape[2]} sequences")
    print(" l   meas  stderr   homog  G-samp  G-corr")
    for l in range(len(meas)):
        print(f"{l:2d}  {meas[l]:.3f}  {se[l]:.3f}   {h[l]:.3f}  {g[l]:.3f}   {gc[l]:.3f}")
    print(f"  worst |homog-meas| {np.abs(h - meas)[1:].max():.3f}  |G-samp-meas| "
          f"{np.abs(g - meas)[1:].max():.3f}  |G-corr-meas| {np.abs(gc - meas)[1:].max():.3f}"
          f"  (max stderr {se[1:].max():.3f})")
