"""The ``sigprop`` command line (docs/cli.md is the contract: option names and JSON shape).

Thin by design: parse, validate (``SpecError`` -> one line on stderr, exit code 2), call the
library, print. Heavy imports happen inside the commands so start-up stays fast.

Layout: :mod:`.common` holds the typer ``app``, the output formats, the error helpers and the
spec options; the commands live in ``cmd_theory`` (predict, diagram, translate), ``cmd_measure``
(measure, longctx), ``cmd_models`` (diagnose, fix), ``cmd_train`` (train, trainability) and
``cmd_reproduce`` (reproduce) and ``cmd_runs`` (sweep, results) and ``cmd_bench`` (bench).
They are registered here, in the order ``sigprop --help`` lists them.
"""

from __future__ import annotations

import sys

import typer

from ..spec import SpecError
from .cmd_bench import bench
from .cmd_instability import instability
from .cmd_measure import longctx, measure, parse_lengths
from .cmd_models import diagnose, fix_cmd, parse_alpha
from .cmd_reproduce import reproduce
from .cmd_runs import results, sweep
from .cmd_theory import TRANSLATE_KEYS, diagram_cmd, predict, translate, translations
from .cmd_train import train_cmd, trainability
from .common import (
    AsymptoticOpt,
    Fmt,
    FormatOpt,
    SeedOpt,
    app,
    fail,
    option_name,
    spec_command,
    write_figure,
    write_report_file,
)

__all__ = [
    "AsymptoticOpt", "Fmt", "bench", "FormatOpt", "SeedOpt", "TRANSLATE_KEYS", "app", "diagnose",
    "diagram_cmd", "fail", "fix_cmd", "instability", "longctx", "main", "measure", "option_name",
    "predict", "reproduce", "results", "run", "spec_command", "sweep", "train_cmd",
    "trainability", "translate", "translations",
    "write_figure", "write_report_file", "parse_alpha", "parse_lengths",
]

app.command()(predict)
app.command("diagram")(diagram_cmd)
app.command()(measure)
app.command()(diagnose)
app.command()(longctx)
app.command("fix")(fix_cmd)
app.command()(translate)
app.command("train")(train_cmd)
app.command()(trainability)
app.command()(instability)
app.command()(reproduce)
app.command()(sweep)
app.command()(results)
app.command()(bench)


def _click_errors() -> tuple[tuple, tuple]:
    """(usage-error, exit) exception classes: typer >= 0.2x vendors its own click, older
    typer uses the click package; accept both."""
    usage, exits = [], [typer.Exit]
    try:
        from typer._click import exceptions as vendored

        usage.append(vendored.UsageError)
    except ImportError:
        pass
    try:
        from click import exceptions as ck

        usage.append(ck.UsageError)
        exits.append(ck.Exit)
    except ImportError:
        pass
    return tuple(usage), tuple(exits)


def run(args: list[str] | None = None) -> int:
    """Run the command line on ``args`` (default ``sys.argv[1:]``) in this process and return
    the exit code: usage errors become one line on stderr and code 2 (no tracebacks)."""
    import os

    # the CLI owns the terminal: transformers' advisory warnings and bars stay quiet
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from ..measurement import heap
    from . import common

    heap.tune()  # the allocator thresholds (measurement.heap): the CLI's choice, not import's
    common.ARGV[:] = list(sys.argv[1:] if args is None else args)
    usage, exits = _click_errors()
    try:
        rv = app(args=args, standalone_mode=False, prog_name="sigprop")
    except usage as err:
        typer.echo(f"sigprop: error: {err.format_message()}", err=True)
        return 2
    except typer.Abort:
        typer.echo("sigprop: aborted", err=True)
        return 130
    except exits as err:
        return int(getattr(err, "exit_code", 1) or 0)
    except (RuntimeError, MemoryError) as err:  # an allocation the memory check missed
        from ..measurement.memory import allocation_failure

        line = allocation_failure(err)
        if line is None:
            raise
        typer.echo(f"sigprop: error: {line}", err=True)
        return 2
    except SpecError as err:  # every command's bad input: one line naming the option
        line = common.spec_message(err, common.options_of(common.ARGV))
        typer.echo(f"sigprop: error: {line}", err=True)
        return 2
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Entry point of the ``sigprop`` script."""
    sys.exit(run())
