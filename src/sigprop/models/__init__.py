"""The HuggingFace world: presets, configs read as JSON (never the hub, never remote code),
config -> :class:`~sigprop.spec.ArchSpec`, module names, models at init and local weights
(safetensors, or ``torch.load(weights_only=True)``), and the fixes ``sigprop fix`` applies.

The names below are the package's face; the modules hold them:
:mod:`.presets`, :mod:`.config` (load_config, shrink), :mod:`.arch` (config -> ArchSpec,
HFInfo), :mod:`.names` (Q/K/V/O/MLP module names), :mod:`.loading` (model_at_init,
load_local_weights), :mod:`.fixes` (apply_fix, the registered attention function).
"""

from .arch import (
    FAMILIES,
    FamilyLayout,
    HFInfo,
    describe,
    spec_and_info,
    spec_from_config,
    spec_with_record,
    translations,
)
from .config import load_config, shrink
from .fixes import FixReport, apply_fix
from .loading import LoadReport, load_local_weights, model_at_init
from .names import qkv_names
from .presets import PRESETS
from .reload import from_pretrained

__all__ = [
    "FAMILIES", "FamilyLayout", "PRESETS", "FixReport", "HFInfo", "LoadReport", "apply_fix",
    "describe", "from_pretrained", "load_config", "load_local_weights", "model_at_init",
    "qkv_names", "shrink", "spec_and_info", "spec_from_config", "spec_with_record", "translations",
]
