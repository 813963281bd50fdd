"""Small configs of every model type the installed ``transformers`` knows (the breadth test and
``benchmarks/breadth.py``): each type's default config, shrunk to a small width and depth so
that its model builds and runs in seconds, sub-configs (vision tower, audio encoder, text model)
included. Nothing is downloaded; the shrunk config is built by transformers itself, so its own
validation decides what is a valid config.

:func:`small_config` tries a full shrink first (width 64, 2 layers, 4 heads), then lighter
ones (layers only; the default), and returns the first dict whose model builds within a
parameter budget, or None with the reason (:func:`why_not`).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["model_types", "small_config", "shrink_dict", "buildable", "has_self_attention"]

#: keys that size something, by role; a nested dict holding ``model_type`` is shrunk the same way
_WIDTH = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "word_embed_proj_dim",
          "emb_dim", "hidden_size_per_layer_input", "embedding_size", "projection_dim",
          "projection_size", "out_hidden_size", "text_hidden_size", "vision_hidden_size",
          "encoder_hidden_size", "decoder_hidden_size")
_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
           "decoder_layers", "num_decoder_layers", "num_encoder_layers", "depth")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "num_decoder_attention_heads")
_KV = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
_FF = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
       "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_dim")
_HEAD_DIM = ("head_dim", "d_kv", "attention_head_size")
_PER_LAYER_LISTS = ("layer_types", "block_types", "layers_block_type", "hybrid_override_pattern",
                    "attention_window", "mlp_only_layers")
#: parameters a shrunk model may have (the breadth pass builds hundreds of them)
MAX_PARAMS = 250_000_000
#: keys dropped when the depth shrinks (backbone outputs named by stage)
_DROP = ("out_features", "out_indices")


def model_types() -> list[str]:
    """Every ``model_type`` in transformers' ``CONFIG_MAPPING``, sorted."""
    from transformers import CONFIG_MAPPING

    return sorted(CONFIG_MAPPING.keys())


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shrink_dict(d: dict[str, Any], width: int = 64, layers: int = 2, heads: int = 4,
                kv_heads: int = 2, ff: int = 128) -> dict[str, Any]:
    """A copy of config dict ``d`` with its sizes set small, recursively into sub-config dicts
    (any nested dict with a ``model_type``, and ``encoder`` / ``decoder`` dicts). Per-layer
    lists are cut to ``layers``; per-stage lists (``depths``, ``num_heads``, ``hidden_sizes``)
    keep their length with small values; a width that a key cannot take (a head count that
    does not divide it) is left to transformers to refuse."""
    out = copy.deepcopy(d)
    n_layers = None
    keep = _kept_layers(out, layers)
    if keep is not None:
        layers = len(keep)
    for k in list(out):
        v = out[k]
        if isinstance(v, dict) and (isinstance(v.get("model_type"), str) or k in (
                "encoder", "decoder", "text_config", "vision_config", "audio_config")):
            out[k] = shrink_dict(v, width, layers, heads, kv_heads, ff)
        elif k in _WIDTH and _int(v) and v > width:
            out[k] = width
        elif k in _LAYERS and _int(v) and v > layers:
            out[k] = n_layers = layers
        elif k in _HEADS and _int(v) and v > heads:
            out[k] = heads
        elif k in _KV and _int(v) and v > kv_heads:
            h0 = next((d[x] for x in _HEADS if _int(d.get(x))), None)
            out[k] = min(heads, h0) if h0 == v else kv_heads  # no GQA where there was none
        elif k in _FF and _int(v) and v > ff:
            out[k] = ff
        elif k in ("depths", "encoder_depths") and isinstance(v, list) and all(map(_int, v)):
            out[k] = [min(x, 1) for x in v]
        elif k in ("num_heads", "encoder_num_heads") and isinstance(v, list) and all(
                map(_int, v)):
            out[k] = [min(x, max(heads // 2, 1)) for x in v]
        elif k in ("hidden_sizes", "embed_dims", "encoder_hidden_sizes", "dims") and isinstance(
                v, list) and all(map(_int, v)):
            out[k] = [min(x, max(width // 4, 1) * 2**i) for i, x in enumerate(v)]
    w = next((out[k] for k in _WIDTH if _int(out.get(k))), None)
    h = next((out[k] for k in _HEADS if _int(out.get(k))), None)
    dh = w // h if w and h and w % h == 0 else None
    mla = _int(out.get("qk_rope_head_dim"))  # MLA: head_dim is the RoPE part's, keep it
    if _int(out.get("head_dim")) and dh and not mla:
        out["head_dim"] = dh
    dh = out.get("head_dim") if _int(out.get("head_dim")) else dh
    if dh and _int(out.get("rotary_dim")) and out["rotary_dim"] > dh:  # GPT-J, CodeGen
        out["rotary_dim"] = dh
    rp = out.get("rope_parameters") or out.get("rope_scaling")
    sec = rp.get("mrope_section") if isinstance(rp, dict) else None
    if dh and sec is None and isinstance(rp, dict) and _reads_mrope(out.get("model_type")):
        sec = rp["mrope_section"] = [1, 1, 1]  # the model's own default assumes its head dim
    prf = (rp or {}).get("partial_rotary_factor") or out.get("partial_rotary_factor") or 1.0
    half = int(dh * prf) // 2 if dh and isinstance(prf, int | float) else None
    if half and isinstance(sec, list) and sec and all(map(_int, sec)) and sum(sec) != half:
        tot = sum(sec)  # multimodal RoPE sections sum to half the rotated head dim
        new = [max(1, x * half // tot) for x in sec]
        new[0] += half - sum(new)
        rp["mrope_section"] = new
    n = n_layers or next((out[k] for k in _LAYERS if _int(out.get(k))), None)
    if n_layers:
        for k in _DROP:
            out.pop(k, None)
        idx = keep if keep is not None else list(range(n))
        for k in _PER_LAYER_LISTS:
            v = out.get(k)
            if isinstance(v, list | str) and len(v) > n:
                picked = [v[i] for i in idx if i < len(v)]
                out[k] = "".join(picked) if isinstance(v, str) else picked
        plc = out.get("per_layer_config")
        if isinstance(plc, dict):
            new = {str(idx.index(int(i))): dict(c) for i, c in plc.items()
                   if str(i).isdigit() and int(i) in idx and isinstance(c, dict)}
            hd = out.get("head_dim")
            for c in new.values():  # a per-layer head dim stays twice the shrunk global one
                if _int(c.get("head_dim")) and _int(hd):
                    c["head_dim"] = 2 * hd
            out["per_layer_config"] = new
        for k, v in list(out.items()):  # layer index lists (attention layers of a hybrid)
            if k.endswith(("layer_indices", "layers_idx", "layer_ids")) and isinstance(
                    v, list) and all(map(_int, v)):
                out[k] = sorted({idx.index(i) for i in v if i in idx}) or [min(n - 1, 1)]
    for k, v in list(out.items()):  # Jamba-style periodic layer kinds
        if n_layers and _int(v) and k.endswith("_layer_offset"):
            out[k] = min(v, n_layers - 1)
        elif n_layers and _int(v) and k.endswith("_layer_period"):
            out[k] = min(v, n_layers)
    if _int(out.get("mamba_d_head")) and _int(out.get("mamba_n_heads")):
        w = next((out[k] for k in _WIDTH if _int(out.get(k))), None)
        if w:
            inner = int(out.get("mamba_expand", 2) or 2) * w
            out["mamba_d_head"] = min(out["mamba_d_head"], 16)
            out["mamba_n_heads"] = max(inner // out["mamba_d_head"], 1)
            if _int(out.get("mamba_d_ssm")):
                out["mamba_d_ssm"] = out["mamba_n_heads"] * out["mamba_d_head"]
    for k in ("mamba_d_state", "ssm_state_size", "state_size"):
        if _int(out.get(k)) and out[k] > 16:
            out[k] = 16
    tc = out.get("text_config")
    vocab = tc.get("vocab_size") if isinstance(tc, dict) else None
    unset = [k for k, v in out.items() if k.endswith("_token_index") and v is None]
    for i, k in enumerate(sorted(unset)):  # placeholder ids a checkpoint always sets and the
        if _int(vocab) and vocab > len(unset):  # default leaves None (the BLIP-2 family):
            out[k] = vocab - 1 - i  # the top ids of the text vocabulary
    if _int(out.get("num_queries")) and out["num_queries"] > 64:  # object queries: the
        out["num_queries"] = 64  # top-k proposals of a small image hold fewer (Grounding DINO)
    experts = next((out[k] for k in ("n_routed_experts", "num_experts", "num_local_experts")
                    if _int(out.get(k))), None)
    if "num_experts_per_tok" in out and out["num_experts_per_tok"] is None and experts:
        out["num_experts_per_tok"] = min(2, experts)  # a default the router cannot run on
    if _int(out.get("max_window_layers")) and n:
        out["max_window_layers"] = min(out["max_window_layers"], n)
    return out


def _reads_mrope(model_type) -> bool:
    """Whether the modelling code of ``model_type`` reads multimodal RoPE sections from the
    config's rope parameters (with a default sized for the default head dim)."""
    import importlib.util

    from transformers import CONFIG_MAPPING

    try:
        mod = CONFIG_MAPPING[model_type].__module__.replace(".configuration_", ".modeling_")
        spec = importlib.util.find_spec(mod)
    except Exception:  # noqa: BLE001 - an unknown type, a module that is not there
        return False
    if spec is None or not spec.origin:
        return False
    with open(spec.origin, encoding="utf-8") as f:
        return '"mrope_section"' in f.read()


def _kept_layers(d: dict[str, Any], layers: int) -> list[int] | None:
    """Which of a config's layers a shrunk copy keeps: with per-layer types (``layer_types``,
    a hybrid pattern), the first layer of each distinct type, then the next ones, up to
    ``max(layers, number of types)``; None when the config has no per-layer types."""
    kinds = next((d[k] for k in _PER_LAYER_LISTS[:4] if isinstance(d.get(k), list | str)
                  and len(d[k]) > 0), None)
    if kinds is None:
        return None
    first: dict = {}
    for i, t in enumerate(kinds):
        first.setdefault(str(t), i)
    keep = sorted(first.values())
    rest = [i for i in range(len(kinds)) if i not in keep]
    return sorted(keep + rest[:max(layers - len(keep), 0)])


def _count_params(cfg) -> int | None:
    """Parameters of ``AutoModel.from_config(cfg)`` counted on the meta device (no memory)."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(cfg, trust_remote_code=False)
    return sum(p.numel() for p in model.parameters())


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"


def buildable(d: dict[str, Any]) -> tuple[bool, str]:
    """Whether transformers builds a config from ``d`` and an ``AutoModel`` from it within
    :data:`MAX_PARAMS` (counted on the meta device); ``(ok, reason)``."""
    from transformers import AutoConfig

    d = dict(d)
    mt = d.pop("model_type", None)
    try:
        cfg = AutoConfig.for_model(mt, **d)
    except Exception as err:  # noqa: BLE001 - transformers' validation decides
        return False, f"config: {_first_line(err)}"
    try:
        n = _count_params(cfg)
    except Exception as err:  # noqa: BLE001 - a type with no AutoModel, or a build failure
        return False, f"model: {_first_line(err)}"
    if n > MAX_PARAMS:
        return False, f"model: {n / 1e6:.0f}M parameters > {MAX_PARAMS / 1e6:.0f}M"
    return True, ""


def _cap_vocab(d: dict[str, Any], cap: int = 4096) -> dict[str, Any]:
    out = copy.deepcopy(d)
    for k, v in out.items():
        if isinstance(v, dict):
            out[k] = _cap_vocab(v, cap)
        elif k == "vocab_size" and _int(v) and v > cap:
            out[k] = cap
    return out


def small_config(model_type: str, mode: str = "width") -> tuple[dict[str, Any] | None, str]:
    """``(config dict, "")`` for the smallest of (full shrink, layers-only shrink, default)
    whose model builds within :data:`MAX_PARAMS`, or ``(None, reason)``. ``mode="layers"``:
    only the depth shrinks (widths, heads and head dims as the default config has them) and
    vocabularies are capped at 4096, so derived sizes the config does not state (multimodal
    RoPE sections, subsampling widths) stay consistent."""
    from transformers import CONFIG_MAPPING

    try:
        base = CONFIG_MAPPING[model_type]().to_dict()
    except Exception as err:  # noqa: BLE001 - a type whose default config is invalid
        return None, f"default config: {type(err).__name__}"
    base["model_type"] = model_type
    base.pop("transformers_version", None)
    layers_only = shrink_dict(base, width=10**9, heads=10**9, kv_heads=10**9, ff=10**9)
    tries = (shrink_dict(base), layers_only, base) if mode == "width" else (
        _cap_vocab(layers_only), layers_only)
    whys = []
    for d in tries:
        ok, why = buildable(d)
        if ok:
            return d, ""
        whys.append(why)
    return None, whys[0] if whys[0] == whys[-1] else f"{whys[0]} (default: {whys[-1]})"


def has_self_attention(model) -> bool:
    """Whether ``model`` holds a self-attention module: one that sigprop's discovery accepts,
    or a module whose class name says attention (``...Attention``, ``...SelfAttention``) and
    that is not a cross-attention only."""
    from ..measurement.probe_sites import describe_attention

    for name, m in model.named_modules():
        if describe_attention(m, name) is not None:
            return True
        cls = type(m).__name__.lower()
        if cls.endswith(("attention", "selfattention", "attn")) and "cross" not in cls:
            return True
    return False
