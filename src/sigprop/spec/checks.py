"""The checks behind :mod:`sigprop.spec`: :class:`SpecError`, whose message is one line
naming the field and its allowed range, and the number / choice validators that raise it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class SpecError(ValueError):
    """Invalid architecture value; ``str(err)`` is one line naming the field and its range."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SpecError(name, f"must be an integer in [{lo}, {hi}] (got {value!r})")
    if not lo <= value <= hi:
        raise SpecError(name, f"must be an integer in [{lo}, {hi}] (got {value})")


def check_float(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> None:
    lo_b = "(" if lo_open else "["
    try:
        x = float(value)
    except (TypeError, ValueError):
        msg = f"must be a number in {lo_b}{lo:g}, {hi:g}] (got {value!r})"
        raise SpecError(name, msg) from None
    if not math.isfinite(x) or x < lo or (lo_open and x == lo) or x > hi:
        raise SpecError(name, f"must be a finite number in {lo_b}{lo:g}, {hi:g}] (got {value!r})")


def float_tuple(name: str, values: Any, lo: float, hi: float, *, array: bool = False,
                 size: int | None = None, need: str = "") -> tuple[float, ...]:
    """``values`` as a tuple of floats, each checked by :func:`check_float`; ``array``: a
    scalar is one value (``np.atleast_1d``); ``size``: the length it must have, else
    ``SpecError(name, "needs " + need)`` with ``{got}`` the length found."""
    vals = np.atleast_1d(np.asarray(values, dtype=float)) if array else values
    out = tuple(float(x) for x in vals)
    if size is not None and len(out) != size:
        raise SpecError(name, "needs " + need.format(got=len(out)))
    for x in out:
        check_float(name, x, lo, hi)
    return out


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(name, f"must be one of {', '.join(choices)} (got {value!r})")
