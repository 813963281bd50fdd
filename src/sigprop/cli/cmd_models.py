"""Real-architecture commands: ``diagnose`` and ``fix``."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import typer

from .common import (
    Fmt,
    FormatOpt,
    NoTimingOpt,
    SeedOpt,
    WideOpt,
    check_output_dir,
    check_output_file,
    emit_json,
    fail,
    progress,
    stack_methods,
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
             text: str | None = typer.Option(None, "--text", help="FILE|DIR of .txt: the "
                                             "inputs, through the model's tokenizer (default: "
                                             "built-in stories for trained weights)"),
             tokenizer: str | None = typer.Option(None, "--tokenizer", help="DIR|NAME: the "
                                                  "tokenizer (default: the model folder's)"),
             vs_init: bool = typer.Option(False, "--vs-init", help="trained weights: also "
                                          "measure a fresh init of the same config on the "
                                          "same inputs (what training changed)"),
             fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
             wide: bool = WideOpt) -> None:
    """A real HuggingFace architecture, at init or trained: measured per layer, theory beside
    it, verdict and recommendations."""
    from ..analysis import diagnose as dg
    from ..analysis.diagnosis import to_json

    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    check_output_file("--report", report, ("html", "htm"))
    with progress(fmt, f"measuring {model}", seeds) as tick:
        d = dg.diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences,
                        device=device, seed=seed, stack=stack, text=text,
                        tokenizer=tokenizer, vs_init=vs_init,
                        on_seed=tick and (lambda s: tick()))
    if report is not None:
        write_report_file(report, d)
    if fmt == Fmt.json:
        emit_json(to_json(d, timing=not no_timing))
    elif fmt == Fmt.csv:
        d.trajectory.drop(columns=[c for c in d.trajectory.columns
                                   if c.startswith("spec.")]).to_csv(sys.stdout, index=False)
    else:
        from ..report import console

        console.print_diagnosis(d, wide=wide)


def parse_alpha(text: str | None) -> float | str | None:
    if text is None or text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        fail(f"--alpha-attn: must be a number in (0, 10000] or auto (got {text!r})")


#: ``--param METHOD.NAME=VALUE``, repeatable (a module-level option: ruff B008)
ParamOpt = typer.Option(None, "--param", help="a method parameter, METHOD.NAME=VALUE "
                        "(repeatable)")


def fix_cmd(model: str | None = typer.Argument(None, help="preset name or local path"),
            out: str | None = typer.Option(None, "--out",
                                           help="folder for config.json + safetensors"),
            method: str | None = typer.Option(
                None, "--method", help="registered fix(es), comma-separated (sigprop fix "
                "--list)"),
            param: list[str] | None = ParamOpt,
            compare: str | None = typer.Option(
                None, "--compare", help="compare fixes on this model: all or NAME,NAME..."),
            train_steps: int = typer.Option(0, "--train-steps",
                                            help="with --compare: train each fix K steps"),
            list_methods: bool = typer.Option(False, "--list", help="list the registered "
                                              "fixes and their parameters"),
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
            seeds: int | None = typer.Option(None, "--seeds", help="initialisations measured "
                                             "(default 2; 1 with --compare)"),
            sequences: int = typer.Option(2, "--sequences", help="sequences per seed"),
            device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
            report: str | None = typer.Option(None, "--report",
                                              help="HTML report of the fixed model"),
            plot: str | None = typer.Option(None, "--plot", help="with --compare: write the "
                                            "comparison figure (.png, .svg, .pdf)"),
            fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
            wide: bool = WideOpt) -> None:
    """Patch a model against rank / entropy collapse, write it to --out (config.json +
    safetensors, reloadable without remote code) and show the diagnosis before and after;
    or, with --compare, apply every fix to the model and rank them."""
    from ..analysis import fix as fx
    from ..spec import SCALINGS

    if list_methods:
        _print_methods(fmt)
        return
    if model is None:
        fail("MODEL: required (a preset name or a local path; --list shows the fixes)")
    a = parse_alpha(alpha_attn)
    if longctx is not None:
        if scaling is not None or scaling_param is not None:
            fail("--longctx: gives the scaling itself; drop --scaling / --scaling-param")
        scaling, scaling_param = _recommended(longctx)
    flags = beta is not None or a is not None or centred or scaling is not None
    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    if not 0 <= train_steps <= 100_000:
        fail(f"--train-steps: must be an integer in [0, 100000] (got {train_steps})")
    if compare is not None:
        if flags or method is not None or out is not None or report is not None:
            fail("--compare: measures every fix on the model as it is; drop --method, "
                 "--beta, --alpha-attn, --centred, --scaling, --out and --report (apply the "
                 "recommendation with --method)")
        check_output_file("--plot", plot, ("png", "svg", "pdf"))
        _rank(model, compare, param, seq_len, 1 if seeds is None else seeds, sequences,
              device, seed, train_steps, fmt, no_timing, wide, plot)
        return
    if plot is not None:
        fail("--plot: only with --compare (the fixed model's figures: sigprop diagnose OUT "
             "--report)")
    if train_steps:
        fail("--train-steps: only with --compare")
    if not flags and method is None:
        fail("fix: give at least one of --method, --compare, --beta, --alpha-attn, "
             "--centred, --scaling (sigprop fix --list names the methods)")
    if out is None:
        fail("--out: required (the folder the fixed model is written to)")
    if scaling is not None and scaling not in SCALINGS:
        fail(f"--scaling: must be one of {', '.join(SCALINGS)} (got {scaling!r})")
    check_output_dir("--out", out)
    check_output_file("--report", report, ("html", "htm"))
    names, params = _fix_request(method, param, beta=beta, alpha_attn=a, centred=centred,
                                 scaling=scaling, scaling_param=scaling_param)
    with progress(fmt, "fix", 4) as tick:
        r = fx.fix(model, out, methods=names, params=params, seq_len=seq_len,
                   seeds=2 if seeds is None else seeds, sequences=sequences, device=device,
                   seed=seed, on_stage=tick and (lambda s: tick(description=s)))
    _print_fix(model, out, r, report, fmt, no_timing, wide)


def _fix_request(method: str | None, param: list[str] | None, **flags
                 ) -> tuple[list[str], dict]:
    """The registry's request of ``sigprop fix``: the fix flags (``--beta``,
    ``--alpha-attn``, ``--centred``, ``--scaling``, ``--scaling-param``) as the methods they
    name (:func:`sigprop.models.methods.from_keywords`, the translation ``fix(beta=...)``
    makes with a FutureWarning; none here), then ``--method`` with its ``--param``
    strings."""
    from ..models.methods import from_keywords

    names, params = from_keywords(**flags)
    chosen, given = stack_methods(method, param)
    return names + (chosen or []), {**params, **(given or {})}


def _print_fix(model: str, out: str, r, report: str | None, fmt, no_timing: bool,
               wide: bool) -> None:
    """The fix's result: the HTML report if asked, then JSON, CSV or the console table."""
    from ..analysis.diagnosis import to_json

    before, rep, after = r.before, r.report, r.after
    if report is not None:
        write_report_file(report, after, fix=(before, rep))
    if fmt == Fmt.json:
        emit_json({"model": model, "out": out, "fix": rep.to_dict(),
                    "before": to_json(before, timing=not no_timing),
                    "after": to_json(after, timing=not no_timing),
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


@contextmanager
def _stages(console, label: str):
    """A callback that shows a job's current stage: a transient bar on ``console`` (None:
    stdout) when it is a terminal, else one ``label: stage`` line per stage."""
    from rich.progress import Progress

    if console is None or console.is_terminal:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(label, total=None)
            yield lambda s: bar.update(task, description=s)
    else:
        yield lambda s: console.print(f"{label}: {s}", markup=False, highlight=False)


def _rank(model, which, param, seq_len, seeds, sequences, device, seed, train_steps, fmt,
             no_timing, wide, plot) -> None:
    from rich.console import Console

    from ..analysis.ranking import rank_fixes
    from ..models.methods import parse_methods, parse_params

    names = parse_methods(which)
    params = parse_params(param, names)
    # table: a bar on stdout, before the table; JSON / CSV: stdout holds the result, so a bar
    # on stderr, or one line per stage where stderr is a log file or a pipe
    progress = None if fmt == Fmt.table else Console(stderr=True)
    with _stages(progress, "comparing fixes") as stage:
        c = rank_fixes(model, names, params, seq_len=seq_len, seeds=seeds,
                       sequences=sequences, device=device, seed=seed, train_steps=train_steps,
                       on_method=stage)
    if plot is not None:
        c.plot(plot)
    if fmt == Fmt.json:
        d = c.to_dict()
        if not no_timing:
            d["seconds"] = round(c.seconds, 3)
        else:
            for r in d["methods"]:
                r.pop("seconds", None)
        emit_json(d)
    elif fmt == Fmt.csv:
        c.trajectory.to_csv(sys.stdout, index=False)
    else:
        from ..report import console

        console.print_compare(c, wide=wide)


def _print_methods(fmt) -> None:
    from ..models import methods as M

    rows = [{"method": n, "title": M.get(n).title, "cite": M.get(n).cite,
             "acts": M.get(n).acts, "theory": M.get(n).theory,
             "params": {p.name: p.help for p in M.get(n).params}} for n in M.names()]
    if fmt == Fmt.json:
        emit_json({"methods": rows})
        return
    from ..report import console

    console.print_methods(rows)


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
