"""dyt: Dynamic Tanh (Zhu et al., CVPR 2025, "Transformers without Normalization";
docs/fixes.md): every norm module of the model (the blocks', the embeddings' and the final
one) replaced by the elementwise ``gamma * tanh(alpha x) + beta``, ``alpha`` a trainable
scalar at ``alpha_0``, ``gamma`` and ``beta`` per feature initialised from the replaced
norm's gains and bias (its weight, or Gemma's ``1 + w``, read by
:func:`~sigprop.measurement.weight_maps.norm_gains`; beta 0 where it had no bias).

``alpha_0``: the paper's default 0.5 for every norm (its setting for all non-LLM models).
For its LLaMA 2 runs it sets a larger alpha_0 on the norm in front of the attention than on
the others (and the final norm), smaller as the width grows: 0.8 / 0.2 at width 4096 (7B),
0.6 / 0.15 at 5120 (13B), 0.2 / 0.05 at 8192 (34B, 70B); ``alpha0_attn`` and ``alpha0`` set those
(``--param dyt.alpha0_attn=0.8 --param dyt.alpha0=0.2``). The attention's norm is the
first input norm of a pre-LN block; a post-LN model's norms all take ``alpha0``.

The new modules (:class:`DynamicTanh`, parameters ``weight``, ``bias``, ``alpha``) take the
norms' places, so their parameters are saved under the norms' names; config.json records
the method and sigprop's loader puts the modules back before loading the weights.

Theory (docs/theory.md §2.6.2): at init (gamma 1, beta 0; the gains fold into the weights
the branch reads, as a norm's do) a norm of kind tanh maps the kernel ``(q, p)`` of its input
to ``(E tanh(alpha u)^2, E tanh(alpha u) tanh(alpha v))`` over the bivariate Gaussian of
that kernel (``LayerSpec.dyt``, also on sigprop's stack): pre-LN each branch reads the tanh
kernel of the raw stream, whose scale the theory then carries; post-LN the stream itself is
``tanh(alpha (x + f))``. Measured only on a post-LN HF model: its embeddings' norm becomes a
tanh of the raw embeddings, an input the spec does not describe. The final norm (after the
last block) is outside the theory as before, but a tanh there changes the cosine.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...spec import SpecError
from .base import Method, Param, register
from .block_norms import input_norms, width_of
from .parts import is_norm


class DynamicTanh(nn.Module):
    """``weight * tanh(alpha x) + bias`` over the last dimension (``alpha`` a scalar)."""

    def __init__(self, width: int, alpha0: float = 0.5, *, device=None,
                 dtype=torch.float32):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.width = int(width)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha0), **kw))
        self.weight = nn.Parameter(torch.ones(width, **kw))
        self.bias = nn.Parameter(torch.zeros(width, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, torch.tanh(self.alpha * x), self.weight)

    def extra_repr(self) -> str:
        return f"{self.width}, alpha={float(self.alpha):.4g}"


@torch.no_grad()
def _replacement(norm: nn.Module, alpha0: float) -> DynamicTanh:
    from ...measurement.weight_maps import norm_gains

    width = width_of(norm)
    ref = next(norm.parameters(), None)
    dev = ref.device if ref is not None else None
    dt = ref.dtype if ref is not None and ref.is_floating_point() else torch.float32
    new = DynamicTanh(width, alpha0, device=dev, dtype=dt)
    w = getattr(norm, "weight", None)
    g = norm_gains(norm, width)
    if isinstance(w, torch.Tensor) and w.shape == (width,) and (
            g is None or np.allclose(w.detach().double().cpu().numpy(), g, atol=1e-5)):
        new.weight.copy_(w)  # the gain is the weight itself: copied exactly
    elif g is not None:
        new.weight.copy_(torch.as_tensor(g, dtype=dt))
    b = getattr(norm, "bias", None)
    if isinstance(b, torch.Tensor) and b.shape == (width,):
        new.bias.copy_(b)
    return new


def _norms(model: nn.Module, parts) -> list[tuple[nn.Module, str, nn.Module, bool]]:
    """Every norm of ``model`` as ``(parent, attribute, module, is_attention_input)``; the
    attention's input norm is each block's first input norm (GPT-2's ``ln_1``, Llama's
    ``input_layernorm``; only asked for on pre-LN models, :meth:`DyT.validate`)."""
    attn_in = {id(ins[0]) for ins in map(input_norms, parts) if ins}
    out = []
    for name, m in model.named_modules():
        if name and is_norm(m):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            out.append((parent, attr, m, id(m) in attn_in))
    return out


def _install(model, parts, params, method: str) -> int:
    found = _norms(model, parts)
    if not found:
        raise SpecError(method, "no norm module found to replace")
    for parent, attr, m, attn in found:
        a0 = params["alpha0_attn"] if attn else params["alpha0"]
        setattr(parent, attr, _replacement(m, a0))
    return len(found)


@register
class DyT(Method):
    name = "dyt"
    params = (Param("alpha0", "alpha at init of every norm (the paper's default 0.5; LLaMA 2 "
                    "7B: 0.2 outside the attention)", 0.5, lo=1e-4, hi=100.0),
              Param("alpha0_attn", "alpha at init of a pre-LN block's attention norm (the "
                    "paper's default 0.5; LLaMA 2 7B: 0.8)", 0.5, lo=1e-4, hi=100.0))

    def validate(self, ctx, params):
        if params["alpha0_attn"] != params["alpha0"] and ctx.norm != "pre":
            raise SpecError(f"{self.name}.alpha0_attn", "a value of its own needs a pre-LN "
                                                        "model (a norm in front of the "
                                                        f"attention); this one is {ctx.norm}")

    def apply(self, model, parts, params, ctx, effect):
        a0, aa = params["alpha0"], params["alpha0_attn"]
        effect.dyt = [(float(aa), float(a0))] * ctx.depth
        if model is not None and ctx.norm == "post":
            effect.measured_only.append("dyt: a post-LN model's embedding norm becomes tanh of "
                                        "the raw embeddings, a first-block input the spec does "
                                        "not describe")
        what = f"alpha_0 {a0:.3g}" + ("" if aa == a0 else f" ({aa:.3g} before attention)")
        if model is None:
            return [f"every norm -> gamma tanh(alpha x) + beta, {what}"]
        n = _install(model, parts, params, self.name)
        return [f"{n} norms -> gamma tanh(alpha x) + beta ({what}; gamma, beta from the norms)"]

    def restore(self, model, parts, params):
        _install(model, parts, params, self.name)
