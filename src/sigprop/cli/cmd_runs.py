"""``sigprop sweep`` (many tasks on a process pool or Ray, into a resumable Parquet store) and
``sigprop results`` (read the store back: query, table, JSON, CSV, Parquet, plot);
docs/sweeps.md."""

from __future__ import annotations

import sys
from enum import StrEnum

import typer

from ..spec import SpecError
from .common import (
    Fmt,
    FormatOpt,
    WideOpt,
    check_figure_path,
    check_output_dir,
    check_output_file,
    emit_json,
    fail,
)


class ResultsFmt(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"
    parquet = "parquet"


ResultsFormatOpt = typer.Option(ResultsFmt.table, "--format",
                                help="output format (parquet needs --out)")


def _open_store(option: str, path: str, create: bool):
    from ..runs.store import Store, StoreError

    if create:
        check_output_dir(option, path)
    try:
        return Store(path, create=create)
    except StoreError as err:
        fail(f"{option}: {err}")


def _tasks(file: str | None, command: str | None, grid: str | None):
    """Tasks and YAML run settings from FILE or --command/--grid (exit 2 on bad input)."""
    from ..runs.grid import GridError, expand, load_yaml, parse_grid

    if file is not None and (grid is not None or command is not None):
        fail("FILE: give a sweep file or --command/--grid, not both")
    try:
        if file is not None:
            return load_yaml(file)
        if grid is None:
            fail("--grid: give the grid (e.g. --grid 'beta=0.1:3:16,depth=12,48') or a FILE")
        if command is None:
            fail("--command: give the command the grid runs (predict, measure, diagnose, "
                 "longctx, train, trainability, reproduce)")
        return expand(command, parse_grid(grid)), {}
    except GridError as err:
        fail(str(err))


def _check_tasks(tasks) -> None:
    from ..runs.tasks import check

    for i, t in enumerate(tasks):
        try:
            check(t.command, t.config)
        except SpecError as err:
            msg = str(err).split(": ", 1)[-1]
            where = f"task {i + 1} of {len(tasks)} ({t.command}"
            where += (", " + ", ".join(f"{k}={v}" for k, v in t.config.items())) + ")"
            fail(f"{err.field}: {msg} [{where}]" if err.field != "command"
                 else f"--command: {msg}")


def sweep(
    file: str | None = typer.Argument(None, help="a sweep file (YAML: command, grid, configs, "
                                                 "fixed, sweeps; docs/sweeps.md)"),
    command: str | None = typer.Option(None, "--command", help="predict|measure|diagnose|"
                                       "longctx|train|trainability|reproduce"),
    grid: str | None = typer.Option(None, "--grid", help="key=values groups, e.g. "
                                    "'beta=0.1:3:16,alpha_attn=0.5,1,2,depth=12,48'"),
    store: str | None = typer.Option(None, "--store", help="results folder (Parquet; created, "
                                     "or resumed when it holds this sweep's tasks)"),
    executor: str | None = typer.Option(None, "--executor", help="local (process pool, "
                                        "default) | ray"),
    workers: int | None = typer.Option(None, "--workers", help="tasks at once (local: CPU "
                                       "count; ray: what the cluster's CPUs allow)"),
    address: str | None = typer.Option(None, "--address", help="join this Ray cluster (auto, "
                                       "ray://host:10001) instead of starting one"),
    retries: int | None = typer.Option(None, "--retries", help="further attempts of a task "
                                       "that fails (default 0)"),
    cpus_per_task: float | None = typer.Option(None, "--cpus-per-task", help="CPUs (and torch "
                                               "threads) per task (default 1)"),
    gpus_per_task: float | None = typer.Option(None, "--gpus-per-task", help="GPUs per task "
                                               "(default: 1 when the task's device is cuda)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the tasks and whether each "
                                 "is in the store already; run nothing"),
    fmt: Fmt = FormatOpt, wide: bool = WideOpt,
) -> None:
    """Run a command over a grid or a list of configs, locally or on Ray, into a Parquet
    store that a killed sweep resumes from (finished tasks are skipped by config hash)."""
    from ..runs.executors import EXECUTORS, pending, run_sweep

    tasks, settings = _tasks(file, command, grid)
    store = store if store is not None else settings.get("store")
    executor = executor or settings.get("executor", "local")
    workers = workers if workers is not None else settings.get("workers")
    address = address or settings.get("address")
    retries = retries if retries is not None else settings.get("retries", 0)
    cpus = cpus_per_task if cpus_per_task is not None else settings.get("cpus_per_task", 1)
    gpus = gpus_per_task if gpus_per_task is not None else settings.get("gpus_per_task")
    if store is None:
        fail("--store: give the results folder (or store: in the sweep file)")
    if executor not in EXECUTORS:
        fail(f"--executor: must be one of {', '.join(EXECUTORS)} (got {executor!r})")
    for name, v, lo, hi in (("--workers", workers, 1, 4096), ("--retries", retries, 0, 100)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not lo <= v <= hi):
            fail(f"{name}: must be an integer in [{lo}, {hi}] (got {v!r})")
    for name, v, lo in (("--cpus-per-task", cpus, 0.01), ("--gpus-per-task", gpus, 0.0)):
        if v is not None and not (isinstance(v, int | float) and lo <= v <= 1024):
            fail(f"{name}: must be a number in [{lo:g}, 1024] (got {v!r})")
    if address and executor != "ray":
        fail("--address: joins a Ray cluster; add --executor ray")
    _check_tasks(tasks)
    st = _open_store("--store", store, create=True)
    if dry_run:
        todo = {(t.command, t.key) for t in pending(tasks, st)[0]}
        rows = [{"command": t.command, "config_hash": t.key,
                 "status": "pending" if (t.command, t.key) in todo else "done", **t.config}
                for t in tasks]
        _print_rows(rows, fmt, wide)
        return
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            fail("--executor: ray is not installed (pip install 'sigprop[ray]')")
    from ..report.runs import print_sweep, sweep_progress

    with sweep_progress(f"sweep ({executor})") as bar:
        try:
            rep = run_sweep(tasks, st, executor=executor, workers=workers, address=address,
                            retries=retries, cpus_per_task=float(cpus),
                            gpus_per_task=None if gpus is None else float(gpus),
                            progress=bar)
        except ConnectionError as err:
            fail(f"--address: cannot join the Ray cluster ({err})", code=1)
    if fmt == Fmt.json:
        emit_json({"store": str(st.root), **rep.to_json()})
    elif fmt == Fmt.csv:
        _print_rows([{"command": t.command, "config_hash": t.key, "error": e, **t.config}
                     for t, e in rep.failures], fmt, wide)
    else:
        print_sweep(rep, str(st.root), wide=wide)
    if rep.failed:
        raise typer.Exit(1)


def _print_rows(rows: list[dict], fmt: Fmt, wide: bool) -> None:
    import pandas as pd

    df = pd.DataFrame(rows)
    if fmt == Fmt.json:
        from .. import trajectory

        emit_json({"tasks": trajectory.to_rows(df) if len(df) else []})
    elif fmt == Fmt.csv:
        df.to_csv(sys.stdout, index=False)
    else:
        from ..report import tables

        t = tables.table(*map(str, df.columns))
        for r in df.itertuples(index=False):
            t.add_row(*["–" if v is None or v != v else str(v) for v in r])
        tables.console(wide).print(t)


def results(
    store: str = typer.Argument(..., help="a results folder written by sigprop sweep"),
    query: str | None = typer.Option(None, "--query", help="pandas query on the rows, e.g. "
                                     "'command == \"measure\" and beta > 1'"),
    command: str | None = typer.Option(None, "--command", help="only this command's rows"),
    fmt: ResultsFmt = ResultsFormatOpt,
    out: str | None = typer.Option(None, "--out", help="file for --plot (.png, .svg, .pdf) "
                                   "or --format parquet"),
    plot: str | None = typer.Option(None, "--plot", help="x=COL,y=OBS|COL[,hue=COL][,col=COL]"
                                    "[,logx][,logy]"),
    layer: str = typer.Option("last", "--layer", help="layer an observable is plotted at "
                              "(default: each task's last)"),
    failures: bool = typer.Option(False, "--failures", help="list the failed tasks"),
    limit: int = typer.Option(40, "--limit", help="rows shown in the table"),
    wide: bool = WideOpt,
) -> None:
    """Read a sweep's results store back: filter with --query, print, export, or plot."""
    st = _open_store("STORE", store, create=False)
    if not 1 <= limit <= 1_000_000:
        fail(f"--limit: must be an integer in [1, 1000000] (got {limit})")
    if layer != "last" and not layer.lstrip("-").isdigit():
        fail(f"--layer: must be 'last' or an integer (got {layer!r})")
    if command is not None and command not in st.commands():
        fail(f"--command: no {command!r} rows in the store (it has: "
             f"{', '.join(st.commands()) or 'nothing yet'})")
    if plot is not None and fmt == ResultsFmt.parquet:
        fail("--plot: writes --out, and so does --format parquet; run them one at a time")
    if fmt == ResultsFmt.parquet and out is None:
        fail("--out: --format parquet needs the file to write (e.g. --out rows.parquet)")
    if plot is not None:
        if out is None:
            fail("--out: --plot needs the figure file (e.g. --out scan.png)")
        check_figure_path("--out", out)
    elif fmt == ResultsFmt.parquet:
        check_output_file("--out", out, ("parquet",))
    fails = st.failures(command)
    if failures:
        from ..report.runs import print_failures

        if fmt == ResultsFmt.json:
            emit_json({"store": str(st.root), "failures": fails.to_dict(orient="records")})
        elif fmt == ResultsFmt.csv:
            fails.to_csv(sys.stdout, index=False)
        else:
            print_failures(fails, wide=wide)
        return
    try:
        df = st.read(command, query)
    except Exception as err:  # noqa: BLE001 - pandas raises many kinds for a bad expression
        if query is None:
            raise
        cols = ", ".join(c for c in st.read(command).columns if not c.startswith("spec."))
        fail(f"--query: {str(err).splitlines()[0] if str(err) else type(err).__name__} "
             f"(columns: {cols})")
    if plot is not None:
        _plot(df, plot, out, layer)
        return
    from ..report.runs import sort_rows

    df = sort_rows(df)
    tasks = df["config_hash"].nunique() if len(df) else 0
    if fmt == ResultsFmt.parquet:
        df.to_parquet(out, index=False)
        typer.echo(f"{len(df)} rows from {tasks} tasks written to {out}")
    elif fmt == ResultsFmt.csv:
        df.to_csv(sys.stdout, index=False)
    elif fmt == ResultsFmt.json:
        from .. import trajectory

        emit_json({"store": str(st.root), "tasks": int(tasks), "n_rows": len(df),
                    "failures": len(fails), "rows": trajectory.to_rows(df)})
    else:
        from ..report.runs import print_results

        print_results(df, tasks=int(tasks), failures=fails, limit=limit, wide=wide)


def _plot(df, text: str, out: str, layer: str) -> None:
    from ..plotting.scan import PlotError, parse_plot, plot_scan

    try:
        opts = parse_plot(text)
        _fig, averaged = plot_scan(df, out, layer=layer if layer == "last" else int(layer),
                                   **opts)
    except PlotError as err:
        fail(f"--plot: {err}")
    except OSError as err:
        fail(f"--out: cannot write {out!r} ({err.strerror or err})")
    note = f"; averaged over {', '.join(averaged)} (split with hue=, col= or --query)" \
        if averaged else ""
    typer.echo(f"wrote {out}{note}")
