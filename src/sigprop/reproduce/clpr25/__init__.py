"""clpr25 (Chen, Lin, Polyanskiy & Rigollet, *Critical attention scaling in long-context
transformers*): its figures and numbered claims as registered items (docs/reproduce/clpr25.md).
Importing the package registers every item.

The model is clpr25's one attention layer with ``Q = K = V = I`` on normalised tokens and the
length scaling ``beta = gamma log n`` (docs/theory.md §3.1); every formula comes from
:mod:`sigprop.theory.scaling` (exact finite-n simplex solution, its n -> infinity limit, the
Jacobian in closed form and at any input) and the practical scalings from
:func:`sigprop.spec.score_multiplier` (docs/theory.md §3.2).

Modules, by topic:

- :mod:`.common`: shared helpers (argument checks, seeds, the transition's crossing and width,
  the row-sampled angle ratio :func:`angle_ratios` and its exact simplex values);
- :mod:`.figures` (Sec. 3, almost-simplex tokens): ``clpr25.fig1``, the angle ratio
  theta'/theta against gamma (Fig. 1), and ``clpr25.fig2``, the normalised Jacobian norm
  against gamma (Fig. 2, Thm 2.4);
- :mod:`.theorems` (Sec. 2, exact simplex tokens against n): ``clpr25.thm21``, Thm 2.1 /
  Eqs. 2.4-2.5 with and without residual, and ``clpr25.thm23``, Thm 2.3, the Jacobian;
- :mod:`.scalings` (Sec. 1): ``clpr25.table1``, the length scalings of Table 1 (and the
  standard and gg25 ones) in clpr25's units and the regime each puts the layer in as n grows,
  and ``clpr25.vs_gg25``, §1's contrast with gg25: the critical scale grows like log n for a
  fixed token geometry, like sqrt(log n) for random (REM) scores.

Each item is a data function, a checks function and a plot function composed by the
registered item. Everything is NumPy float64 on the CPU (``device`` is accepted and ignored:
nothing here is large enough to need an accelerator).
"""

from __future__ import annotations

from . import common, figures, scalings, theorems
from .common import COLOURS, angle_ratios
from .figures import fig1, fig2
from .scalings import TABLE1, table1, vs_gg25
from .theorems import thm21, thm23

__all__ = ["angle_ratios", "fig1", "fig2", "table1", "thm21", "thm23", "vs_gg25", "COLOURS",
           "TABLE1", "common", "figures", "scalings", "theorems"]
