"""The norms of a block as the norm-placement methods (peri-ln, ln-scaling, mix-ln, dyt) see
them: the norms on each branch's input, in the block's module order (a pre-LN block: the
attention's, then the MLP's), and a fresh norm of the model's own kind for a new place.

The input norms are every norm module of the block (:attr:`.parts.Part.norms`) except those
on the branch outputs (Gemma 2 / OLMo 2 style blocks, Peri-LN's own, named ``sigprop_*``)
and those inside the attention module (a model's own q, k or v norms).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ...spec import SpecError
from .parts import GATE, HOOKS, Part, is_norm

#: attribute prefix of the norms sigprop puts into a block (Peri-LN's branch output norms)
OWN = "sigprop_"


def input_norms(p: Part) -> list[nn.Module]:
    """``p``'s norms on its branch inputs, in module order (module docstring)."""
    inner = set() if p.site is None else {id(m) for m in p.site.module.modules()}
    outs = {id(m) for m in (p.gate_attn_at, p.gate_mlp_at) if m is not None and is_norm(m)}
    got = []
    for parent, attr in p.norms:
        m = getattr(parent, attr, None)
        if m is None or not is_norm(m) or attr.startswith(OWN) or id(m) in inner \
                or id(m) in outs:
            continue
        got.append(m)
    return got


def need_pre_ln(ctx, method: str, what: str) -> None:
    """SpecError naming ``method`` unless the model is pre-LN (``what``: why it needs it)."""
    if ctx.norm != "pre":
        raise SpecError(method, f"needs a pre-LN model ({what}); this one is "
                                f"{'without norms' if ctx.norm == 'none' else ctx.norm + '-LN'}")


def two_input_norms(p: Part, method: str) -> tuple[nn.Module, nn.Module]:
    """The attention's and the MLP's input norm of a sequential pre-LN block, or a SpecError
    (a parallel block has one, a decoder block with cross-attention three)."""
    got = input_norms(p)
    if len(got) != 2:
        raise SpecError(method, f"{p.name}: needs one norm before the attention and one before "
                                f"the MLP (found {len(got)} input norms)")
    return got[0], got[1]


@torch.no_grad()
def fresh_norm(model: nn.Module, like: nn.Module) -> nn.Module:
    """A new norm of ``like``'s class, width and epsilon at the model's own initialisation
    (``_init_weights``: LayerNorm and RMSNorm gains 1, Gemma's ``1 + w`` at w = 0), without
    ``like``'s hooks or sigprop gates."""
    n = copy.deepcopy(like)
    n._forward_hooks.clear()
    n._forward_pre_hooks.clear()
    n.__dict__.pop(HOOKS, None)
    for store in (n._parameters, n._buffers):
        store.pop(GATE, None)
    for name, prm in list(n._parameters.items()):
        if prm is not None:  # fresh tensors: HF's init skips the ones flagged initialised
            setattr(n, name, nn.Parameter(torch.empty_like(prm), requires_grad=prm.requires_grad))
    init = getattr(model, "_init_weights", None)
    if callable(init):
        init(n)
    else:
        for name, prm in n.named_parameters(recurse=False):
            prm.fill_(1.0 if name == "weight" else 0.0)
    return n


def width_of(norm: nn.Module) -> int:
    """A norm's feature width (its ``normalized_shape``, or its gain's size)."""
    shape = getattr(norm, "normalized_shape", None)
    if isinstance(shape, tuple | list | torch.Size) and len(shape):
        return int(shape[-1])
    w = getattr(norm, "weight", None)
    if isinstance(w, torch.Tensor) and w.dim() == 1:
        return int(w.numel())
    for key in ("hidden_size", "dim"):
        v = getattr(norm, key, None)
        if isinstance(v, int) and v > 0:
            return v
    raise SpecError("method", f"{type(norm).__name__}: cannot tell its width")
