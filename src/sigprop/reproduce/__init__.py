"""Every figure and numbered claim of the five seed papers, one registered item each
(docs/reproduce.md; ``sigprop reproduce``).

An item is ``"<paper>.<figure>"`` (``"gg25.fig1f"``, ``"noci22.eq47"`` ...) registered in
:data:`ITEMS` by :func:`register` with the paper's claim, its figure or equation number and its
sizes; :func:`run` returns an :class:`Experiment` (the figure's data as a tidy table, a summary
table, the claims as :class:`Check` s, the Figure), and :meth:`Experiment.save` writes it.
Item modules are imported on first use by :func:`items`, so importing this package is cheap.
"""
from __future__ import annotations

from .core import (
    ITEMS,
    PAPERS,
    SIZES,
    Check,
    Experiment,
    Item,
    frame,
    items,
    register,
    run,
    select,
    slope,
)

__all__ = ["ITEMS", "PAPERS", "SIZES", "Check", "Experiment", "Item", "frame", "items",
           "register", "run", "select", "slope", "get"]


def get(name: str) -> Item:
    """The item called ``name``; a ``KeyError`` naming the known ones otherwise."""
    reg = items()
    if name not in reg:
        raise KeyError(f"unknown item {name!r}; known: {', '.join(reg)}")
    return reg[name]
