"""peri-ln: Peri-LN (Kim et al. 2025, "Peri-LN: Revisiting Layer Normalization in the
Transformer Architecture"; docs/fixes.md): each sublayer keeps its pre-LN input norm and gets
a second norm on its output, before the residual add, ``x <- x + N_out(f(N_in(x)))``. The
output norms are new modules of the model's own norm class at its own initialisation (gain
1), children of the block (``sigprop_attn_out_norm``, ``sigprop_mlp_out_norm``, so their
gains are saved with the weights), run by a forward hook on the attention's output
projection and the MLP's output layer (first among that module's hooks: a branch gate of a
residual method acts after the norm). Recorded in config.json and re-installed by sigprop's
loader. Pre-LN models only; a model that already normalises its branch outputs (Gemma 2,
OLMo 2) is refused.

Theory: the branch outputs are normalised before the add (the spec's ``branch_gain2``,
docs/theory.md §2.6): each adds a fixed squared norm ``g^2`` (1 at init) per dimension
whatever its weights, with the cosine of the normalised branch.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from ...spec import SpecError
from .base import Method, register
from .block_norms import fresh_norm, input_norms, need_pre_ln
from .parts import Part, hooked, is_norm, need, remember_hook

#: the block attributes of the two output norms (attention, MLP)
NAMES = ("sigprop_attn_out_norm", "sigprop_mlp_out_norm")
_REF = "_sigprop_out_norm"


def _out_hook(module, _args, out):
    norm = getattr(module, _REF)
    if isinstance(out, tuple):
        return (norm(out[0]),) + tuple(out[1:])
    return norm(out)


def _targets(p: Part, method: str) -> tuple[nn.Module, nn.Module]:
    if p.gate_attn_at is not None and is_norm(p.gate_attn_at):
        raise SpecError(method, f"{p.name}: the model already normalises its branch outputs "
                                "(Gemma 2 / OLMo 2 style)")
    return need(p, "o", method), need(p, "mlp_out", method)


def _install(model, parts: list[Part], method: str) -> list[float]:
    """Two output norms per block (module docstring); each block's mean squared gain."""
    from ...measurement.weight_maps import norm_gains

    plan = []
    for p in parts:  # check every block before touching one
        ins = input_norms(p)
        if not ins:
            raise SpecError(method, f"{p.name}: no input norm found to copy the kind from")
        plan.append((p, ins[0], _targets(p, method)))
    gains = []
    for p, like, mods in plan:
        for name, mod in zip(NAMES, mods, strict=True):
            if hooked(mod, "peri"):
                raise SpecError(method, f"{p.name}: peri-ln is already applied")
            norm = fresh_norm(model, like)
            p.block.add_module(name, norm)
            object.__setattr__(mod, _REF, norm)
            remember_hook(mod, "peri", mod.register_forward_hook(_out_hook, prepend=True))
        g = norm_gains(getattr(p.block, NAMES[0]))
        gains.append(1.0 if g is None else float(np.mean(np.square(g))))
    return gains


@register
class PeriLN(Method):
    name = "peri-ln"

    def validate(self, ctx, params):
        need_pre_ln(ctx, self.name, "it adds a norm on each pre-LN sublayer's output")

    def apply(self, model, parts, params, ctx, effect):
        gains = _install(model, parts, self.name) if parts else [1.0] * ctx.depth
        effect.branch_gain2 = [(g, g) for g in gains]
        return [f"a norm on every sublayer's output before the residual add "
                f"({2 * ctx.depth} new norms, gains 1)"]

    def restore(self, model, parts, params):
        _install(model, parts, self.name)
