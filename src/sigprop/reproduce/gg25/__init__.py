"""gg25 (Giorlandino & Goldt): every figure and numbered claim, one registered item each
(docs/reproduce/gg25.md, docs/reproduce/training.md; theory in :mod:`sigprop.theory`, the
finite-T REM of docs/theory.md §2.3 by default, the T -> infinity map of gg25 where the paper
draws it). Importing the package registers every item. Nothing here prints.

Modules, by topic:

- :mod:`.common`: gg25's variances (``GG25_VARS``), HF's ``BETA_HF``, the single-head
  simulator :func:`head_sweep` (tokens at cosine rho drawn exactly), :func:`crossing` and the
  small helpers the items share;
- :mod:`.maps` (Sec. 1): ``gg25.fig1ab``, attention maps in rank and in entropy collapse;
- :mod:`.trainability` (Sec. 1): ``gg25.fig1c``, the (beta, alpha_attn) diagram, with
  :func:`gg25_block_map`, gg25's block equations coded independently of the library;
- :mod:`.cosine` (Sec. 1): ``gg25.fig1d`` / ``gg25.fig1e``, the cosine over depth;
- :mod:`.phase` (Sec. 3): ``gg25.fig3``, the one-head phase diagram and its finite-size shift;
- :mod:`.tanh` (Sec. 4): ``gg25.fig5``, the order-to-chaos transition of a tanh stack
  (:func:`tanh_slope_closed_form`);
- :mod:`.temperature` (Eq. 11, B.1): ``gg25.eqB1``, the effective beta of standard
  initialisations;
- :mod:`.appendix_b`: ``gg25.figB1``, ``gg25.figB2``, ``gg25.eqB18`` (the REM order
  parameter, the lengths after one head, the row entropy);
- :mod:`.appendix_c`: ``gg25.figC1`` (attention spectra), ``gg25.figC3`` (no skips);
- :mod:`.training`: the items that train, ``gg25.fig1f``, ``gg25.fig4``, ``gg25.figC2``, and
  the helpers the other papers' training items share (:func:`run_config`, :func:`loss_rows`,
  :func:`gain_of`).

Each item is a data function, a checks function and a plot function (``plot_<item>(data,
ax=None)``) composed by the registered item.
"""

from . import (
               appendix_b,
               appendix_c,
               common,
               cosine,
               maps,
               phase,
               tanh,
               temperature,
               trainability,
               training,
)
from .appendix_b import eqB18, figB1, figB2
from .appendix_c import figC1, figC3
from .common import BETA_HF, GG25_VARS, crossing, head_sweep
from .cosine import fig1d, fig1e
from .maps import fig1ab
from .phase import fig3
from .tanh import critical, fig5, tanh_slope_closed_form
from .temperature import eqB1
from .trainability import fig1c, gg25_block_map
from .training import (
    LEARN_MARGIN,
    STUCK_MARGIN,
    fig1f,
    fig4,
    figC2,
    gain_of,
    loss_rows,
    run_config,
)

__all__ = ["head_sweep", "gg25_block_map", "crossing", "GG25_VARS", "BETA_HF",
           "tanh_slope_closed_form", "critical", "LEARN_MARGIN", "STUCK_MARGIN", "run_config",
           "loss_rows", "gain_of", "fig1ab", "fig1c", "fig1d", "fig1e", "fig3", "fig5",
           "figB1", "figB2", "eqB18", "figC1", "figC3", "eqB1", "fig1f", "fig4", "figC2",
           "appendix_b", "appendix_c", "common", "cosine", "maps", "phase", "tanh",
           "temperature", "trainability", "training"]
