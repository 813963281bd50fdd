"""z-loss: the training loss plus ``coeff * log^2 Z`` of the output logits, ``Z = sum_j
exp(z_j)`` the softmax's normaliser per position (Chowdhery et al. 2022, PaLM: ``coeff =
1e-4``; Wortsman et al. 2023, small-scale proxies of large-scale instabilities:
output-logit divergence). It pulls ``log Z`` towards 0, against the drift of the output
logits that makes the loss spike late in training; nothing changes in the model.

At init nothing changes: the method records its coefficient in
``config.sigprop_fix["train_loss"]`` and a training loop adds :func:`z_loss` of its logits to
its loss (``sigprop fix --compare --train-steps`` does, :mod:`sigprop.analysis.compare_train`).
The term is averaged over the positions the cross-entropy averages over (the labelled ones
under masked-token prediction; every position under next-token prediction). Theory: measured
only (a training loss term).
"""

from __future__ import annotations

from typing import Any

import torch

from ...spec import SpecError
from .base import Method, Param, recorded_entry, register

#: the key of ``config.sigprop_fix`` listing the loss terms a training loop adds, each
#: ``{"name": ..., "params": {...}}``
TRAIN_LOSS = "train_loss"


def z_loss(logits: torch.Tensor, coeff: float, mask: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``coeff * mean(logsumexp(logits, -1)^2)`` over the positions (``logits``: ``(...,
    V)``; ``mask``: a boolean of ``logits.shape[:-1]``, the positions that count; none
    counted: 0). The log-sum-exp is taken in float32 at least."""
    lz = torch.logsumexp(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    sq = lz.square()
    if mask is not None:
        sq = sq[mask]
    if sq.numel() == 0:
        return sq.sum() * 0.0
    return float(coeff) * sq.mean()


def recorded_z_loss(config) -> dict[str, Any] | None:
    """The z-loss parameters a config records (``sigprop_fix["train_loss"]``), or None."""
    return recorded_entry(config, TRAIN_LOSS, ZLoss.name)


@register
class ZLoss(Method):
    name = "z-loss"
    #: acts through training only: at init the model is the baseline itself
    training_only = True
    params = (Param("coeff", "weight of log^2 Z in the loss (PaLM: 1e-4)", 1e-4, lo=0.0,
                    hi=1.0),)

    def apply(self, model, parts, params, ctx, effect):
        cfg = getattr(model, "config", None)
        if cfg is not None:
            rec = dict(getattr(cfg, "sigprop_fix", None) or {})
            rec[TRAIN_LOSS] = [e for e in rec.get(TRAIN_LOSS) or [] if e.get("name") != self.name
                               ] + [{"name": self.name, "params": dict(params)}]
            cfg.sigprop_fix = rec
        return [f"nothing changes at init; training adds {params['coeff']:.4g} * log^2 Z of the "
                "output logits to the loss (train_loss; compared under --train-steps only)"]

    def loss(self, logits: torch.Tensor, params: dict[str, Any] | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """The term a training loop adds: :func:`z_loss` with ``params`` (``coeff``; the
        default where missing; checked as the registry checks it)."""
        given = dict(params or {})
        for k in given:
            if k != "coeff":
                raise SpecError(f"{self.name}.{k}", "unknown parameter; z-loss takes: coeff")
        coeff = self.params[0].check(self.name, given.get("coeff", self.params[0].default))
        return z_loss(logits, coeff, mask)
