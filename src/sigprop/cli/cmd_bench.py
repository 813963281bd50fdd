"""``sigprop bench``: every speed figure beside its reference, measured in one run
(docs/bench.md)."""

from __future__ import annotations

import json

import typer

from .common import Fmt, FormatOpt, WideOpt, check_output_file, emit_json, fail

NamesArg = typer.Argument(None, help="benchmarks to run (default: all; --list)")


def bench(
    names: list[str] = NamesArg,
    size: str = typer.Option("default", "--size", help="quick (seconds, a smoke run) | "
                             "default (the stated sizes)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    list_: bool = typer.Option(False, "--list", help="list the benchmarks and exit"),
    out: str | None = typer.Option(None, "--out", help="also write the JSON to this file"),
    readme: str | None = typer.Option(None, "--readme", help="rewrite this README's speed "
                                      "section from the run"),
    from_: str | None = typer.Option(None, "--from", help="render this saved run's JSON "
                                     "(--out, --format json) instead of running"),
    fmt: Fmt = FormatOpt, wide: bool = WideOpt,
) -> None:
    """Run sigprop's benchmarks: each sigprop figure beside its reference measured in the
    same run, the ratio, and the machine's matmul rate and memory bandwidth."""
    from ..bench.core import SIZES, benchmarks, run

    known = benchmarks()
    if list_:
        rows = [{"name": b.name, "title": b.title, "default_s": b.runtime}
                for b in known.values()]
        if fmt == Fmt.json:
            emit_json({"benchmarks": rows})
        else:
            for r in rows:
                typer.echo(f"{r['name']:<16} ~{r['default_s']:>5.0f} s  {r['title']}")
        return
    check_output_file("--readme", readme, ("md",))
    if from_ is not None:
        if names or out or size != "default" or device != "cpu":
            fail("--from: renders a saved run; NAMES, --out, --size and --device do not apply "
                 "to it (its size and device are those in its JSON)")
        res = _saved(from_)
        _render(res, readme, fmt, wide)
        return
    if size not in SIZES:
        fail(f"--size: must be one of {', '.join(SIZES)} (got {size!r})")
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        fail(f"--device: must be cpu, cuda or cuda:N (got {device!r})")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            fail("--device: cuda is not available on this machine (use --device cpu)")
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        fail(f"NAMES: unknown benchmark {unknown[0]!r} (known: {', '.join(known)})")
    check_output_file("--out", out, ("json",))
    from rich.console import Console

    console = Console(stderr=True)
    with console.status("benchmarks") as status:
        def started(b) -> None:
            line = f"{b.name}: {b.title} (~{b.runtime:.0f} s at default size)"
            if console.is_terminal:
                status.update(line)
            else:  # a log file or a pipe shows no spinner: one line per benchmark instead
                console.print(line, markup=False, highlight=False)
        res = run(names or [], size=size, device=device, on_start=started)
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=1)
    _render(res, readme, fmt, wide)


def _saved(path: str) -> dict:
    """A run's JSON read back, or a one-line error naming --from."""
    try:
        with open(path) as fh:
            res = json.load(fh)
    except (OSError, ValueError) as err:
        fail(f"--from: cannot read a bench JSON from {path!r} ({type(err).__name__})")
    ok = isinstance(res, dict) and isinstance(res.get("machine"), dict) and isinstance(
        res.get("benchmarks"), list) and "device" in res["machine"]
    if not ok:
        fail(f"--from: {path!r} is not a `sigprop bench` JSON (needs machine and benchmarks)")
    return res


def _render(res: dict, readme: str | None, fmt: Fmt, wide: bool) -> None:
    if readme:
        from pathlib import Path

        from ..report.bench import markdown, replace_section

        p = Path(readme)
        p.write_text(replace_section(p.read_text() if p.exists() else "", markdown(res)))
    if fmt == Fmt.json:
        emit_json(res)
    else:
        from ..report.bench import print_bench

        print_bench(res, wide=wide)
