"""Number formatting for terminal tables: one number of decimals per column, so a column's
cells line up and carry the same significant digits (``0.600`` beside ``0.615``, never
``0.6`` beside ``0.6146``), and ``value ± stderr`` as one aligned cell.

A column gets ``digits`` significant digits at its largest magnitude: cosines (~0.5) print
as ``0.615``, an ipr column (~0.002) as ``0.00207``. Values far below the column's scale keep
the column's decimals (``0.000``): the column reads as one quantity, as in a paper's table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

#: significant digits at a column's largest magnitude
DIGITS = 3
_MAX_DECIMALS = 6
#: width of a console that never wraps (``--wide``)
WIDE = 240


def _finite(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def decimals(values: Iterable, digits: int = DIGITS) -> int:
    """Decimals that give ``digits`` significant digits at the largest finite |value|."""
    big = max((abs(float(v)) for v in values if _finite(v)), default=0.0)
    if big == 0.0:
        return digits - 1
    return int(min(_MAX_DECIMALS, max(0, digits - 1 - math.floor(math.log10(big)))))


def fmt(x, dec: int) -> str:
    """``x`` with ``dec`` decimals; ``inf``, ``–`` for missing / NaN."""
    if x is None:
        return "–"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if abs(v) >= 1e6:
        return f"{v:.3g}"
    return f"{v:.{dec}f}"


def fmt_pm(x, se, dec: int) -> str:
    """``value±stderr`` with the column's decimals (stderr omitted when missing)."""
    s = fmt(x, dec)
    if _finite(x) and _finite(se):
        s += f"±{fmt(se, dec)}"
    return s


def column(values: Sequence, stderrs: Sequence | None = None, digits: int = DIGITS
           ) -> list[str]:
    """Format one column: shared decimals, ``±stderr`` where given."""
    dec = decimals(values, digits)
    if stderrs is None:
        return [fmt(v, dec) for v in values]
    return [fmt_pm(v, s, dec) for v, s in zip(values, stderrs, strict=True)]


def table(*columns: str, right: Iterable[str] = ()) -> Table:
    """A compact rich table: header rule, no vertical borders (2 characters per column)."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    right = set(right)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=True)
    return t


def console(wide: bool = False) -> Console:
    """The CLI's console: the terminal's width (80 when piped), or :data:`WIDE` columns."""
    return Console(width=WIDE) if wide else Console()
