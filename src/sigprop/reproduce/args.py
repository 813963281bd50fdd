"""Argument checks shared by every reproduced item: one line naming the argument and its
allowed range, raised as :class:`sigprop.spec.SpecError` (a ``ValueError``) before any work,
so ``sigprop reproduce`` exits 2 with that line.

Each checker returns the value in the type the item computes with (``int``, ``float``, a
float64 array, a list of ints).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..spec import SpecError

__all__ = ["device", "grid", "integer", "integers", "need", "real", "reals"]


def need(name: str, ok: bool, allowed: str) -> None:
    """Raise ``SpecError(name, "must be <allowed>")`` unless ``ok``."""
    if not ok:
        raise SpecError(name, f"must be {allowed}")


def _is_int(v) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def integer(name: str, v, lo: int, hi: int = 10**9) -> int:
    """An integer in ``[lo, hi]`` (a bool is not one)."""
    need(name, _is_int(v) and lo <= v <= hi, f"an integer in [{lo}, {hi}] (got {v!r})")
    return int(v)


def real(name: str, v, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = float("nan")
    ok = math.isfinite(x) and (lo < x if lo_open else lo <= x) and x <= hi
    need(name, ok, f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}] (got {v!r})")
    return x


def grid(name: str, v, lo: float, hi: float, *, ints: bool = False, n_min: int = 2,
         increasing: bool = True) -> np.ndarray:
    """A 1-D list of at least ``n_min`` finite numbers in ``[lo, hi]``, strictly increasing
    unless ``increasing=False``, whole numbers with ``ints`` (then returned as ints)."""
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        a = np.asarray([np.nan])
    ok = a.ndim == 1 and a.size >= n_min and bool(np.all(np.isfinite(a))) \
        and bool(np.all((a >= lo) & (a <= hi)))
    if ok and increasing and a.size > 1:
        ok = bool(np.all(np.diff(a) > 0))
    if ok and ints:
        ok = bool(np.all(a == np.round(a)))
    kind = "integers" if ints else "numbers"
    order = "an increasing list" if increasing else "a list"
    need(name, ok, f"{order} of >= {n_min} {kind} in [{lo:g}, {hi:g}] (got {v!r})")
    return a.astype(int) if ints else a


def integers(name: str, vals: Sequence[int] | int, lo: int, hi: int, *,
             increasing: bool = False, n_min: int = 1) -> list[int]:
    """A list of integers (a single one is a list of one) in ``[lo, hi]``."""
    out = list(np.atleast_1d(np.asarray(vals, dtype=object)))
    ok = len(out) >= n_min and all(_is_int(x) and lo <= x <= hi for x in out)
    ok = ok and (not increasing or all(b > a for a, b in zip(out, out[1:], strict=False)))
    order = "an increasing list" if increasing else "a list"
    need(name, ok, f"{order} of >= {n_min} integers in [{lo}, {hi}] (got {vals!r})")
    return [int(x) for x in out]


def reals(name: str, vals, lo: float, hi: float, *, n_min: int = 1) -> np.ndarray:
    """Finite numbers (a single one is a list of one) in ``[lo, hi]``, as float64."""
    try:
        arr = np.atleast_1d(np.asarray(vals, dtype=np.float64))
    except (TypeError, ValueError):
        arr = np.asarray([np.nan])
    ok = arr.ndim == 1 and arr.size >= n_min and bool(np.all(np.isfinite(arr))) \
        and bool(np.all((arr >= lo) & (arr <= hi)))
    need(name, ok, f"numbers in [{lo:g}, {hi:g}] (got {vals!r})")
    return arr


def device(d) -> str:
    """A torch device string: ``cpu``, ``cuda[:i]`` or ``mps``."""
    need("device", isinstance(d, str) and d.split(":")[0] in ("cpu", "cuda", "mps"),
         f"cpu, cuda or mps (got {d!r})")
    return d
