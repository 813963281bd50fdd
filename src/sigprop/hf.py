"""HuggingFace architectures at initialisation (ARCHITECTURE.md: HF config -> ArchSpec).

* :func:`load_config`: a preset name (:mod:`sigprop.presets`), a ``config.json`` or a model folder.
* :func:`spec_from_config`: the :class:`~sigprop.spec.ArchSpec` the theory runs on;
  :func:`describe`: an :class:`HFInfo` holding what the spec cannot (GQA, RoPE, tied
  embeddings ...) with plain notes on where the theory does not cover the model;
  :func:`translations`: THEORY §6.
* :func:`model_at_init`: the base model (no LM head) with its own ``_init_weights``, eval mode.
* :func:`load_local_weights`: safetensors, else ``torch.load(weights_only=True)``; never unpickles.
* :func:`qkv_names`: per block, the Q/K/V/O/MLP module names (for ``sigprop fix``).

Mapping at HF init (every family here draws weights N(0, std^2), std = ``initializer_range``,
biases 0, norm gains 1). Score std (THEORY §2.1, gg25 B.1): ``sigma_s = std^2 d m``, so
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

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .measure.probe import find_attention, find_blocks
from .presets import PRESETS
from .presets import shrink as _shrink_dict
from .spec import ArchSpec, SpecError

__all__ = ["HFInfo", "LoadReport", "FAMILIES", "load_config", "shrink", "describe",
           "spec_from_config", "spec_and_info", "translations", "model_at_init",
           "load_local_weights", "qkv_names"]

_ENC, _DEC = ("post", "layernorm", False, False, "learned"), ("pre", "rms", True, True, "rope")
#: model_type -> (norm, ln_kind, causal, gated MLP, positions); the families checked here.
FAMILIES = {"bert": _ENC, "roberta": _ENC, "xlm-roberta": _ENC,
            "gpt2": ("pre", "layernorm", True, False, "learned"),
            "llama": _DEC, "mistral": _DEC, "qwen2": _DEC, "qwen3": _DEC}
_QK_NORM = ("qwen3",)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
         "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh", "linear": "linear"}
DEFAULT_SEQ_LEN = 512


@dataclass(frozen=True)
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


@dataclass
class LoadReport:
    """What :func:`load_local_weights` did: ``trained`` is True when weights were loaded (the
    diagnosis is then of trained weights, not of the initialisation)."""

    trained: bool
    files: list[str] = field(default_factory=list)
    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # embedding tables cut to the model's rows


# --------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------
def _from_dict(d: dict[str, Any], where: str):
    from transformers import AutoConfig

    d = {k: v for k, v in d.items() if k not in ("auto_map", "_name_or_path")}
    mt = d.pop("model_type", None)
    if not isinstance(mt, str):
        raise SpecError("model", f"{where} has no model_type")
    try:
        return AutoConfig.for_model(mt, **d)
    except (ValueError, KeyError, TypeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SpecError("model", f"{where}: cannot build a {mt!r} config ({msg})") from None


def _unknown(name: str) -> SpecError:
    return SpecError("model", f"unknown model {name!r}; known presets: {', '.join(PRESETS)}, "
                              "or a local path to config.json / a model folder")


def load_config(name_or_path):
    """A ``transformers`` config from a preset name, a local ``config.json`` or a local folder
    holding one (read as JSON; never the hub, never remote code). A config object is returned
    as is, a dict is built. Anything else raises a one-line :class:`SpecError` (field
    ``model``) listing the presets."""
    from transformers import PretrainedConfig

    if isinstance(name_or_path, PretrainedConfig):
        return name_or_path
    if isinstance(name_or_path, dict):
        return _from_dict(name_or_path, "config dict")
    name = str(name_or_path)
    if name in PRESETS:
        return _from_dict(PRESETS[name], f"preset {name}")
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise _unknown(name)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        msg = f"{path}: not a readable JSON config ({type(err).__name__})"
        raise SpecError("model", msg) from None
    if not isinstance(data, dict):
        raise SpecError("model", f"{path}: not a JSON object")
    return _from_dict(data, str(path))


def shrink(config, **sizes):
    """A small config of the same family (:func:`sigprop.presets.shrink` on its dict)."""
    return _from_dict(_shrink_dict(load_config(config).to_dict(), **sizes), "shrunk config")


# --------------------------------------------------------------------------------------------
# config -> ArchSpec + HFInfo
# --------------------------------------------------------------------------------------------
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


def _analyse(config, seq_len, rho0, absorb_embedding) -> tuple[ArchSpec, HFInfo]:
    cfg = load_config(config)
    mt = cfg.model_type
    if mt not in FAMILIES:
        raise SpecError("model", f"architecture {mt!r} is not supported; supported: "
                                 f"{', '.join(FAMILIES)}")
    norm, ln_kind, causal, gated, positions = FAMILIES[mt]
    notes: list[str] = []
    d, L, H = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or H
    head_dim = getattr(cfg, "head_dim", None) or d // H
    d_ff = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * d
    std = float(cfg.initializer_range)
    act_hf = getattr(cfg, "hidden_act", None) or getattr(cfg, "activation_function", "gelu")
    act = _ACTS.get(act_hf) if isinstance(act_hf, str) else None
    if act is None or (gated and act != "silu"):
        raise SpecError("activation", f"{mt} activation {act_hf!r} has no sigprop counterpart")
    if gated:
        act = "swiglu"
        notes.append("SwiGLU MLP: covered by the product kernel silu(gate) x up (THEORY §2.5)")
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
            scaling, scaling_param = "tau", 1.0 / m
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
    spec = ArchSpec(depth=L, d_model=d, heads=heads, d_ff=d_ff, seq_len=T, norm=norm,
                    ln_kind=ln_kind, qk_std=qk_std, scaling=scaling,
                    scaling_param=scaling_param, init_std=std,
                    sigma_o2=var_o if explicit else None,
                    sigma_w2_out=var_w_out if explicit else None, sigma_b2=0.0,
                    activation=act, causal=causal, rho0=r0)
    fix = getattr(cfg, "sigprop_fix", None)
    if isinstance(fix, dict):
        from .hf_fix import spec_with_record

        spec = spec_with_record(spec, fix)
        notes.append("sigprop fix in config.json: " + ", ".join(
            f"{k}={v}" for k, v in fix.items() if k != "version" and v is not None))
    info = HFInfo(mt, H, kv, head_dim, cfg.vocab_size, positions, theta, rtype, a_rope,
                  scale, m, bool(getattr(cfg, "tie_word_embeddings", False)), max_pos, max_len,
                  embed_q, float(shared / tables), str(act_hf), qk_norm,
                  bool(getattr(cfg, "attention_bias", False) or mt == "qwen2"), tuple(notes))
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
    """THEORY §6 names of the score scale (``ArchSpec.derived``), identical for every layer at
    HF init (all Q/K weights share one law); ``rho`` defaults to the spec's ``rho0``."""
    return spec_from_config(config, seq_len).derived(rho)


# --------------------------------------------------------------------------------------------
# models and weights
# --------------------------------------------------------------------------------------------
def model_at_init(config, seed: int = 0, attn_implementation: str = "eager",
                  vocab_size: int | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``AutoModel.from_config`` (the base model, no LM head) with the model's own
    ``_init_weights`` drawn under ``torch.manual_seed(seed)`` (the caller's RNG state is
    restored), in eval mode (dropout off), KV cache off. Never downloads, never runs remote
    code (a config recording a runtime ``sigprop fix`` gets the ``"sigprop"`` attention
    function, :mod:`sigprop.hf_fix`). ``vocab_size`` replaces the embedding table's size
    before building: at init the rows are i.i.d., so a small table (e.g. 1024) changes
    nothing for signal propagation and saves memory (Llama-3.2-1B's real table is 1 GiB in
    float32). The config is not modified."""
    from transformers import AutoModel

    if attn_implementation not in ("eager", "sdpa"):
        raise SpecError("attn_implementation", f"must be eager or sdpa ({attn_implementation!r})")
    cfg = copy.deepcopy(load_config(config))
    from . import hf_fix

    if hf_fix.needs_runtime(cfg):  # centred attention / length scaling from `sigprop fix`
        hf_fix.register_attention()
        attn_implementation = hf_fix.ATTN_NAME
    if vocab_size is not None:
        pad = getattr(cfg, "pad_token_id", None)
        low = pad + 1 if isinstance(pad, int) else 1
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < low:
            raise SpecError("vocab_size", f"must be an integer >= {low} (got {vocab_size!r})")
        cfg.vocab_size = vocab_size
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = AutoModel.from_config(cfg, attn_implementation=attn_implementation, dtype=dtype,
                                      trust_remote_code=False)
    return model.eval()


def _read_weights(folder: Path) -> tuple[list[Path], dict[str, torch.Tensor]]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return files, out
    files = [f for pat in ("pytorch_model*.bin", "*.pt", "*.pth") for f in sorted(folder.glob(pat))]
    out = {}
    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any failure means: not plain tensors
            raise SpecError("weights", f"{f.name} cannot be loaded with torch.load("
                                       f"weights_only=True) ({type(err).__name__}); refusing "
                                       "to unpickle; convert to safetensors") from None
        for key in ("state_dict", "model"):
            if isinstance(obj, dict) and isinstance(obj.get(key), dict):
                obj = obj[key]
        if not isinstance(obj, dict):
            raise SpecError("weights", f"{f.name} holds no state dict")
        out.update({k: v for k, v in obj.items() if torch.is_tensor(v)})
    return files, out


@torch.no_grad()
def load_local_weights(model: nn.Module, folder) -> LoadReport:
    """Load a local folder's weights into ``model`` (in place): every ``*.safetensors`` (via
    ``safetensors.torch.load_file``), else ``pytorch_model*.bin`` / ``*.pt`` / ``*.pth`` via
    ``torch.load(weights_only=True)``, refusing (SpecError) anything that needs unpickling.
    A checkpoint of the model with a head (``bert.``, ``model.``, ``transformer.`` prefixes)
    fits the base model; head tensors are reported as unexpected. Embedding tables larger than
    the model's (built with a small ``vocab_size``) are cut to its rows. No weight files:
    ``trained=False`` and the model is untouched."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise SpecError("weights", f"{folder} is not a folder")
    files, raw = _read_weights(folder)
    if not files:
        return LoadReport(trained=False)
    own = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    embeds = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    rep = LoadReport(trained=True, files=[f.name for f in files])
    matched = {}
    for key, val in raw.items():
        k = key[len(prefix) + 1:] if prefix and key.startswith(prefix + ".") else key
        if k not in own:
            rep.unexpected.append(key)
            continue
        if val.shape != own[k].shape:
            if k in embeds and val.shape[1:] == own[k].shape[1:] and val.shape[0] > own[k].shape[0]:
                val = val[: own[k].shape[0]]
                rep.truncated.append(k)
            else:
                raise SpecError("weights", f"{key}: shape {tuple(val.shape)} in the checkpoint, "
                                           f"{tuple(own[k].shape)} in the model; build the "
                                           "model from the checkpoint's config.json")
        matched[k] = val
    if not matched:
        raise SpecError("weights", f"no tensor in {folder} matches the model's parameter names")
    model.load_state_dict(matched, strict=False)
    rep.loaded = len(matched)
    rep.missing = [k for k in own if k not in matched]
    return rep


# --------------------------------------------------------------------------------------------
# module names for fixes
# --------------------------------------------------------------------------------------------
_O = ("o_proj", "out_proj", "attention.output.dense", "attn.c_proj", "attention.dense")
_MLP_IN = ("gate_proj", "up_proj", "intermediate.dense", "c_fc", "fc1", "dense_h_to_4h")
_MLP_OUT = ("down_proj", "output.dense", "mlp.c_proj", "fc2", "dense_4h_to_h")


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"


def _ends(rel: str, pats) -> bool:
    return any(rel == p or rel.endswith("." + p) for p in pats)


def qkv_names(model: nn.Module) -> list[dict[str, Any]]:
    """Per block, the qualified names (as in ``model.named_modules()``) of its linear layers by
    role: ``q, k, v, o, mlp_out`` (str or None), ``mlp_in`` (list: ``[gate, up]`` for SwiGLU),
    ``other`` (unclassified linear layers), ``block``.

    Fused QKV (GPT-2's ``c_attn``, a ``Conv1D`` with weight ``(d, 3d)``, output ``[q | k | v]``):
    ``q = k = v = None``, ``qkv`` = its name, ``fused = "concat"``, ``qkv_slices`` = ``{"q":
    (start, stop), "k": ..., "v": ...}`` along the output features and ``out_axis`` = the weight
    axis holding them (1 for Conv1D, 0 for nn.Linear). Pass the slices to a fix; never give the
    fused module as ``q`` and ``k`` to ``init_foreign`` (the last law would win). BERT's output
    projection (``attention.output.dense``) lives outside its self-attention module."""
    out = []
    for bname, block in find_blocks(model):
        site = find_attention(block)
        e: dict[str, Any] = {"block": bname, "q": None, "k": None, "v": None, "qkv": None,
                             "fused": None, "o": None, "mlp_in": [], "mlp_out": None,
                             "other": []}
        ids = {}
        if site is not None and site.fused:
            ids, e["fused"] = {id(site.q): "qkv"}, site.fused
            if site.fused == "concat":
                n_q, n_kv = site.n_heads * site.head_dim, site.n_kv_heads * site.head_dim
                e["qkv_slices"] = {"q": (0, n_q), "k": (n_q, n_q + n_kv),
                                   "v": (n_q + n_kv, n_q + 2 * n_kv)}
                e["out_axis"] = 1 if type(site.q).__name__ == "Conv1D" else 0
        elif site is not None:
            pairs = ((site.q, "q"), (site.k, "k"), (site.v, "v"))
            ids = {id(m): r for m, r in pairs if m is not None}
        for rel, m in block.named_modules():
            if not _is_linear(m):
                continue
            full = f"{bname}.{rel}"
            role = ids.get(id(m))
            if role is None:
                role = "o" if _ends(rel, _O) else "mlp_in" if _ends(rel, _MLP_IN) else \
                    "mlp_out" if _ends(rel, _MLP_OUT) else "other"
            if role in ("mlp_in", "other"):
                e[role].append(full)
            else:
                e[role] = full
        out.append(e)
    return out


def apply_fix(model: nn.Module, **kwargs):
    """Patch an HF model in place against rank / entropy collapse; see
    :func:`sigprop.hf_fix.apply_fix` (beta, alpha_attn incl. ``"auto"``, centred, scaling)."""
    from .hf_fix import apply_fix as _apply

    return _apply(model, **kwargs)
