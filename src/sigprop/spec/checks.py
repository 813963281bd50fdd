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


def check_moe(self, weightings: tuple[str, ...]) -> None:
    """A LayerSpec's ``moe_*`` fields (:class:`sigprop.spec.LayerSpec`): checked and made
    floats (``weightings``: the routing rules allowed); refused without ``moe_experts``."""
    if self.moe_experts is None:
        for name, default in (("moe_top_k", 1), ("moe_router_var", 0.0),
                              ("moe_weighting", "softmax_norm"), ("moe_scale", 1.0),
                              ("moe_shared_var_in", None), ("moe_shared_var_out", None),
                              ("moe_shared_gate_var", None)):
            if getattr(self, name) != default:
                raise SpecError(f"layers.{name}", "needs moe_experts (a mixture-of-"
                                                  "experts MLP)")
        return
    check_int("layers.moe_experts", self.moe_experts, 1, 1_000_000)
    check_int("layers.moe_top_k", self.moe_top_k, 1, int(self.moe_experts))
    check_float("layers.moe_router_var", self.moe_router_var, 0.0, 1e8)
    check_choice("layers.moe_weighting", self.moe_weighting, weightings)
    check_float("layers.moe_scale", self.moe_scale, 0.0, 1e6)
    object.__setattr__(self, "moe_router_var", float(self.moe_router_var))
    object.__setattr__(self, "moe_scale", float(self.moe_scale))
    if (self.moe_shared_var_in is None) != (self.moe_shared_var_out is None):
        raise SpecError("layers.moe_shared_var_out", "give both moe_shared_var_in and "
                                                     "moe_shared_var_out, or neither")
    for name in ("moe_shared_var_in", "moe_shared_var_out", "moe_shared_gate_var"):
        if getattr(self, name) is not None:
            check_float(f"layers.{name}", getattr(self, name), 0.0, 1e12)
            object.__setattr__(self, name, float(getattr(self, name)))
    if self.moe_shared_gate_var is not None and self.moe_shared_var_in is None:
        raise SpecError("layers.moe_shared_gate_var", "needs a shared expert "
                                                      "(moe_shared_var_in)")


def check_attention_map(self) -> None:
    """A LayerSpec's attention-map fields (:class:`sigprop.spec.LayerSpec`): sigmoid rows
    (``sigmoid_bias = (k, b0)``), differential attention (``diff_lambda = (lambda_init,
    lambda_std)``, the std below 1/sqrt 2 where ``E lambda^2`` is finite) and the per-head
    output norm (``head_norm2``); at most one map in place of the softmax."""
    if self.sigmoid_bias is not None:
        object.__setattr__(self, "sigmoid_bias", float_tuple(
            "layers.sigmoid_bias", self.sigmoid_bias, -1e3, 1e3, size=2,
            need="(k, b0), the bias b0 - k log n (got {got} values)"))
    if self.diff_lambda is not None:
        lam = float_tuple("layers.diff_lambda", self.diff_lambda, -10.0, 10.0, size=2,
                          need="(lambda_init, lambda_std) (got {got} values)")
        if not 0.0 <= lam[1] < 0.7:
            raise SpecError("layers.diff_lambda", "lambda_std must be in [0, 0.7) (E lambda^2 "
                                                  f"is infinite from 1/sqrt 2; got {lam[1]!r})")
        object.__setattr__(self, "diff_lambda", lam)
    if self.head_norm2 is not None:
        check_float("layers.head_norm2", self.head_norm2, 0.0, 1e12)
        object.__setattr__(self, "head_norm2", float(self.head_norm2))
    maps = [n for n in ("sigmoid_bias", "diff_lambda", "sink_logit")
            if getattr(self, n) is not None]
    if len(maps) > 1:
        raise SpecError(f"layers.{maps[1]}", f"one map in place of the softmax per block "
                                             f"(got {maps[0]} too)")
