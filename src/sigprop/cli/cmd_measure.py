"""Simulation commands: ``measure`` (depth) and ``longctx`` (context length)."""

from __future__ import annotations

import sys

import typer

from ..spec import ArchSpec
from .common import (
    AsymptoticOpt,
    Fmt,
    FormatOpt,
    NoTimingOpt,
    SeedOpt,
    StackMethodOpt,
    StackParamOpt,
    WideOpt,
    check_figure_path,
    emit_json,
    fail,
    progress,
    spec_command,
    stack_methods,
    timing_fields,
    write_figure,
)


@spec_command
def measure(spec: ArchSpec,
            seeds: int = typer.Option(4, "--seeds", help="independent initialisations S"),
            sequences: int = typer.Option(2, "--sequences", help="sequences per seed B"),
            input: str = typer.Option("rho", "--input", help="inputs: rho|isometric|text"),
            plot: str | None = typer.Option(None, "--plot", help="write depth curves PNG"),
            grads: bool = typer.Option(False, "--grads", help="also Q/V gradient norms"),
            float64: bool = typer.Option(False, "--float64", help="simulate in float64"),
            asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
            seed: int = SeedOpt, no_timing: bool = NoTimingOpt, wide: bool = WideOpt,
            method: str | None = StackMethodOpt, param: list[str] | None = StackParamOpt
            ) -> None:
    """Theory and simulation side by side: S seeds x B sequences through the torch model."""
    from .. import trajectory
    from ..analysis.measure import measure as run

    check_figure_path("--plot", plot)
    names, params = stack_methods(method, param)
    # theory at --rho0, else at the measured input cosine
    m = run(spec, seeds=seeds, sequences=sequences, input=input, seed=seed,
            float64=float64, grads=grads, asymptotic=asymptotic, methods=names,
            method_params=params)
    spec = m.spec
    traj, verdict, a_crit, agreement, rho0 = (m.trajectory, m.verdict, m.alpha_crit,
                                              m.max_abs_error, m.rho0)
    if plot:
        from ..plotting.figures import plot_depth

        write_figure("--plot", plot, plot_depth, traj, spec=spec)
    if fmt == Fmt.json:
        emit_json({"spec": spec.to_dict(), "derived": spec.derived(rho0),
                    "rows": trajectory.to_rows(traj), "verdict": verdict, "alpha_crit": a_crit,
                    "rho0": rho0, "max_abs_error": agreement, **timing_fields(m.seconds, no_timing),
                    **m.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report import console, tables

        if "methods" in m.info:  # what --method changed in the stack, before its table
            out = tables.console(wide)
            for line in m.info["methods"]["changes"]:
                out.print(f"fix {line}", markup=False, highlight=False)
        console.print_measurement(spec, traj, agreement, verdict, m, wide=wide)


def parse_lengths(text: str | None) -> list[int] | None:
    """``--lengths``: comma-separated integers, each also accepted as ``2^k``."""
    if text is None:
        return None
    from ..spec import MAX_SEQ_LEN

    usage = "must be comma-separated integers >= 2, e.g. 512,4096 or 2^20"
    out = []
    for part in text.split(","):
        p = part.strip()
        base, _, exp = p.partition("^")
        try:
            b, e = int(base), int(exp) if exp else 1
        except ValueError:
            fail(f"--lengths: {usage} (got {p!r})")
        # bound the exponent before raising to it: 2^100000000 would take minutes
        if not (2 <= b <= MAX_SEQ_LEN and 1 <= e <= 64 and b**e <= MAX_SEQ_LEN):
            fail(f"--lengths: each length must be in [2, 2^30] (got {p!r})")
        out.append(b**e)
    if not out:
        fail(f"--lengths: {usage} (got {text!r})")
    return out


@spec_command
def longctx(spec: ArchSpec,
            model: str | None = typer.Argument(None, help="a model (preset name or local "
                                               "path): every attention layer with its own "
                                               "weights; omitted: the spec options' layer"),
            lengths: str | None = typer.Option(None, "--lengths",
                                               help="context lengths T (default 2^9..2^20; "
                                               "with MODEL 2^12..2^20 step 4x)"),
            queries: int | None = typer.Option(None, "--queries", help="sampled query rows R "
                                               "per length (default 256; MODEL: 128)"),
            chunk: int = typer.Option(8192, "--chunk", help="keys per streamed chunk"),
            input: str = typer.Option("rho", "--input", help="inputs: rho|isometric|rem "
                                      "(rem: i.i.d. Gaussian scores)"),
            compare: bool = typer.Option(False, "--compare", help="none, gg25 sqrt(log T) and "
                                         "clpr25 log T scalings side by side (MODEL: also "
                                         "qwen and tau, all streamed)"),
            scalings: str | None = typer.Option(None, "--scalings", help="MODEL: scalings to "
                                                "stream, comma-separated kind or kind:param "
                                                "(none, sqrt-log-n, log-n, qwen, ssmax:s, "
                                                "yarn:s, tau:t)"),
            train_len: int | None = typer.Option(None, "--train-len", help="MODEL: the length "
                                                 "it was built for (default from its config)"),
            band: float = typer.Option(0.05, "--band", help="MODEL: half-width of the entropy "
                                       "band around each layer's value at --train-len"),
            band_from: str | None = typer.Option(None, "--band-from", help="MODEL: the bands "
                                                 "of an earlier `longctx MODEL --format json` "
                                                 "run (re-measure a fixed model against the "
                                                 "original's bands)"),
            layers: str | None = typer.Option(None, "--layers", help="MODEL: attention layers "
                                              "to stream, e.g. 0,5,15 (default all)"),
            out_queries: int = typer.Option(32, "--out-queries", help="MODEL: rows per length "
                                            "whose layer output gives the output cosine"),
            sequences: int = typer.Option(2, "--sequences", help="MODEL: sequences of the "
                                          "reference pass that measures each layer's inputs"),
            report: str | None = typer.Option(None, "--report", help="MODEL: write a "
                                              "self-contained HTML report"),
            device: str = typer.Option("cpu", "--device", help="MODEL: where the stream runs, "
                                       "cpu or cuda"),
            text: str | None = typer.Option(None, "--text", help="MODEL: real text (a .txt "
                                            "file or a folder of them) through the model's "
                                            "tokenizer (default on trained weights: built-in "
                                            "stories)"),
            tokenizer: str | None = typer.Option(None, "--tokenizer", help="MODEL: its "
                                                 "tokenizer (folder or hub name) when none "
                                                 "sits beside the weights"),
            real_max: int | None = typer.Option(None, "--real-max", help="MODEL: on real text, "
                                                "the lengths up to this are also read by the "
                                                "model itself and set beside the stream "
                                                "(default 4096; 0: none)"),
            key_model: str | None = typer.Option(None, "--key-model", help="MODEL: the "
                                                 "stream's inputs, gaussian or resampled "
                                                 "(default: resampled on real text)"),
            plot: str | None = typer.Option(None, "--plot", help="write ipr/entropy/wmax vs T"),
            fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
            wide: bool = WideOpt) -> None:
    """Attention against context length, streamed without T x T. With MODEL: every attention
    layer of a real model (its weights, norm, RoPE at the true positions), theory beside it
    and the length scaling that keeps each layer's entropy in band. Without: one layer drawn
    from the spec options (weights drawn once at --seq-len), finite-T theory beside it."""
    ts = parse_lengths(lengths)
    check_figure_path("--plot", plot)
    if model is not None:
        return _longctx_model(model, spec, ts, queries, chunk, compare, scalings, train_len,
                              band, layers, out_queries, sequences, report, plot, fmt, seed,
                              no_timing, wide, device, band_from,
                              dict(text=text, tokenizer=tokenizer, real_max=real_max,
                                   key_model=key_model))
    for name, val in (("--scalings", scalings), ("--train-len", train_len),
                      ("--layers", layers), ("--report", report),
                      ("--device", None if device == "cpu" else device),
                      ("--band-from", band_from), ("--text", text),
                      ("--tokenizer", tokenizer), ("--real-max", real_max),
                      ("--key-model", key_model)):
        if val is not None:
            fail(f"{name}: applies to a MODEL (sigprop longctx MODEL {name} ...)")
    _longctx_spec(spec, ts, queries, chunk, input, compare, plot, fmt, seed, no_timing, wide)


def _longctx_spec(spec, ts, queries, chunk, input, compare, plot, fmt, seed, no_timing, wide):
    """``sigprop longctx`` without a MODEL: one layer of the spec streamed over lengths."""
    from .. import trajectory
    from ..measurement import longctx as lc

    ts = ts or lc.default_lengths()
    queries = 256 if queries is None else queries
    lc.check_args(ts, queries, chunk, input, spec)
    # before any allocation: work bound and memory (also checked inside stream_lengths)
    lc.check_resources(spec, ts, queries=queries, chunk=chunk, input=input,
                       n_scalings=len(lc.scaling_kinds(spec, compare)))
    with progress(fmt, "streaming keys", sum(ts)) as tick:
        run = lc.stream_lengths(spec, ts, queries=queries, input=input, compare=compare,
                                chunk=chunk, seed=seed, on_progress=tick)
    if plot:
        from ..plotting.longctx import plot_longctx

        write_figure("--plot", plot, plot_longctx, run.trajectory, spec=spec)
    traj = run.trajectory
    if fmt == Fmt.json:
        from ..measurement.longctx import trends

        emit_json({"spec": spec.to_dict(), "derived": spec.derived(),
                    "rows": trajectory.to_rows(traj), "trends": trends(traj),
                    **timing_fields(run.seconds, no_timing), "plot": plot, **run.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report.longctx import print_longctx

        print_longctx(run, spec, wide=wide)


def _int_list(option: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        fail(f"{option}: must be comma-separated integers, e.g. 0,5,15 (got {text!r})")
    if not out:
        fail(f"{option}: must be comma-separated integers, e.g. 0,5,15 (got {text!r})")
    return out


def _longctx_model(model, spec, ts, queries, chunk, compare, scalings, train_len, band,
                   layers, out_queries, sequences, report, plot, fmt, seed, no_timing, wide,
                   device, band_from=None, real=None):
    """``sigprop longctx MODEL``: :func:`sigprop.analysis.longctx.longctx_model`."""
    from ..analysis.longctx import longctx_model
    from .common import check_output_file, command_line

    base = ArchSpec()
    changed = [k for k, v in spec.to_dict().items()
               if k != "seq_len" and v != base.to_dict().get(k)]
    if changed:
        fail(f"--{changed[0].replace('_', '-')}: spec options describe a spec; with MODEL the "
             "architecture comes from the model")
    check_output_file("--report", report, ("html", "htm"))
    kw = dict(queries=128 if queries is None else queries, out_queries=out_queries,
              train_len=train_len, seq_len=spec.seq_len if spec.seq_len != base.seq_len
              else None, sequences=sequences, compare=compare, band=band,
              scalings=None if scalings is None else [x for x in scalings.split(",")
                                                      if x.strip()],
              layers=_int_list("--layers", layers), chunk=chunk, seed=seed, device=device,
              bands=_bands_from(band_from))
    real = {k: v for k, v in (real or {}).items() if v is not None}
    if "real_max" in real and not 0 <= real["real_max"] <= 2**20:
        fail(f"--real-max: must be an integer in [0, 2^20] (got {real['real_max']})")
    kw.update(real)
    if kw["train_len"] is not None and not 2 <= kw["train_len"] <= 2**30:
        fail(f"--train-len: must be an integer in [2, 2^30] (got {train_len})")
    if not 1 <= sequences <= 64:
        fail(f"--sequences: must be an integer in [1, 64] (got {sequences})")
    with progress(fmt, f"streaming {model}") as tick:
        r = longctx_model(model, ts, on_progress=tick, **kw)
    if plot:
        write_figure("--plot", plot, lambda traj, path, **_: r.plot(path), r.trajectory)
    if report is not None:
        from ..report.longctx_html import write_longctx_report

        try:
            write_longctx_report(report, r, command=command_line())
        except OSError as err:
            fail(f"--report: cannot write {report!r} ({err.strerror or err})")
    if fmt == Fmt.json:
        out = r.to_json(timing=not no_timing)
        out["plot"], out["report"] = plot, report
        emit_json(out)
    elif fmt == Fmt.csv:
        r.trajectory.to_csv(sys.stdout, index=False)
    else:
        from ..report.longctx import print_model_longctx

        print_model_longctx(r, wide=wide)


def _bands_from(path: str | None) -> dict | None:
    """``--band-from``: the ``band`` object of an earlier ``longctx MODEL`` JSON."""
    if path is None:
        return None
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            bands = json.load(fh)["band"]
    except OSError as err:
        fail(f"--band-from: cannot read {path!r} ({err.strerror or err})")
    except (ValueError, KeyError, TypeError):
        fail(f"--band-from: {path!r} is not the JSON of `sigprop longctx MODEL --format json`")
    if not isinstance(bands, dict) or not bands:
        fail(f"--band-from: {path!r} has no per-layer bands")
    return bands
