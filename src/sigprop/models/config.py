"""HF configs for :mod:`sigprop.models.loading` (re-exported there): a preset name
(:mod:`sigprop.models.presets`), a ``config.json`` or a model folder, read as JSON (never the hub,
never remote code), and small configs of the same family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..spec import SpecError
from .presets import PRESETS
from .presets import shrink as _shrink_dict

__all__ = ["config_attr", "load_config", "shrink"]


#: config fields that count or size something: integers in [1, upper bound] (the bounds are
#: ArchSpec's, so a config that passes here also passes there)
_SIZE_FIELDS = {
    "hidden_size": 1_000_000, "num_attention_heads": 1_000_000, "num_hidden_layers": 100_000,
    "num_key_value_heads": 1_000_000, "intermediate_size": 10_000_000, "head_dim": 1_000_000,
    "vocab_size": 100_000_000, "max_position_embeddings": 2**30, "num_layers": 100_000,
    "num_heads": 1_000_000, "d_model": 1_000_000, "d_ff": 10_000_000, "d_kv": 1_000_000,
}
_MAX_LISTED = 10


def _known_types_hint() -> str:
    from transformers import CONFIG_MAPPING

    common = [t for t in ("bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "t5", "opt",
                          "falcon", "gemma") if t in CONFIG_MAPPING]
    listed = ", ".join(common[:_MAX_LISTED])
    return f"{len(list(CONFIG_MAPPING.keys()))} types are known, e.g. {listed}, …"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_fields(cls, d: dict[str, Any], where: str) -> None:
    """Validate a config dict's fields before transformers (or a model) sees them: integer
    and float fields must have that type (read from the config class's defaults, so every
    family is covered), sizes lie in their range, heads divide the width. Raises a one-line
    :class:`SpecError` naming the config field and its allowed range."""
    import math

    def bad(key: str, msg: str):
        raise SpecError("model", f"{where}: {key} {msg}")

    # attribute_map: standard name -> this family's name (gpt2: hidden_size -> n_embd)
    standard = {v: k for k, v in (getattr(cls, "attribute_map", {}) or {}).items()}
    canon = {k: standard.get(k, k) for k in d}
    try:
        defaults = cls()
    except Exception:  # a family whose config cannot be built without arguments
        defaults = None
    for key, val in d.items():
        name = canon[key]
        ref = config_attr(defaults, key) if defaults is not None else None
        if name in _SIZE_FIELDS or key in _SIZE_FIELDS:
            hi = _SIZE_FIELDS.get(name, _SIZE_FIELDS.get(key))
            if val is None and (name in ("num_key_value_heads", "head_dim") or ref is None):
                continue  # None where the class's own default is None (transformers decides)
            if isinstance(val, float) and val.is_integer() and 1 <= val <= hi:
                continue  # 1200.0: transformers decides whether it takes a float
            vals = list(val.values()) if isinstance(val, dict) else val
            if isinstance(vals, list) and vals and all(_is_int(v) and 1 <= v <= hi
                                                       for v in vals):
                continue  # per-stage / per-part values (Swin heads per stage, LXMERT layers)
            if not _is_int(val) or not 1 <= val <= hi:
                bad(key, f"must be an integer in [1, {hi}] (got {val!r})")
        elif key.endswith(("_eps", "epsilon")) or key == "initializer_range":
            if isinstance(val, bool) or not isinstance(val, int | float) or not (
                    math.isfinite(val) and 0 < val <= 1e3):
                bad(key, f"must be a finite number in (0, 1000] (got {val!r})")
        elif _is_int(ref) and not _is_int(val) and val is not None and not (
                isinstance(val, list) and val and all(map(_is_int, val))):  # per-layer list
            bad(key, f"must be an integer (got {val!r})")
        elif isinstance(ref, float) and val is not None and (
                isinstance(val, bool) or not isinstance(val, int | float)
                or not math.isfinite(val)):
            bad(key, f"must be a finite number (got {val!r})")



def config_attr(cfg, name: str, *, first_layer: bool = False):
    """``getattr(cfg, name, None)`` that never raises: transformers' per-layer configs raise
    on a global read of a per-layer attribute (``AmbiguousGlobalPerLayerAttributeError``);
    such a read gives None, or with ``first_layer`` layer 0's value."""
    try:
        return getattr(cfg, name, None)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError and kin
        if not first_layer:
            return None
    try:
        return getattr(cfg.per_layer_config[0], name, None)
    except Exception:  # noqa: BLE001
        return None


def _from_dict(d: dict[str, Any], where: str):
    from transformers import CONFIG_MAPPING, AutoConfig

    d = {k: v for k, v in d.items() if k not in ("auto_map", "_name_or_path")}
    mt = d.pop("model_type", None)
    if not isinstance(mt, str):
        raise SpecError("model", f"{where} has no model_type")
    if mt not in CONFIG_MAPPING:
        raise SpecError("model", f"{where}: unknown model_type {mt[:60]!r}; "
                                 f"{_known_types_hint()}")
    _check_fields(CONFIG_MAPPING[mt], d, where)
    try:
        return AutoConfig.for_model(mt, **d)
    except Exception as err:  # noqa: BLE001 - third-party validation of an arbitrary config
        lines = [x.strip() for x in str(err).splitlines() if x.strip()]
        msg = " ".join(lines[-2:])[:200] if lines else type(err).__name__
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
    try:
        path = Path(name).expanduser()
        if path.is_dir():
            path = path / "config.json"
        found = path.is_file()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte ...
        found = False
    if not found:
        raise _unknown(name[:80] + ("…" if len(name) > 80 else ""))
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        msg = f"{path}: not a readable JSON config ({type(err).__name__})"
        raise SpecError("model", msg) from None
    if not isinstance(data, dict):
        raise SpecError("model", f"{path}: not a JSON object")
    return _from_dict(data, str(path))


def shrink(config, **sizes):
    """A small config of the same family (:func:`sigprop.models.presets.shrink` on its dict)."""
    return _from_dict(_shrink_dict(load_config(config).to_dict(), **sizes), "shrunk config")
