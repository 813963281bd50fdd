"""Shared pieces of the CLI: the typer ``app``, output formats, error helpers and the spec
options every architecture command takes (docs/cli.md "Spec options")."""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import os
import sys
from enum import StrEnum
from typing import Any

import typer

from ..spec import ArchSpec, SpecError

app = typer.Typer(
    name="sigprop",
    help="Predict, measure and prevent rank collapse and entropy collapse in transformers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"sigprop {version()} ({stack_versions()})")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Predict, measure and prevent rank collapse and entropy collapse in transformers."""


class Fmt(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def fail(message: str, code: int = 2):
    """One line on stderr and exit (docs/cli.md: bad values exit 2, never a traceback)."""
    typer.echo(f"sigprop: error: {message}", err=True)
    raise typer.Exit(code)


def option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


@contextlib.contextmanager
def progress(fmt: Fmt, label: str, total: float | None = None):
    """A transient progress bar on stderr for table output: yields ``tick(n=1, *,
    completed=None, description=None)`` that advances it (by ``n``, to ``completed``, or with a
    new label); for JSON / CSV output yields None, so the caller passes no callback."""
    if fmt != Fmt.table:
        yield None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=total)

        def tick(n: float = 1, *, completed: float | None = None,
                 description: str | None = None) -> None:
            if description is not None:
                bar.update(task, description=description)
            if completed is not None:
                bar.update(task, completed=completed)
            else:
                bar.advance(task, n)

        yield tick


def spec_message(err: SpecError, options: set[str]) -> str:
    """A SpecError as the CLI's one line: a field that is one of the command's ``options`` is
    named as the option (``--seq-len``), ``model`` as the MODEL argument, anything else (a
    config.json field, ``weights``) by its own name."""
    msg = str(err).split(": ", 1)[-1]
    name = option_name(err.field)
    if err.field == "model":
        return f"MODEL: {msg}"
    return f"{name}: {msg}" if name in options else f"{err.field}: {msg}"


def options_of(argv: list[str]) -> set[str]:
    """Long option names of the (sub)command that ``argv`` invokes (empty when it names
    none)."""
    try:
        cmd = typer.main.get_command(app)
    except Exception:  # noqa: BLE001 - no command tree: no options to name
        return set()
    for tok in argv:
        sub_cmds = getattr(cmd, "commands", None)
        if not isinstance(sub_cmds, dict):
            break
        if tok in sub_cmds:
            cmd = sub_cmds[tok]
    return {o for p in getattr(cmd, "params", ()) for o in getattr(p, "opts", ())
            if o.startswith("--")}


# ---- output paths, checked before any work ---------------------------------------------------
#: figure formats matplotlib writes (``--out``, ``--plot``)
FIGURE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def _probe_writable(option: str, folder: str) -> None:
    """``folder`` must exist and accept a new file (tried, so read-only mounts and /sys fail)."""
    import tempfile

    if not os.path.isdir(folder):
        fail(f"{option}: folder {folder!r} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".sigprop-probe-"):
            pass
    except OSError as err:
        fail(f"{option}: cannot write in {folder!r} ({err.strerror or err})")


def _check_name(option: str, path: str) -> str:
    if not path or not path.strip():
        fail(f"{option}: must be a non-empty path")
    if "\0" in path:
        fail(f"{option}: path contains a NUL byte")
    full = os.path.abspath(os.path.expanduser(path))
    for part in full.split(os.sep):
        if len(part.encode()) > 255:
            fail(f"{option}: a path component is longer than 255 bytes")
    if len(full.encode()) > 4000:
        fail(f"{option}: path longer than 4000 bytes")
    return full


def check_output_file(option: str, path: str | None, formats: tuple[str, ...] | None = None
                      ) -> None:
    """Validate a file to be written (``--report``, ``--plot``, ``--out`` of diagram) before
    any work: non-empty, not a folder, an allowed extension, a writable existing folder."""
    if path is None:
        return
    full = _check_name(option, path)
    if os.path.isdir(full):
        fail(f"{option}: {path!r} is a folder; give a file name")
    if formats is not None:
        ext = os.path.splitext(full)[1].lower().lstrip(".")
        if ext not in formats:
            fail(f"{option}: file name must end in one of .{', .'.join(formats)} "
                 f"(got {path!r})")
    _probe_writable(option, os.path.dirname(full))


def check_figure_path(option: str, path: str | None) -> None:
    check_output_file(option, path, FIGURE_FORMATS)


def check_output_dir(option: str, path: str | None) -> None:
    """A folder to be created or filled (``fix --out``, ``train --checkpoint``): non-empty,
    not an existing file, its nearest existing ancestor writable."""
    if path is None:
        return
    full = _check_name(option, path)
    if os.path.exists(full) and not os.path.isdir(full):
        fail(f"{option}: {path!r} exists and is not a folder")
    probe = full
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        fail(f"{option}: {probe!r} is a file, so {path!r} cannot be a folder")
    _probe_writable(option, probe)


def _check_seed(value: int) -> int:
    if value is not None and not 0 <= value < 2**63:
        fail(f"--seed: must be an integer in [0, 2^63) (got {value})")
    return value


def write_figure(option: str, path: str, draw, *args, **kwargs) -> None:
    """Draw a figure to ``path`` (validated up front with :func:`check_figure_path`); a write
    that still fails is a bad value of ``option`` (exit 2)."""
    try:
        draw(*args, path, **kwargs)
    except OSError as err:
        fail(f"{option}: cannot write {path!r} ({err.strerror or errno.errorcode.get(err.errno)})")


# Spec options shared by every command that takes an architecture (docs/cli.md "Spec options").
# name -> (annotation, default, help)
SPEC_OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "depth": (int, 12, "number of blocks"),
    "d_model": (int, 768, "model width d"),
    "heads": (int, 12, "attention heads H"),
    "d_ff": (int | None, None, "MLP width (default 4d)"),
    "seq_len": (int, 512, "tokens per sequence T"),
    "norm": (str, "post", "LayerNorm placement: post|pre|none"),
    "ln_kind": (str, "rms", "LayerNorm kind: rms|layernorm"),
    "attention": (str, "softmax", "attention variant: softmax|centred|uniform|identity"),
    "beta": (float | None, None, "score scale as gg25 beta (exclusive with --qk-std)"),
    "qk_std": (float | None, None, "raw Q/K init std (default: --init-std, i.e. 0.02)"),
    "scaling": (str, "none", "context-length score scaling: none|log-n|sqrt-log-n|qwen|"
                             "sqrt-qwen|ssmax|yarn|tau"),
    "scaling_param": (float | None, None, "parameter of the scaling (docs/theory.md §3.2)"),
    "alpha_attn": (float, 1.0, "attention residual strength (0 = no residual)"),
    "alpha_mlp": (float, 1.0, "MLP residual strength (0 = no residual)"),
    "init_std": (float, 0.02, "std of every weight, as HuggingFace initialises"),
    "sigma_v2": (float | None, None, "value weight variance x fan-in"),
    "sigma_w2": (float | None, None, "MLP weight variance x fan-in"),
    "sigma_w2_out": (float | None, None, "MLP output weight variance x fan-in"),
    "sigma_o2": (float | None, None, "output projection variance x fan-in"),
    "sigma_b2": (float, 0.0, "bias variance"),
    "activation": (str, "relu", "MLP activation: relu|gelu|tanh|silu|linear|swiglu|geglu"),
    "causal": (bool, False, "decoder (causal) attention"),
    "parallel": (bool, False, "attention and MLP read the same input (GPT-J, Falcon, Phi)"),
    "rho0": (float | None, None, "input cosine for theory (default 0)"),
    "q0": (float | None, None, "squared norm per dimension of the embeddings (default 1)"),
    "rho_max": (float, 0.9, "rank-collapse threshold on the final cosine"),
}


def spec_command(fn):
    """Add the spec options to a command; it receives ``spec: ArchSpec`` instead."""
    sig = inspect.signature(fn)
    own = [p for name, p in sig.parameters.items() if name != "spec"]
    extra = []
    for name, (ann, default, help_) in SPEC_OPTIONS.items():
        opt = typer.Option(default, option_name(name), help=help_, show_default=default is not None)
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                                       annotation=ann))

    @functools.wraps(fn)
    def wrapper(**kwargs):
        values = {k: kwargs.pop(k) for k in SPEC_OPTIONS}
        spec = ArchSpec(**values)
        return fn(spec=spec, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)
    return wrapper


FormatOpt = typer.Option(Fmt.table, "--format", help="output format")
StackMethodOpt = typer.Option(None, "--method", help="registered fix(es) applied to sigprop's "
                              "stack of the spec first, comma-separated (sigprop fix --list)")
StackParamOpt = typer.Option(None, "--param", help="a method parameter, METHOD.NAME=VALUE "
                             "(repeatable; with --method)")


def stack_methods(method: str | None, param: list[str] | None):
    """``--method`` / ``--param`` of a spec command: (names, parameters) or (None, None);
    bad input exits 2 with one line."""
    if method is None:
        if param:
            fail("--param: needs --method")
        return None, None
    from ..models.methods import parse_methods, parse_params

    names = parse_methods(method)
    return names, parse_params(param, names)
AsymptoticOpt = typer.Option(False, "--asymptotic", help="T -> inf theory (docs/theory.md §2.2)")
SeedOpt = typer.Option(0, "--seed", help="randomness seed, 0 <= seed < 2^63",
                       callback=_check_seed)
WideOpt = typer.Option(False, "--wide", help="tables with every column, never cut to the "
                       "terminal's width")
NoTimingOpt = typer.Option(False, "--no-timing",
                           help="leave wall-clock fields out of the JSON (byte-reproducible)")


def timing_fields(seconds: float, no_timing: bool) -> dict:
    """The wall-clock field of a JSON result, or nothing under ``--no-timing``."""
    return {} if no_timing else {"seconds": seconds}


#: the arguments of the command being run (set by :func:`sigprop.cli.run`)
ARGV: list[str] = []


def command_line() -> str:
    import shlex

    return shlex.join(["sigprop", *ARGV])


def stack_versions() -> str:
    """The installed torch, transformers and Python versions (package metadata: no import)."""
    import platform
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    out = []
    for pkg in ("torch", "transformers"):
        try:
            out.append(f"{pkg} {_v(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} not installed")
    return ", ".join(out + [f"python {platform.python_version()}"])


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("sigprop")
    except PackageNotFoundError:
        return "unknown"


def emit_json(obj: dict) -> None:
    """Print a result as JSON, with ``meta``: the command line and the sigprop version."""
    from ..trajectory import clean_json

    obj = clean_json({**obj, "meta": {"command": command_line(), "version": version()}})
    sys.stdout.write(dumps(obj) + "\n")


def dumps(obj: dict) -> str:
    """JSON with one top-level key per line and one element per line in lists of objects
    (Trajectory rows), each value written compactly: readable, diffable, and fast (the C
    encoder; ``indent=`` would use the pure-Python one, 1.2 s for 60,000 rows)."""
    def value(v) -> str:
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            return "[\n  " + ",\n  ".join(json.dumps(x, allow_nan=False) for x in v) + "\n ]"
        return json.dumps(v, allow_nan=False)

    body = ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in obj.items())
    return "{\n" + body + "\n}"


def write_report_file(path: str, d, **kwargs) -> None:
    """The HTML report of diagnosis ``d``; an unwritable path is a bad ``--report`` (exit 2)."""
    from ..report.html import write_report

    try:
        write_report(d, path, command=command_line(), **kwargs)
    except OSError as err:
        fail(f"--report: cannot write {path!r} ({err.strerror or err})")
