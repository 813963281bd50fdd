"""Real-architecture commands: ``diagnose`` and ``fix``."""

from __future__ import annotations

import sys

import typer

from ..spec import SpecError
from .common import (
    Fmt,
    FormatOpt,
    NoTimingOpt,
    SeedOpt,
    WideOpt,
    _emit_json,
    check_output_dir,
    check_output_file,
    fail,
    fail_spec,
    write_report_file,
)


def diagnose(model: str = typer.Argument("bert-base-uncased",
                                         help="preset name or local path (config.json / folder)"),
             seq_len: int | None = typer.Option(None, "--seq-len", help="tokens per sequence"),
             seeds: int = typer.Option(2, "--seeds", help="independent initialisations"),
             sequences: int = typer.Option(2, "--sequences", help="sequences per seed"),
             device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
             report: str | None = typer.Option(None, "--report",
                                               help="write a self-contained HTML report"),
             stack: str = typer.Option("encoder", "--stack",
                                       help="encoder-decoder models: encoder or decoder"),
             fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
             wide: bool = WideOpt) -> None:
    """A real HuggingFace architecture at init: measured per layer, theory beside it, verdict
    and recommendations."""
    from ..analysis import diagnose as dg

    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    check_output_file("--report", report, ("html", "htm"))
    try:
        if fmt == Fmt.table:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"measuring {model}", total=seeds)
                d = dg.diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences,
                                device=device, seed=seed, stack=stack,
                                on_seed=lambda s: bar.advance(task))
        else:
            d = dg.diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences,
                            device=device, seed=seed, stack=stack)
    except SpecError as err:
        fail_spec(err)
    if report is not None:
        write_report_file(report, d)
    if fmt == Fmt.json:
        _emit_json(dg.to_json(d, timing=not no_timing))
    elif fmt == Fmt.csv:
        d.trajectory.drop(columns=[c for c in d.trajectory.columns
                                   if c.startswith("spec.")]).to_csv(sys.stdout, index=False)
    else:
        from ..report import console

        console.print_diagnosis(d, wide=wide)


def _alpha_value(text: str | None) -> float | str | None:
    if text is None or text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        fail(f"--alpha-attn: must be a number in (0, 10000] or auto (got {text!r})")


def fix_cmd(model: str = typer.Argument(..., help="preset name or local path"),
            out: str = typer.Option(..., "--out", help="folder for config.json + safetensors"),
            beta: float | None = typer.Option(None, "--beta",
                                              help="re-scale Q/K to this gg25 beta"),
            alpha_attn: str | None = typer.Option(None, "--alpha-attn",
                                                  help="attention skip strength, or auto"),
            centred: bool = typer.Option(False, "--centred", help="centred attention A - 11^T/n"),
            scaling: str | None = typer.Option(
                None, "--scaling",
                help="length scaling: log-n|sqrt-log-n|qwen|sqrt-qwen|ssmax|yarn|tau"),
            scaling_param: float | None = typer.Option(None, "--scaling-param",
                                                       help="parameter of the scaling"),
            longctx: str | None = typer.Option(None, "--longctx",
                                               help="apply the length scaling recommended in "
                                               "this `sigprop longctx MODEL --format json` "
                                               "output"),
            seq_len: int | None = typer.Option(None, "--seq-len", help="tokens per sequence"),
            seeds: int = typer.Option(2, "--seeds", help="initialisations for the diagnosis"),
            sequences: int = typer.Option(2, "--sequences", help="sequences per seed"),
            device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
            report: str | None = typer.Option(None, "--report",
                                              help="HTML report of the fixed model"),
            fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
            wide: bool = WideOpt) -> None:
    """Patch a model against rank / entropy collapse, write it to --out (config.json +
    safetensors, reloadable without remote code) and show the diagnosis before and after."""
    from ..analysis import diagnose as dg
    from ..spec import SCALINGS

    a = _alpha_value(alpha_attn)
    if longctx is not None:
        if scaling is not None or scaling_param is not None:
            fail("--longctx: gives the scaling itself; drop --scaling / --scaling-param")
        scaling, scaling_param = _recommended(longctx)
    if beta is None and a is None and not centred and scaling is None:
        fail("fix: give at least one of --beta, --alpha-attn, --centred, --scaling")
    if scaling is not None and scaling not in SCALINGS:
        fail(f"--scaling: must be one of {', '.join(SCALINGS)} (got {scaling!r})")
    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    check_output_dir("--out", out)
    check_output_file("--report", report, ("html", "htm"))
    kw = dict(beta=beta, alpha_attn=a, centred=centred, scaling=scaling,
              scaling_param=scaling_param, seq_len=seq_len, seeds=seeds, sequences=sequences,
              device=device, seed=seed)
    try:
        if fmt == Fmt.table:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("fix", total=4)
                r = dg.fix(model, out, on_stage=lambda s: (
                    bar.update(task, description=s), bar.advance(task)), **kw)
        else:
            r = dg.fix(model, out, **kw)
    except SpecError as err:
        fail_spec(err)
    before, rep, after = r.before, r.report, r.after
    if report is not None:
        write_report_file(report, after, fix=(before, rep))
    if fmt == Fmt.json:
        _emit_json({"model": model, "out": out, "fix": rep.to_dict(),
                    "before": dg.to_json(before, timing=not no_timing),
                    "after": dg.to_json(after, timing=not no_timing),
                    "verdict_before": before.verdict, "verdict": after.verdict})
    elif fmt == Fmt.csv:
        import pandas as pd

        t = pd.concat([before.trajectory.assign(model="before"),
                       after.trajectory.assign(model="after")], ignore_index=True)
        t.drop(columns=[c for c in t.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report import console

        console.print_fix(before, rep, after, out, wide=wide)


def _recommended(path: str) -> tuple[str, float | None]:
    """``(scaling, scaling_param)`` of the recommendation in a ``sigprop longctx MODEL --format
    json`` file; a bad file is a bad ``--longctx`` (exit 2)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            rec = json.load(fh)["recommendation"]
        kind, param = rec["scaling"], rec.get("scaling_param")
    except OSError as err:
        fail(f"--longctx: cannot read {path!r} ({err.strerror or err})")
    except (ValueError, KeyError, TypeError):
        fail(f"--longctx: {path!r} is not the JSON of `sigprop longctx MODEL --format json`")
    from ..spec import SCALINGS

    if kind not in SCALINGS:
        fail(f"--longctx: unknown scaling {kind!r} in {path!r}")
    if kind == "none":
        fail(f"--longctx: the recommendation in {path!r} is no change (the model stays in "
             "band as it is)")
    return kind, None if param is None else float(param)
