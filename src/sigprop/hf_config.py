"""HF configs for :mod:`sigprop.hf` (re-exported there): a preset name
(:mod:`sigprop.presets`), a ``config.json`` or a model folder, read as JSON (never the hub,
never remote code), and small configs of the same family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .presets import PRESETS
from .presets import shrink as _shrink_dict
from .spec import SpecError

__all__ = ["load_config", "shrink"]


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
