"""HF config -> :class:`~sigprop.spec.ArchSpec` and :class:`HFInfo` (re-exported by
:mod:`sigprop.models.loading`): :func:`spec_from_config`, :func:`describe`, :func:`spec_and_info`,
:func:`translations` (docs/theory.md §6).

Mapping at HF init (every family here draws weights N(0, std^2), std = ``initializer_range``,
biases 0, norm gains 1). Score std (docs/theory.md §2.1, gg25 B.1): ``sigma_s = std^2 d m``, so
``beta_eff = std^2 d m / sqrt(log T)``, where ``m`` is the logit multiplier relative to
``1/sqrt(d_head)``: (attention scale) x sqrt(d_head) x (RoPE attention factor)^2. ``m != 1`` goes
into the spec as ``scaling="yarn"`` (YaRN with its default factor) or ``scaling="tau",
scaling_param=1/m``. QK-norm (Qwen3) fixes ``sigma_s = m`` whatever the init (``qk_std = d^-1/2``).
GPT-2 scales both residual output projections (``c_proj``) by ``1/sqrt(2L)``:
``sigma_o2 = std^2 d / (2L)``, ``sigma_w2_out = std^2 d_ff / (2L)``.
Pre-LN models feed the raw embeddings (``q0 = std^2`` per summed table: 8e-4 for GPT-2's wte +
wpe, 4e-4 for LLaMA) into the residual stream, while the theory starts at ``q = 1``. The pre-LN
map is invariant under rescaling the stream together with the sublayer outputs, so
``absorb_embedding=True`` divides ``sigma_o2`` and ``sigma_w2_out`` by ``q0`` (measured ``q``
is then in units of ``q0``). Input cosine of distinct tokens: a table shared by all positions
(BERT / RoBERTa token type) gives ``rho0 = shared / tables`` (1/3 for BERT, 0 for GPT-2, LLaMA).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..spec import ArchSpec, SpecError
from .config import load_config

__all__ = ["HFInfo", "FAMILIES", "FamilyLayout", "describe", "spec_from_config", "spec_and_info",
           "generic_spec_and_info", "input_kind", "structure_spec",
           "translations"]



@dataclass(frozen=True, kw_only=True)
class FamilyLayout:
    """How a family checked against the theory lays out its blocks: norm placement
    (``"pre"`` / ``"post"``), norm kind (``"layernorm"`` / ``"rms"``), causal attention, a gated
    MLP, and its positions (``"learned"`` / ``"rope"``)."""

    norm: str
    ln_kind: str
    causal: bool
    gated: bool
    positions: str


_ENC = FamilyLayout(norm="post", ln_kind="layernorm", causal=False, gated=False,
                    positions="learned")
_DEC = FamilyLayout(norm="pre", ln_kind="rms", causal=True, gated=True, positions="rope")
#: model_type -> its :class:`FamilyLayout`; the families checked here.
FAMILIES = {"bert": _ENC, "roberta": _ENC, "xlm-roberta": _ENC,
            "gpt2": FamilyLayout(norm="pre", ln_kind="layernorm", causal=True, gated=False,
                                 positions="learned"),
            "llama": _DEC, "mistral": _DEC, "qwen2": _DEC, "qwen3": _DEC}
_QK_NORM = ("qwen3",)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
         "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh", "linear": "linear"}
DEFAULT_SEQ_LEN = 512


@dataclass(frozen=True, kw_only=True)
class HFInfo:
    """Facts about an HF architecture that :class:`ArchSpec` cannot hold, and ``notes``: one
    plain sentence per place where the theory does not (fully) cover the model."""

    model_type: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    positions: str  # "learned" | "rope"
    rope_theta: float | None
    rope_type: str | None
    rope_attention_factor: float
    attention_scale: float  # the factor multiplying q.k
    logit_multiplier: float  # m in the module docstring
    tied_embeddings: bool
    max_position: int | None
    max_len: int | None  # longest sequence the model can run (None: unbounded, RoPE)
    embed_q: float  # q0 of the block-0 input (1 after an embedding LayerNorm)
    rho0: float  # expected input cosine of distinct tokens
    activation_hf: str
    qk_norm: bool
    attention_bias: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def _rope(cfg) -> tuple[float | None, str | None, float, str | None]:
    """(theta, rope_type, attention factor applied to cos and sin, problem)."""
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rp and all(isinstance(v, dict) for v in rp.values()):  # per layer type
        rp = next(iter(rp.values()))
    rtype = rp.get("rope_type", rp.get("type", "default"))
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    if rtype == "default":
        return theta, rtype, 1.0, None
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        _, factor = ROPE_INIT_FUNCTIONS[rtype](cfg, "cpu")
        return theta, rtype, float(factor), None
    except Exception as err:  # noqa: BLE001 - any failure only loses the attention factor
        return theta, rtype, 1.0, f"RoPE type {rtype!r}: attention factor not evaluated " \
                                  f"({type(err).__name__}); taken as 1"


#: ArchSpec field -> the config.json field it is read from (for error messages)
_CONFIG_KEYS = {"depth": "num_hidden_layers", "d_model": "hidden_size",
                "heads": "num_attention_heads", "d_ff": "intermediate_size",
                "init_std": "initializer_range", "scaling_param": "rope_parameters"}


def _analyse(config, seq_len, rho0, absorb_embedding) -> tuple[ArchSpec, HFInfo]:
    cfg = load_config(config)
    mt = cfg.model_type
    if mt not in FAMILIES:
        raise SpecError("model", f"architecture {mt!r} is not supported; supported: "
                                 f"{', '.join(FAMILIES)}")
    lay = FAMILIES[mt]
    norm, ln_kind, causal, gated, positions = (lay.norm, lay.ln_kind, lay.causal, lay.gated,
                                               lay.positions)
    notes: list[str] = []
    d, L, H = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or H
    head_dim = getattr(cfg, "head_dim", None) or d // H
    d_ff = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * d
    std = float(cfg.initializer_range)
    act_hf = getattr(cfg, "hidden_act", None) or getattr(cfg, "activation_function", "gelu")
    act = _ACTS.get(act_hf) if isinstance(act_hf, str) else None
    if act is None or (gated and act != "silu"):
        key = "hidden_act" if getattr(cfg, "hidden_act", None) else "activation_function"
        raise SpecError("model", f"config {key} {act_hf!r} of {mt} has no sigprop counterpart "
                                 f"(known: {', '.join(sorted(_ACTS))})")
    if gated:
        act = "swiglu"
        notes.append("SwiGLU MLP: covered by the product kernel silu(gate) x up "
                     "(docs/theory.md §2.5)")
    elif act_hf != act:
        notes.append(f"{act_hf}: a tanh approximation of GELU, treated as exact GELU")

    # sequence length
    max_pos = getattr(cfg, "max_position_embeddings", None)
    max_len = None
    if positions == "learned" and max_pos:
        pad = cfg.pad_token_id if isinstance(cfg.pad_token_id, int) else 1
        max_len = max_pos - (pad + 1 if "roberta" in mt else 0)  # RoBERTa counts from pad + 1
    T = int(seq_len) if seq_len is not None else min(max_len or max_pos or DEFAULT_SEQ_LEN,
                                                     DEFAULT_SEQ_LEN)
    if max_len is not None and T > max_len:
        raise SpecError("seq_len", f"must be <= {max_len} for {mt} (learned position "
                                   f"embeddings; got {T})")

    # score scale: attention scale x RoPE attention factor^2, relative to 1/sqrt(d_head)
    scale = head_dim ** -0.5
    if mt == "gpt2":
        scale = scale if cfg.scale_attn_weights else 1.0
        if cfg.scale_attn_by_inverse_layer_idx:
            notes.append("scale_attn_by_inverse_layer_idx: layer l's logits are divided by l; "
                         "the spec uses layer 1's scale for all layers")
    theta, rtype, a_rope = None, None, 1.0
    if positions == "rope":
        theta, rtype, a_rope, problem = _rope(cfg)
        notes.append(f"RoPE (theta={theta:g}): the theory ignores the positional rotation "
                     "(score variance is unchanged; its position dependence is not modelled)")
        if rtype != "default" and a_rope == 1.0:
            notes.append(f"RoPE scaling {rtype!r}: rescales frequencies only (attention factor 1)")
        elif rtype != "default":
            notes.append(f"RoPE scaling {rtype!r}: attention factor {a_rope:.4g} on cos and "
                         f"sin, so the logits are multiplied by {a_rope ** 2:.4g}")
        if problem:
            notes.append(problem)
        if max_pos and T > max_pos:
            notes.append(f"seq_len {T} exceeds max_position_embeddings={max_pos}")
    m = scale * math.sqrt(head_dim) * a_rope**2
    scaling, scaling_param = "none", None
    if abs(m - 1.0) > 1e-12:
        f = (getattr(cfg, "rope_parameters", None) or {}).get("factor")
        yarn_default = rtype == "yarn" and f and abs(a_rope - (0.1 * math.log(f) + 1)) < 1e-9
        if yarn_default and abs(scale * math.sqrt(head_dim) - 1) < 1e-12:
            scaling, scaling_param = "yarn", float(f)
        else:
            scaling, scaling_param = "tau", m
    qk_norm = mt in _QK_NORM
    qk_std = d**-0.5 if qk_norm else None
    if qk_norm:
        notes.append("QK-norm: q and k are RMS-normalised per head, so sigma_s = 1 (times the "
                     "logit multiplier) whatever the Q/K init; beta is not set by init_std")
    if kv != H:
        notes.append(f"GQA: {kv} K/V heads shared by {H} query heads; per-head statistics "
                     "follow the theory, heads in one group are correlated")
    if head_dim * H != d:
        notes.append(f"head_dim {head_dim} x {H} heads != d_model {d}: sigma_s is unaffected, "
                     "the spec's d_head is d_model/heads")
    heads = H if d % H == 0 else math.gcd(d, H)
    window = getattr(cfg, "sliding_window", None)
    if (isinstance(window, int) and window < T and getattr(cfg, "use_sliding_window", True)):
        notes.append(f"sliding window {window} < seq_len {T}: keys are limited to the window, "
                     "the theory lets every query see all (earlier) keys")

    # variances: GPT-2 residual scaling, pre-LN embedding scale q0, input cosine rho0
    var_o, var_w_out = std**2 * d, std**2 * d_ff
    if mt == "gpt2":
        var_o, var_w_out = var_o / (2 * L), var_w_out / (2 * L)
        notes.append("GPT-2 init scales both c_proj by 1/sqrt(2L): in sigma_o2 and sigma_w2_out")
    shared = 1 if getattr(cfg, "type_vocab_size", 0) else 0
    tables = 2 + shared if positions == "learned" else 1
    embed_q = 1.0 if norm == "post" else tables * std**2
    r0 = shared / tables if rho0 == "auto" else rho0
    if shared:
        notes.append(f"token-type embedding shared by all positions: distinct tokens enter "
                     f"with cosine rho0 = {shared}/{tables}")
    explicit = mt == "gpt2"
    if norm == "pre":
        if absorb_embedding:
            var_o, var_w_out, explicit = var_o / embed_q, var_w_out / embed_q, True
            notes.append(f"pre-LN: embeddings enter the residual stream with q0 = {embed_q:.3g}; "
                         "absorbed into sigma_o2 and sigma_w2_out (measured q is in units of q0)")
        notes.append("final norm after the last block is outside the theory (cos unchanged)")
    if getattr(cfg, "attention_bias", False) or mt == "qwen2":
        notes.append("attention biases are zero at init (sigma_b2 = 0)")
    try:
        spec = ArchSpec(depth=L, d_model=d, heads=heads, d_ff=d_ff, seq_len=T, norm=norm,
                        ln_kind=ln_kind, qk_std=qk_std, scaling=scaling,
                        scaling_param=scaling_param, init_std=std,
                        sigma_o2=var_o if explicit else None,
                        sigma_w2_out=var_w_out if explicit else None, sigma_b2=0.0,
                        activation=act, causal=causal, rho0=r0)
    except SpecError as err:  # name the config.json field the bad value came from
        if err.field == "seq_len":
            raise
        key = _CONFIG_KEYS.get(err.field, err.field)
        raise SpecError("model", f"config {key}: {str(err).split(': ', 1)[1]}") from None
    fix = getattr(cfg, "sigprop_fix", None)
    if isinstance(fix, dict):
        spec = spec_with_record(spec, fix)
        notes.append("sigprop fix in config.json: " + ", ".join(
            f"{k}={v}" for k, v in fix.items() if k != "version" and v is not None))
    info = HFInfo(model_type=mt, n_heads=H, n_kv_heads=kv, head_dim=head_dim,
                  vocab_size=cfg.vocab_size, positions=positions, rope_theta=theta,
                  rope_type=rtype, rope_attention_factor=a_rope, attention_scale=scale,
                  logit_multiplier=m,
                  tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                  max_position=max_pos, max_len=max_len, embed_q=embed_q,
                  rho0=float(shared / tables), activation_hf=str(act_hf), qk_norm=qk_norm,
                  attention_bias=bool(getattr(cfg, "attention_bias", False) or mt == "qwen2"),
                  notes=tuple(notes))
    return spec, info


def spec_and_info(config, seq_len: int | None = None, *, rho0: float | str | None = "auto",
                  absorb_embedding: bool = True) -> tuple[ArchSpec, HFInfo]:
    """:func:`spec_from_config` and :func:`describe` in one call."""
    return _analyse(config, seq_len, rho0, absorb_embedding)


def spec_from_config(config, seq_len: int | None = None, *, rho0: float | str | None = "auto",
                     absorb_embedding: bool = True) -> ArchSpec:
    """The :class:`ArchSpec` of an HF architecture at its HF initialisation (module docstring).

    ``config``: anything :func:`load_config` takes. ``seq_len``: default
    ``min(max_position_embeddings, 512)`` (learned positions: the model's longest input, which
    ``seq_len`` may not exceed). ``rho0``: ``"auto"`` = the expected input cosine of distinct
    tokens, None = leave it to the measurement / 0. Unsupported families raise SpecError."""
    return _analyse(config, seq_len, rho0, absorb_embedding)[0]


def describe(config, seq_len: int | None = None) -> HFInfo:
    """The :class:`HFInfo` of an HF architecture (what ArchSpec cannot hold, and notes)."""
    return _analyse(config, seq_len, "auto", True)[1]


def translations(config, seq_len: int | None = None, rho: float | None = None) -> dict:
    """docs/theory.md §6 names of the score scale (``ArchSpec.derived``), identical for every
    layer at HF init (all Q/K weights share one law); ``rho`` defaults to the spec's ``rho0``."""
    return spec_from_config(config, seq_len).derived(rho)


def spec_with_record(spec: ArchSpec, rec: dict[str, Any]) -> ArchSpec:
    """The spec of a model whose config carries ``sigprop_fix`` = ``rec``."""
    kw: dict[str, Any] = {}
    if rec.get("qk_std") is not None:
        kw.update(qk_std=float(rec["qk_std"]), beta=None)
    if rec.get("alpha_attn") is not None:
        kw["alpha_attn"] = float(rec["alpha_attn"])
    if rec.get("attention") is not None:
        kw["attention"] = rec["attention"]
    if (rec.get("scaling") or "none") != "none":
        kw.update(scaling=rec["scaling"], scaling_param=rec.get("scaling_param"))
    return spec.replace(**kw) if kw else spec


def first_attr(cfg, names, default=None):
    from .config import config_attr

    for n in names:
        v = config_attr(cfg, n)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return v
    return default


def input_kind(config) -> str:
    """What a model of this config takes: ``"text"`` (``input_ids``), ``"image"``
    (``pixel_values``) or ``"audio"`` (``input_features``), from its model class's
    ``main_input_name`` (``"text"`` when the class cannot be found)."""
    try:
        from transformers import AutoModel

        cls = AutoModel._model_mapping[type(load_config(config))]
        name = getattr(cls, "main_input_name", "input_ids")
    except Exception:  # noqa: BLE001 - unknown class: text, as most families
        name = "input_ids"
    if not isinstance(name, str):
        name = "input_ids"
    return {"pixel_values": "image", "input_features": "audio", "input_values": "audio"}.get(
        name, "text")


def generic_spec_and_info(config, seq_len: int | None = None) -> tuple[ArchSpec, HFInfo]:
    """A placeholder :class:`ArchSpec` and :class:`HFInfo` for a model type not in
    :data:`FAMILIES`, from generic config fields only (layers, width, heads, MLP width,
    ``initializer_range``, sequence length). No theory is run on it (``sigprop diagnose``
    gives a measured-only diagnosis): it sizes the inputs and names the shape in reports.
    The sequence length is the model's own where the input fixes it (image patches + 1,
    Whisper's ``max_source_positions``)."""
    cfg = load_config(config)
    mt = cfg.model_type
    try:  # a composite's language model (Kimi-K2.5): the sizes its top level does not state
        text = cfg.get_text_config()
    except Exception:  # noqa: BLE001 - a config class without the method's usual layout
        text = cfg

    def size(names, default):
        return first_attr(cfg, names) or first_attr(text, names, default)

    d = int(size(("hidden_size", "d_model", "dim", "n_embd"), 64))
    L = int(size(("num_hidden_layers", "encoder_layers", "num_layers", "n_layers", "n_layer"),
                 1))
    H = int(size(("num_attention_heads", "encoder_attention_heads", "num_heads", "n_heads",
                  "n_head"), 1))
    kv = int(size(("num_key_value_heads", "num_kv_heads"), H))
    head_dim = int(size(("head_dim", "d_kv"), d // H or 1))
    d_ff = int(size(("intermediate_size", "encoder_ffn_dim", "ffn_dim", "d_ff", "hidden_dim",
                     "n_inner"), 4 * d))
    std = float(first_attr(cfg, ("initializer_range", "init_std"), 0.02))
    kind = input_kind(cfg)
    max_pos = first_attr(cfg, ("max_position_embeddings", "n_positions"))
    max_len = None
    if kind == "image":
        image, patch = getattr(cfg, "image_size", 224), getattr(cfg, "patch_size", 16)
        image = image if isinstance(image, int) else image[0]
        patch = patch if isinstance(patch, int) else patch[0]
        T = max_len = (image // patch) ** 2 + 1
    elif kind == "audio":
        T = max_len = int(first_attr(cfg, ("max_source_positions",), 1500))
    else:
        learned = getattr(cfg, "position_embedding_type", "absolute") == "absolute" and not (
            getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None))
        max_len = int(max_pos) if max_pos and learned else None
        T = int(seq_len) if seq_len is not None else min(int(max_pos or DEFAULT_SEQ_LEN),
                                                         DEFAULT_SEQ_LEN)
        if max_len is not None and T > max_len:
            raise SpecError("seq_len", f"must be <= {max_len} for {mt} "
                                       f"(max_position_embeddings; got {T})")
    heads = H if d % H == 0 else math.gcd(d, H)
    act_hf = getattr(cfg, "hidden_act", None) or getattr(cfg, "activation_function", None) \
        or getattr(cfg, "hidden_activation", None) or "unknown"
    notes = (f"theory: model type {mt!r} is not mapped to an ArchSpec yet; verdict read from "
             "the measurement (no theory rows, no theory-based recommendations)",)
    try:
        spec = ArchSpec(depth=max(L, 1), d_model=d, heads=heads, d_ff=d_ff, seq_len=max(T, 2),
                        init_std=std, sigma_b2=0.0, rho0=0.0)
    except SpecError as err:
        raise SpecError("model", f"config of {mt}: {err}") from None
    from .inputs import config_value

    vocab = int(config_value(cfg, ("vocab_size",), 1))
    info = HFInfo(model_type=mt, n_heads=H, n_kv_heads=kv, head_dim=head_dim,
                  vocab_size=vocab, positions="unknown", rope_theta=None, rope_type=None,
                  rope_attention_factor=1.0, attention_scale=head_dim ** -0.5,
                  logit_multiplier=1.0,
                  tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
                  max_position=int(max_pos) if max_pos else None, max_len=max_len,
                  embed_q=1.0, rho0=0.0, activation_hf=str(act_hf), qk_norm=False,
                  attention_bias=False, notes=notes)
    return spec, info


#: config fields whose features the theory leaves out, with the note each gets
_OUTSIDE = (
    ("attn_logit_softcapping", "attention logit soft-capping ({v}): logits pass through "
                               "{v} tanh(s / {v}); the theory uses the raw logits"),
    ("final_logit_softcapping", None),
    ("sliding_window", "sliding window {v}: the theory lets every query see all (earlier) keys"),
)


def _layer_type_notes(config, T: int) -> list[str]:
    """One note on a config's per-layer attention types (``layer_types``: sliding vs full
    attention, linear attention ...): which layers are which, and where a sliding window is
    shorter than T (the theory then lets those layers' queries see every earlier key)."""
    from collections import Counter

    from .config import config_attr

    kinds = config_attr(config, "layer_types")
    if not isinstance(kinds, list | tuple) or len(set(map(str, kinds))) < 2:
        return []
    count = Counter(map(str, kinds))
    text = ", ".join(f"{k} x {n}" for k, n in count.items())
    out = [f"per-layer attention types: {text} (layers "
           + "; ".join(f"{k}: " + ",".join(str(i + 1) for i, t in enumerate(kinds) if str(t) == k)
                       for k in count) + ")"]
    w = config_attr(config, "sliding_window")
    if isinstance(w, int) and not isinstance(w, bool) and 0 < w < T and any(
            "sliding" in str(t) for t in kinds):
        out.append(f"sliding layers see a window of {w} < T = {T} keys; their theory rows let "
                   "every query see all earlier keys")
    return out


def _ranges(layers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out: list[str] = []
    for x in layers:
        if out and out[-1].split("-")[-1] == str(x - 1):
            out[-1] = out[-1].split("-")[0] + f"-{x}"
        else:
            out.append(str(x))
    return ", ".join(out)


def structure_spec(spec: ArchSpec, config, table, causal_seen: bool | None = None, *,
                   rope: bool = False, position_bias: bool = False
                   ) -> tuple[ArchSpec | None, list[str]]:
    """A theory spec for a model type outside :data:`FAMILIES`, from what the weights and the
    call order say (:class:`sigprop.measurement.weight_table.WeightTable` ``structure``): norm
    placement, parallel blocks, gated MLP, the activation (read functionally), causality (the
    attention module's, or a mask seen to hide every later key), the logit scale. Returns
    ``(spec, notes)``, or ``(None, notes)`` with the reason when the blocks are not all of one
    layout the theory covers (an MLP the reader does not recognise, an unrecognised
    activation ...); mixture-of-experts MLPs are in the theory (docs/theory.md §2.5.2).
    Hybrid stacks: blocks without attention (layout ``mixer`` ``"measured"``) are measured
    residual maps (docs/theory.md §2.8.1), noted by layer; the layout is the attention
    blocks'.
    ``rope`` / ``position_bias``: the model rotates q, k / adds a position bias to the logits
    (noted: outside the theory)."""
    import statistics
    from collections import Counter

    st = list(table.structure)
    mixed = [i + 1 for i, s in enumerate(st) if s.get("mixer") == "measured"]
    st_all = st
    st = [s for s in st if s.get("mixer") != "measured"]  # the attention blocks' layout
    if not st:
        return None, ["theory: no block layout read"]
    # hybrid stacks: attention blocks without an MLP (Nemotron-H's "*" layers: the MLP is a
    # block of its own) have a zero MLP branch (the reader's var_w_in = var_w_out = 0)
    bare = [i + 1 for i, s in enumerate(st_all)
            if mixed and s.get("mixer") != "measured" and s["mlp"] == "missing"]
    if bare:
        if any(table.layers[i - 1].var_b > 0 for i in bare):
            return None, ["theory: attention blocks without an MLP carry biases (the "
                          "theory's MLP branch would add them); verdict read from the "
                          "measurement"]
        causal_all = any(s["causal"] for s in st)
        st = [s for s in st if s["mlp"] != "missing"] or [
            dict(st[0], mlp="ok", activation="linear", activation_error=0.0, gated=False,
                 parallel=False, sandwich=False)]
        st[0] = dict(st[0], causal=st[0]["causal"] or causal_all)
    body = st[1:] if len(st) > 1 else st  # layer 1 may read the embeddings' norm (ModernBERT)
    norm = Counter(s["norm"] for s in body).most_common(1)[0][0]
    keys = ("parallel", "gated", "activation", "mlp", "sandwich")
    first = {k: body[0][k] for k in keys}
    if any({k: s[k] for k in keys} != first for s in st):
        return None, ["theory: the blocks differ in layout (MLP, activation or parallel "
                      "branches); verdict read from the measurement"]
    if first["mlp"] != "ok":
        why = ("no MLP found" if first["mlp"] == "missing"
               else "MLP not recognised")
        return None, [f"theory: {why}; verdict read from the measurement"]
    act = first["activation"]
    if act is None:
        return None, ["theory: the MLP activation is not one the theory has (relu, gelu, "
                      "silu, tanh, linear); verdict read from the measurement"]
    notes = []
    if first["gated"]:
        if act not in ("silu", "gelu"):
            return None, [f"theory: gated MLP with {act} is not covered; verdict read from "
                          "the measurement"]
        act = "swiglu" if act == "silu" else "geglu"
    if max(s["activation_error"] for s in st) > 2e-3:
        notes.append(f"activation read as GELU (max difference "
                     f"{max(s['activation_error'] for s in st):.2g} on [-5, 5]: an "
                     "approximation such as quick-GELU)")
    causal = any(s["causal"] for s in st) or bool(causal_seen)
    if causal and not any(s["causal"] for s in st):
        notes.append("causal: the attention mask hides every later key (read from the "
                     "measured attention)")
    m = float(statistics.median(table.scale))
    scaling, param = ("none", None) if abs(m - 1.0) < 1e-9 else ("tau", m)
    if scaling == "tau":
        notes.append(f"logit scale {m:.4g} / sqrt(d_head) (spec scaling tau = {m:.4g})")
    for key, text in _OUTSIDE:
        v = getattr(config, key, None)
        if text and isinstance(v, int | float) and not isinstance(v, bool) and v:
            if key != "sliding_window" or v < spec.seq_len:
                notes.append(text.format(v=v))
    notes += _layer_type_notes(config, spec.seq_len)
    if rope:
        notes.append("RoPE: the theory ignores the positional rotation (score variance "
                     "unchanged)")
    if position_bias:
        notes.append("position bias added to the logits (ALiBi / relative): not in the theory "
                     "(the measurement includes it)")
    lays = table.layers or ()
    if any(x.sink_logit is not None for x in lays):
        notes.append("attention sinks: per-head sink logits read from the weights, in the "
                     "theory (docs/theory.md §2.4.3)")
    if any(x.moe_experts is not None for x in lays):
        moe = next(x for x in lays if x.moe_experts is not None)
        shared = ", a shared expert" if moe.moe_shared_var_in is not None else ""
        notes.append(f"mixture of experts: top-{moe.moe_top_k} of {moe.moe_experts} experts "
                     f"({moe.moe_weighting} weights{shared}) read from the weights, in the "
                     "theory (docs/theory.md §2.5.2)")
    glu = next((s_["glu"] for s_ in st if s_.get("glu")), None)
    if glu is not None and any(x.glu_shift for x in lays):
        notes.append(f"clamped SwiGLU experts (gpt-oss): gate g sigmoid({glu[0]:.4g} g) read "
                     "as GELU, the up branch's + 1 in the theory (docs/theory.md §2.5.3); the "
                     f"clamps at {glu[1]:.3g} are not (inactive while |g|, |u| stay below)")
    mla = next((s_["mla"] for s_ in st if s_.get("mla")), None)
    if mla is not None:
        qr = mla["q_lora_rank"]
        notes.append("multi-head latent attention (MLA: query rank "
                     f"{qr if qr is not None else 'none (full query map)'}, key/value latent "
                     f"{mla['kv_lora_rank']}, head {mla['qk_nope_head_dim']} + "
                     f"{mla['qk_rope_head_dim']} RoPE, values {mla['v_head_dim']}): score std "
                     "and value variance read through the latent RMSNorms, in the theory "
                     "(docs/theory.md §2.4.5); no probe site: the measured per-head score "
                     "std and beta are not recomputed")
    if any(x.gate_var is not None for x in lays):
        notes.append("output-gated attention: the sigmoid gate's variance read from the "
                     "weights, in the theory (docs/theory.md §2.4.4)")
    if mixed:
        att = [i for i in range(1, len(mixed) + len(st) + 1) if i not in mixed]
        notes.append(f"hybrid stack: layer(s) {_ranges(mixed)} have no attention (another "
                     "token mixer): measured residual maps in the theory, mixer and MLP "
                     f"together (docs/theory.md §2.8.1); layer(s) {_ranges(att)} from the "
                     "attention theory"
                     + (f" (layer(s) {_ranges(bare)}: attention only, no MLP branch)"
                        if bare else ""))
    notes.append(f"block layout read from the model: {norm}-LN"
                 f"{', normalised branch outputs' if first['sandwich'] else ''}"
                 f"{', parallel attention + MLP' if first['parallel'] else ''}, {act}"
                 f"{', causal' if causal else ''}")
    new = spec.replace(norm=norm, parallel=bool(first["parallel"]) and norm != "none",
                       activation=act, causal=causal, scaling=scaling, scaling_param=param)
    return new, notes
