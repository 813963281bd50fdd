"""``sigprop reproduce``: the seed papers' figures and claims, each with its check, and a
gallery (docs/reproduce.md)."""

from __future__ import annotations

import sys

import typer

from .common import (
    Fmt,
    FormatOpt,
    WideOpt,
    check_output_dir,
    command_line,
    emit_json,
    fail,
)

NamesArg = typer.Argument(None, help="items to run (see --list); a prefix ending in '.' or '*' "
                                     "selects several")
PaperSeedOpt = typer.Option([], "--seed", help="a paper (gg25|clpr25|noci22|deshpande26|"
                                               "mindthegap; repeatable) or the randomness seed N "
                                               "(default 0)")
SIZE_HELP = "tiny|quick|default|full (default: full with --device cuda, else default)"


def _split_seed(values: list[str]) -> tuple[list[str], int]:
    """``--seed`` takes a paper (gg25, clpr25, noci22, deshpande26, mindthegap; repeatable)
    or, as in every command, the randomness seed N."""
    from ..reproduce.core import PAPERS

    papers, rng = [], 0
    for v in values:
        if v in PAPERS:
            papers.append(v)
            continue
        try:
            n = int(v)
        except ValueError:
            fail(f"--seed: must be a paper ({', '.join(PAPERS)}) or a randomness seed N in "
                 f"[0, 2^63) (got {v!r})")
        if not 0 <= n < 2**63:
            fail(f"--seed: must be an integer in [0, 2^63) (got {v})")
        rng = n
    return papers, rng


def _list(fmt: Fmt, sel, wide: bool) -> None:
    rows = [{"name": it.name, "paper": it.paper, "ref": it.ref, "title": it.title,
             "trains": it.trains, "quick_s": it.runtime.get("quick"),
             "default_s": it.runtime.get("default"), "differs": bool(it.differs)}
            for it in sel]
    if fmt == Fmt.json:
        emit_json({"items": rows, "quick_total_s": sum(r["quick_s"] or 0 for r in rows)})
        return
    if fmt == Fmt.csv:
        import csv

        w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else ["name"])
        w.writeheader()
        w.writerows(rows)
        return
    from ..report.reproduce import print_items

    print_items(sel, wide=wide)


def reproduce(
    names: list[str] = NamesArg,
    list_: bool = typer.Option(False, "--list", help="list the items and exit"),
    seed: list[str] = PaperSeedOpt,
    all_: bool = typer.Option(False, "--all", help="every item"),
    quick: bool = typer.Option(False, "--quick", help="the --quick sizes (whole gallery "
                                                      "<= 15 min on 2 cores)"),
    size: str = typer.Option(None, "--size", help=SIZE_HELP),
    out: str = typer.Option("gallery", "--out", help="folder for figures, data, checks and "
                                                     "index.html"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    fmt: Fmt = FormatOpt,
    wide: bool = WideOpt,
) -> None:
    """Reproduce the seed papers' figures and claims; write DIR/index.html."""
    from ..reproduce import core

    papers, rng = _split_seed(seed)
    try:
        sel = core.select(names or (), papers, everything=all_ or list_ and not (names or papers))
    except ValueError as err:
        fail(str(err).replace("unknown item", "NAMES: unknown item"))
    if list_:
        _list(fmt, sel, wide)
        return
    if not sel:
        fail("NAMES: give item names, --seed PAPER or --all (see --list)")
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        fail(f"--device: must be cpu, cuda or cuda:N (got {device!r})")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            fail("--device: cuda is not available on this machine (use --device cpu)")
    if quick and size not in (None, "quick"):
        fail(f"--size: --quick already asks for the quick sizes (got --size {size})")
    size = "quick" if quick else size or ("full" if device.startswith("cuda") else "default")
    if size not in core.SIZES:
        fail(f"--size: must be one of {', '.join(core.SIZES)} (got {size!r})")
    check_output_dir("--out", out)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..report.gallery import write_gallery

    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
            "{task.completed}/{task.total}"), TimeElapsedColumn(), transient=True,
            console=_stderr_console()) as bar:
        task = bar.add_task("reproduce", total=len(sel))
        for it in sel:
            bar.update(task, description=f"{it.name} ({size})")
            r = core.run(it, size, seed=rng, device=device, catch=True)
            r.save(out)
            if r.figure is not None:
                r.figure.clear()  # free the canvas; the files are written
                r.figure = None
            results.append(r)
            bar.advance(task)
    page = write_gallery(results, out, command=command_line())
    _report(results, fmt, page, wide)
    if any(r.status in ("fail", "error") for r in results):
        raise typer.Exit(1)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def _report(results, fmt: Fmt, page, wide: bool) -> None:
    if fmt == Fmt.json:
        emit_json({"gallery": str(page), "items": [r.to_json() for r in results]})
        return
    rows = [(r.name, r.status, f"{sum(c.status != 'fail' for c in r.checks)}/{len(r.checks)}",
             f"{r.seconds:.1f}", r.error) for r in results]
    if fmt == Fmt.csv:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(["name", "status", "checks_ok", "seconds", "error"])
        w.writerows(rows)
        return
    from ..report.reproduce import print_results

    print_results(results, page, wide=wide)
