"""``sigprop instability``: a provoked training instability, the attention health check's early
warning against the loss spike, and the fixes (QK-Clip, QK-norm, sigma-reparam) against it
(:mod:`sigprop.training.instability`, docs/instability.md)."""

from __future__ import annotations

import math

import typer

from .common import (
    Fmt,
    FormatOpt,
    SeedOpt,
    check_figure_path,
    emit_json,
    fail,
    progress,
    write_figure,
)


def parse_fixes(text: str) -> tuple[str, ...]:
    """``--fixes``: comma-separated names among the experiment's fixes, each once."""
    from ..training.instability import FIXES

    items = [v.strip() for v in text.split(",")]
    if not all(items):
        fail(f"--fixes: must be comma-separated names among {','.join(FIXES)} (got {text!r})")
    for v in items:
        if v not in FIXES:
            fail(f"--fixes: unknown fix {v!r} (known: {', '.join(FIXES)})")
    if len(set(items)) != len(items):
        fail(f"--fixes: a fix is named twice (got {text!r})")
    return tuple(items)


def _fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.{digits}g}"


def print_instability(res, wide: bool = False) -> None:
    """The per-fix table (spikes / seeds, warnings, median lead time, max logit, loss)."""
    from ..report import tables

    console = tables.console(wide)
    c = res.config
    hold = "" if c.ramp >= c.steps else ", then constant"
    opt = "Muon (AdamW on embeddings, norms, biases)" if c.optimizer == "muon" else "AdamW"
    console.print(f"[bold]sigprop instability[/] {c.arch} LM d={c.d_model}, "
                  f"{c.layers} layers, {c.heads} heads, T={c.seq_len}, batch {c.batch}; {opt} "
                  f"lr 0 -> {c.lr:g} over {c.ramp} steps{hold}, {c.steps} steps; seeds "
                  f"{','.join(str(s) for s in res.seeds)}; QK-Clip tau {c.tau:g}")
    names = ("fix", "spikes", "warned", "lead", "lead range", "spike", "max logit",
             "min loss", "final loss")
    t = tables.table(*names, right=names[1:])
    for r in res.summary.to_dict(orient="records"):
        none = r["min_lead"] is None or (isinstance(r["min_lead"], float)
                                         and not math.isfinite(r["min_lead"]))
        rng = "–" if none else f"{int(r['min_lead'])}..{int(r['max_lead'])}"
        t.add_row(r["fix"], f"{r['spikes']}/{r['seeds']}", f"{r['warned']}/{r['seeds']}",
                  _fmt(r["median_lead"]), rng, _fmt(r["median_spike_step"]),
                  _fmt(r["max_logit"], 3), _fmt(r["median_min_loss"], 3),
                  _fmt(r["median_final_loss"], 3))
    console.print(t)
    console.print("lead, spike (its step), min loss: medians over the seeds; max logit: the "
                  "largest of every step and seed")
    clip = res.summary[res.summary["fix"] == "qk-clip"]
    if len(clip):
        r = clip.iloc[0]
        on = {"updated": "the updated weights' maxima", "step": "the step's maxima",
              "bound": "a bound over every input, read from the updated weights"}[c.clip_on]
        within = None if r["clip_within"] is None else 100 * r["clip_within"]
        console.print(f"QK-Clip bound {'held' if r['clip_held'] else 'NOT held'} (on {on}"
                      f"): largest logit {r['clip_ratio']:.3g} x tau (bound "
                      f"{1 + c.clip_slack:g} x tau); once active, median "
                      f"{_fmt(r['clip_median_ratio'], 3)} x tau, {_fmt(within, 3)}% of steps "
                      f"within the bound (medians over the seeds)")
        top = r.get("max_logit_bound")
        if c.clip_on == "bound" and top is not None and math.isfinite(top):
            console.print(f"the logit bound over every input reached {top / c.tau:.3g} x tau "
                          "after an update, before its clip (the largest of every step and "
                          "seed)")
    console.print(res.rule)
    for n in res.notes:
        console.print(n)
    console.print(f"{res.seconds:.0f} s")


def instability(seeds: int = typer.Option(5, "--seeds", help="seeds per fix"),
                steps: int | None = typer.Option(None, "--steps",
                                                 help="optimizer steps per run (default 300)"),
                lr: float | None = typer.Option(None, "--lr", help="peak learning rate "
                                                "(the optimizer's), reached linearly over --warmup "
                                                "steps (default 0.2)"),
                warmup: int | None = typer.Option(
                    None, "--warmup", help="steps of the linear ramp to the peak "
                    "learning rate, then constant (default: the whole run; 0: no ramp)"),
                fixes: str = typer.Option("none,qk-clip,qk-norm,sigma-reparam", "--fixes",
                                          help="comma-separated arms"),
                qk_clip: float | None = typer.Option(None, "--qk-clip",
                                                     help="QK-Clip threshold tau (default 30)"),
                clip_on: str = typer.Option(
                    "updated", "--clip-on", help="what QK-Clip acts on: updated (the "
                    "step's inputs through the updated weights), step (Kimi's: the step's "
                    "forward pass) or bound (a bound over every input, from the weights)"),
                logit_limit: float | None = typer.Option(
                    None, "--logit-limit", help="the early warning's limit on a head's "
                    "largest logit (default 100)"),
                optimizer: str = typer.Option(
                    "adamw", "--optimizer", help="adamw, or muon (Muon on the hidden "
                    "matrices, AdamW on the rest: the optimizer QK-Clip was made for)"),
                workers: int | None = typer.Option(
                    None, "--workers", help="runs trained at once, one CPU thread each "
                    "(default: 2, or 1 on a one-core machine)"),
                plot: str | None = typer.Option(None, "--plot",
                                                help="write the figure (PNG, PDF, SVG)"),
                fmt: Fmt = FormatOpt, seed: int = SeedOpt) -> None:
    """Provoke an attention-logit-growth instability in a small causal LM (AdamW, or Muon
    with --optimizer muon, ramped to a very high learning rate), watch it with the attention
    health check and compare its early warning with the loss spike, per fix and seed
    (docs/instability.md; the default: 20 runs of ~45 s on one CPU thread each, two at a
    time)."""
    import os
    from dataclasses import replace

    from ..spec import SpecError
    from ..training.instability import DEFAULTS, run_instability

    if not 1 <= seeds <= 100:
        fail(f"--seeds: must be an integer in [1, 100] (got {seeds})")
    if steps is not None and not 1 <= steps <= 100_000:
        fail(f"--steps: must be an integer in [1, 100000] (got {steps})")
    if lr is not None and not (math.isfinite(lr) and 0 < lr <= 100):
        fail(f"--lr: must be a number in (0, 100] (got {lr})")
    if warmup is not None and not 0 <= warmup <= 100_000:
        fail(f"--warmup: must be an integer in [0, 100000] (got {warmup})")
    for opt, v in (("--qk-clip", qk_clip), ("--logit-limit", logit_limit)):
        if v is not None and not (math.isfinite(v) and 0 < v <= 1e6):
            fail(f"{opt}: must be a number in (0, 1000000] (got {v})")
    if workers is None:
        workers = 2 if (os.cpu_count() or 1) > 1 else 1
    if not 1 <= workers <= 256:
        fail(f"--workers: must be an integer in [1, 256] (got {workers})")
    from ..training.health import CLIP_ON
    from ..training.instability import OPTIMIZERS

    if optimizer not in OPTIMIZERS:
        fail(f"--optimizer: must be one of {', '.join(OPTIMIZERS)} (got {optimizer!r})")
    if clip_on not in CLIP_ON:
        fail(f"--clip-on: must be one of {', '.join(CLIP_ON)} (got {clip_on!r})")
    if fmt == Fmt.csv:
        fail("--format: must be table or json (got csv)")
    arms = parse_fixes(fixes)
    check_figure_path("--plot", plot)
    cfg = DEFAULTS if logit_limit is None else replace(DEFAULTS, logit_limit=logit_limit)
    try:
        cfg = replace(cfg, clip_on=clip_on, optimizer=optimizer, **{k: v for k, v in (
            ("steps", steps), ("lr", lr), ("tau", qk_clip), ("warmup", warmup))
            if v is not None}).check()
    except SpecError as err:
        fail(str(err))
    with progress(fmt, "instability", seeds * len(arms) * cfg.steps) as tick:
        res = run_instability(seeds=seeds, fixes=arms, seed=seed, config=cfg, progress=tick,
                              workers=workers)
    if plot:
        from ..plotting.instability import plot_instability

        write_figure("--plot", plot, plot_instability, res)
    if fmt == Fmt.json:
        emit_json(res.to_dict())
    else:
        print_instability(res)
