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

Theory (docs/theory.md §2.4.8): the per-layer spec's ``diff_lambda = (lambda_init,
lambda_std)`` and, with the head norm, ``head_norm2 = (1 - lambda_init)^2`` (the norm's gains
are ones at init). Given the tokens, ``A1`` and ``A2`` are independent softmax rows of one
score std over ``d_H / 2`` channels, each of mean ``1/n`` per key, so ``E sum_b D_ab D_cb =
(1 + E lambda^2) Yx - 2 E lambda / n`` (``Y2`` alike) with the REM tables at ``d_H / 2``, and
every row sums to ``1 - lambda``; ``E lambda = lambda_init`` and ``E lambda^2`` follow from
the vectors' Gaussian draw in closed form. The head norm makes each head's output of mean
square ``(1 - lambda_init)^2`` and keeps its cosine (the ratio of the branch's averages;
:mod:`sigprop.theory.attn_maps`). The reported ipr, entropy, ... are ``A1``'s. A
``lambda_std`` of 0.7 or more (``E lambda^2`` infinite) is measured only. On sigprop's stack
the same fields (each head's q and k split into its first and second halves of channels).
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
    gen = torch.Generator().manual_seed(int(params["seed"]))
    for i, p in enumerate(parts):
        mod = p.site.module
        dev = next(mod.parameters()).device
        lam = torch.zeros(4, p.head_dim // 2)
        if draw:  # its own generator: the same draw whatever ran before
            lam.normal_(0.0, float(params["lambda_std"]), generator=gen)
        lam = lam.to(dev)
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
                    choices=("yes", "no")),
              Param("seed", "seed of lambda's draws", 0.0, lo=0.0, hi=2.0**31))

    def apply(self, model, parts, params, ctx, effect):
        for p in parts:
            if p.site is not None and p.head_dim % 4:
                raise SpecError(self.name, f"{p.name}: head dim {p.head_dim} is not divisible "
                                           "by 4 (two halves of rotary pairs)")
        if not parts and ctx.spec.d_head % 2:
            raise SpecError(self.name, f"head dim {ctx.spec.d_head} is odd (two halves)")
        claim_softmax(model, parts, self.name)
        _install(parts, params, draw=True)
        n = len(parts) if parts else ctx.depth
        li = [lambda_init(i + 1) if params["lambda_init"] is None else
              float(params["lambda_init"]) for i in range(n)]
        if params["lambda_std"] >= 0.7:
            effect.measured_only.append("diff-attn: lambda_std >= 0.7 gives lambda an infinite "
                                        "second moment (outside the theory)")
        else:
            effect.diff_lambda = [(x, float(params["lambda_std"])) for x in li]
            if params["headnorm"] == "yes":
                effect.head_norm2 = [(1.0 - x) ** 2 for x in li]
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
