"""Transformer blocks and attention sites of any ``nn.Module``, for :mod:`.probe` (re-exported
there) and the other users of the same discovery (:mod:`.gradients`, :mod:`sigprop.models.loading`).

An attention site is a module owning Q/K projections: split ones (``query/key``,
``q_proj/k_proj``, ``query_proj/key_proj`` (DeBERTa-v2), ``q_lin/k_lin``, ``wq/wk``, ``q/k``;
with ``q_norm/k_norm`` after them as in Qwen3 / OLMo2, ``q_layernorm/k_layernorm`` in
StableLM / Persimmon), fused ``[q | k | v]`` (GPT-2
``c_attn``, ``qkv_proj``, ``Wqkv``) or per-head interleaved ``(H, 3, d_H)`` (GPT-NeoX
``query_key_value``, no grouped KV; a multi-query ``query_key_value`` of width
``(H + 2) d_H`` is ``[q | k | v]`` with one K/V head, Falcon).
Scale: the module's ``scaling`` (HF) or ``head_dim ** -0.5``; causal: the module's
``is_causal`` unless overridden.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["AttentionSite", "blocks_of", "candidate_stacks", "describe_attention",
           "find_attention", "find_blocks", "stack_has_attention"]

_SPLIT_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"),
                ("query_proj", "key_proj", "value_proj"),
                ("q_lin", "k_lin", "v_lin"), ("wq", "wk", "wv"), ("q", "k", "v"))
_FUSED = {"c_attn": "concat", "qkv_proj": "concat", "Wqkv": "concat", "qkv": "concat",
          "query_key_value": "per_head"}
_KNOWN_BLOCKS = ("encoder.layer", "transformer.h", "h", "model.layers", "layers", "blocks",
                 "encoder.layers", "decoder.layers", "block")


@dataclass
class AttentionSite:
    """Where one attention layer's Q/K live and how to turn them into probabilities.

    ``module`` receives ``attention_mask`` / ``position_embeddings`` and may return the
    probabilities; ``q``/``k``/``v`` are the projections (one module when ``fused`` is
    ``"concat"``, output ``[q | k | v]``, or ``"per_head"``, output ``(H, 3, d_H)``);
    ``q_post``/``k_post``: modules applied to the projections before the scores (hooked instead).
    """

    module: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    causal: bool
    fused: str | None = None
    q_post: nn.Module | None = None
    k_post: nn.Module | None = None
    name: str = ""
    #: ``"per_head"``: the query projection's rows are ``(H, 2, d_H)``, each head's query
    #: followed by its output gate (Qwen3-Next's gated attention); None: no gate in it
    q_gate: str | None = None


def _first_int(objs, names):
    for o in objs:
        for n in names:
            v = getattr(o, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _out_features(m: nn.Module) -> int | None:
    """Output width of a projection: an ``nn.Linear`` / HF ``Conv1D``, or a module wrapping
    exactly one of them with its own post-processing (a norm, a clip, a short convolution:
    Inkling 2), whose output is then the projection the attention uses."""
    n = _first_int([m], ("out_features", "nf"))
    if n is not None:
        return n
    lin = [c for c in m.children() if isinstance(c, nn.Linear)]
    return lin[0].out_features if len(lin) == 1 else None


def describe_attention(module: nn.Module, name: str = "", causal: bool | None = None):
    """An :class:`AttentionSite` for ``module`` if it owns Q/K projections, else None.

    Head counts and sizes come from the module's attributes (``num_heads``,
    ``num_attention_heads``, ``head_dim``, ``attention_head_size`` ...), its ``config`` and the
    projections' output widths; ``causal`` overrides the module's ``is_causal``.
    """
    kids = dict(module.named_children())
    v = q_gate = None
    for qn, kn, vn in _SPLIT_NAMES:
        if qn in kids and kn in kids and _out_features(kids[qn]) is not None:
            q, k, v, fused = kids[qn], kids[kn], kids.get(vn), None
            break
    else:
        fn = next((n for n in _FUSED if n in kids and _out_features(kids[n])), None)
        if fn is None:
            return None
        q = k = v = kids[fn]
        fused = _FUSED[fn]
    cfg = getattr(module, "config", None)
    srcs = [module] + ([cfg] if cfg is not None else [])
    n_heads = _first_int(srcs, ("num_heads", "num_attention_heads", "n_head", "n_heads"))
    head_dim = _first_int(srcs[:1], ("head_dim", "attention_head_size", "head_size", "d_head"))
    head_dim = head_dim or _first_int(srcs[1:], ("head_dim",))
    q_out = _out_features(q)
    if fused:
        if n_heads is None:
            return None
        if head_dim is None:
            width = _first_int(srcs, ("embed_dim", "hidden_size", "n_embd"))
            head_dim = (width or q_out // 3) // n_heads
        n_kv = _first_int(srcs, ("num_key_value_heads", "num_kv_heads", "n_kv_heads"))
        n_kv = n_kv or (q_out // head_dim - n_heads) // 2
        if fused == "per_head" and q_out == (n_heads + 2) * head_dim:
            fused, n_kv = "concat", 1  # multi-query (Falcon): [q heads | one k | one v]
        elif fused == "per_head" and q_out != 3 * n_heads * head_dim:
            return None  # grouped interleaved layouts (Falcon new_decoder_architecture)
    else:
        if head_dim is None and n_heads is None:
            return None
        head_dim = head_dim or q_out // n_heads
        cfg_heads = n_heads
        n_heads = q_out // head_dim
        n_kv = _out_features(k) // head_dim
        # an output gate folded into the query projection: twice the configured heads' width
        # (Qwen3-Next; its config's attn_output_gate, where present, must not say no)
        if (cfg_heads is not None and q_out == 2 * cfg_heads * head_dim
                and getattr(cfg, "attn_output_gate", True) is not False):
            n_heads, q_gate = cfg_heads, "per_head"
    scale = getattr(module, "scaling", None)
    scale = scale if isinstance(scale, float | int) and scale > 0 else head_dim ** -0.5
    is_causal = bool(getattr(module, "is_causal", False)) if causal is None else causal
    qp, kp = kids.get("q_norm"), kids.get("k_norm")
    if qp is None or kp is None:  # Persimmon / StableLM name them q_layernorm, k_layernorm
        qp, kp = kids.get("q_layernorm"), kids.get("k_layernorm")
    return AttentionSite(module, q, k, v, n_heads, n_kv, head_dim, float(scale), is_causal,
                         fused, qp if kp is not None else None, kp if qp is not None else None,
                         name, q_gate)


def find_attention(block: nn.Module, causal: bool | None = None, prefix: str = ""):
    """The first submodule of ``block`` (itself included) that :func:`describe_attention`
    accepts, so self-attention wins over a later cross-attention; None if there is none."""
    for name, m in block.named_modules():
        site = describe_attention(m, f"{prefix}.{name}".strip("."), causal)
        if site is not None:
            return site
    return None


def candidate_stacks(model: nn.Module, prefer: str | None = None) -> list[str]:
    """Qualified names of the model's block lists, best first: ``nn.ModuleList`` containers
    whose children all share one class (an ``nn.Sequential`` of them holding attention: MGP-STR),
    or that mix classes with attention among them (hybrid
    stacks: Jamba, Nemotron-H, OLMo-hybrid), ranked by (name contains ``prefer``, children contain
    an attention site, name ends with a known container — HF BERT ``encoder.layer``, GPT-2
    ``h`` / ``transformer.h``, LLaMA/Qwen ``model.layers``, ``layers``, ``blocks`` ... —,
    length), first in module order on ties (so an encoder wins over its decoder)."""
    found = []
    for pos, (name, m) in enumerate(model.named_modules()):
        if not isinstance(m, nn.ModuleList | nn.Sequential) or len(m) == 0:
            continue
        mixed = len({type(c) for c in m}) != 1  # a hybrid stack: attention and other mixers
        att = any(find_attention(c) is not None for c in (list(m) if mixed else [m[0]]))
        if (mixed or isinstance(m, nn.Sequential)) and (not att or len(m) < 2):
            continue  # a Sequential of blocks (MGP-STR) only with attention: not a conv stem
        known = any(name == s or name.endswith("." + s) for s in _KNOWN_BLOCKS)
        pref = prefer is not None and (prefer == name or prefer in name.split("."))
        found.append(((pref, att, known, not mixed, len(m), -pos), name))
    return [n for _, n in sorted(found, reverse=True)]


def stack_has_attention(model: nn.Module, name: str) -> bool:
    """Whether the block list ``name`` holds an attention site sigprop reads."""
    lst = dict(model.named_modules()).get(name)
    return bool(lst is not None and any(find_attention(c) is not None for c in lst))


def blocks_of(model: nn.Module, name: str) -> list[tuple[str, nn.Module]]:
    """``[(qualified name, block), ...]`` of the block list ``name``."""
    lst = dict(model.named_modules())[name]
    return [(f"{name}.{i}".strip("."), c) for i, c in enumerate(lst)]


def find_blocks(model: nn.Module, prefer: str | None = None) -> list[tuple[str, nn.Module]]:
    """``[(qualified name, block), ...]`` of the model's transformer blocks: the best of
    :func:`candidate_stacks`. ``prefer``: lists whose name contains this word rank first
    (``"decoder"``: the decoder stack of an encoder-decoder model). Raises ``ValueError`` when
    the model has no such list.
    """
    names = candidate_stacks(model, prefer)
    if not names:
        raise ValueError("no block list found: pass layers= (modules, names or a regex)")
    return blocks_of(model, names[0])
