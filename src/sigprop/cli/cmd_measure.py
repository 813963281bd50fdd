"""Simulation commands: ``measure`` (depth) and ``longctx`` (context length)."""

from __future__ import annotations

import sys

import typer

from ..spec import ArchSpec, SpecError
from .common import (
    AsymptoticOpt,
    Fmt,
    FormatOpt,
    NoTimingOpt,
    SeedOpt,
    WideOpt,
    _emit_json,
    _timing,
    check_figure_path,
    fail,
    fail_spec,
    spec_command,
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
            seed: int = SeedOpt, no_timing: bool = NoTimingOpt, wide: bool = WideOpt) -> None:
    """Theory and simulation side by side: S seeds x B sequences through the torch model."""
    from .. import trajectory
    from ..analysis.measure import measure as run

    check_figure_path("--plot", plot)
    try:  # theory at --rho0, else at the measured input cosine
        m = run(spec, seeds=seeds, sequences=sequences, input=input, seed=seed,
                float64=float64, grads=grads, asymptotic=asymptotic)
    except SpecError as err:
        fail_spec(err)
    traj, verdict, a_crit, agreement, rho0 = (m.trajectory, m.verdict, m.alpha_crit,
                                              m.max_abs_error, m.rho0)
    if plot:
        from ..plotting.figures import plot_depth

        write_figure("--plot", plot, plot_depth, traj, spec=spec)
    if fmt == Fmt.json:
        _emit_json({"spec": spec.to_dict(), "derived": spec.derived(rho0),
                    "rows": trajectory.to_rows(traj), "verdict": verdict, "alpha_crit": a_crit,
                    "rho0": rho0, "max_abs_error": agreement, **_timing(m.seconds, no_timing),
                    **m.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report import console

        console.print_measurement(spec, traj, agreement, verdict, m, wide=wide)


def _lengths(text: str | None) -> list[int] | None:
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
            lengths: str | None = typer.Option(None, "--lengths",
                                               help="context lengths T (default 2^9..2^20)"),
            queries: int = typer.Option(256, "--queries", help="sampled query rows R "
                                        "(every row when T <= R)"),
            chunk: int = typer.Option(8192, "--chunk", help="keys per streamed chunk"),
            input: str = typer.Option("rho", "--input", help="inputs: rho|isometric|rem "
                                      "(rem: i.i.d. Gaussian scores)"),
            compare: bool = typer.Option(False, "--compare", help="none, gg25 sqrt(log T) and "
                                         "clpr25 log T scalings side by side"),
            plot: str | None = typer.Option(None, "--plot", help="write ipr/entropy/wmax vs T"),
            fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
            wide: bool = WideOpt) -> None:
    """One attention layer's ipr, entropy, wmax and output cosine against context length,
    streamed without T x T (weights drawn once at --seq-len), finite-T theory beside them."""
    from .. import trajectory
    from ..measurement import longctx as lc

    ts = _lengths(lengths) or lc.default_lengths()
    check_figure_path("--plot", plot)
    try:
        lc._check(ts, queries, chunk, input, spec)
    except SpecError as err:
        fail_spec(err)
    try:  # before any allocation: work bound and memory (also checked inside sweep)
        lc.check_resources(spec, ts, queries=queries, chunk=chunk, input=input,
                           n_scalings=len(lc.scaling_kinds(spec, compare)))
    except SpecError as err:
        fail_spec(err)
    try:
        if fmt == Fmt.table:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("streaming keys", total=sum(ts))
                sw = lc.sweep(spec, ts, queries=queries, input=input, compare=compare,
                              chunk=chunk, seed=seed, on_progress=lambda k: bar.advance(task, k))
        else:
            sw = lc.sweep(spec, ts, queries=queries, input=input, compare=compare, chunk=chunk,
                          seed=seed)
    except SpecError as err:
        fail_spec(err)
    if plot:
        from ..plotting.longctx import plot_sweep

        write_figure("--plot", plot, plot_sweep, sw.trajectory, spec=spec)
    traj = sw.trajectory
    if fmt == Fmt.json:
        from ..measurement.longctx import trends

        _emit_json({"spec": spec.to_dict(), "derived": spec.derived(),
                    "rows": trajectory.to_rows(traj), "trends": trends(traj),
                    **_timing(sw.seconds, no_timing), "plot": plot, **sw.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from ..report.longctx import print_sweep

        print_sweep(sw, spec, wide=wide)
