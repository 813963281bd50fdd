"""softpick: the softmax replaced by the rectified softmax of Zuhri et al. 2025 ("Softpick: No
Attention Sink, No Massive Activations with Rectified Softmax"),

    w_ab = relu(e^{z_ab} - 1) / (sum_c |e^{z_ac} - 1| + eps),

the sums over the row's visible keys (hidden keys get weight 0 and are left out of the
denominator). A key with a score at or below 0 gets weight 0, so a row can put little or no
weight anywhere (its sum is at most 1) instead of dumping it on a sink token. Computed from
``m = max(0, max_c z_ac)`` as ``relu(e^{z-m} - e^{-m}) / (sum |e^{z-m} - e^{-m}| + eps
e^{-m})``, the same ratio multiplied through by ``e^{-m}`` (no overflow, no cancellation
beyond the formula's own). ``eps`` 1e-6 only guards the division (a row of equal scores 0).
Runs in sigprop's attention function (recorded in config.json, restored by sigprop's loader);
no weight changes.

Theory: measured only. The weights are not a softmax (rows sum to at most 1, keys below 0
are cut), which the REM tables are.
"""

from __future__ import annotations

import torch

from .base import Method, Param, register
from .softmax_owner import claim_softmax


def softpick(z: torch.Tensor, eps: float) -> torch.Tensor:
    """Rows of softpick weights of logits ``z`` (..., Tk), ``-inf`` on the hidden keys
    (module docstring)."""
    vis = z > float("-inf")
    zz = z.masked_fill(~vis, 0.0)  # hidden keys: finite, then dropped
    m = zz.masked_fill(~vis, float("-inf")).amax(-1, keepdim=True).clamp_min(0.0)
    e = torch.exp(zz - m) - torch.exp(-m)
    e = e.masked_fill(~vis, 0.0)
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + eps * torch.exp(-m))


@register
class Softpick(Method):
    name = "softpick"
    attention_ops = True
    replaces_softmax = True
    params = (Param("eps", "the denominator's guard eps", 1e-6, lo=1e-12, hi=1.0),)

    def apply(self, model, parts, params, ctx, effect):
        claim_softmax(model, parts, self.name)
        effect.measured_only.append("softpick: rectified rows (sum <= 1, keys below 0 cut) "
                                    "are not the REM's softmax rows")
        return [f"softmax -> relu(e^z - 1) / (sum |e^z - 1| + {params['eps']:.3g}) over the "
                "visible keys"]

    def attend(self, module, query, key, scale, prepare, allowed, n_keys, params):
        z = prepare(torch.matmul(query, key.transpose(-1, -2)) * scale)
        return softpick(z, float(params["eps"]))
