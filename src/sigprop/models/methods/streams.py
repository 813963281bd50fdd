"""The block layout the stream methods (``ngpt``, ``hyper-connections``) act on, and the hook
plumbing they share: both change what a block adds to its residual stream, so both need the
block's input, its attention and MLP branches' outputs and the norm in front of each branch.

Layout: pre-LN decoder blocks as GPT-2 (``ln_1``, ``attn``, ``ln_2``, ``mlp``) and the Llama
family (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``: Llama,
Mistral, Qwen 2 ...) write them, ``h = h + attn(n1(h)); h = h + mlp(n2(h))``, and one final
norm after the last block. Anything else is refused with one line.

How a block's update is replaced without rewriting its forward: a pre-hook on the block keeps
its input ``h`` (the residual the block adds to); a hook on the attention module (its output
after any dropout) returns ``target - h``, so the block's own ``h + (target - h)`` is the
method's ``target`` (to rounding); likewise the MLP module's hook against the stream after
the attention branch, which the hook recomputes as the block does (``h + delta``, bitwise the
block's sum). The hooks read their state through the module they sit on (an object shared by
the block's hooks), so a deep copy of the model carries its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...spec import SpecError
from .parts import Part, hooked, is_norm, need

#: the hook key a stream method's block pre-hook is remembered under (one per model)
KEY = "stream"

#: (attention norm, MLP norm) attribute names of the layouts the stream methods act on
LAYOUTS = {("ln_1", "ln_2"): "GPT-2", ("input_layernorm", "post_attention_layernorm"): "Llama"}


@dataclass
class Layout:
    """One pre-LN decoder block: the block, its attention and MLP modules (the block's
    children holding the output projections) and its two norms as ``(parent, attribute)``."""

    part: Part
    attn: nn.Module
    mlp: nn.Module
    attn_norm: tuple[nn.Module, str]
    mlp_norm: tuple[nn.Module, str]

    @property
    def block(self) -> nn.Module:
        return self.part.block


class State:
    """What a block's hooks share during one forward pass (the block's input, the stream
    after its attention branch, and a method's own entries)."""

    def __init__(self, **kw):
        self.h: torch.Tensor | None = None
        self.res: torch.Tensor | None = None
        self.__dict__.update(kw)


def check_unstreamed(parts: list[Part], method: str) -> None:
    """A one-line SpecError where a stream method (ngpt, hyper-connections) already acts on
    the blocks: each replaces what a block adds to its stream, so one per model."""
    for p in parts:
        if hooked(p.block, KEY):
            raise SpecError(method, "the blocks' updates are already replaced (ngpt or "
                                    "hyper-connections applied; one per model)")


def _child_holding(block: nn.Module, target: nn.Module) -> nn.Module | None:
    for _name, child in block.named_children():
        if any(m is target for m in child.modules()):
            return child
    return None


def decoder_layout(parts: list[Part], ctx, method: str) -> list[Layout]:
    """Each block's :class:`Layout`, or a one-line SpecError naming ``method`` (``ctx``: the
    model's :class:`~.base.Context`, whose norm placement is checked; None on a reload)."""
    if not parts:
        raise SpecError(method, "no transformer blocks found")
    if ctx is not None and (ctx.decoder_depth or ctx.norm != "pre"):  # None: a reload
        what = "encoder-decoder" if ctx.decoder_depth else f"{ctx.norm}-LN"
        raise SpecError(method, f"acts on pre-LN decoder blocks (GPT-2, Llama family); this "
                                f"model is {what}")
    out = []
    for p in parts:
        o, mlp_out = need(p, "o", method), need(p, "mlp_out", method)
        names = tuple(attr for _parent, attr in p.norms)
        if names not in LAYOUTS or any(parent is not p.block for parent, _ in p.norms):
            raise SpecError(method, f"{p.name}: block norms {', '.join(names) or 'none'} are not "
                                    "a GPT-2 or Llama pre-LN layout (the method acts on those)")
        attn, mlp = _child_holding(p.block, o), _child_holding(p.block, mlp_out)
        if attn is None or mlp is None or attn is mlp:
            raise SpecError(method, f"{p.name}: no separate attention and MLP modules found")
        out.append(Layout(p, attn, mlp, p.norms[0], p.norms[1]))
    return out


def final_norm(model: nn.Module, parts: list[Part], method: str) -> tuple[nn.Module, str]:
    """The one norm after the last block (GPT-2's ``ln_f``, Llama's ``norm``) as ``(parent,
    attribute)``."""
    blocks = [p.name + "." for p in parts]
    found = [n for n, m in model.named_modules()
             if n and is_norm(m) and not any(n.startswith(b) for b in blocks)]
    if len(found) != 1:
        raise SpecError(method, f"expected one final norm outside the blocks, found "
                                f"{len(found)} ({', '.join(found) or 'none'})")
    parent, _, attr = found[0].rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr


def block_input(args, kwargs) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def with_block_input(args, kwargs, h: torch.Tensor):
    """The block's ``(args, kwargs)`` with its hidden states replaced by ``h``."""
    if args:
        return (h, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def branch_output(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def with_branch_output(out, y: torch.Tensor):
    return (y, *out[1:]) if isinstance(out, tuple) else y
