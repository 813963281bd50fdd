"""noci22 (Noci et al. 2022): every figure and numbered claim (docs/reproduce/noci22.md; theory
in :mod:`sigprop.theory.uniform`, docs/theory.md §4), one module per topic:

* :mod:`.common`: shared estimators, token and weight draws, plot helpers;
* :mod:`.jacobians`: one attention layer's Jacobian norms in closed form (:func:`jacobian_norms`)
  and by torch autograd, the input Jacobian's terms (:func:`input_grad_terms`);
* :mod:`.network`: noci22's network (``Z = alpha_1 S + X``, ``X' = alpha_2 Y + Z``) simulated;
* :mod:`.forward`: ``noci22.lemma3_2``, ``lemma3_3``, ``thm3_3``, ``fig8`` (§3.2-3.3);
* :mod:`.forward_appendix`: ``noci22.fig10``, ``fig11``;
* :mod:`.gradients`: ``noci22.lemma3_1``, ``thm3_2``, ``eq17_18`` (§3.1, Eqs. 17-18);
* :mod:`.input_gradient`: ``noci22.eq8`` (Eqs. 8, 30-40);
* :mod:`.temperature`: ``noci22.eq47`` (Eqs. 45-47, App. C.2-C.3);
* :mod:`.gradient_maps`: ``noci22.fig12``, ``fig13_14``;
* :mod:`.uniform_limit`: ``noci22.fig7`` (Lemma A.7, Thm A.2);
* :mod:`.layernorm`: ``noci22.fig3_9`` (post-LN vs pre-LN, Table 2);
* :mod:`.training`: the items that train, ``noci22.reverse`` and ``noci22.fig15``.

Importing the package registers every item. Each item is a data function, a checks function
and a plot function composed by the registered item.
"""

from __future__ import annotations

from ..core import Check, Experiment
from .common import Z, gaussian_tokens
from .forward import fig8, lemma3_2, lemma3_3, thm3_3
from .forward_appendix import fig10, fig11
from .gradient_maps import fig12, fig13_14
from .gradients import eq17_18, lemma3_1, thm3_2
from .input_gradient import eq8
from .jacobians import autograd_norms, input_grad_terms, jacobian_norms
from .layernorm import fig3_9
from .temperature import eq47
from .training import fig15, qk_grad_norms, reverse
from .uniform_limit import fig7

__all__ = ["Check", "Experiment", "Z", "jacobian_norms", "autograd_norms", "gaussian_tokens",
           "input_grad_terms", "qk_grad_norms", "lemma3_1", "lemma3_2", "lemma3_3", "thm3_2",
           "thm3_3", "eq17_18", "eq8", "eq47", "fig3_9", "fig7", "fig8", "fig10", "fig11",
           "fig12", "fig13_14", "reverse", "fig15"]
