"""q and k read where a HuggingFace attention module hands them to its attention function.

transformers' attention modules form their query and key states (projections, norms, RoPE in
whatever convention, latent up-projections) and then call the function the config's
``_attn_implementation`` names in ``ALL_ATTENTION_FUNCTIONS`` (eager: the module file's own
``eager_attention_forward``) as ``fn(module, query, key, value, attention_mask, scaling=...,
...)``, query ``(B, H, T, d)`` and key ``(B, H_kv, Tk, d)``. Reading them there is exact for
any such module, whatever happened before the call -- multi-head latent attention
(DeepSeek-V2/V3, Kimi K2, GLM-4 MoE Lite, MiniCPM3, ...) included, where the key is assembled
from a shared latent and a shared rotary part that no single projection holds.

How it is reached without touching other models: :func:`attach` gives the one attention
module its own shallow copy of its config whose implementation name is
``"sigprop-telemetry|<name>"``, registered (once per name) in transformers'
``AttentionInterface`` as a function that passes query and key to the module's reader and
then calls the original function unchanged. :func:`attach` returns the undo (the module's own
config object back). The output of the attention is the original function's: nothing the
model computes changes.

Not attached (the reason is returned instead): a module without a transformers config, one
whose implementation is a flash kernel (their modules compare the implementation's name to
pick code paths, which the renamed copy would not match), and an eager module whose file has
no ``eager_attention_forward``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import weakref
from collections.abc import Callable

from torch import nn

__all__ = ["PREFIX", "attach", "interface_modules"]

PREFIX = "sigprop-telemetry|"
#: module -> its reader ``(module, query, key, attention_mask, kwargs)``
_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REGISTERED: set[str] = set()


def _original(module: nn.Module, name: str) -> Callable | None:
    if name == "eager":
        return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS else None


def _through(name: str) -> Callable:
    """The registered function for implementation ``name``: read, then the original."""

    def attend(module, query, key, value, attention_mask, *args, **kwargs):
        read = _READERS.get(module)
        if read is not None:
            read(module, query, key, attention_mask, kwargs)
        return _original(module, name)(module, query, key, value, attention_mask, *args,
                                       **kwargs)

    return attend


@functools.lru_cache(maxsize=1024)
def _calls_interface(cls: type) -> bool:
    """Whether the class's forward looks its attention function up in transformers'
    interface (its source names the interface)."""
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError, AttributeError):
        return False
    return "ATTENTION_FUNCTIONS" in src or "attention_interface" in src


def interface_modules(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(name, module), ...]``: the modules of ``block`` (itself included) that hold a
    transformers config and call the attention interface from their forward, in module
    order."""
    out = []
    for name, m in block.named_modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and \
                _calls_interface(type(m)):
            out.append((name, m))
    return out


def attach(module: nn.Module, read: Callable) -> Callable[[], None] | str:
    """Route ``module``'s attention-function calls through ``read(module, query, key,
    attention_mask, kwargs)`` first. Returns the undo, or one line saying why it cannot."""
    from transformers import AttentionInterface

    cfg = getattr(module, "config", None)
    name = getattr(cfg, "_attn_implementation", None)
    if not isinstance(name, str):
        return "its config names no attention implementation"
    base = name.removeprefix(PREFIX)
    if "flash" in base:
        return (f"attention implementation {base!r}: the telemetry reads this module's q and "
                "k under eager, sdpa or flex attention")
    if _original(module, base) is None:
        return f"attention implementation {base!r} not found for {type(module).__name__}"
    key = PREFIX + base
    if key not in _REGISTERED:
        AttentionInterface.register(key, _through(base))
        _REGISTERED.add(key)
    mine = copy.copy(cfg)
    mine._attn_implementation_internal = key
    module.config = mine
    _READERS[module] = read

    def undo() -> None:
        if module.config is mine:
            module.config = cfg
        _READERS.pop(module, None)

    return undo
