"""Torch half of sigprop: batched-seed attention, the transformer stack and init schemes.

``build(spec, n_seeds=S)`` returns a :class:`SigpropTransformer` holding S independent
initialisations of ``spec`` (every weight has a leading seed dimension).
"""

from .attention import STAT_NAMES, AttentionOutput, BatchedAttention, row_stats
from .init import SCHEMES, init_batched, init_foreign, rem_qk_std
from .model import ModelOutput, SigpropTransformer, normalise

build = SigpropTransformer

__all__ = [
    "STAT_NAMES", "SCHEMES", "AttentionOutput", "BatchedAttention", "ModelOutput",
    "SigpropTransformer", "build", "init_batched", "init_foreign", "normalise", "rem_qk_std",
    "row_stats",
]
