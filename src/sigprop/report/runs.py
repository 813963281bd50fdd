"""Console output of ``sigprop sweep`` (progress bar, summary) and ``sigprop results``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..plotting.scan import config_keys
from . import tables

#: result columns shown first in ``sigprop results`` tables
_LEAD = ("command", "layer", "observable", "source", "value", "stderr")


@contextlib.contextmanager
def sweep_progress(label: str = "sweep") -> Iterator:
    """A rich progress bar on stderr: done of total, then running / failed / skipped counts,
    elapsed time and ETA. Yields the ``progress(counts)`` callback of
    :func:`sigprop.runs.executors.run_sweep`; silent when stderr is not a terminal."""
    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[counts]}"), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=console,
                   disable=not console.is_terminal)
    task = bar.add_task(label, total=None, counts="")

    def update(c: dict) -> None:
        # skipped tasks count as complete (the bar shows how much of the sweep is in the
        # store) but the ETA only sees the tasks run in this session
        bar.update(task, total=c["total"], completed=c["done"] + c["failed"] + c["skipped"],
                   counts=f"[green]{c['done']} done[/] · {c['running']} running · "
                          f"[red]{c['failed']} failed[/] · {c['skipped']} skipped")

    with bar:
        yield update


def print_sweep(rep, store: str, console: Console | None = None, wide: bool = False) -> None:
    """The sweep's counts, timing and failures."""
    console = console or tables.console(wide)
    t = tables.table("tasks", "done", "skipped", "failed", "retried", "executor", "workers",
                     "seconds", "start-up s",
                     right=("tasks", "done", "skipped", "failed", "retried", "workers",
                            "seconds", "start-up s"))
    t.add_row(str(rep.total), str(rep.done), str(rep.skipped), str(rep.failed),
              str(rep.retried), rep.executor, str(rep.workers), f"{rep.seconds:.1f}",
              f"{rep.startup:.1f}")
    console.print(t)
    if rep.failures:
        f = tables.table("failed task", "config", "error")
        for task, err in rep.failures[:20]:
            f.add_row(f"{task.command} {task.key}", _config(task.config), err)
        console.print(f)
        if len(rep.failures) > 20:
            console.print(f"... and {len(rep.failures) - 20} more (sigprop results "
                          f"{store} --failures)")
    console.print(f"store: {store}   (sigprop results {store})")


def _config(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def print_results(df: pd.DataFrame, *, tasks: int, failures: pd.DataFrame, limit: int,
                  console: Console | None = None, wide: bool = False) -> None:
    """Rows of the store up to ``limit``: the config columns that vary (the sweep's
    coordinates), then layer, observable, source, value, stderr; the config values shared by
    every row are listed once above. ``wide`` adds every other column but the ``spec.*``
    copies."""

    console = console or tables.console(wide)
    cmds = ", ".join(sorted(df["command"].dropna().unique())) if len(df) else "none"
    console.print(f"{len(df)} rows from {tasks} tasks (commands: {cmds}); "
                  f"{len(failures)} failed task(s)")
    if df.empty:
        return
    keys = config_keys(df)
    varying = [k for k in keys if df[k].nunique(dropna=False) > 1]
    fixed = [k for k in keys if k not in varying]
    if fixed:
        console.print("fixed: " + ", ".join(f"{k}={_short(_cell(df[k].iloc[0]))}"
                                            for k in fixed))
    lead = [c for c in _LEAD if c in df.columns and c != "command"]
    cols = (["command"] if df["command"].nunique() > 1 else []) + varying + lead
    if wide:
        cols += [c for c in df.columns if c not in cols and c not in fixed
                 and c not in ("config", "config_hash", "command") and not c.startswith("spec.")]
    shown = df.head(limit)
    num = [c for c in cols if pd.api.types.is_float_dtype(df[c])]
    t = tables.table(*cols, right=num)
    fmt = {c: tables.column(list(shown[c])) for c in num}
    for i in range(len(shown)):
        t.add_row(*[fmt[c][i] if c in fmt else _cell(shown[c].iloc[i]) for c in cols])
    console.print(t)
    if len(df) > limit:
        console.print(f"first {limit} of {len(df)} rows (--limit N, --query, or --format "
                      f"csv|json|parquet for all)")


def sort_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows ordered by command and the sweep's config columns (each task's own row order
    kept), for reading; the store itself keeps them in config-hash order."""

    if df.empty:
        return df
    keys = config_keys(df)
    by = ["command", *[k for k in keys if df[k].nunique(dropna=False) > 1]]
    try:
        return df.sort_values(by, kind="stable", na_position="first").reset_index(drop=True)
    except TypeError:  # a column mixing numbers and text: keep the store's order
        return df


def _short(text: str, most: int = 32) -> str:
    """A long value (a nested config as JSON) cut for the one-line summary."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return str(v)


def print_failures(failures: pd.DataFrame, console: Console | None = None,
                   wide: bool = False) -> None:
    console = console or tables.console(wide)
    t = tables.table("command", "config_hash", "attempts", "config", "error")
    for r in failures.itertuples():
        t.add_row(r.command, r.config_hash, str(r.attempts), r.config, r.error)
    console.print(t)
