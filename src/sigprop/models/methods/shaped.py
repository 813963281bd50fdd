"""shaped: the attention matrix reshaped as ``A <- alpha I + beta A - gamma C`` with ``C`` the
uniform attention over each query's visible keys (causal-aware) and ``W_Q = 0`` at init, so
the softmax is exactly ``C`` and, with ``gamma = beta``, every token attends to itself:
``A = alpha I`` (He & Hofmann, ICLR 2024, whose defaults are alpha = beta = gamma = 1, per-head
trainable; Noci et al. 2023; He et al., ICLR 2023 Value-SkipInit is ``gamma = 0``,
``beta = 0``). The three gains are per-head parameters ``sigprop_shape`` (H, 3) on the
attention module, trainable, restored by sigprop's loader; the reshaping runs in sigprop's
attention function (recorded in config.json).

Theory: at init (W_Q = 0, gamma = beta) the attention map is the identity times alpha
(``attention="identity"``, the value variance times ``alpha^2``); otherwise measured only.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import Method, Param, register
from .parts import need, scale

SHAPE = "sigprop_shape"


def _install(parts, params):
    for p in parts:
        mod = p.site.module
        init = torch.tensor([params["alpha"], params["beta"], params["gamma"]],
                            dtype=torch.float32).repeat(p.heads, 1)
        if SHAPE in mod._parameters:
            del mod._parameters[SHAPE]
        mod.register_parameter(SHAPE, nn.Parameter(init.to(next(mod.parameters()).device)))


@register
class Shaped(Method):
    name = "shaped"
    attention_ops = True
    params = (Param("alpha", "identity gain at init", 1.0, lo=0.0, hi=100.0),
              Param("beta", "softmax gain at init", 1.0, lo=0.0, hi=100.0),
              Param("gamma", "uniform (centring) gain at init", 1.0, lo=0.0, hi=100.0),
              Param("zero_q", "W_Q = 0 at init (yes) or kept (no)", "yes",
                    choices=("yes", "no")))

    def apply(self, model, parts, params, ctx, effect):
        for p in parts:
            need(p, "site", self.name)
            if params["zero_q"] == "yes":
                for t in need(p, "q", self.name):
                    scale(t, 0.0)
        _install(parts, params)
        if params["zero_q"] == "yes" and params["beta"] == params["gamma"]:
            # the softmax is exactly C, so A = alpha I: each token's own value, times alpha
            effect.zero_q = True
            effect.attention = "identity"
            effect.scale("v", params["alpha"])
        else:
            effect.measured_only.append("shaped: with W_Q kept or beta != gamma the matrix "
                                        "mixes a softmax into alpha I, outside the theory")
        return [f"A <- {params['alpha']:.3g} I + {params['beta']:.3g} A - "
                f"{params['gamma']:.3g} C (per-head trainable gains)"
                + (", W_Q = 0" if params["zero_q"] == "yes" else "")]

    def restore(self, model, parts, params):
        _install(parts, params)

    def weights(self, module, probs, allowed, n_keys, params):
        g = getattr(module, SHAPE, None)
        H, Tq, Tk = probs.shape[1], probs.shape[-2], probs.shape[-1]
        if g is None:
            g = torch.tensor([[params["alpha"], params["beta"], params["gamma"]]]).repeat(H, 1)
        g = g.to(probs.dtype).to(probs.device)
        a, b, c = (g[:, i].view(1, H, 1, 1) for i in range(3))
        eye = torch.zeros(Tq, Tk, dtype=probs.dtype, device=probs.device)
        idx = torch.arange(Tq, device=probs.device)
        eye[idx, Tk - Tq + idx] = 1.0
        if allowed is not None:
            uni = allowed.to(probs.dtype) / n_keys.to(probs.dtype)
        else:
            uni = torch.full((Tq, Tk), 1.0 / Tk, dtype=probs.dtype, device=probs.device)
        return a * eye + b * probs - c * uni
