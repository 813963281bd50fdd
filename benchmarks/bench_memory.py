"""Accuracy of :mod:`sigprop.measurement.memory` against measured peak RSS.

Every (workload, size) runs in a fresh ``python`` subprocess, which builds the workload through
the library's public entry point, computes the estimate with the same arguments and prints its
own peak RSS at exit (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), so each peak is clean of
the other runs. Prints ``workload, setting, estimate, peak, ratio`` (estimate / peak).

    .venv/bin/python benchmarks/bench_memory.py [--only measure,train] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys
kind, kw = sys.argv[1], json.loads(sys.argv[2])
import torch
from sigprop.measurement import memory
from sigprop.spec import ArchSpec
memory.available = lambda: float("inf")  # measure the estimate, do not refuse
spec = ArchSpec(**kw.pop("spec")) if "spec" in kw else None
if kind == "measure":
    from sigprop.measurement.engine import measure
    est = memory.estimate("measure", spec=spec, **kw)
    measure(spec, seeds=kw["seeds"], sequences=kw["sequences"], grads=kw.get("grads", False))
elif kind == "diagnose":
    from sigprop import models as hf
    from sigprop.analysis import diagnose as dg
    from sigprop.analysis.forward import VOCAB_AT_INIT
    config = hf.load_config(kw["model"])
    sp, info = hf.spec_and_info(config, kw["seq_len"])
    kv = getattr(config, "num_key_value_heads", None) or sp.heads
    est = memory.estimate("diagnose", spec=sp, sequences=kw["sequences"],
                          vocab=min(info.vocab_size, VOCAB_AT_INIT), kv_heads=kv)
    dg.diagnose(kw["model"], seq_len=kw["seq_len"], seeds=1, sequences=kw["sequences"])
elif kind == "longctx":
    from sigprop.measurement import longctx as lc
    est = memory.estimate("longctx", spec=spec, lengths=kw["lengths"], queries=kw["queries"],
                          chunk=kw["chunk"], workers=torch.get_num_threads(),
                          n_scalings=len(lc.scaling_kinds(spec, kw["compare"])))
    lc.stream_lengths(spec, kw["lengths"], queries=kw["queries"], chunk=kw["chunk"],
                      compare=kw["compare"])
elif kind == "train":
    from sigprop.training.config import TrainConfig
    from sigprop.training.loop import train
    cfg = TrainConfig(steps=2, batch_size=kw["batch_size"], seeds=kw["seeds"], measure_every=0)
    est = memory.estimate("train", spec=spec, batch_size=kw["batch_size"], slices=kw["seeds"],
                          vocab=memory.BUILTIN_VOCAB)
    train(spec, cfg)
elif kind == "spectra":
    from sigprop.measurement import spectra
    g = torch.Generator().manual_seed(0)
    n, dh = kw["n"], 64
    q = torch.randn(n, dh, generator=g, dtype=torch.float64) / dh ** 0.5
    k = torch.randn(n, dh, generator=g, dtype=torch.float64)
    op = spectra.AttentionOperator(q, k, centred=kw.get("centred", False))
    est = memory.estimate("spectra", seq_len=n, d_head=dh, workers=op.workers,
                          dense=kw.get("dense", False), centred=op.centred)
    if kw.get("dense"):
        op.to_dense()
    else:
        spectra.top_singular_values(op, 5)
print(json.dumps({"estimate": est,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

S = {"depth": 4, "d_model": 256, "heads": 4}
BERTISH = {"depth": 12, "d_model": 768, "heads": 12}
SMALL = {"depth": 2, "d_model": 128, "heads": 2}

#: (workload, label, keyword arguments); the first of each workload is the quick set
CASES = [
    ("measure", "d256 L4 S4 B2 T1024", {"spec": {**S, "seq_len": 1024}, "seeds": 4,
                                        "sequences": 2}),
    ("measure", "d256 L4 S4 B2 T2048", {"spec": {**S, "seq_len": 2048}, "seeds": 4,
                                        "sequences": 2}),
    ("measure", "d512 L2 S64 B2 T128", {"spec": {"depth": 2, "d_model": 512, "heads": 8,
                                                 "seq_len": 128}, "seeds": 64, "sequences": 2}),
    ("measure", "d256 L4 S4 B2 T1024 grads", {"spec": {**S, "seq_len": 1024}, "seeds": 4,
                                              "sequences": 2, "grads": True}),
    ("diagnose", "bert-base T512 B4", {"model": "bert-base-uncased", "seq_len": 512,
                                       "sequences": 4}),
    ("diagnose", "bert-base T128 B2", {"model": "bert-base-uncased", "seq_len": 128,
                                       "sequences": 2}),
    ("diagnose", "gpt2 T1024 B2", {"model": "gpt2", "seq_len": 1024, "sequences": 2}),
    ("longctx", "d768 T2^18 chunk 2^17", {"spec": BERTISH, "lengths": [2**18], "queries": 256,
                                          "chunk": 2**17, "compare": False}),
    ("longctx", "d768 T2^16 chunk 2^13", {"spec": BERTISH, "lengths": [2**16], "queries": 256,
                                          "chunk": 2**13, "compare": False}),
    ("longctx", "d768 T2^17 chunk 2^16 R1024 compare",
     {"spec": BERTISH, "lengths": [2**17], "queries": 1024, "chunk": 2**16, "compare": True}),
    ("train", "d128 L2 B64 T512", {"spec": {**SMALL, "seq_len": 512}, "batch_size": 64,
                                   "seeds": 1}),
    ("train", "d128 L2 B16 T256", {"spec": {**SMALL, "seq_len": 256}, "batch_size": 16,
                                   "seeds": 1}),
    ("train", "d256 L4 B16 T256 S2", {"spec": {**S, "seq_len": 256}, "batch_size": 16,
                                      "seeds": 2}),
    ("spectra", "T 16384 Krylov", {"n": 2**14}),
    ("spectra", "T 8192 dense", {"n": 8192, "dense": True}),
    ("spectra", "T 4096 dense centred", {"n": 4096, "dense": True, "centred": True}),
]


def run_case(kind: str, kw: dict) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, kind, json.dumps(kw)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} {kw} failed: {out.stderr.strip().splitlines()[-1:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["seconds"] = time.perf_counter() - t0
    res["ratio"] = res["estimate"] / res["peak"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("--quick", action="store_true", help="the first case of each workload")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    seen: set[str] = set()
    print(f"{'workload':9} {'setting':38} {'estimate':>9} {'peak RSS':>9} {'ratio':>6} {'s':>5}")
    for kind, label, kw in CASES:
        if (only and kind not in only) or (a.quick and kind in seen):
            continue
        seen.add(kind)
        r = run_case(kind, kw)
        print(f"{kind:9} {label:38} {r['estimate'] / 1e9:7.2f}GB {r['peak'] / 1e9:7.2f}GB "
              f"{r['ratio']:6.2f} {r['seconds']:5.1f}", flush=True)


if __name__ == "__main__":
    main()
