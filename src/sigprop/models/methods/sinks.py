"""sinks: a learned attention sink per head, a logit ``s_h`` in the softmax's denominator that
carries no value,

    w_ab = e^{z_ab} / (e^{s_h} + sum_c e^{z_ac}),

so a row can give part of its weight to nothing (gpt-oss, OpenAI 2025; "attention is off by
one", Miller 2023, is ``s_h = 0`` fixed). Each row's weights are the softmax times its mass
``W = sigmoid(logsumexp(z) - s_h)`` (docs/theory.md §2.4.3). The logits are a trainable
parameter ``sigprop_sinks`` (one per query head) on each attention module, ``logit`` at init
(default 0: the off-by-one softmax); its name says sink, so sigprop's weight reader reads it
back as the spec's ``sink_logit`` (``diagnose`` of the saved folder). Runs in sigprop's
attention function (recorded in config.json, restored by sigprop's loader).

Theory: the sink logits in the per-layer spec (``LayerSpec.sink_logit``, in the units of the
scaled logits, as here), docs/theory.md §2.4.3; on sigprop's stack the same field.
"""

from __future__ import annotations

import torch
from torch import nn

from ...spec import SINK_MAX, SpecError
from .base import Method, Param, register
from .softmax_owner import claim_softmax

SINKS = "sigprop_sinks"


def _install(parts, logit: float) -> None:
    for p in parts:
        mod = p.site.module
        if SINKS in mod._parameters:
            del mod._parameters[SINKS]
        dev = next(mod.parameters()).device
        mod.register_parameter(SINKS, nn.Parameter(torch.full((p.heads,), float(logit),
                                                              device=dev)))


@register
class Sinks(Method):
    name = "sinks"
    attention_ops = True
    replaces_softmax = True
    params = (Param("logit", "each head's sink logit at init (0: the off-by-one softmax)", 0.0,
                    lo=-SINK_MAX, hi=SINK_MAX),)

    def apply(self, model, parts, params, ctx, effect):
        for p in parts:
            if p.site is not None and any("sink" in n.lower() for n, _ in
                                          p.site.module.named_parameters(recurse=False)):
                raise SpecError(self.name, f"{p.name}: the attention already has sinks")
        claim_softmax(model, parts, self.name)
        _install(parts, params["logit"])
        heads = [p.heads for p in parts] if parts else [ctx.spec.heads] * ctx.depth
        effect.sink_logit = [(float(params["logit"]),) * h for h in heads]
        return [f"a trainable sink logit per head in the softmax's denominator, "
                f"{params['logit']:.4g} at init"]

    def restore(self, model, parts, params):
        _install(parts, params["logit"])

    def attend(self, module, query, key, scale, prepare, allowed, n_keys, params):
        z = prepare(torch.matmul(query, key.transpose(-1, -2)) * scale)
        s = getattr(module, SINKS, None)
        if s is None:
            s = torch.full((z.shape[1],), float(params["logit"]))
        col = s.to(z.dtype).to(z.device).view(1, -1, 1, 1).expand(*z.shape[:-1], 1)
        return torch.softmax(torch.cat([z, col], dim=-1), dim=-1)[..., :-1]
