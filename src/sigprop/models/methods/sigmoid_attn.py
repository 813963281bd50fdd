"""sigmoid-attn: the softmax replaced by an elementwise sigmoid, ``w_ab = sigmoid(z_ab + b)``
with ``z`` the scaled logits and the bias ``b = -log n`` (``n`` the row's number of visible
keys: ``T`` bidirectional, ``t`` at causal position ``t``), as Ramapuram et al. 2024 ("Theory,
Analysis, and Best Practices for Sigmoid Self-Attention") recommend: with ``b = -log n`` a row
of logits of order 1 starts with total weight about 1, where ``b = 0`` would give every key
weight about 1/2 and a row sum ``n / 2``. The rows are not normalised (their sums move with
the scores); hidden keys get weight 0. ``sigmoid-attn.bias=B`` sets a fixed ``b`` instead.
Runs in sigprop's attention function (recorded in config.json, restored by sigprop's loader);
no weight changes.

Theory (docs/theory.md §2.4.7): the per-layer spec's ``sigmoid_bias = (k, b0)``, the bias
``b0 - k log n`` ((1, 0) for the paper's ``-log n``, (0, B) for a fixed B). A row's weights
do not sum to 1, so the attention map carries the rows' masses as for sinks: ``q_att = s_v^2
[p E W^2 + (q - p) E sum_b w_b^2] + s_b^2 E W^2`` (pairs of rows alike), each moment a sum of
2-D Gaussian integrals ``E sigmoid(X - beta) sigmoid(Y - beta')`` over two scores of one row
(correlation rho), of two rows on one key (rho) or on two keys (rho^2): at finite head width
the scores are Gaussian given the queries, so each integral is averaged over the two queries'
Gram matrix (:func:`sigprop.theory.attn_maps.query_gram`). In the position-resolved theory of
causal decoders (``sigprop fix --compare``) the rows are sampled instead
(:mod:`sigprop.theory.gram`). The reported
ipr, entropy, ... are those of the softmax rows of the same scores, which the renormalised
rows ``w / W`` approach while ``e^s << n``. On sigprop's stack the same field.
"""

from __future__ import annotations

import torch

from .base import Method, Param, register
from .softmax_owner import claim_softmax


@register
class SigmoidAttention(Method):
    name = "sigmoid-attn"
    attention_ops = True
    replaces_softmax = True
    params = (Param("bias", "the sigmoid's bias b (default None: -log n, n the row's visible "
                    "keys, as the paper)", None, lo=-100.0, hi=100.0, optional=True),)

    def apply(self, model, parts, params, ctx, effect):
        claim_softmax(model, parts, self.name)
        bias = (1.0, 0.0) if params["bias"] is None else (0.0, float(params["bias"]))
        effect.sigmoid_bias = [bias] * (len(parts) if parts else ctx.depth)
        b = "-log n" if params["bias"] is None else f"{params['bias']:.4g}"
        return [f"softmax -> sigmoid(score + b), b = {b} (rows not normalised)"]

    def attend(self, module, query, key, scale, prepare, allowed, n_keys, params):
        z = prepare(torch.matmul(query, key.transpose(-1, -2)) * scale)
        b = params["bias"]
        if b is None:
            b = -torch.log(n_keys.to(z.dtype))
        return torch.sigmoid(z + b)  # hidden keys: z = -inf, weight 0
