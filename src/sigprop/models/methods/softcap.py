"""softcap: scores squashed into ``(-cap, cap)`` by ``z <- cap tanh(z / cap)`` after the
``1/sqrt(d)`` scaling and before the mask, as Gemma 2 does (``attn_logit_softcapping``, 50 in
its config; docs/fixes.md).

Default cap ``sqrt(2 log T)``: the score range at the REM's freezing point (beta_c = sqrt 2,
docs/theory.md §2.1), so the cap leaves a model whose scores stay below it untouched and
compresses the scores of one that would freeze onto a few keys. ``softcap.cap=50`` gives
Gemma 2's value (which acts only on scores far larger than a model at init has).

Theory: measured only. A capped score is no longer Gaussian, and the REM tables assume
Gaussian energies.
"""

from __future__ import annotations

import math

import torch

from .base import Method, Param, register


@register
class SoftCap(Method):
    name = "softcap"
    attention_ops = True
    params = (Param("cap", "scores become cap tanh(score / cap) (default sqrt(2 log T))",
                    lambda ctx: math.sqrt(2.0 * math.log(ctx.seq_len)), lo=1e-3, hi=1e4),)

    def apply(self, model, parts, params, ctx, effect):
        effect.measured_only.append("softcap: capped scores are not Gaussian (outside the REM "
                                    "tables)")
        return [f"scores capped: cap tanh(score / cap), cap = {params['cap']:.4g}"]

    def scores(self, module, scores, params):
        c = float(params["cap"])
        return c * torch.tanh(scores / c)
