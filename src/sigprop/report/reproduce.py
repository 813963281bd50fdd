"""Console tables of ``sigprop reproduce``: the item list and the run's verdicts (80 columns
unless ``--wide``; nothing is cut with an ellipsis, long cells fold)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from . import tables


def _secs(x) -> str:
    return "" if x is None else f"{x:.0f}"


def print_items(items: Sequence, console: Console | None = None, wide: bool = False) -> None:
    """The registered items: name, paper reference, whether it trains, expected seconds on 2
    CPU cores at the quick and default sizes (and the title with ``wide``)."""
    c = console or tables.console(wide)
    cols = ["item", "ref", *(["title"] if wide else []), "trains", "quick s", "default s"]
    t = tables.table(*cols, right=("quick s", "default s"))
    for name in ("ref", "title"):
        if name in cols:
            t.columns[cols.index(name)].no_wrap = False
            t.columns[cols.index(name)].overflow = "fold"
    for it in items:
        t.add_row(it.name, it.ref, *([it.title] if wide else []), "yes" if it.trains else "",
                  _secs(it.runtime.get("quick")), _secs(it.runtime.get("default")))
    c.print(t)
    quick = sum(it.runtime.get("quick") or 0 for it in items)
    c.print(f"{len(items)} items; --quick takes about {quick / 60:.1f} min on 2 CPU cores "
            f"(--wide adds the titles)")


def print_results(results: Sequence, page, console: Console | None = None,
                  wide: bool = False) -> None:
    """One row per item run: verdict, checks held, seconds; then where the gallery is."""
    c = console or tables.console(wide)
    t = tables.table("item", "verdict", "checks held", "seconds", "error",
                     right=("checks held", "seconds"))
    t.columns[4].no_wrap = False
    t.columns[4].overflow = "fold"
    for r in results:
        held = sum(ch.status != "fail" for ch in r.checks)
        t.add_row(r.name, r.status, f"{held}/{len(r.checks)}", f"{r.seconds:.1f}", r.error)
    c.print(t)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    c.print(", ".join(f"{k} {v}" for k, v in counts.items()))
    c.print(f"gallery: {page}", overflow="fold")
