"""mindthegap (Naderi, Nait Saada & Tanner, ICML 2025): every figure and numbered claim, one
registered item each (docs/reproduce/mindthegap.md, docs/reproduce/mindthegap_training_figs.md;
docs/theory.md §5). Importing the package registers every item.

The model is the paper's attention-only network ``X_l = A_l X_(l-1) W_l^V`` (Eq. 3) with
Random Markov attention ``A_l`` (Def. 1.1) or key-query attention ``A(X)``, value matrices
``N(0, sigma_V^2)`` *not* divided by ``d``, orthonormal tokens ``X_0``, and its gap-free
version with ``A_perp = A - 11^T / T`` (Eq. 9). Everything is dense float64 (NumPy, torch for
autograd), single-threaded torch next to BLAS. The formulas come from
:mod:`sigprop.theory.spectral`; where a proposition's rate or normalisation departs from
simulation the item says so with a :meth:`Check.differs` (Prop. 3's rate, Prop. 8's
normalisation, the key-query bulk of Prop. 1).

Modules, by topic:

- :mod:`.common`: shared simulators and helpers (``tokens``, ``loglog_slope``, softmax,
  LayerNorm, stable rank, plotting bits);
- :mod:`.spectrum` (Sec. 2): ``fig1``, ``thm2_prop1``, ``prop1_xavier``;
- :mod:`.rank` (Sec. 3): ``prop3``, ``prop5``, ``fig2``, ``fig4``;
- :mod:`.encoders` (Sec. 3): ``fig3`` (BERT and RoBERTa at initialisation);
- :mod:`.gradients`: ``prop4``, ``prop6``, ``fig5``, ``fig6``, ``fig10``;
- :mod:`.moments` (Sec. 4): ``prop7``, ``prop8``;
- :mod:`.lemmas` (appendix): ``lemma1``, ``lemma2_thm9_10``;
- :mod:`.appendix`: ``fig7`` (outliers of deeper key-query attention), ``fig9`` (sigmoid and
  ReLU attention);
- :mod:`.fitting`: the batched fits of Figs. 8 and 12 (sigprop's loop, a rate per slice);
- :mod:`.training`: the items that train, ``fig8a``, ``fig8b``, ``fig12``, ``heaviside``.
"""

from . import (
               appendix,
               common,
               encoders,
               fitting,
               gradients,
               lemmas,
               moments,
               rank,
               spectrum,
               training,
)
from .appendix import fig7, fig9
from .common import C_GAP, C_ID, C_KQ, C_PERP, MODULES, loglog_slope, plt_colours, tokens
from .encoders import fig3
from .fitting import CONST_LOSS, ZERO_LOSS, Variant, fit, heaviside_data
from .gradients import fig5, fig6, fig10, prop4, prop6
from .lemmas import lemma1, lemma2_thm9_10
from .moments import prop7, prop8
from .rank import fig2, fig4, prop3, prop5
from .spectrum import fig1, prop1_xavier, thm2_prop1
from .training import fig8a, fig8b, fig12, heaviside

__all__ = ["fig1", "thm2_prop1", "prop1_xavier", "prop3", "prop4", "prop5", "prop6", "prop7",
           "prop8", "lemma1", "lemma2_thm9_10", "fig2", "fig3", "fig4", "fig5", "fig6", "fig7",
           "fig9", "fig10", "tokens", "loglog_slope", "Variant", "fit", "fig8a", "fig8b",
           "fig12", "heaviside_data", "heaviside", "CONST_LOSS", "ZERO_LOSS", "MODULES",
           "C_GAP", "C_PERP", "C_ID", "C_KQ", "plt_colours", "appendix", "common", "encoders",
           "fitting", "gradients", "lemmas", "moments", "rank", "spectrum", "training"]
