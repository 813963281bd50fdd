"""The old path of :mod:`sigprop.analysis.ranking`, kept for a release: ``compare`` is
:func:`~sigprop.analysis.ranking.rank_fixes` and ``FixComparison`` is
:class:`~sigprop.analysis.ranking.FixRanking` ("compare" elsewhere means theory beside
measurement: ``sigprop.measure`` returns a :class:`sigprop.Comparison`)."""

from .ranking import KEPT_Z, RANKING, MethodRow, kept_floor
from .ranking import FixRanking as FixComparison
from .ranking import rank_fixes as compare

__all__ = ["KEPT_Z", "RANKING", "FixComparison", "MethodRow", "compare", "kept_floor"]
