"""HuggingFace architectures at initialisation (docs/architecture.md: HF config -> ArchSpec).

* :func:`load_config`: a preset name (:mod:`sigprop.models.presets`), a ``config.json`` or a model
folder.
* :func:`spec_from_config`: the :class:`~sigprop.spec.ArchSpec` the theory runs on;
  :func:`describe`: an :class:`HFInfo` holding what the spec cannot (GQA, RoPE, tied
  embeddings ...) with plain notes on where the theory does not cover the model;
  :func:`translations`: docs/theory.md §6.
* :func:`model_at_init`: the base model (no LM head) with its own ``_init_weights``, eval mode.
* :func:`load_local_weights`: safetensors, else ``torch.load(weights_only=True)``; never unpickles.
* :func:`qkv_names`: per block, the Q/K/V/O/MLP module names (for ``sigprop fix``).

Models and weights live here; configs in :mod:`sigprop.models.config`, the config -> ArchSpec
mapping at HF init (score std, GPT-2 residual scaling, pre-LN embedding scale, input cosine)
in
:mod:`sigprop.models.arch`, module names in :mod:`sigprop.models.names`. Every name above is
importable
from this module.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..spec import SpecError
from .config import load_config

__all__ = ["LoadReport", "load_local_weights", "model_at_init"]


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
# models and weights
# --------------------------------------------------------------------------------------------
def model_at_init(config, seed: int = 0, attn_implementation: str = "eager",
                  vocab_size: int | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``AutoModel.from_config`` (the base model, no LM head) with the model's own
    ``_init_weights`` drawn under ``torch.manual_seed(seed)`` (the caller's RNG state is
    restored), in eval mode (dropout off), KV cache off. Never downloads, never runs remote
    code (a config recording a runtime ``sigprop fix`` gets the ``"sigprop"`` attention
    function, :mod:`sigprop.models.fixes`). ``vocab_size`` replaces the embedding table's size
    before building: at init the rows are i.i.d., so a small table (e.g. 1024) changes
    nothing for signal propagation and saves memory (Llama-3.2-1B's real table is 1 GiB in
    float32). The config is not modified."""
    from transformers import AutoModel

    if attn_implementation not in ("eager", "sdpa"):
        raise SpecError("attn_implementation", f"must be eager or sdpa ({attn_implementation!r})")
    cfg = copy.deepcopy(load_config(config))
    from . import fixes as hf_fix

    if hf_fix.needs_runtime(cfg):  # centred attention / length scaling from `sigprop fix`
        hf_fix.register_attention()
        attn_implementation = hf_fix.ATTN_NAME
    from .config import config_attr

    own = config_attr(cfg, "vocab_size")
    if vocab_size is not None and isinstance(own, int) and not isinstance(own, bool):
        pad = config_attr(cfg, "pad_token_id")  # a pad id outside the table indexes another one's
        low = pad + 1 if isinstance(pad, int) and 0 <= pad < own else 1
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < low:
            raise SpecError("vocab_size", f"must be an integer >= {low} (pad_token_id + 1; "
                                          f"got {vocab_size!r})")
        cfg.vocab_size = vocab_size
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            model = AutoModel.from_config(cfg, attn_implementation=attn_implementation,
                                          dtype=dtype, trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - third-party code on an arbitrary config
            msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            raise SpecError("model", f"cannot build a {cfg.model_type!r} model from this "
                                     f"config ({msg})") from None
        from .methods import restore_methods

        restore_methods(model)  # hooks and parameters of recorded `sigprop fix` methods
    return model.eval()


#: the weight files :func:`read_weights` reads, in order of preference
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")


def has_weights(folder) -> bool:
    """True when ``folder`` holds weight files :func:`load_local_weights` would read."""
    p = Path(folder).expanduser()
    return p.is_dir() and any(any(p.glob(pat)) for pat in WEIGHT_PATTERNS)


def read_weights(folder: Path) -> tuple[list[Path], dict[str, torch.Tensor]]:
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
    files, raw = read_weights(folder)
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


def save_quietly(model, folder) -> None:
    """``save_pretrained`` without transformers' tqdm bar on stderr (libraries never print);
    the global progress-bar switch is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(folder), safe_serialization=True)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
