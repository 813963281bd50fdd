"""Theory variants vs the measurements saved by e6_measure_full.py.

Columns: meas (text), homog (homogeneous theory, rho0 = measured layer 0), G-hom (Gram theory
from a homogeneous input at rho0: positions only), G (Gram, token mixture), G+rope, and the
same for unique ids / no-RoPE runs."""
import json
import sys

import numpy as np
import torch

from sigprop import models as hf
from sigprop.theory import depth, gram

torch.set_num_threads(1)

WEIGHTS = {"llama": (1, 0, 0), "qwen2": (1, 0, 0), "mistral": (1, 0, 0),
           "gpt2": (1, 1, 0), "bert": (1, 1, 1)}


def hom(spec, rho0):
    tr = depth.propagate(spec, rho0=float(min(max(rho0, 0.0), 1.0)))
    return tr[tr.observable == "cos"].sort_values("layer")["value"].to_numpy()


def run(preset, verbose=True):
    r = json.load(open(f"results/{preset}.json"))
    T = r["T"]
    cfg = hf.load_config(preset)
    spec = hf.spec_from_config(cfg, T)
    wt, wp, ws = WEIGHTS[cfg.model_type]
    fr = np.array(r["inv_freq"]) if "inv_freq" in r else None
    out = {}
    for inp in ("text", "unique"):
        ids = np.array(r[f"ids_{inp}"])
        meas = np.array(r[inp]).mean(axis=(0, 2))  # seeds, sequences
        sd = np.array(r[inp]).mean(axis=2).std(axis=0) / np.sqrt(2)
        C0 = gram.input_gram(ids, w_token=wt, w_position=wp, w_shared=ws)
        rho0 = float(meas[0])
        T_ = C0.shape[-1]
        Ch = np.full((T_, T_), max(rho0, 0.0))
        np.fill_diagonal(Ch, 1.0)
        def P(C, **kw):
            return gram.propagate_gram(spec, C, **kw).reshape(spec.depth + 1, -1).mean(1)

        cols = {"meas": meas, "homog": hom(spec, rho0),
                "G-exch": P(C0, attn="exch"), "G-hom-samp": P(Ch, rope=fr),
                "G-samp": P(C0, rope=fr)}
        if fr is not None:
            cols["G-samp-nor"] = P(C0)
        # calibrated input: the realised share of a shared table (BERT's token type) differs
        # from its expectation by ~sqrt(2/d); shift the off-diagonal to the measured layer 0
        shift = rho0 - float(gram.mean_cos(C0).mean())
        if abs(shift) > 0.005:
            cols["G-samp-cal"] = P(C0 + shift * (1.0 - np.eye(T_)), rope=fr)
        if f"{inp}_norope" in r:
            cols["meas_norope"] = np.array(r[f"{inp}_norope"]).mean(axis=(0, 2))
        out[inp] = cols
        if verbose:
            print(f"{preset} {inp}  (seed stderr layer1 {sd[1]:.3f}, max {sd.max():.3f})")
            print(" l " + " ".join(f"{k:>11s}" for k in cols))
            for l in range(len(meas)):
                print(f"{l:2d} " + " ".join(f"{v[l]:11.3f}" for v in cols.values()))
            for k, v in cols.items():
                if k != "meas":
                    ref = cols["meas_norope"] if k == "G-samp-nor" and "meas_norope" in cols \
                        else meas
                    print(f"   max|{k} - {'meas_norope' if ref is not meas else 'meas'}| = "
                          f"{np.max(np.abs(v - ref)[1:]):.3f}")
    return out


if __name__ == "__main__":
    for p in sys.argv[1:]:
        run(p)
