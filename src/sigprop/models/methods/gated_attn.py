"""gated-attn: the attention's head outputs multiplied, before ``W_O``, by a sigmoid gate of the
attention's own input, ``o_a <- sigmoid(x_a W_g + b_g) * o_a`` (Qiu et al. 2025, "Gated
Attention for Large Language Models"; Qwen3-Next). ``kind=elementwise`` (default, the paper's
best variant and Qwen3-Next's): one gate per channel of every head (``W_g``: ``d x H d_H``);
``kind=head``: one gate per head (``W_g``: ``d x H``), shared by the head's channels.

The gate is a trainable ``nn.Linear`` child ``sigprop_attn_gate`` of each attention module,
drawn ``W_g ~ N(0, std^2)`` with ``std`` 0.02 (Qwen3-Next computes the gate in its query
projection, drawn like every projection with ``initializer_range`` 0.02) and ``b_g = bias``
(0: Qwen3-Next's projection has no bias; here a trainable bias starting at 0). At init the
gates are near 1/2, so the attention branch is about halved. Two forward hooks carry it (its
weights are in the state dict, the hooks are re-installed by sigprop's loader): a pre-hook on
the attention module keeps its input ``x``, a pre-hook on the output projection multiplies
the merged head outputs by the gate. The elementwise gate is a child named ``*gate*`` mapping
the width to ``H d_H``, so sigprop's weight reader reads the saved model's ``gate_var`` back
(docs/theory.md §2.4.4); the head-wise one it does not read.

Theory: ``LayerSpec.gate_var = |W_g|_F^2 / rows`` from the drawn weights (the norm in front of
the attention at its init gains 1), ``gate_bias2 = 0``: docs/theory.md §2.4.4. Every second
moment factorises into the gate kernel times the ungated one, for a gate per channel or per
head alike (a head's channels share one gate of the same variance), so both kinds have the
same theory; on sigprop's stack the gate is the stack's elementwise one, ``gate_var = std^2
d``. A non-zero constant ``bias`` is not the theory's bias (a Gaussian one, shared by the
tokens): measured only.
"""

from __future__ import annotations

import torch
from torch import nn

from ...spec import SpecError
from .base import Method, Param, register
from .parts import hooked, need, remember_hook, weight_of

GATE = "sigprop_attn_gate"
_X = "_sigprop_gate_x"
_ATTN = "_sigprop_gate_attn"


def _keep_input(module, args, kwargs):
    x = kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]
    object.__setattr__(module, _X, x)


def _gate_output(module, args):
    """The output projection's input (the merged heads) times the gate of the attention
    module's kept input (a plain attribute of the projection, so a deep copy of the model
    points at the copy's attention module)."""
    attn = module.__dict__[_ATTN]
    x = attn.__dict__.pop(_X, None)
    if x is None:
        raise RuntimeError("gated-attn: the attention module's input was not seen before its "
                           "output projection")
    lin = getattr(attn, GATE)
    g = torch.sigmoid(lin(x.to(lin.weight.dtype)))
    h = args[0]
    if g.shape[-1] != h.shape[-1]:  # one gate per head, shared by its channels
        g = g.repeat_interleave(h.shape[-1] // g.shape[-1], dim=-1)
    return (h * g.to(h.dtype),) + tuple(args[1:])


def _install(parts, params, draw: bool) -> list[nn.Linear]:
    out, gen = [], torch.Generator().manual_seed(int(params["seed"]))
    for p in parts:
        attn = p.site.module
        d = weight_of(need(p, "q", "gated-attn")[0]).shape[1]
        width = p.heads * p.head_dim if params["kind"] == "elementwise" else p.heads
        dev = weight_of(p.q[0]).device
        lin = nn.Linear(d, width, bias=True, device=dev)
        with torch.no_grad():
            if draw:  # its own generator: the same draw whatever ran before
                w = torch.empty(lin.weight.shape).normal_(0.0, float(params["std"]),
                                                          generator=gen)
                lin.weight.copy_(w)
            lin.bias.fill_(float(params["bias"]))
        if GATE in attn._modules:
            del attn._modules[GATE]
        attn.add_module(GATE, lin)
        if not hooked(attn, "gate_x"):
            remember_hook(attn, "gate_x", attn.register_forward_pre_hook(_keep_input,
                                                                     with_kwargs=True))
        object.__setattr__(p.o, _ATTN, attn)
        if not hooked(p.o, "gate_o"):
            remember_hook(p.o, "gate_o", p.o.register_forward_pre_hook(_gate_output))
        out.append(lin)
    return out


@register
class GatedAttention(Method):
    name = "gated-attn"
    params = (Param("kind", "a gate per channel (elementwise, the paper's best) or per head",
                    "elementwise", choices=("elementwise", "head")),
              Param("std", "W_g's init std (Qwen3-Next: the query projection's 0.02)", 0.02,
                    lo=0.0, hi=10.0),
              Param("bias", "b_g at init (trainable)", 0.0, lo=-20.0, hi=20.0),
              Param("seed", "seed of W_g's draws", 0.0, lo=0.0, hi=2.0**31))

    def apply(self, model, parts, params, ctx, effect):
        for p in parts:
            need(p, "site", self.name)
            need(p, "o", self.name)
            if p.site.q_gate is not None or any("gate" in n.lower() for n, _ in
                                                p.site.module.named_children()):
                raise SpecError(self.name, f"{p.name}: the attention output is gated already")
            width = getattr(p.o, "in_features", None) or weight_of((p.o, None, 0)).shape[1]
            if width != p.heads * p.head_dim:
                raise SpecError(self.name, f"{p.name}: the output projection reads {width} "
                                           f"features, not heads x head dim "
                                           f"{p.heads * p.head_dim}")
        lins = _install(parts, params, draw=True)
        if params["bias"] != 0:
            effect.measured_only.append("gated-attn: a constant gate bias is not the theory's "
                                        "(Gaussian, shared by the tokens)")
        elif lins:
            effect.gate = [(float(lin.weight.detach().double().square().sum())
                            / lin.weight.shape[0], 0.0) for lin in lins]
        else:  # sigprop's stack: its own elementwise gate, the same theory
            effect.gate = [(float(params["std"]) ** 2 * ctx.spec.d_model, 0.0)] * ctx.depth
        return [f"head outputs times sigmoid(x W_g + b_g) before W_O ({params['kind']}, "
                f"W_g std {params['std']:.3g}, b_g {params['bias']:.3g}; trainable)"]

    def restore(self, model, parts, params):
        _install(parts, params, draw=False)
