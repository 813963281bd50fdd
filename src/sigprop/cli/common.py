"""Shared pieces of the CLI: the typer ``app``, output formats, error helpers and the spec
options every architecture command takes (CLI.md "Spec options")."""

from __future__ import annotations

import functools
import inspect
import json
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


class Fmt(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def fail(message: str, code: int = 2):
    """One line on stderr and exit (CLI.md: bad values exit 2, never a traceback)."""
    typer.echo(f"sigprop: error: {message}", err=True)
    raise typer.Exit(code)


def option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def fail_spec(err: SpecError):
    """A SpecError as the CLI's one-line message, naming the option instead of the field."""
    fail(f"{option_name(err.field)}: {str(err).split(': ', 1)[1]}")


def write_figure(option: str, path: str, draw, *args, **kwargs) -> None:
    """Draw a figure to ``path``; an unwritable path is a bad value of ``option`` (exit 2)."""
    try:
        draw(*args, path, **kwargs)
    except OSError as err:
        fail(f"{option}: cannot write {path!r} ({err.strerror or err})")


# Spec options shared by every command that takes an architecture (CLI.md "Spec options").
# name -> (annotation, default, help)
_SPEC_OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "depth": (int, 12, "number of blocks"),
    "d_model": (int, 768, "model width d"),
    "heads": (int, 12, "attention heads H"),
    "d_ff": (int | None, None, "MLP width (default 4d)"),
    "seq_len": (int, 512, "tokens per sequence T"),
    "norm": (str, "post", "LayerNorm placement: post|pre|none"),
    "ln_kind": (str, "rms", "LayerNorm kind: rms|layernorm"),
    "attention": (str, "softmax", "attention variant: softmax|centred|uniform"),
    "beta": (float | None, None, "score scale as gg25 beta (exclusive with --qk-std)"),
    "qk_std": (float | None, None, "raw Q/K init std (default: --init-std, i.e. 0.02)"),
    "scaling": (str, "none", "context-length score scaling: none|log-n|qwen|ssmax|yarn|tau"),
    "scaling_param": (float | None, None, "parameter of the scaling (THEORY §3.2)"),
    "alpha_attn": (float, 1.0, "attention residual strength (0 = no residual)"),
    "alpha_mlp": (float, 1.0, "MLP residual strength (0 = no residual)"),
    "init_std": (float, 0.02, "std of every weight, as HuggingFace initialises"),
    "sigma_v2": (float | None, None, "value weight variance x fan-in"),
    "sigma_w2": (float | None, None, "MLP weight variance x fan-in"),
    "sigma_w2_out": (float | None, None, "MLP output weight variance x fan-in"),
    "sigma_o2": (float | None, None, "output projection variance x fan-in"),
    "sigma_b2": (float, 0.0, "bias variance"),
    "activation": (str, "relu", "MLP activation: relu|gelu|tanh|silu|linear|swiglu"),
    "causal": (bool, False, "decoder (causal) attention"),
    "rho0": (float | None, None, "input cosine for theory (default 0)"),
    "rho_max": (float, 0.9, "rank-collapse threshold on the final cosine"),
}


def spec_command(fn):
    """Add the spec options to a command; it receives ``spec: ArchSpec`` instead."""
    sig = inspect.signature(fn)
    own = [p for name, p in sig.parameters.items() if name != "spec"]
    extra = []
    for name, (ann, default, help_) in _SPEC_OPTIONS.items():
        opt = typer.Option(default, option_name(name), help=help_, show_default=default is not None)
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                                       annotation=ann))

    @functools.wraps(fn)
    def wrapper(**kwargs):
        values = {k: kwargs.pop(k) for k in _SPEC_OPTIONS}
        try:
            spec = ArchSpec(**values)
        except SpecError as err:
            fail_spec(err)
        return fn(spec=spec, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)
    return wrapper


FormatOpt = typer.Option(Fmt.table, "--format", help="output format")
AsymptoticOpt = typer.Option(False, "--asymptotic", help="T -> inf theory (THEORY §2.2)")
SeedOpt = typer.Option(0, "--seed", help="randomness seed")


def _emit_json(obj: dict) -> None:
    from ..jsonutil import clean_json

    sys.stdout.write(json.dumps(clean_json(obj), indent=1) + "\n")


def write_report_file(path: str, d, **kwargs) -> None:
    """The HTML report of diagnosis ``d``; an unwritable path is a bad ``--report`` (exit 2)."""
    from ..report.html import write_report

    try:
        write_report(d, path, **kwargs)
    except OSError as err:
        fail(f"--report: cannot write {path!r} ({err.strerror or err})")
