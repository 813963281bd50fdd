"""Training checks (issue 7): ``train`` and ``trainability``."""

from __future__ import annotations

import os
import sys

import typer

from ..spec import ArchSpec, SpecError
from .common import (
    Fmt,
    FormatOpt,
    NoTimingOpt,
    SeedOpt,
    WideOpt,
    check_figure_path,
    check_output_dir,
    emit_json,
    fail,
    progress,
    spec_command,
    timing_fields,
    write_figure,
)

# ---- training checks (issue 7): sigprop train / sigprop trainability --------------------
TaskOpt = typer.Option("mlm", "--task", help="mlm|clm|reverse|heaviside")
DataOpt = typer.Option("builtin", "--data", help="builtin|tinystories|PATH (text file/folder)")
DeviceOpt = typer.Option("cpu", "--device", help="cpu or cuda")
ThreadsOpt = typer.Option(1, "--threads", help="CPU threads while training (0 = torch's)")
#: the trainability grid trains as shards side by side, one thread each: bit-equal results,
#: and on the earlier 2-core Intel machine 0.44 s a grid step with 2 shards against 1.03 s
#: with one (`sigprop bench training`, idle machine; on the 2-core AMD EPYC VM ~0.85 and ~1.3 s)
GridThreadsOpt = typer.Option(min(2, os.cpu_count() or 1), "--threads",
                              help="shards of the grid trained side by side, one CPU thread "
                                   "each (default: 2, or 1 on a 1-core machine)")


def _bias_init_opt(default: str):
    return typer.Option(default, "--bias-init",
                        help="readout bias at init: unigram (log token frequencies) | zero")


def _train_config(**kw):
    """A TrainConfig from CLI values; bad values exit 2 naming the option."""
    import torch

    from ..training.config import TrainConfig

    dev = kw.get("device", "cpu")
    if dev != "cpu" and not (dev == "cuda" or dev.startswith("cuda:")):
        fail(f"--device: must be cpu, cuda or cuda:N (got {dev!r})")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        fail("--device: cuda is not available on this machine (use --device cpu)")
    return TrainConfig(**kw)


def _explicit(name: str) -> bool:
    """Whether option ``name`` (``--batch-size``) was given on the command line rather than
    left at its default: click's parameter source, else the arguments (``common.ARGV``)."""
    from . import common

    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    ctx = get_current_context(silent=True)
    param = name.lstrip("-").replace("-", "_")
    source = ctx.get_parameter_source(param) if ctx is not None else None
    if source is not None:
        return source.name not in ("DEFAULT", "DEFAULT_MAP")
    return any(a == name or a.startswith(name + "=") for a in common.ARGV)


def _fit_default_batch(spec, cfg, **kw):
    """``cfg`` with the default ``--batch-size`` halved until the run fits the memory
    available (the largest power-of-two fraction that passes the check), with one note on
    stderr; unchanged when the user set ``--batch-size``, when the default fits, or when not
    even a batch of one does (the check then refuses, naming what to shrink)."""
    from dataclasses import replace

    from ..measurement import memory
    from ..training.loop import check_memory

    if _explicit("--batch-size"):
        return cfg
    try:
        check_memory(spec, cfg, **kw)
        return cfg
    except SpecError:
        pass
    b = cfg.batch_size // 2
    while b >= 1:
        trial = replace(cfg, batch_size=b)
        try:
            need = check_memory(spec, trial, **kw)
        except SpecError:
            b //= 2
            continue
        have = memory.available()
        typer.echo(f"sigprop: note: --batch-size {b} (estimated peak ~{memory.gb(need)}) "
                   f"instead of the default {cfg.batch_size}, which does not fit the "
                   f"{memory.gb(have)} available ({memory.bound_text(have)}"
                   f"{memory.SAFETY:.0%} may be used); set --batch-size to choose", err=True)
        return trial
    return cfg


def _corpus_or_fail(task: str, data: str, documents: int | None, vocab_size: int):
    if task not in ("mlm", "clm"):
        return None
    from ..data.corpus import load_corpus
    from ..data.text import CorpusError

    if not 16 <= vocab_size <= 1_000_000:
        fail(f"--vocab-size: must be an integer in [16, 1000000] (got {vocab_size})")
    try:
        return load_corpus(data, n_documents=documents, vocab_size=vocab_size)
    except CorpusError as err:
        fail(f"--data: {err}")


def _progress(fmt: Fmt, label: str, total: int, run):
    """Run ``run(on_step)`` under a rich progress bar in table mode."""
    with progress(fmt, label, total) as tick:
        return run(tick and (lambda s, _t: tick(completed=s)))


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
              store: str | None = typer.Option(None, "--store",
                                               help="log every measurement to this results "
                                                    "store (command monitor)"),
              telemetry_every: int = typer.Option(
                  0, "--telemetry-every", help="read each slice's per-head largest logit "
                  "and entropy on the training batch every K steps (0 = off)"),
              qk_clip: float | None = typer.Option(
                  None, "--qk-clip", help="QK-Clip threshold tau: after every optimizer "
                  "step, heads whose largest logit passed tau are rescaled (Kimi K2)"),
              qk_clip_alpha: float = typer.Option(
                  0.5, "--qk-clip-alpha", help="QK-Clip's share on W_Q (gamma^alpha)"),
              fmt: Fmt = FormatOpt, seed: int = SeedOpt, no_timing: bool = NoTimingOpt,
              wide: bool = WideOpt) -> None:
    """Train the spec's model (MLM by default on the built-in stories) and record the loss
    and the signal-propagation observables during training. The first rank collapse and the
    first entropy collapse the monitor sees are reported once on stderr (docs/monitor.md).
    ``--telemetry-every`` / ``--qk-clip``: the attention health of the training batch
    (largest logit and entropy per layer, early warnings, QK-Clip; docs/monitor.md)."""
    from dataclasses import asdict

    from .. import trajectory
    from ..training.loop import save_checkpoint, train

    cfg = _train_config(task=task, steps=steps, batch_size=batch_size, lr=lr,
                        warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, eval_every=eval_every,
                        measure_every=measure_every, seeds=seeds, seed=seed, device=device,
                        attention_only=attention_only, tie=tie, threads=threads,
                        bias_init=bias_init, telemetry_every=telemetry_every, qk_clip=qk_clip,
                        qk_clip_alpha=qk_clip_alpha)
    check_figure_path("--plot", plot)
    check_output_dir("--checkpoint", checkpoint)
    cfg = _fit_default_batch(spec, cfg, data=data)
    from ..training.loop import check_memory

    check_memory(spec, cfg, data=data)  # before the corpus is built (seconds)
    sinks = _store_sinks(store, spec, cfg)
    corpus = _corpus_or_fail(task, data, documents, vocab_size)
    try:
        res = _progress(fmt, f"training ({task})", steps,
                        lambda cb: train(spec, cfg, corpus=corpus, on_step=cb,
                                         keep_model=checkpoint is not None, sinks=sinks))
        written = save_checkpoint(res, checkpoint) if checkpoint else []
    except SpecError:
        raise  # cli.run names the option
    except ValueError as err:
        fail(str(err))
    except OSError as err:
        fail(f"--checkpoint: cannot write {checkpoint!r} ({err.strerror or err})")
    _report_collapse(res.events)
    _report_health(res.health)
    if plot:
        from ..plotting.training import plot_training
        from ..report.training import loss_unit

        write_figure("--plot", plot, plot_training, res.trajectory,
                     title=f"{task}, L={spec.depth}, beta_eff={spec.beta_eff:.3g}",
                     baseline=res.baseline, unit=loss_unit(task))
    if fmt == Fmt.json:
        emit_json({"spec": spec.to_dict(), "config": asdict(cfg),
                    "rows": trajectory.to_rows(res.trajectory),
                    "final_loss": float(res.final_train.mean()),
                    "eval_loss": float(res.final_eval.mean()), "baseline": res.baseline,
                    **timing_fields(res.seconds, no_timing), "checkpoint": written, **res.info,
                    **({"health": [asdict(e) for e in res.health]}
                       if cfg.telemetry_every or cfg.qk_clip is not None else {})})
    elif fmt == Fmt.csv:
        res.trajectory.drop(columns=[c for c in res.trajectory.columns
                                     if c.startswith("spec.")]).to_csv(sys.stdout, index=False)
    else:
        from ..report.training import print_training

        print_training(res, wide=wide)


def _store_sinks(store: str | None, spec: ArchSpec, cfg) -> list:
    """``--store``: a monitor sink writing each measurement to the results store (record
    ``run = "train"``, the step, the spec and the training config), or none."""
    if store is None:
        return []
    from dataclasses import asdict

    from ..integrations import store_sink
    from ..runs.store import StoreError

    try:
        return [store_sink(store, "train", spec=spec.to_dict(), train=asdict(cfg))]
    except StoreError as err:
        fail(f"--store: {err}")


def _report_collapse(events) -> None:
    """The monitor's first event of each kind, one line each on stderr (the library warns
    with ``CollapseWarning``; the CLI prints)."""
    from ..measurement.monitor import KINDS

    for kind in KINDS:
        ev = next((e for e in events if e.kind == kind), None)
        if ev is not None:
            typer.echo(f"sigprop: warning: {ev.message()}", err=True)


def _report_health(events) -> None:
    """The attention health's first event of each kind (non-finite logits, a forecast, a
    crossing) one line each on stderr, and how many heads QK-Clip rescaled."""
    for kind in ("non_finite", "forecast", "crossed"):
        ev = next((e for e in events if e.kind == kind), None)
        if ev is not None:
            typer.echo(f"sigprop: warning: {ev.message()}", err=True)
    clips = [e for e in events if e.kind == "qk_clip"]
    if clips:
        typer.echo(f"sigprop: QK-Clip rescaled {len(clips)} heads over "
                   f"{len({e.step for e in clips})} steps (largest logit seen "
                   f"{max(e.value for e in clips):.4g}, tau {clips[0].threshold:.4g})",
                   err=True)


def _floats(option: str, text: str, hi: float) -> list[float]:
    """A comma-separated list of finite numbers in [0, hi] (``--betas``, ``--alphas``); every
    item must parse on its own (``'1 2'`` is an error, not 12)."""
    import math

    usage = f"must be comma-separated numbers in [0, {hi:g}], e.g. 0.3,1,8"
    items = [v.strip() for v in text.split(",")]
    if not any(items) or len(items) > 64:
        fail(f"{option}: {usage}, at most 64 (got {text!r})")
    vals = []
    for v in items:
        try:
            x = float(v)
        except ValueError:
            fail(f"{option}: {usage} (got {v!r})")
        if not (math.isfinite(x) and 0 <= x <= hi):
            fail(f"{option}: {usage} (got {v!r})")
        vals.append(x)
    return vals


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
                 data: str = DataOpt, device: str = DeviceOpt,
                 threads: int = GridThreadsOpt,
                 plot: str | None = typer.Option(None, "--plot", help="write loss curves PNG"),
                 fmt: Fmt = FormatOpt, seed: int = SeedOpt, wide: bool = WideOpt) -> None:
    """Train every (beta, alpha_attn) grid point briefly, classify it learned / stuck and
    show it beside the theory's regime. Without architecture options: a 24-layer post-LN
    model, d=32, 2 heads, T=32, gg25 variances; training defaults are
    sigprop.training.trainability.TRAINABILITY_CONFIG (500 steps, batch 64, lr 2e-3, unigram
    readout bias). The 9 points train as slices of one model, split into --threads shards
    side by side (the default grid: ~7 min with 2 shards on a 2-core AMD EPYC VM, about
    twice that with one; docs/bench.md)."""
    from dataclasses import asdict, replace

    from .. import trajectory
    from ..training.trainability import DEEP_SMALL, criterion_text
    from ..training.trainability import trainability as run_grid

    if spec == ArchSpec():
        spec = replace(spec, **DEEP_SMALL)
    if not 0 < margin <= 100:
        fail(f"--margin: must be a number in (0, 100] (got {margin})")
    b, a = _floats("--betas", betas, 1e4), _floats("--alphas", alphas, 1e6)
    check_figure_path("--plot", plot)
    cfg = _train_config(steps=steps, batch_size=batch_size, lr=lr, seeds=seeds, seed=seed,
                        device=device, measure_every=0, threads=threads, bias_init=bias_init)
    from ..training.loop import check_memory

    check_memory(spec, cfg, data=data, betas=b)
    corpus = _corpus_or_fail("mlm", data, None, 2000)
    table, traj = _progress(fmt, f"trainability ({len(b)}x{len(a)} points)", steps * len(a),
                            lambda cb: run_grid(spec, b, a, cfg, corpus=corpus,
                                                margin=margin, on_step=cb))
    if plot:
        from ..plotting.training import plot_trainability

        write_figure("--plot", plot, plot_trainability, traj, table)
    crit = criterion_text(margin)
    if fmt == Fmt.json:
        emit_json({"spec": spec.to_dict(), "config": asdict(cfg), "criterion": crit,
                    "points": table.to_dict(orient="records"),
                    "disagreements": int((~table["agree"]).sum()),
                    "rows": trajectory.to_rows(traj)})
    elif fmt == Fmt.csv:
        table.to_csv(sys.stdout, index=False)
    else:
        from ..report.training import print_trainability

        print_trainability(table, crit, wide=wide)
