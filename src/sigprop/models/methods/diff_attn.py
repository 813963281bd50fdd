"""diff-attn: differential attention (Ye et al., "Differential Transformer", ICLR 2025). Each
head's query and key are split into two halves of ``d' = d_H / 2`` channels and the map is
the difference of their two softmaxes,

    A = softmax(q1 k1^T / sqrt(d')) - lambda softmax(q2 k2^T / sqrt(d')),

with ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` (four trainable vectors of
``d'`` entries per block, drawn N(0, 0.1^2) as the paper) and ``lambda_init = 0.8 - 0.6
exp(-0.3 (l - 1))`` at the (1-based) block ``l`` (the blocks counted in module order). The
values keep the head's full width (the paper halves the number of heads instead; an existing
model keeps its heads). Then, as the paper, each head's output is normalised (``headnorm=yes``:
RMS over the head's channels, eps 1e-5, times a trainable gain per channel, ones at init: the
paper's per-head GroupNorm without mean subtraction) and multiplied by ``1 - lambda_init``.

The halves: each takes every other rotary pair, channels ``j`` and ``j + d_H/2`` for even
``j`` (first half) or odd ``j`` (second), so in a model with rotate-half RoPE (Llama, Qwen,
Mistral ...) each half is rotary in itself and its scores depend on relative position only;
in a model without RoPE any fixed split is as good. Needs ``d_H`` divisible by 4. The scale is
the module's times sqrt 2 (``1/sqrt(d')`` for the usual ``1/sqrt(d_H)``). The vectors (and
the gains) are parameters ``sigprop_diff_lambda`` (4, d'), ``sigprop_diff_norm`` (d_H) of each
attention module, ``lambda_init`` a buffer; the map runs in sigprop's attention function
(recorded in config.json, restored by sigprop's loader).

Theory: measured only. The map's rows are signed and sum to ``1 - lambda``; the REM tables
are those of one softmax row. (Two independent half-width REM rows would give it, but sigprop
does not tabulate their difference.)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...spec import SpecError
from .base import Method, Param, register
from .softmax_owner import claim_softmax

LAMBDA, LAMBDA_INIT, NORM = "sigprop_diff_lambda", "sigprop_diff_lambda_init", "sigprop_diff_norm"
EPS = 1e-5


def lambda_init(layer: int) -> float:
    """The paper's depth schedule at the 1-based block ``layer``."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def halves(d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The channel indices of the two halves (module docstring): rotary pairs ``(j, j +
    d_head/2)``, even ``j`` first, odd ``j`` second."""
    h = d_head // 2
    j = torch.arange(0, h, 2)
    return torch.cat([j, j + h]), torch.cat([j + 1, j + 1 + h])


def _install(parts, params, draw: bool) -> None:
    for i, p in enumerate(parts):
        mod = p.site.module
        dev = next(mod.parameters()).device
        lam = torch.zeros(4, p.head_dim // 2, device=dev)
        if draw:
            lam.normal_(0.0, float(params["lambda_std"]))
        li = params["lambda_init"]
        li = lambda_init(i + 1) if li is None else float(li)
        for name in (LAMBDA, NORM):
            if name in mod._parameters:
                del mod._parameters[name]
        if LAMBDA_INIT in mod._buffers:
            del mod._buffers[LAMBDA_INIT]
        mod.register_parameter(LAMBDA, nn.Parameter(lam))
        mod.register_buffer(LAMBDA_INIT, torch.tensor(li, device=dev))
        if params["headnorm"] == "yes":
            mod.register_parameter(NORM, nn.Parameter(torch.ones(p.head_dim, device=dev)))


def lambda_of(module) -> torch.Tensor:
    """``lambda`` of one attention module (a 0-d tensor, differentiable)."""
    lv = getattr(module, LAMBDA)
    return (torch.exp((lv[0] * lv[1]).sum()) - torch.exp((lv[2] * lv[3]).sum())
            + getattr(module, LAMBDA_INIT))


@register
class DiffAttention(Method):
    name = "diff-attn"
    attention_ops = True
    replaces_softmax = True
    params = (Param("lambda_init", "lambda_init for every block (default None: the paper's "
                    "0.8 - 0.6 exp(-0.3 (l - 1)) at block l)", None, lo=-10.0, hi=10.0,
                    optional=True),
              Param("lambda_std", "init std of lambda's four vectors (the paper's 0.1)", 0.1,
                    lo=0.0, hi=10.0),
              Param("headnorm", "per-head RMS norm and the (1 - lambda_init) scale on each "
                    "head's output (yes, as the paper) or neither", "yes",
                    choices=("yes", "no")))

    def apply(self, model, parts, params, ctx, effect):
        for p in parts:
            if p.site is not None and p.head_dim % 4:
                raise SpecError(self.name, f"{p.name}: head dim {p.head_dim} is not divisible "
                                           "by 4 (two halves of rotary pairs)")
        claim_softmax(model, parts, self.name)
        _install(parts, params, draw=True)
        effect.measured_only.append("diff-attn: a difference of two softmax rows (signed, sum "
                                    "1 - lambda) is outside the REM's one-row tables")
        li = ("0.8 - 0.6 exp(-0.3 (l - 1))" if params["lambda_init"] is None
              else f"{params['lambda_init']:.4g}")
        return [f"A = softmax(q1 k1^T / sqrt(d/2)) - lambda softmax(q2 k2^T / sqrt(d/2)), "
                f"lambda_init = {li}"
                + (", per-head RMS norm x (1 - lambda_init)" if params["headnorm"] == "yes"
                   else "")]

    def restore(self, model, parts, params):
        _install(parts, params, draw=False)

    def attend(self, module, query, key, scale, prepare, allowed, n_keys, params):
        i1, i2 = (i.to(query.device) for i in halves(query.shape[-1]))
        s = scale * math.sqrt(2.0)
        a1 = torch.softmax(prepare(torch.matmul(query[..., i1], key[..., i1].transpose(-1, -2))
                                   * s), dim=-1)
        a2 = torch.softmax(prepare(torch.matmul(query[..., i2], key[..., i2].transpose(-1, -2))
                                   * s), dim=-1)
        return a1 - lambda_of(module).to(a1.dtype) * a2

    def output(self, module, out, params):
        g = getattr(module, NORM, None)
        if params["headnorm"] != "yes" or g is None:
            return out
        y = out.float()
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + EPS)
        y = y * g.float() * (1.0 - getattr(module, LAMBDA_INIT).float())
        return y.to(out.dtype)
