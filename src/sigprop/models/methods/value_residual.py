"""value-residual: the values of every block after the first mixed with the first block's,
``V_l <- lambda_self V_l + lambda_first V_1`` for ``l > 1`` (Zhou et al. 2024, "Value Residual
Learning For Alleviating Attention Concentration In Transformers", ResFormer: both 0.5 by
default; ``trainable=yes`` makes them one learned pair per block, their learnable variant).
``V_l`` is the value projection's output (after its bias, before the heads split and any
rotary or cache), so the mix acts on the values every head reads, with any attention
implementation.

Where it lands: a forward hook on the first block's value projection keeps its output for the
forward pass (a holder shared by the model's hooks), and a hook on every later block's value
projection replaces its output (its value slice of a fused ``[q | k | v]`` layer) by the mix.
The pair ``(lambda_self, lambda_first)`` is ``sigprop_value_mix`` on each later block's value
projection (a buffer, or a parameter when trainable; in the state dict, so the written folder
carries it), restored by sigprop's loader.

Theory (docs/theory.md §2.4.6): the value projections of two blocks are independent draws,
so the mixed values' kernel is ``lambda_self^2 K_l + lambda_first^2 K_1`` (no cross term),
``K_1`` the kernel of the first block's values, which the depth driver carries from block 1
(``LayerSpec.value_mix``, also on sigprop's stack); the attention rows stay block ``l``'s own.
The learned pair (``trainable=yes``) starts at the constants, so the prediction at init is
the same.
"""

from __future__ import annotations

import torch
from torch import nn

from ...spec import SpecError
from .base import Method, Param, register
from .parts import hooked, need, remember_hook

MIX = "sigprop_value_mix"
HOLD = "_sigprop_value_first"


class _First:
    """The first block's values of the current forward pass (shared by the hooks)."""

    def __init__(self):
        self.v: torch.Tensor | None = None


def _slice(out: torch.Tensor, sl) -> torch.Tensor:
    return out if sl is None else out[..., sl[0]:sl[1]]


def _put(out: torch.Tensor, sl, new: torch.Tensor) -> torch.Tensor:
    if sl is None:
        return new
    return torch.cat([out[..., :sl[0]], new, out[..., sl[1]:]], dim=-1)


def _capture_hook(module, _args, out):
    first, sl = getattr(module, HOLD)
    first.v = _slice(out, sl)
    return out


def _mix_hook(module, _args, out):
    first, sl = getattr(module, HOLD)
    if first.v is None or first.v.shape != _slice(out, sl).shape:
        raise RuntimeError("value-residual: the first block's values were not computed in "
                           "this forward pass (the first block must run before the others)")
    lam = getattr(module, MIX).to(out.dtype)
    return _put(out, sl, lam[0] * _slice(out, sl) + lam[1] * first.v.to(out.dtype))


def _targets(parts, method: str):
    """Per block its one value target ``(module, slice)``; the blocks' value widths equal."""
    if len(parts) < 2:
        raise SpecError(method, "needs two or more blocks (the first block's values feed the "
                                "later ones)")
    out = []
    for p in parts:
        v = need(p, "v", method)
        if len(v) != 1:
            raise SpecError(method, f"{p.name}: the values come from {len(v)} projections "
                                    "(one expected)")
        m, sl, _ax = v[0]  # a fused layer's slice: of its output's last axis, either layout
        out.append((m, sl))
    widths = {(sl[1] - sl[0]) if sl is not None else _width(m) for m, sl in out}
    if len(widths) != 1:
        raise SpecError(method, f"the blocks' value widths differ ({sorted(widths)}): the "
                                "first block's values cannot be added to every block's")
    return out


def _width(m: nn.Module) -> int:
    return int(getattr(m, "out_features", None) or getattr(m, "nf", 0))


def _install(parts, params, method: str) -> None:
    targets = _targets(parts, method)
    if any(hooked(m, "value_residual") for m, _ in targets):
        raise SpecError(method, "the model already mixes its values with the first block's")
    first = _First()
    m0, sl0 = targets[0]
    object.__setattr__(m0, HOLD, (first, sl0))
    remember_hook(m0, "value_residual", m0.register_forward_hook(_capture_hook))
    lam = torch.tensor([params["lambda_self"], params["lambda_first"]])
    for m, sl in targets[1:]:
        object.__setattr__(m, HOLD, (first, sl))
        dev = m.weight.device
        if params["trainable"] == "yes":
            m.register_parameter(MIX, nn.Parameter(lam.clone().to(dev)))
        else:
            m.register_buffer(MIX, lam.clone().to(dev))
        remember_hook(m, "value_residual", m.register_forward_hook(_mix_hook))


@register
class ValueResidual(Method):
    name = "value-residual"
    params = (
        Param("lambda_self", "weight of a block's own values (ResFormer: 0.5)", 0.5, lo=0.0,
              hi=10.0),
        Param("lambda_first", "weight of the first block's values (ResFormer: 0.5)", 0.5,
              lo=0.0, hi=10.0),
        Param("trainable", "no: constant weights (ResFormer); yes: one learned pair per block "
                           "(their learnable variant)", "no", choices=("no", "yes")),
    )

    def validate(self, ctx, params):
        if ctx.decoder_depth:
            raise SpecError(self.name, "acts on one stack of blocks; an encoder-decoder model "
                                       "has two")

    def apply(self, model, parts, params, ctx, effect):
        pair = (float(params["lambda_self"]), float(params["lambda_first"]))
        effect.value_mix = [None] + [pair] * (ctx.depth - 1)
        if not parts:
            return [f"values of blocks 2..L: {params['lambda_self']:.4g} V_l + "
                    f"{params['lambda_first']:.4g} V_1"]
        _install(parts, params, self.name)
        how = "learned" if params["trainable"] == "yes" else "constant"
        return [f"values of blocks 2..{len(parts)}: {params['lambda_self']:.4g} V_l + "
                f"{params['lambda_first']:.4g} V_1 ({how} weights, hooks on the value "
                "projections)"]

    def restore(self, model, parts, params):
        _install(parts, params, self.name)
