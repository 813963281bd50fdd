"""Measurement throughput: sigprop's batched-seed engine vs a per-seed, per-sequence loop over
`transformers.BertModel` (gg25 notebook style), same machine, same run.

    python benchmarks/bench_measure.py [--seeds 8] [--sequences 4] [--seq-len 256] [--device cpu]

Both sides initialise S models of a 12-layer, d = 256, 4-head post-LN BERT-style encoder and
measure per-layer cos and attention ipr on B sequences each (float32). Reported: wall times
(initialisation included and excluded; best of two runs each), the throughput ratio, the
engine's achieved FLOP/s and that as a fraction of this machine's dense float32 matmul rate
measured in the same run, and the loop's own achieved rate.

Both sides do the same forward FLOPs, so on a machine where the per-sequence loop already runs
its matmuls near the machine's rate (a CPU: 37-47% on the 2-core development machine) no
engine can be much faster; the two ceilings printed last make that explicit. Batching seeds
pays where the loop is bound by per-call overhead, as on a GPU (``--device cuda``).
"""

from __future__ import annotations

import argparse
import time

import torch

from sigprop.measurement import observables as obs
from sigprop.measurement.inputs import rho_tokens
from sigprop.nn.model import SigpropTransformer
from sigprop.spec import ArchSpec


def _now(device: torch.device) -> float:
    """perf_counter after the device's queued work has finished (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def matmul_rate(device: torch.device, n: int = 2048, repeat: int = 5) -> float:
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeat):
        t0 = _now(device)
        a @ b
        best = min(best, _now(device) - t0)
    return 2 * n**3 / best


def model_flops(L: int, T: int, d: int, ff: int) -> float:
    """Forward FLOPs of one sequence: Q, K, V, O projections, QK^T and AV, the MLP."""
    return L * (8 * T * d * d + 4 * T * T * d + 4 * T * d * ff)


def engine(spec: ArchSpec, x: torch.Tensor, S: int) -> tuple[float, float]:
    dev = x.device
    t0 = _now(dev)
    model = SigpropTransformer(spec, n_seeds=S, seed=0).to(dev)
    t1 = _now(dev)
    with torch.no_grad():
        out = model(x.float(), return_hidden=True, return_stats=True)
        cos = [obs.mean_cos(h).mean().item() for h in out.hidden]
        ipr = [st["ipr"].mean().item() for st in out.stats]
    t2 = _now(dev)
    assert len(cos) == spec.depth + 1 and len(ipr) == spec.depth
    return t2 - t0, t2 - t1


def bert_loop(spec: ArchSpec, x: torch.Tensor, S: int) -> tuple[float, float]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=spec.d_model, num_hidden_layers=spec.depth,
                     num_attention_heads=spec.heads, intermediate_size=spec.ff,
                     hidden_act="relu", max_position_embeddings=spec.seq_len,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation="eager")
    dev = x.device
    t_init = 0.0
    t0 = _now(dev)
    for s in range(S):
        ti = _now(dev)
        torch.manual_seed(s)
        model = BertModel(cfg).eval().to(dev)
        t_init += _now(dev) - ti
        for b in range(x.shape[0]):
            with torch.no_grad():
                out = model(inputs_embeds=x[b:b + 1].float(), output_hidden_states=True,
                            output_attentions=True)
            cos = [obs.mean_cos(h[0]).item() for h in out.hidden_states]
            ipr = [obs.ipr(a[0]).mean().item() for a in out.attentions]
            assert len(cos) == spec.depth + 1 and len(ipr) == spec.depth
    total = _now(dev) - t0
    return total, total - t_init


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    a = ap.parse_args()
    S, B, T = a.seeds, a.sequences, a.seq_len
    dev = torch.device(a.device)
    spec = ArchSpec(depth=12, d_model=256, heads=4, seq_len=T, init_std=0.02)
    x = rho_tokens(B, T, spec.d_model, 0.05, seed=0).to(dev)
    engine(spec, x[:1], 1)  # warm-up
    bert_loop(spec, x[:1], 1)
    rate = matmul_rate(dev)
    e_tot, e_fwd = min(engine(spec, x, S) for _ in range(2))
    b_tot, b_fwd = min(bert_loop(spec, x, S) for _ in range(2))
    flops = model_flops(spec.depth, T, spec.d_model, spec.ff) * S * B
    where = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
             else f"cpu, {torch.get_num_threads()} threads")
    print(f"S={S} seeds x B={B} sequences, 12 layers, d=256, T={T}, float32, {where}")
    print(f"machine matmul rate (2048^2 float32): {rate / 1e9:.1f} GFLOP/s")
    print(f"sigprop batched engine: {e_tot:.2f} s incl. init ({e_fwd:.2f} s forward+stats)")
    print(f"BertModel loop:         {b_tot:.2f} s incl. init ({b_fwd:.2f} s forward+stats)")
    print(f"throughput ratio: {b_tot / e_tot:.1f}x incl. init, {b_fwd / e_fwd:.1f}x forward only")
    print(f"engine achieved {flops / e_fwd / 1e9:.1f} GFLOP/s = {flops / e_fwd / rate:.0%} of "
          f"the matmul rate ({flops / 1e9:.0f} GFLOP model forward)")
    # the same FLOPs are done by both sides, so no engine can beat the loop by more than
    # (matmul rate) / (loop's achieved rate) on this machine
    print(f"BertModel loop achieved {flops / b_fwd / 1e9:.1f} GFLOP/s = "
          f"{flops / b_fwd / rate:.0%} of the matmul rate")
    t_peak = flops / rate
    print(f"ceiling on any engine's ratio on this device (forward at the full matmul rate): "
          f"{b_fwd / t_peak:.1f}x forward only, {b_tot / t_peak:.1f}x incl. init even with "
          f"a free init")


if __name__ == "__main__":
    main()
