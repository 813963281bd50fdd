"""Long-context benchmark: streaming vs dense attention statistics, the T = 2^20 run alone, and
matrix-free top-5 singular values vs a dense SVD.

    python benchmarks/bench_longctx.py [--dense-T 4096] [--big-T 1048576] [--svd-T 16384]
                                       [--skip-big] [--skip-svd]

Every part runs in a fresh subprocess so that its peak memory (ru_maxrss) is its own. Ratios
are taken against measurements made in the same run; this machine's dense float32 matmul rate
(4096 x 768 @ 768 x 1536) is measured first and last, and the streaming runs are reported as a
fraction of it. Model: d = 768, 12 heads, beta = 2 at T_ref = 512 (sigprop longctx defaults).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

D, H, BETA = 768, 12, 2.0


def matmul_rate(seconds: float = 3.0) -> float:
    import torch

    a, b = torch.randn(4096, D), torch.randn(D, 2 * D)
    a @ b
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 4096 * D * 2 * D * n / (time.perf_counter() - t0)


def _setup(T):
    import torch

    from sigprop.measurement import stream_inputs as si
    from sigprop.measurement import streaming as st
    from sigprop.spec import ArchSpec

    spec = ArchSpec(d_model=D, heads=H, beta=BETA)
    return spec, st.LayerWeights.from_spec(spec, 0), si.token_source("rho", T, D, seed=0), torch


def part_dense(T: int) -> dict:
    """Dense BatchedAttention forward with statistics over all T rows."""
    import torch

    from sigprop.nn.attention import BatchedAttention
    from sigprop.nn.init import init_batched

    spec, _, src, _ = _setup(T)
    x = src.chunk(0, T)
    attn = init_batched(BatchedAttention(spec, 1), "spec", 0, spec=spec)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = attn(x[None, None], return_stats=True)
    sec = time.perf_counter() - t0
    return {"seconds": sec, "ipr": float(out.stats["ipr"].double().mean()),
            "entropy": float(out.stats["entropy"].double().mean())}


def part_stream(T: int, rows: int) -> dict:
    """Streaming statistics of ``rows`` sampled rows (all rows when rows >= T)."""
    from sigprop.measurement import streaming as st

    spec, w, src, torch = _setup(T)
    r = torch.randperm(T, generator=torch.Generator().manual_seed(0))[:rows]
    t0 = time.perf_counter()
    res = st.stream_attention(src, w, r)[0]
    sec = time.perf_counter() - t0
    flops = 2 * T * D * 2 * D + 2 * 2 * len(r) * T * D  # K/V projections, QK^T and AV
    return {"seconds": sec, "ipr": float(res.ipr.mean()), "entropy": float(res.entropy.mean()),
            "flops": flops}


def part_svd(T: int, dense: bool) -> dict:
    """Top-5 singular values of head 0's attention matrix: matrix-free vs dense svdvals (one
    LAPACK thread, the faster setting on this machine)."""
    from sigprop.measurement import spectra as sp

    spec, w, src, torch = _setup(T)
    op = sp.AttentionOperator.from_weights(src.chunk(0, T), w, 0)
    t0 = time.perf_counter()
    s = sp.top_singular_values(op, 5)
    out = {"free_seconds": time.perf_counter() - t0, "free": s.tolist()}
    if dense:
        a = op.to_dense()  # T x T float32
        torch.set_num_threads(1)  # fastest measured: 2.0 s vs 31 s with 2 threads at T = 2048
        t0 = time.perf_counter()
        sd = torch.linalg.svdvals(a)[:5].double()
        out.update(dense_seconds=time.perf_counter() - t0, dense=sd.tolist(),
                   max_rel_err=float(((s - sd) / sd).abs().max()))
    return out


def child(args: list[str]) -> dict:
    """Run one part in a fresh interpreter; returns its dict plus peak RSS (GB)."""
    p = subprocess.run([sys.executable, __file__, "--part", *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense-T", type=int, default=4096)
    ap.add_argument("--big-T", type=int, default=2**20)
    ap.add_argument("--svd-T", type=int, default=16384)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-svd", action="store_true")
    ap.add_argument("--skip-dense-svd", action="store_true")
    ap.add_argument("--part", nargs="+")
    a = ap.parse_args()
    if a.part:
        kind, *rest = a.part
        res = {"dense": lambda: part_dense(int(rest[0])),
               "stream": lambda: part_stream(int(rest[0]), int(rest[1])),
               "svd": lambda: part_svd(int(rest[0]), rest[1] == "1"),
               "rate": lambda: {"rate": matmul_rate()},
               "startup": lambda: _setup(8) and {}}[kind]()
        res["maxrss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        print(json.dumps(res))
        return
    base = child(["rate"])
    base["maxrss_gb"] = child(["startup"])["maxrss_gb"]
    print(f"matmul rate {base['rate'] / 1e9:.1f} GFLOP/s (fp32, 4096x768 @ 768x1536); "
          f"start-up RSS (torch + sigprop imported) {base['maxrss_gb']:.2f} GB")
    T = a.dense_T
    dn = child(["dense", str(T)])
    full = child(["stream", str(T), str(T)])
    samp = child(["stream", str(T), "256"])
    print(f"\nT = {T}: dense {dn['seconds']:.2f} s / {dn['maxrss_gb']:.2f} GB peak; streaming "
          f"all rows {full['seconds']:.2f} s / {full['maxrss_gb']:.2f} GB; streaming 256 rows "
          f"{samp['seconds']:.2f} s / {samp['maxrss_gb']:.2f} GB")
    print(f"  time ratio dense / streaming (all rows) = {dn['seconds'] / full['seconds']:.2f}, "
          f"dense / streaming (256 rows) = {dn['seconds'] / samp['seconds']:.2f}; peak memory "
          f"ratio dense / streaming = {dn['maxrss_gb'] / full['maxrss_gb']:.2f}")
    print(f"  mean ipr dense {dn['ipr']:.6f} vs streaming {full['ipr']:.6f} (rel diff "
          f"{abs(dn['ipr'] - full['ipr']) / dn['ipr']:.1e}); entropy {dn['entropy']:.6f} vs "
          f"{full['entropy']:.6f}")
    if not a.skip_big:
        big = child(["stream", str(a.big_T), "256"])
        print(f"\nT = {a.big_T}, 256 rows: {big['seconds']:.1f} s, peak RSS "
              f"{big['maxrss_gb']:.2f} GB ({big['maxrss_gb'] - base['maxrss_gb']:.2f} GB above "
              f"start-up); {big['flops'] / big['seconds'] / 1e9:.1f} GFLOP/s = "
              f"{big['flops'] / big['seconds'] / base['rate']:.2f} of the matmul rate; "
              f"mean ipr {big['ipr']:.4f}")
    if not a.skip_svd:
        sv = child(["svd", str(a.svd_T), "0" if a.skip_dense_svd else "1"])
        msg = (f"\nT = {a.svd_T} top-5 singular values: matrix-free {sv['free_seconds']:.1f} s "
               f"{[round(x, 5) for x in sv['free']]}")
        if "dense_seconds" in sv:
            msg += (f"; dense svdvals {sv['dense_seconds']:.1f} s; speed-up "
                    f"{sv['dense_seconds'] / sv['free_seconds']:.1f}x; max rel err "
                    f"{sv['max_rel_err']:.1e}")
        print(msg)
    end = child(["rate"])
    print(f"\nmatmul rate at the end {end['rate'] / 1e9:.1f} GFLOP/s (load drift check)")


if __name__ == "__main__":
    main()
