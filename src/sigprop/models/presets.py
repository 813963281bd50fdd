"""Plain HuggingFace config dicts for well-known architectures (no downloads, no transformers).

Each entry is what the model's ``config.json`` holds (the fields that matter for the architecture
at initialisation), with ``"model_type"`` set, so that
``transformers.AutoConfig.for_model(d["model_type"], **rest)`` builds the config
(:func:`sigprop.models.loading.load_config` does this). Sizes are the real ones; the vocabularies
are the
real ones too, which makes full models large (Llama-3.2-1B: a 128256 x 2048 embedding, 1 GiB
in
float32): pass ``vocab_size=`` to :func:`sigprop.models.loading.model_at_init` to build a small
table, since
signal propagation at init does not depend on the vocabulary (embedding rows are i.i.d.).

:func:`shrink` returns a small copy of any config dict (same family, same structure) for tests.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PRESETS", "shrink"]

PRESETS: dict[str, dict[str, Any]] = {
    # https://huggingface.co/google-bert/bert-base-uncased/blob/main/config.json
    "bert-base-uncased": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 30522,
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
        "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    },
    # https://huggingface.co/FacebookAI/roberta-base/blob/main/config.json
    "roberta-base": {
        "model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "vocab_size": 50265,
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 514,
        "type_vocab_size": 1, "initializer_range": 0.02, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
    },
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json (n_inner None = 4 d)
    "gpt2": {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
        "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "n_positions": 1024,
        "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
        "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "bos_token_id": 50256, "eos_token_id": 50256,
    },
    # Llama-3.2-1B-like (meta-llama/Llama-3.2-1B config.json, gated repository)
    "llama-3.2-1b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
        "hidden_act": "silu", "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "rms_norm_eps": 1e-5, "initializer_range": 0.02, "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001,
    },
    # Qwen/Qwen2-0.5B config.json (q/k/v carry biases in Qwen2's code). The base model lists
    # 131072 positions and window; Qwen2-0.5B-Instruct and Qwen2.5-0.5B list 32768.
    "qwen2-0.5b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
        "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "intermediate_size": 4864, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "initializer_range": 0.02, "tie_word_embeddings": True, "use_sliding_window": False,
        "sliding_window": 131072, "max_window_layers": 24, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643,
    },
}
# Not a released checkpoint: BERT-base's widths and init stretched to 48 post-LN layers, the
# depth at which gg25's alpha_crit(L) passes 1 (docs/theory.md §2.7), so stock HF init collapses in
# rank; `sigprop fix bert-deep-48 --alpha-attn auto` is the worked example of the fix.
PRESETS["bert-deep-48"] = {**PRESETS["bert-base-uncased"], "num_hidden_layers": 48}
# Not a released checkpoint: a tiny post-LN BERT (24 blocks of width 64, 4 heads) at init std
# 0.1, rank-collapsed at init (cos ~0.998 after 24 blocks at T 64): small enough to train
# every fix of `sigprop fix --compare --train-steps` on a laptop at its own size.
PRESETS["bert-tiny-collapse"] = {**PRESETS["bert-base-uncased"], "num_hidden_layers": 24,
                                 "hidden_size": 64, "num_attention_heads": 4,
                                 "intermediate_size": 256, "initializer_range": 0.1}
# Not a released checkpoint: Mistral-7B-v0.1's architecture (its config.json: sliding window
# 4096, 8 K/V heads of 128, SwiGLU at 3.5x, RoPE theta 1e4) at LLaMA-3.2-1B's size (2048 wide,
# 16 layers), so that it builds and runs at init on a laptop; the 7B model needs ~28 GB.
PRESETS["mistral-like-1b"] = {
    "model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 7168, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096,
    "rms_norm_eps": 1e-5, "initializer_range": 0.02, "tie_word_embeddings": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
}

# shrink() argument -> the config keys that hold it, per naming convention (GPT-2 uses n_*)
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "intermediate": ("intermediate_size", "n_inner"),
    "vocab": ("vocab_size",),
}


def shrink(config: dict[str, Any], layers: int = 2, hidden: int = 64, heads: int = 4,
           kv_heads: int = 2, intermediate: int = 128, vocab: int = 512) -> dict[str, Any]:
    """A small copy of a config dict with the same family and structure (for fast tests).

    Sets depth, width, heads, KV heads (only where the config has grouped KV heads), MLP width
    and vocabulary; ``head_dim`` (when present) becomes ``hidden // heads``; per-layer lists
    (``layer_types``) are cut or extended to ``layers``; ``max_window_layers`` is capped.
    Special token ids that would fall outside the small vocabulary are dropped (pad keeps a
    valid index). Everything else (norms, activation, RoPE, init range ...) is kept."""
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"need heads | hidden and kv_heads | heads (got {hidden}, {heads}, "
                         f"{kv_heads})")
    out = copy.deepcopy(dict(config))
    values = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
              "intermediate": intermediate, "vocab": vocab}
    for arg, keys in _KEYS.items():
        present = [k for k in keys if k in out]
        if arg == "intermediate" and not present and "n_embd" in out:
            present = ["n_inner"]
        for k in present:
            out[k] = values[arg]
    if out.get("head_dim") is not None:
        out["head_dim"] = hidden // heads
    if isinstance(out.get("layer_types"), list) and out["layer_types"]:
        lt = out["layer_types"]
        out["layer_types"] = (lt + [lt[-1]] * layers)[:layers]
    if isinstance(out.get("max_window_layers"), int):
        out["max_window_layers"] = min(out["max_window_layers"], layers)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        tok = out.get(key)
        if isinstance(tok, int) and tok >= vocab:
            out[key] = None if key != "pad_token_id" else 0
    return out
