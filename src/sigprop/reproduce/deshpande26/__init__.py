"""deshpande26 (Deshpande, *A phase transition of attention collapse*): its numbered claims as
registered items (docs/reproduce/deshpande26.md). Importing the package registers every item.

The model is one softmax row over ``N`` i.i.d. ``N(0, sigma^2)`` logits at inverse temperature
``beta`` (docs/theory.md §3.3). Theory: the threshold, bulk formula and retrieval condition of
:mod:`sigprop.theory.scaling`; the exact finite-N expectation of the largest weight by
quadrature and its N -> infinity (Poisson-Dirichlet) limit from :mod:`sigprop.theory.rem`
(docs/theory.md §2.2.1, §2.3), reached through gg25's variable
``beta_gg = beta sigma / sqrt(log N)`` (``deshpande_to_gg``). Simulation samples the rows.

Modules, by topic:

- :mod:`.common`: shared helpers (argument checks, seeded draws, :func:`sample_wmax`,
  sigprop's :func:`gumbel_bulk` correction, the E w_max tables of the first two items);
- :mod:`.collapse` (Eqs. 4, 8, 10, 11): ``deshpande26.wmax``, E w_max against beta / beta_c for
  several N, and ``deshpande26.bulk``, the bulk approximation (Eq. 10) against the exact
  finite-N value;
- :mod:`.planted` (Eq. 13): ``deshpande26.retrieval``, a planted key with margin m among
  N - 1 noise keys;
- :mod:`.head_width` (Eq. 12): ``deshpande26.eq12``, why the 1/sqrt(d) factor matters: real
  query-key dot products with and without it.

Each item is a data function, a checks function and a plot function composed by the
registered item. NumPy float64 on the CPU (``device`` is accepted and ignored).
"""

from __future__ import annotations

from . import collapse, common, head_width, planted
from .collapse import bulk, wmax
from .common import COLOURS, exponent_pred, gumbel_bulk, sample_wmax
from .head_width import eq12
from .planted import kappa_half_gumbel, retrieval

__all__ = ["wmax", "bulk", "retrieval", "eq12", "sample_wmax", "gumbel_bulk", "exponent_pred",
           "kappa_half_gumbel", "COLOURS", "collapse", "common", "head_width", "planted"]
