"""mix-ln: Mix-LN (Li et al. 2024, "Mix-LN: Unleashing the Power of Deeper Layers by
Combining Pre-LN and Post-LN"; docs/fixes.md): the first ``floor(alpha L)`` blocks of a
pre-LN model become post-LN, ``y = N1(x + A(x))``, ``x' = N2(y + M(y))``, the rest stay
pre-LN (the paper's default ``alpha = 0.25``). Each post-LN block reuses its own two norms
(the attention's input norm after the attention's add, the MLP's after the MLP's add), so
no weight changes and the final norm stays.

The block's own forward pass is kept and re-routed by hooks: the attention's input norm
passes its input through (the attention reads the raw stream); the MLP's input norm, called
on ``h = x + A(x)``, returns ``y = N1(h)`` (the MLP reads it) and remembers ``h`` and ``y``;
the block's output ``z = h + M(y)`` becomes ``N2(z - h + y) = N2(y + M(y))`` (the norms run
through their ``forward``, so no hook runs twice). The subtraction rounds at the float
precision of ``h``, ~1e-7 relative in float32. Recorded in config.json and re-installed by
sigprop's loader. Sequential pre-LN blocks with two input norms only (a parallel block or a
post-LN model is refused).

Theory (docs/theory.md §2.6.1): each block's own norm placement (``LayerSpec.norm``: post
for the first ``floor(alpha L)``, the spec's pre after; also on sigprop's stack). A post-LN
block reads the raw stream and leaves it at unit scale, so the stack's state is carried in
absolute units (the pre-LN spec's variances, in units of the embeddings' q0, return to
absolute ones with the measured q0).
"""

from __future__ import annotations

import math

from torch import nn

from ...spec import SpecError
from .base import Method, Param, register
from .block_norms import need_pre_ln, two_input_norms
from .parts import Part, hooked, remember_hook

_STASH = "_sigprop_mix"


def post_blocks(depth: int, alpha: float) -> int:
    """How many of the first blocks are post-LN: ``floor(alpha L)``."""
    return int(math.floor(float(alpha) * depth + 1e-9))


def _pass_through(_module, args, _out):
    return args[0]


def _mlp_norm_hook(module, args, _out):
    block, n1 = module._sigprop_mix_of
    h = args[0]
    y = n1.forward(h)
    object.__setattr__(block, _STASH, (h, y))
    return y


def _block_hook(module, _args, out):
    h, y = getattr(module, _STASH)
    object.__setattr__(module, _STASH, None)
    n2 = module._sigprop_mix_n2
    z = out[0] if isinstance(out, tuple) else out
    new = n2.forward(z - h + y)
    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new


def _install(parts: list[Part], alpha: float, method: str) -> int:
    k = post_blocks(len(parts), alpha)
    plan = [(p, *two_input_norms(p, method)) for p in parts[:k]]  # check all, then patch
    for p, n1, n2 in plan:
        if hooked(p.block, "mix"):
            raise SpecError(method, f"{p.name}: mix-ln is already applied")
        _set_ref(n2, "_sigprop_mix_of", (p.block, n1))
        _set_ref(p.block, "_sigprop_mix_n2", n2)
        remember_hook(n1, "mix", n1.register_forward_hook(_pass_through))
        remember_hook(n2, "mix", n2.register_forward_hook(_mlp_norm_hook))
        remember_hook(p.block, "mix", p.block.register_forward_hook(_block_hook))
    return k


def _set_ref(module: nn.Module, key: str, value) -> None:
    object.__setattr__(module, key, value)  # a reference, not a child module


@register
class MixLN(Method):
    name = "mix-ln"
    params = (Param("alpha", "share of the blocks, from the first, made post-LN: "
                    "floor(alpha L) (the paper's 0.25)", 0.25, lo=0.0, hi=1.0),)

    def validate(self, ctx, params):
        need_pre_ln(ctx, self.name, "its first blocks are turned into post-LN ones")
        if ctx.spec.parallel:
            raise SpecError(self.name, "needs sequential blocks (attention, then MLP); this "
                                       "model's blocks are parallel")

    def apply(self, model, parts, params, ctx, effect):
        k = post_blocks(ctx.depth, params["alpha"])
        if parts:
            _install(parts, params["alpha"], self.name)
        effect.layer_norm = ["post"] * k + [None] * (ctx.depth - k)
        return [f"blocks 1-{k} post-LN, {k + 1}-{ctx.depth} pre-LN" if k else
                f"alpha={params['alpha']:.3g}: no block post-LN (floor(alpha L) = 0)"]

    def restore(self, model, parts, params):
        _install(parts, params["alpha"], self.name)
