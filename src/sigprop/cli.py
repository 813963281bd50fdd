"""The ``sigprop`` command line (CLI.md is the contract: option names and JSON shape).

Thin by design: parse, validate (``SpecError`` -> one line on stderr, exit code 2), call the
library, print. Heavy imports happen inside the commands so start-up stays fast.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from enum import StrEnum
from typing import Any

import typer

from .spec import ArchSpec, SpecError

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
    from .jsonutil import clean_json

    sys.stdout.write(json.dumps(clean_json(obj), indent=1) + "\n")


@app.command()
@spec_command
def predict(spec: ArchSpec, asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
            seed: int = SeedOpt) -> None:
    """Theory trajectory (cos, q, ipr, entropy, wmax per layer), verdict and alpha_crit."""
    from . import trajectory
    from .theory import blocks, diagram

    traj = blocks.propagate(spec, asymptotic=asymptotic)
    verdict = blocks.verdict(spec, traj, asymptotic=asymptotic)
    a_crit = float(diagram.alpha_crit(spec, asymptotic=asymptotic)[0])
    derived = spec.derived()
    if fmt == Fmt.json:
        _emit_json({"spec": spec.to_dict(), "derived": derived, "rows": trajectory.to_rows(traj),
                    "verdict": verdict, "alpha_crit": a_crit})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from .report import console

        console.print_prediction(spec, traj, derived, verdict, a_crit)


@app.command("diagram")
@spec_command
def diagram_cmd(spec: ArchSpec,
                out: str | None = typer.Option(None, "--out", help="write the diagram PNG"),
                grid: int = typer.Option(256, "--grid", help="grid points per axis"),
                beta_max: float | None = typer.Option(None, "--beta-max", help="beta axis end"),
                alpha_max: float | None = typer.Option(None, "--alpha-max",
                                                       help="alpha_attn axis end"),
                asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
                seed: int = SeedOpt) -> None:
    """(beta, alpha_attn) trainability diagram for the spec's depth (THEORY §2.7)."""
    from .theory import diagram

    if not 2 <= grid <= 4096:
        fail(f"--grid: must be an integer in [2, 4096] (got {grid})")
    for name, val in (("--beta-max", beta_max), ("--alpha-max", alpha_max)):
        if val is not None and not 0 < val <= 1e3:
            fail(f"{name}: must be a number in (0, 1000] (got {val})")
    d = diagram.compute(spec, n_beta=grid, n_alpha=grid, beta_max=beta_max,
                        alpha_max=alpha_max, asymptotic=asymptotic)
    if out:
        from .report.figures import plot_diagram

        write_figure("--out", out, plot_diagram, d, spec=spec)
    if fmt == Fmt.json:
        _emit_json({"spec": spec.to_dict(), "derived": spec.derived(), **d.to_json(),
                    "out": out})
    elif fmt == Fmt.csv:
        import pandas as pd

        pd.DataFrame({"beta": d.betas, "alpha_crit": d.alpha_crit}).to_csv(sys.stdout,
                                                                           index=False)
    else:
        from .report import console

        console.print_diagram(spec, d, out)


@app.command()
@spec_command
def measure(spec: ArchSpec,
            seeds: int = typer.Option(4, "--seeds", help="independent initialisations S"),
            sequences: int = typer.Option(2, "--sequences", help="sequences per seed B"),
            input: str = typer.Option("rho", "--input", help="inputs: rho|isometric|text"),
            plot: str | None = typer.Option(None, "--plot", help="write depth curves PNG"),
            grads: bool = typer.Option(False, "--grads", help="also Q/V gradient norms"),
            float64: bool = typer.Option(False, "--float64", help="simulate in float64"),
            asymptotic: bool = AsymptoticOpt, fmt: Fmt = FormatOpt,
            seed: int = SeedOpt) -> None:
    """Theory and simulation side by side: S seeds x B sequences through the torch model."""
    import pandas as pd
    import torch

    from . import trajectory
    from .measure.engine import compare
    from .measure.engine import measure as run_measure
    from .theory import blocks, diagram

    if seed < 0:
        fail(f"--seed: must be a non-negative integer (got {seed})")
    try:
        m = run_measure(spec, seeds=seeds, sequences=sequences, input=input, rho0=spec.rho0,
                        seed=seed, dtype=torch.float64 if float64 else torch.float32,
                        grads=grads)
    except SpecError as err:
        fail_spec(err)
    # theory from the spec's rho0, else from the measured input cosine (CLI.md --rho0)
    rho0 = spec.rho0 if spec.rho0 is not None else min(max(m.rho0, 0.0), 1.0)
    theory = blocks.propagate(spec, rho0=rho0, asymptotic=asymptotic)
    traj = pd.concat([theory, m.trajectory], ignore_index=True)
    verdict = blocks.verdict(spec, theory, rho0=rho0, asymptotic=asymptotic)
    a_crit = float(diagram.alpha_crit(spec, rho0=rho0, asymptotic=asymptotic)[0])
    agreement = compare(theory, m.trajectory)
    if plot:
        from .report.figures import plot_depth

        write_figure("--plot", plot, plot_depth, traj, spec=spec)
    if fmt == Fmt.json:
        _emit_json({"spec": spec.to_dict(), "derived": spec.derived(rho0),
                    "rows": trajectory.to_rows(traj), "verdict": verdict, "alpha_crit": a_crit,
                    "rho0": rho0, "max_abs_error": agreement, "seconds": m.seconds, **m.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from .report import console

        console.print_measurement(spec, traj, agreement, verdict, m)


@app.command()
def diagnose(model: str = typer.Argument("bert-base-uncased",
                                         help="preset name or local path (config.json / folder)"),
             seq_len: int | None = typer.Option(None, "--seq-len", help="tokens per sequence"),
             seeds: int = typer.Option(2, "--seeds", help="independent initialisations"),
             sequences: int = typer.Option(2, "--sequences", help="sequences per seed"),
             device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
             report: str | None = typer.Option(None, "--report",
                                               help="write a self-contained HTML report"),
             fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """A real HuggingFace architecture at init: measured per layer, theory beside it, verdict
    and recommendations."""
    from . import diagnose as dg

    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    if seed < 0:
        fail(f"--seed: must be a non-negative integer (got {seed})")
    try:
        if fmt == Fmt.table:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"measuring {model}", total=seeds)
                d = dg.diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences,
                                device=device, seed=seed,
                                on_seed=lambda s: bar.advance(task))
        else:
            d = dg.diagnose(model, seq_len=seq_len, seeds=seeds, sequences=sequences,
                            device=device, seed=seed)
    except SpecError as err:
        fail_spec(err) if err.field != "model" else fail(str(err).split(": ", 1)[1])
    if report is not None:
        write_report_file(report, d)
    if fmt == Fmt.json:
        _emit_json(dg.to_json(d))
    elif fmt == Fmt.csv:
        d.trajectory.drop(columns=[c for c in d.trajectory.columns
                                   if c.startswith("spec.")]).to_csv(sys.stdout, index=False)
    else:
        from .report import console

        console.print_diagnosis(d)


def _lengths(text: str | None) -> list[int] | None:
    """``--lengths``: comma-separated integers, each also accepted as ``2^k``."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        p = part.strip()
        try:
            base, _, exp = p.partition("^")
            out.append(int(base) ** int(exp) if exp else int(p))
        except ValueError:
            fail(f"--lengths: must be comma-separated integers >= 2, e.g. 512,4096 or 2^20 "
                 f"(got {p!r})")
    return out


@app.command()
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
            fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """One attention layer's ipr, entropy, wmax and output cosine against context length,
    streamed without T x T (weights drawn once at --seq-len), finite-T theory beside them."""
    from . import longctx as lc
    from . import trajectory
    from .diagnose import available_memory

    if seed < 0:
        fail(f"--seed: must be a non-negative integer (got {seed})")
    ts = _lengths(lengths) or lc.default_lengths()
    try:
        lc._check(ts, queries, chunk, input, spec)
    except SpecError as err:
        fail_spec(err)
    import torch

    need = max(lc.estimate_memory(spec, queries=queries, chunk=chunk, T=T, rem=input == "rem",
                                  n_scalings=len(lc.scaling_kinds(spec, compare)),
                                  workers=torch.get_num_threads()) for T in ts)
    have = available_memory()
    if need > have:
        fail(f"--chunk/--queries: this run needs ~{need / 1e9:.1f} GB but "
             f"{have / 1e9:.1f} GB are available; lower --chunk or --queries")
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
        from .report.longctx import plot_sweep

        write_figure("--plot", plot, plot_sweep, sw.trajectory, spec=spec)
    traj = sw.trajectory
    if fmt == Fmt.json:
        from .report.longctx import trends

        _emit_json({"spec": spec.to_dict(), "derived": spec.derived(),
                    "rows": trajectory.to_rows(traj), "trends": trends(traj),
                    "seconds": sw.seconds, "plot": plot, **sw.info})
    elif fmt == Fmt.csv:
        traj.drop(columns=[c for c in traj.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from .report.longctx import print_sweep

        print_sweep(sw, spec)


TRANSLATE_KEYS = ("sigma_s", "beta", "beta_c", "beta_over_beta_c", "gamma", "gamma_c",
                  "deshpande_ratio", "sigma_A", "tau", "tau_star")


def translations(spec: ArchSpec) -> dict:
    """THEORY §6 for the spec's first attention layer at rho0 (default 0): the CLI.md keys,
    with noci22's equalising temperature tau* (Eq. 47) for LayerNorm-ed inputs
    (sigma_x^2 = 1), d = d_model (the ratio of the two gradients does not depend on the head
    width for weights of variance 1/d_model), n = seq_len."""
    from .theory.uniform import tau_star

    d = spec.derived()
    d["tau_star"] = float(tau_star(1.0, spec.d_model, spec.seq_len, d["rho0"]))
    return d


def write_report_file(path: str, d, **kwargs) -> None:
    """The HTML report of diagnosis ``d``; an unwritable path is a bad ``--report`` (exit 2)."""
    from .report.html import write_report

    try:
        write_report(d, path, **kwargs)
    except OSError as err:
        fail(f"--report: cannot write {path!r} ({err.strerror or err})")


def _alpha_value(text: str | None) -> float | str | None:
    if text is None or text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        fail(f"--alpha-attn: must be a number in (0, 10000] or auto (got {text!r})")


@app.command("fix")
def fix_cmd(model: str = typer.Argument(..., help="preset name or local path"),
            out: str = typer.Option(..., "--out", help="folder for config.json + safetensors"),
            beta: float | None = typer.Option(None, "--beta",
                                              help="re-scale Q/K to this gg25 beta"),
            alpha_attn: str | None = typer.Option(None, "--alpha-attn",
                                                  help="attention skip strength, or auto"),
            centred: bool = typer.Option(False, "--centred", help="centred attention A - 11^T/n"),
            scaling: str | None = typer.Option(None, "--scaling",
                                               help="length scaling: log-n|qwen|ssmax|yarn|tau"),
            scaling_param: float | None = typer.Option(None, "--scaling-param",
                                                       help="parameter of the scaling"),
            seq_len: int | None = typer.Option(None, "--seq-len", help="tokens per sequence"),
            seeds: int = typer.Option(2, "--seeds", help="initialisations for the diagnosis"),
            sequences: int = typer.Option(2, "--sequences", help="sequences per seed"),
            device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
            report: str | None = typer.Option(None, "--report",
                                              help="HTML report of the fixed model"),
            fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """Patch a model against rank / entropy collapse, write it to --out (config.json +
    safetensors, reloadable without remote code) and show the diagnosis before and after."""
    from . import diagnose as dg
    from .spec import SCALINGS

    a = _alpha_value(alpha_attn)
    if beta is None and a is None and not centred and scaling is None:
        fail("fix: give at least one of --beta, --alpha-attn, --centred, --scaling")
    if scaling is not None and scaling not in SCALINGS:
        fail(f"--scaling: must be one of {', '.join(SCALINGS)} (got {scaling!r})")
    if seq_len is not None and not 2 <= seq_len <= 2**20:
        fail(f"--seq-len: must be an integer in [2, 1048576] (got {seq_len})")
    if seed < 0:
        fail(f"--seed: must be a non-negative integer (got {seed})")
    kw = dict(beta=beta, alpha_attn=a, centred=centred, scaling=scaling,
              scaling_param=scaling_param, seq_len=seq_len, seeds=seeds, sequences=sequences,
              device=device, seed=seed)
    try:
        if fmt == Fmt.table:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("fix", total=4)
                before, rep, after = dg.fix(model, out, on_stage=lambda s: (
                    bar.update(task, description=s), bar.advance(task)), **kw)
        else:
            before, rep, after = dg.fix(model, out, **kw)
    except SpecError as err:
        fail_spec(err) if err.field != "model" else fail(str(err).split(": ", 1)[1])
    if report is not None:
        write_report_file(report, after, fix=(before, rep))
    if fmt == Fmt.json:
        _emit_json({"model": model, "out": out, "fix": rep.to_dict(),
                    "before": dg.to_json(before), "after": dg.to_json(after),
                    "verdict_before": before.verdict, "verdict": after.verdict})
    elif fmt == Fmt.csv:
        import pandas as pd

        t = pd.concat([before.trajectory.assign(model="before"),
                       after.trajectory.assign(model="after")], ignore_index=True)
        t.drop(columns=[c for c in t.columns if c.startswith("spec.")]).to_csv(
            sys.stdout, index=False)
    else:
        from .report import console

        console.print_fix(before, rep, after, out)


@app.command()
@spec_command
def translate(spec: ArchSpec, fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """The score scale in all five papers' terms (THEORY §6)."""
    d = translations(spec)
    if fmt == Fmt.json:
        _emit_json({k: d[k] for k in TRANSLATE_KEYS} | {"spec": spec.to_dict(),
                                                         "extra": {k: v for k, v in d.items()
                                                                   if k not in TRANSLATE_KEYS}})
    elif fmt == Fmt.csv:
        sys.stdout.write("name,value\n" + "".join(f"{k},{v}\n" for k, v in d.items()))
    else:
        from .report import console

        console.print_translation(spec, d)


# ---- training checks (issue 7): sigprop train / sigprop trainability --------------------
TaskOpt = typer.Option("mlm", "--task", help="mlm|clm|reverse|heaviside")
DataOpt = typer.Option("builtin", "--data", help="builtin|tinystories|PATH (text file/folder)")
DeviceOpt = typer.Option("cpu", "--device", help="cpu or cuda")
ThreadsOpt = typer.Option(1, "--threads", help="CPU threads while training (0 = torch's)")


def _bias_init_opt(default: str):
    return typer.Option(default, "--bias-init",
                        help="readout bias at init: unigram (log token frequencies) | zero")


def _train_config(**kw):
    """A TrainConfig from CLI values; bad values exit 2 naming the option."""
    import torch

    from .train import TrainConfig

    dev = kw.get("device", "cpu")
    if dev != "cpu" and not (dev == "cuda" or dev.startswith("cuda:")):
        fail(f"--device: must be cpu, cuda or cuda:N (got {dev!r})")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        fail("--device: cuda is not available on this machine (use --device cpu)")
    try:
        return TrainConfig(**kw)
    except SpecError as err:
        fail_spec(err)


def _corpus_or_fail(task: str, data: str, documents: int | None, vocab_size: int):
    if task not in ("mlm", "clm"):
        return None
    from .data.corpus import load_corpus
    from .data.text import CorpusError

    if not 16 <= vocab_size <= 1_000_000:
        fail(f"--vocab-size: must be an integer in [16, 1000000] (got {vocab_size})")
    try:
        return load_corpus(data, n_documents=documents, vocab_size=vocab_size)
    except CorpusError as err:
        fail(f"--data: {err}")


def _progress(fmt: Fmt, label: str, total: int, run):
    """Run ``run(on_step)`` under a rich progress bar in table mode."""
    if fmt != Fmt.table:
        return run(None)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=total)
        return run(lambda s, _t: bar.update(task, completed=s))


@app.command("train")
@spec_command
def train_cmd(spec: ArchSpec,
              steps: int = typer.Option(1000, "--steps", help="optimizer steps"),
              task: str = TaskOpt, data: str = DataOpt,
              documents: int | None = typer.Option(None, "--documents",
                                                   help="corpus documents (default 10000)"),
              vocab_size: int = typer.Option(2000, "--vocab-size", help="WordPiece vocabulary"),
              batch_size: int = typer.Option(64, "--batch-size", help="sequences per step"),
              lr: float = typer.Option(2e-3, "--lr", help="peak learning rate (AdamW)"),
              warmup_ratio: float = typer.Option(0.05, "--warmup-ratio", help="warmup fraction"),
              weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW decay"),
              max_grad_norm: float = typer.Option(1.0, "--max-grad-norm",
                                                  help="per-seed clipping (0 = off)"),
              eval_every: int | None = typer.Option(None, "--eval-every",
                                                    help="eval loss every K steps"),
              measure_every: int | None = typer.Option(None, "--measure-every",
                                                       help="cos/entropy every K steps (0=off)"),
              seeds: int = typer.Option(1, "--seeds", help="independent runs trained at once"),
              attention_only: bool = typer.Option(False, "--attention-only",
                                                  help="freeze the MLPs at zero"),
              tie: bool = typer.Option(False, "--tie", help="tie the LM head to embeddings"),
              bias_init: str = _bias_init_opt("unigram"),
              device: str = DeviceOpt, threads: int = ThreadsOpt,
              plot: str | None = typer.Option(None, "--plot", help="write loss curves PNG"),
              checkpoint: str | None = typer.Option(None, "--checkpoint",
                                                    help="write safetensors + spec.json here"),
              fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """Train the spec's model (MLM by default on the built-in stories) and record the loss
    and the signal-propagation observables during training."""
    from . import trajectory
    from .train import save_checkpoint, train

    cfg = _train_config(task=task, steps=steps, batch_size=batch_size, lr=lr,
                        warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, eval_every=eval_every,
                        measure_every=measure_every, seeds=seeds, seed=seed, device=device,
                        attention_only=attention_only, tie=tie, threads=threads,
                        bias_init=bias_init)
    corpus = _corpus_or_fail(task, data, documents, vocab_size)
    try:
        res = _progress(fmt, f"training ({task})", steps,
                        lambda cb: train(spec, cfg, corpus=corpus, on_step=cb,
                                         keep_model=checkpoint is not None))
        written = save_checkpoint(res, checkpoint) if checkpoint else []
    except SpecError as err:
        fail_spec(err)
    except ValueError as err:
        fail(str(err))
    except OSError as err:
        fail(f"--checkpoint: cannot write {checkpoint!r} ({err.strerror or err})")
    if plot:
        from .report.training import plot_training

        write_figure("--plot", plot, plot_training, res.trajectory,
                     title=f"{task}, L={spec.depth}, beta_eff={spec.beta_eff:.3g}")
    if fmt == Fmt.json:
        from dataclasses import asdict

        _emit_json({"spec": spec.to_dict(), "config": asdict(cfg),
                    "rows": trajectory.to_rows(res.trajectory),
                    "final_loss": float(res.final_train.mean()),
                    "eval_loss": float(res.final_eval.mean()), "baseline": res.baseline,
                    "seconds": res.seconds, "checkpoint": written, **res.info})
    elif fmt == Fmt.csv:
        res.trajectory.drop(columns=[c for c in res.trajectory.columns
                                     if c.startswith("spec.")]).to_csv(sys.stdout, index=False)
    else:
        from .report.training import print_training

        print_training(res)


def _floats(option: str, text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        fail(f"{option}: must be comma-separated numbers (got {text!r})")
    if not vals:
        fail(f"{option}: give at least one number")
    return vals


@app.command()
@spec_command
def trainability(spec: ArchSpec,
                 betas: str = typer.Option("0.3,1,8", "--betas", help="comma-separated betas"),
                 alphas: str = typer.Option("0.2,0.5,2", "--alphas",
                                            help="comma-separated alpha_attn values"),
                 steps: int = typer.Option(500, "--steps", help="steps per grid point"),
                 seeds: int = typer.Option(1, "--seeds", help="seeds per grid point"),
                 batch_size: int = typer.Option(64, "--batch-size", help="sequences per step"),
                 lr: float = typer.Option(2e-3, "--lr", help="peak learning rate"),
                 margin: float = typer.Option(0.5, "--margin",
                                              help="nats below the baseline that count as learned"),
                 bias_init: str = _bias_init_opt("unigram"),
                 data: str = DataOpt, device: str = DeviceOpt, threads: int = ThreadsOpt,
                 plot: str | None = typer.Option(None, "--plot", help="write loss curves PNG"),
                 fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """Train every (beta, alpha_attn) grid point briefly, classify it learned / stuck and
    show it beside the theory's regime. Without architecture options: a 24-layer post-LN
    model, d=32, 2 heads, T=32, gg25 variances; training defaults are
    sigprop.trainability.TRAINABILITY_CONFIG (500 steps, batch 64, lr 2e-3, unigram readout bias;
    13-14 min on one CPU thread)."""
    from dataclasses import asdict, replace

    from . import trajectory
    from .trainability import DEEP_SMALL, criterion_text
    from .trainability import trainability as run_grid

    if spec == ArchSpec():
        spec = replace(spec, **DEEP_SMALL)
    if not 0 < margin <= 100:
        fail(f"--margin: must be a number in (0, 100] (got {margin})")
    b, a = _floats("--betas", betas), _floats("--alphas", alphas)
    cfg = _train_config(steps=steps, batch_size=batch_size, lr=lr, seeds=seeds, seed=seed,
                        device=device, measure_every=0, threads=threads, bias_init=bias_init)
    corpus = _corpus_or_fail("mlm", data, None, 2000)
    try:
        table, traj = _progress(fmt, f"trainability ({len(b)}x{len(a)} points)", steps * len(a),
                                lambda cb: run_grid(spec, b, a, cfg, corpus=corpus,
                                                    margin=margin, on_step=cb))
    except SpecError as err:
        fail_spec(err)
    if plot:
        from .report.training import plot_trainability

        write_figure("--plot", plot, plot_trainability, traj, table)
    crit = criterion_text(margin)
    if fmt == Fmt.json:
        _emit_json({"spec": spec.to_dict(), "config": asdict(cfg), "criterion": crit,
                    "points": table.to_dict(orient="records"),
                    "disagreements": int((~table["agree"]).sum()),
                    "rows": trajectory.to_rows(traj)})
    elif fmt == Fmt.csv:
        table.to_csv(sys.stdout, index=False)
    else:
        from .report.training import print_trainability

        print_trainability(table, crit)


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


def main() -> None:
    """Entry point: usage errors become one line on stderr and exit code 2 (no tracebacks)."""
    usage, exits = _click_errors()
    try:
        rv = app(standalone_mode=False)
    except usage as err:
        typer.echo(f"sigprop: error: {err.format_message()}", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("sigprop: aborted", err=True)
        sys.exit(130)
    except exits as err:
        sys.exit(getattr(err, "exit_code", 1))
    except SpecError as err:
        typer.echo(f"sigprop: error: {err}", err=True)
        sys.exit(2)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
