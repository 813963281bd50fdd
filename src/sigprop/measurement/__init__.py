"""Measurement: docs/theory.md §1 observables on real activations (docs/architecture.md,
``measure/``).

* :mod:`.observables` — pure, batched tensor functions (cos, q, ipr, ipr_cross, entropy, wmax,
  stable_rank, gap) and :func:`summarise` (mean ± standard error);
* :mod:`.probe` — :class:`Probe`, forward hooks on any ``nn.Module`` (HF models included),
  returned or recomputed attention probabilities, and :func:`to_trajectory`;
* :mod:`.gradients` — :func:`qkv_grad_norms`, Q/K/V weight gradients at init.
"""

from .gradients import MLMReadoutLoss, grads_to_trajectory, qkv_grad_norms
from .observables import (
    entropy,
    entropy_from_logits,
    gap,
    ipr,
    ipr_cross,
    mean_cos,
    mean_q,
    stable_rank,
    summarise,
    wmax,
)
from .probe import (
    AttentionSite,
    Probe,
    describe_attention,
    find_attention,
    find_blocks,
    to_trajectory,
)

__all__ = [
    "AttentionSite", "MLMReadoutLoss", "Probe", "describe_attention", "entropy",
    "entropy_from_logits", "find_attention", "find_blocks", "gap", "grads_to_trajectory", "ipr",
    "ipr_cross", "mean_cos", "mean_q", "qkv_grad_norms", "stable_rank", "summarise",
    "to_trajectory", "wmax",
]
