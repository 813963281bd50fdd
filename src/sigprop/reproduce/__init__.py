"""Reproduced seed figures and claims, one module per seed topic, in one registry.

Each experiment is a plain function that returns data (a Trajectory or a dict of arrays and
fitted constants) and never prints. Modules register their experiments with :func:`register`
under a dotted name such as ``"mindthegap.prop1"``; :data:`REGISTRY` maps names to functions and
:func:`get` looks one up with a one-line error listing the known names. Modules are imported
lazily by :func:`load_all`, so importing :mod:`sigprop.reproduce` stays cheap.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

REGISTRY: dict[str, Callable] = {}

#: Modules holding registered experiments (imported by :func:`load_all`).
MODULES: tuple[str, ...] = ("mindthegap", "training")


def register(name: str) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` to :data:`REGISTRY` under ``name`` (names are unique)."""
    def deco(fn: Callable) -> Callable:
        if name in REGISTRY and REGISTRY[name] is not fn:
            raise ValueError(f"experiment {name!r} is registered twice")
        REGISTRY[name] = fn
        return fn
    return deco


def load_all() -> dict[str, Callable]:
    """Import every experiment module that exists and return the registry."""
    for mod in MODULES:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{mod}":
                raise
    return REGISTRY


def get(name: str) -> Callable:
    """The experiment called ``name``; a ``KeyError`` naming the known ones otherwise."""
    reg = load_all()
    if name not in reg:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(sorted(reg))}")
    return reg[name]
