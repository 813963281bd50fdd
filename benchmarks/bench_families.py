"""Theory vs measurement at init for every family transformers builds offline (issue 15): the
worst per-layer |theory - measured| cos of each, with the theory from the model's own weights
and block layout (docs/theory.md §2.8).

    python benchmarks/bench_families.py [--hidden 256] [--layers 6] [--seq-len 128] [--seeds 2]
        [--families bert,gpt2,...] [--presets] [--json out.json]

Each family is built from a config of its own kind at ``--hidden`` width (4 heads of 64 by
default, MLP 4x, the family's own init), measured on ``--seeds`` x 2 sequences of built-in
text at ``--seq-len``. ``--presets`` runs the issue's realistic-size list instead
(bert-base-uncased at T = 512, gpt2 / llama-3.2-1b / qwen2-0.5b at T = 256, the mistral-like
preset at T = 256): minutes each on a 2-core CPU. Prints one line per family (worst layer, its
theory and measured cos, the verdict, the seconds it took) and, with ``--json``, writes them.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

PRESET_RUNS = [("bert-base-uncased", 512), ("gpt2", 256), ("llama-3.2-1b", 256),
               ("qwen2-0.5b", 256), ("mistral-like-1b", 256)]


def family_configs(D: int, L: int, H: int, V: int = 4096, T: int = 512) -> dict[str, dict]:
    """One config per family at width ``D``, ``L`` layers, ``H`` heads (head_dim D/H)."""
    FF, dh = 4 * D, D // H
    common = dict(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                  intermediate_size=FF, max_position_embeddings=T)
    kv = max(H // 2, 1)
    return {
        "bert": dict(model_type="bert", **common),
        "roberta": dict(model_type="roberta", pad_token_id=1,
                        **{**common, "max_position_embeddings": T + 2}),
        "gpt2": dict(model_type="gpt2", vocab_size=V, n_embd=D, n_layer=L, n_head=H,
                     n_positions=T),
        "llama": dict(model_type="llama", num_key_value_heads=kv, **common),
        "mistral": dict(model_type="mistral", num_key_value_heads=kv, **common),
        "qwen2": dict(model_type="qwen2", num_key_value_heads=kv, **common),
        "qwen3": dict(model_type="qwen3", num_key_value_heads=kv, head_dim=dh, **common),
        "albert": dict(model_type="albert", embedding_size=128, pad_token_id=0, **common),
        "bart": dict(model_type="bart", vocab_size=V, d_model=D, encoder_layers=L,
                     decoder_layers=L, encoder_attention_heads=H, decoder_attention_heads=H,
                     encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=T,
                     pad_token_id=1),
        "bloom": dict(model_type="bloom", vocab_size=V, hidden_size=D, n_layer=L, n_head=H),
        "clip_text_model": dict(model_type="clip_text_model", **common),
        "deberta-v2": dict(model_type="deberta-v2", pad_token_id=0, **common),
        "distilbert": dict(model_type="distilbert", vocab_size=V, dim=D, n_layers=L, n_heads=H,
                           hidden_dim=FF, max_position_embeddings=T, pad_token_id=0),
        "electra": dict(model_type="electra", embedding_size=128, **common),
        "falcon": dict(model_type="falcon", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                       num_attention_heads=H),
        "gemma": dict(model_type="gemma", num_key_value_heads=kv, head_dim=dh, **common),
        "gemma2": dict(model_type="gemma2", num_key_value_heads=kv, head_dim=dh, **common),
        "gpt_neox": dict(model_type="gpt_neox", **common),
        "mixtral": dict(model_type="mixtral", num_key_value_heads=kv, num_local_experts=4,
                        num_experts_per_tok=2, **common),
        "modernbert": dict(model_type="modernbert", pad_token_id=0, global_attn_every_n_layers=1,
                           **common),
        "olmo": dict(model_type="olmo", num_key_value_heads=H, pad_token_id=0, **common),
        "opt": dict(model_type="opt", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                    num_attention_heads=H, ffn_dim=FF, word_embed_proj_dim=D,
                    max_position_embeddings=T, pad_token_id=1),
        "phi": dict(model_type="phi", num_key_value_heads=H, **common),
        "phi3": dict(model_type="phi3", num_key_value_heads=H, pad_token_id=0, **common),
        "starcoder2": dict(model_type="starcoder2", num_key_value_heads=kv, **common),
        "t5": dict(model_type="t5", vocab_size=V, d_model=D, d_kv=dh, d_ff=FF, num_layers=L,
                   num_decoder_layers=L, num_heads=H, pad_token_id=0, decoder_start_token_id=0),
        "vit": dict(model_type="vit", hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                    intermediate_size=FF, image_size=160, patch_size=16, num_channels=3),
        "whisper": dict(model_type="whisper", vocab_size=V, d_model=D, encoder_layers=L,
                        decoder_layers=L, encoder_attention_heads=H, decoder_attention_heads=H,
                        encoder_ffn_dim=FF, decoder_ffn_dim=FF, num_mel_bins=80,
                        num_key_value_heads=H, max_source_positions=T // 2,
                        max_target_positions=T, pad_token_id=0,
                        decoder_start_token_id=1),
    }


def worst_layer(d) -> dict:
    tr = d.trajectory
    w = tr[tr.observable == "cos"].pivot_table(index="layer", columns="source", values="value")
    if "theory" not in w:
        return {"worst_layer": None, "gap": None}
    gap = (w["theory"] - w["measured"]).abs()
    layer = int(gap.idxmax())
    return {"worst_layer": layer, "gap": float(gap.max()),
            "theory": float(w.loc[layer, "theory"]), "measured": float(w.loc[layer, "measured"])}


def main() -> None:
    import transformers

    from sigprop.analysis.diagnose import diagnose

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--families", default=None, help="comma-separated subset")
    ap.add_argument("--presets", action="store_true", help="the realistic-size presets")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    if a.presets:
        runs = [(name, name, T) for name, T in PRESET_RUNS]
    else:
        cfgs = family_configs(a.hidden, a.layers, a.heads)
        names = a.families.split(",") if a.families else list(cfgs)
        runs = [(n, cfgs[n], a.seq_len) for n in names]
    out = []
    for name, model, T in runs:
        t0 = time.perf_counter()
        d = diagnose(dict(model) if isinstance(model, dict) else model, seq_len=T,
                     seeds=a.seeds, sequences=2)
        row = {"family": name, "seq_len": d.spec.seq_len, "verdict": d.verdict,
               **worst_layer(d), "seconds": time.perf_counter() - t0}
        out.append(row)
        gap = "measured only" if row["gap"] is None else (
            f"worst layer {row['worst_layer']:>2}: |{row['theory']:.3f} - {row['measured']:.3f}|"
            f" = {row['gap']:.3f}")
        print(f"{name:18s} T={row['seq_len']:<5d} {d.verdict:17s} {gap}  ({row['seconds']:.0f} s)",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
