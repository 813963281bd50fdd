"""Long-context sweep (:func:`sigprop.analysis.longctx_model.run`) on every family of
``benchmarks/bench_families.py``: does it run, fail cleanly (a one-line ``SpecError``) or crash,
and how close is the measured ipr to the theory?

    python benchmarks/longctx_families.py [--families bert,gpt2,...] [--hidden 128] [--layers 2]
        [--heads 4] [--max-pos 2048] [--queries 32] [--extra] [--vs-real GAIN]
        [--json benchmarks/results/longctx_families.json]

Each family is built at init from its small config (``family_configs(D, L, H, T=max_pos)``),
then ``run(cfg, [1024, 8192], queries=32, seed=0, train_len=1024)``. The stream draws
synthetic keys, so 8192 > max positions is fine; the reference pass runs at 512 tokens.
Families run one after another on one CPU thread. Per family: status (ok / SpecError / other
exception, first line, the innermost sigprop frame), seconds, layers streamed, RoPE found,
causal, window, worst |measured - theory| ipr and entropy over layers and lengths, notes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_families import family_configs  # noqa: E402

LENGTHS = [1024, 8192]
TRAIN_LEN = 1024


def extra_configs(D: int, L: int, H: int, V: int = 4096, T: int = 2048) -> dict[str, dict]:
    """``--extra``: families (or settings) outside ``bench_families`` that exercise what the
    generic path has to recognise: old-style rotary inside attention (GPT-J, CodeGen), ALiBi
    (MPT, Falcon alibi), local / sliding windows (GPT-Neo, Mistral's config window, Gemma 3 /
    OLMo 3 per-layer-type RoPE), multi-query fused QKV (GPTBigCode), Q/K layer norms
    (Persimmon, StableLM, Cohere's per-head norms, OLMo 2), attention sinks (gpt-oss),
    Gemma 2's soft-capping at a low cap, DeBERTa-v3's relative attention."""
    FF, dh = 4 * D, D // H
    kv = max(H // 2, 1)
    common = dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                  intermediate_size=FF, max_position_embeddings=T)
    gpt = dict(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=T)
    return {
        "gptj": dict(model_type="gptj", rotary_dim=dh // 2, **gpt),
        "codegen": dict(model_type="codegen", rotary_dim=dh // 2, n_ctx=T, **gpt),
        "gpt_bigcode": dict(model_type="gpt_bigcode", multi_query=True, **gpt),
        "gpt_neo(local 256)": dict(model_type="gpt_neo", vocab_size=V, hidden_size=D,
                                   num_layers=L, num_heads=H, max_position_embeddings=T,
                                   attention_types=[[["global", "local"], L // 2]],
                                   window_size=256),
        "mpt(alibi)": dict(model_type="mpt", vocab_size=V, d_model=D, n_layers=L, n_heads=H,
                           max_seq_len=T),
        "falcon(alibi)": dict(model_type="falcon", vocab_size=V, hidden_size=D,
                              num_hidden_layers=L, num_attention_heads=H, alibi=True),
        "falcon(new_arch)": dict(model_type="falcon", vocab_size=V, hidden_size=D,
                                 num_hidden_layers=L, num_attention_heads=H,
                                 new_decoder_architecture=True, num_kv_heads=kv),
        "mistral(swa 256)": dict(model_type="mistral", num_key_value_heads=kv,
                                 sliding_window=256, **common),
        "gemma3_text": dict(model_type="gemma3_text", num_key_value_heads=kv, head_dim=dh,
                            sliding_window=256,
                            layer_types=["sliding_attention", "full_attention"] * (L // 2),
                            **common),
        "olmo2": dict(model_type="olmo2", num_key_value_heads=H, pad_token_id=0, **common),
        "olmo3": dict(model_type="olmo3", num_key_value_heads=H, pad_token_id=0,
                      sliding_window=256, **common),
        "persimmon": dict(model_type="persimmon", qk_layernorm=True, **common),
        "stablelm": dict(model_type="stablelm", num_key_value_heads=H, **common),
        "cohere": dict(model_type="cohere", num_key_value_heads=kv, **common),
        "gpt_oss": dict(model_type="gpt_oss", num_key_value_heads=kv, head_dim=dh,
                        num_local_experts=4, num_experts_per_tok=2, sliding_window=256,
                        layer_types=["sliding_attention", "full_attention"] * (L // 2),
                        **common),
        "deberta-v3": dict(model_type="deberta-v2", pad_token_id=0, relative_attention=True,
                           pos_att_type=["p2c", "c2p"], position_buckets=256,
                           max_relative_positions=-1, position_biased_input=False,
                           norm_rel_ebd="layer_norm", share_att_key=True, **common),
        "gemma2(softcap 1)": dict(model_type="gemma2", num_key_value_heads=kv, head_dim=dh,
                                  attn_logit_softcapping=1.0, **common),
        "cohere(qk_norm)": dict(model_type="cohere", num_key_value_heads=kv, use_qk_norm=True,
                                **common),
        "stablelm(qk_norm)": dict(model_type="stablelm", num_key_value_heads=H,
                                  qk_layernorm=True, **common),
        "xglm": dict(model_type="xglm", vocab_size=V, d_model=D, num_layers=L,
                     attention_heads=H, ffn_dim=FF, max_position_embeddings=T),
    }


def _where(err: BaseException) -> str | None:
    """The innermost frame inside sigprop (or the innermost frame at all)."""
    tb = traceback.extract_tb(err.__traceback__)
    mine = [f for f in tb if "sigprop" in f.filename]
    f = (mine or tb or [None])[-1]
    if f is None:
        return None
    path = f.filename.split("src/")[-1] if "sigprop" in f.filename else f.filename
    return f"{path}:{f.lineno} ({f.name})"


def _git_state() -> str | None:
    """HEAD and whether sigprop's sources had uncommitted changes when this ran."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=HERE, text=True,
                               capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" + uncommitted src changes" if dirty else "")


def _finite(x):
    return x if isinstance(x, float | int) and math.isfinite(x) else None


def worst_gaps(r) -> tuple[float | None, float | None]:
    """Worst |measured - theory| over layers and lengths, ipr and entropy, at the model's own
    scaling."""
    tr = r.trajectory
    own = r.info["own_scaling"]
    out = []
    for obs in ("ipr", "entropy"):
        sel = tr[(tr.observable == obs) & (tr.scaling == own)]
        w = sel.pivot_table(index=["layer", "seq_len"], columns="source", values="value")
        if "measured" not in w or "theory" not in w:
            out.append(None)
            continue
        g = (w["measured"] - w["theory"]).abs().max()
        out.append(_finite(float(g)))
    return out[0], out[1]


def run_family(name: str, cfg: dict, queries: int) -> dict:
    from sigprop.analysis.longctx_model import run
    from sigprop.spec import SpecError

    t0 = time.perf_counter()
    row: dict = {"family": name}
    try:
        r = run(dict(cfg), LENGTHS, queries=queries, seed=0, train_len=TRAIN_LEN,
                        workers=1)
    except SpecError as err:
        msg = str(err).splitlines()[0] if str(err) else ""
        row.update(status="spec_error", error=f"SpecError: {msg}", where=_where(err))
    except Exception as err:  # noqa: BLE001 - recorded, not raised: a family that crashes
        msg = str(err).splitlines()[0] if str(err) else ""
        row.update(status="error", error=f"{type(err).__name__}: {msg}", where=_where(err))
    else:
        ipr_gap, ent_gap = worst_gaps(r)
        row.update(
            status="ok",
            n_layers=len(r.layers),
            rope=[bool(x["rope"]) for x in r.layers],
            causal=[bool(x["causal"]) for x in r.layers],
            window=[x["window"] for x in r.layers],
            kv_heads=[x["kv_heads"] for x in r.layers],
            worst_gap=_finite(max((x["worst_gap"] or 0.0) for x in r.layers)),
            worst_gap_layers=[_finite(x["worst_gap"]) for x in r.layers],
            worst_gap_recomputed=ipr_gap,
            worst_entropy_gap=ent_gap,
            beta_train=[_finite(x["beta"]) for x in r.layers],
            rho=[_finite(x["rho"]) for x in r.layers],
            recommendation=r.recommendation["label"],
            notes=list(r.info["notes"]),
        )
    row["seconds"] = time.perf_counter() - t0
    return row


def vs_real(name: str, cfg: dict, gain: float, T: int = 512) -> dict:
    """``--vs-real GAIN``: the stream against the model's own eager attention at ``T``. Q and K
    outputs (after any q/k norm; a fused QKV output as a whole) are multiplied by ``gain`` so
    that attention is far from uniform (at init beta ~ 0.02); then per layer the real mean ipr /
    normalised entropy over all rows of 2 sequences beside ``run(module, [T],
    queries=T, seq_len=T)``'s measured and theory values (same inputs, every row). Catches what
    the stream leaves out or gets wrong (position biases, scale, windows, norms, soft-capping,
    causality), which measured-vs-theory cannot see: both use the same fitted layer."""
    import torch

    from sigprop.analysis import forward as fw
    from sigprop.analysis.longctx_model import build_model, run
    from sigprop.measurement.probe_sites import find_attention, find_blocks
    from sigprop.models.arch import input_kind

    try:
        b = build_model(dict(cfg))
        m, config = b.module, b.config
        if input_kind(config) != "text":
            return {"status": "skipped (not text)"}
        m.eval()
        sites = [x for x in (find_attention(b, None, n) for n, b in find_blocks(m))
                 if x is not None]
        for x in sites:
            for mod in ({x.q} if x.fused else {x.q_post or x.q, x.k_post or x.k}):
                mod.register_forward_hook(lambda mm, a, out: out * gain)
        probs: list = [None] * len(sites)
        hooks = []
        for i, x in enumerate(sites):
            def grab(mm, a, out, i=i):
                for o in (out[1:] if isinstance(out, tuple) else ()):
                    if torch.is_tensor(o) and o.dim() == 4 and o.shape[-1] == o.shape[-2] == T \
                            and bool((o >= 0).all()) and bool((o.sum(-1) <= 1 + 1e-3).all()):
                        probs[i] = o.detach().double()
            hooks.append(x.module.register_forward_hook(grab))
        vocab = fw.vocab_at_init(config, int(getattr(config, "vocab_size", 0) or 1))
        inputs = fw.text_inputs(2, T, vocab, 0, "cpu")
        with torch.no_grad():
            fw.forward_once(m, inputs, bool(getattr(config, "is_encoder_decoder", False)),
                        returned=True)
        for h in hooks:
            h.remove()
        r = run(m, [T], queries=T, seed=0, train_len=T, seq_len=T, workers=1)
    except Exception as err:  # noqa: BLE001
        return {"status": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    tr = r.trajectory
    own = r.info["own_scaling"]

    def val(layer, obs, src):
        x = tr[(tr.layer == layer) & (tr.observable == obs) & (tr.source == src)
               & (tr.scaling == own) & (tr.seq_len == T)]["value"]
        return float(x.iloc[0]) if len(x) else None

    layers = []
    for i, p in enumerate(probs):
        row = {"layer": i, "stream_ipr": val(i, "ipr", "measured"),
               "theory_ipr": val(i, "ipr", "theory"),
               "stream_entropy": val(i, "entropy", "measured"),
               "beta": r.layers[i]["beta"] if i < len(r.layers) else None}
        if p is not None:
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)  # sinks: mass on the keys
            n = (p > 0).sum(-1).double()
            ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1) / torch.log(n.clamp_min(2))
            row.update(real_ipr=float((p ** 2).sum(-1).mean()),
                       real_entropy=float(torch.where(n > 1, ent, torch.nan).nanmean()),
                       real_mean_keys=float(n.mean()))
        layers.append(row)
    gaps = [abs(x["real_ipr"] - x["stream_ipr"]) for x in layers
            if x.get("real_ipr") is not None and x["stream_ipr"] is not None]
    return {"status": "ok", "gain": gain, "T": T, "layers": layers,
            "worst_real_gap": max(gaps) if gaps else None}


def _cell(v) -> str:
    if isinstance(v, list):
        uniq = sorted({str(x) for x in v})
        return uniq[0] if len(uniq) == 1 else "/".join(str(x) for x in v)
    return "-" if v is None else str(v)


def main() -> None:
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=None, help="comma-separated subset")
    ap.add_argument("--extra", action="store_true",
                    help="also the families of extra_configs (written under 'extra')")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--vs-real", type=float, default=None, metavar="GAIN",
                    help="also compare the stream with the real eager attention at T=512, "
                         "Q/K outputs times GAIN (e.g. 6: beta ~ 0.7)")
    ap.add_argument("--json", default=str(HERE / "results" / "longctx_families.json"))
    a = ap.parse_args()
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfgs = family_configs(D=a.hidden, L=a.layers, H=a.heads, T=a.max_pos)
    extra = extra_configs(D=a.hidden, L=a.layers, H=a.heads, T=a.max_pos) if a.extra else {}
    if a.families:
        names = a.families.split(",")
        cfgs = {**cfgs, **extra_configs(D=a.hidden, L=a.layers, H=a.heads, T=a.max_pos)}
    else:
        names = list(cfgs) + list(extra)
        cfgs = {**cfgs, **extra}
    base = set(family_configs(D=a.hidden, L=a.layers, H=a.heads, T=a.max_pos))
    rows = []
    print(f"{'family':16s} {'status':10s} {'s':>5s} {'L':>2s} {'rope':5s} {'causal':6s} "
          f"{'window':7s} {'ipr gap':>7s} {'H gap':>6s}  error / notes", flush=True)
    shown_extra = False
    for name in names:
        if name not in base and not shown_extra:
            print("-- extra families (extra_configs)", flush=True)
            shown_extra = True
        row = run_family(name, cfgs[name], a.queries)
        row["set"] = "bench_families" if name in base else "extra"
        rows.append(row)
        if row["status"] == "ok":
            gap = row["worst_gap"]
            eg = row["worst_entropy_gap"]
            tail = f"{len(row['notes'])} note(s)"
            print(f"{name:16s} {'ok':10s} {row['seconds']:5.1f} {row['n_layers']:2d} "
                  f"{_cell(row['rope']):5s} {_cell(row['causal']):6s} "
                  f"{_cell(row['window']):7s} {gap:7.4f} {eg if eg is None else f'{eg:6.4f}'}"
                  f"  {tail}", flush=True)
        else:
            print(f"{name:16s} {row['status']:10s} {row['seconds']:5.1f} {'':2s} {'':5s} "
                  f"{'':6s} {'':7s} {'':>7s} {'':>6s}  {row['error'][:110]}  "
                  f"[{row['where']}]", flush=True)
        if a.vs_real:
            vr = vs_real(name, cfgs[name], a.vs_real)
            row["vs_real"] = vr
            if vr["status"] == "ok":
                cells = " ".join(
                    f"L{x['layer']} real {x.get('real_ipr', float('nan')):.3f} "
                    f"stream {x['stream_ipr']:.3f} th {x['theory_ipr']:.3f};"
                    for x in vr["layers"])
                print(f"{'':16s} vs real (x{a.vs_real:g}, T=512, beta "
                      f"{vr['layers'][0]['beta']:.2f}): {cells}", flush=True)
            else:
                print(f"{'':16s} vs real: {vr['status'][:120]}", flush=True)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"lengths": LENGTHS, "train_len": TRAIN_LEN, "queries": a.queries, "seed": 0,
            "hidden": a.hidden, "layers": a.layers, "heads": a.heads, "max_pos": a.max_pos,
            "vs_real_gain": a.vs_real,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "git": _git_state()}
    with open(out, "w") as f:
        json.dump({"meta": meta, "families": rows}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
