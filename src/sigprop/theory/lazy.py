"""Deferred imports for start-up time."""

from __future__ import annotations

import importlib


class LazyModule:
    """A module imported on first attribute access. Evaluating cached theory tables needs no
    SciPy, so the CLI's start-up skips ``scipy.special`` (~0.3 s) unless a table is built."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)
