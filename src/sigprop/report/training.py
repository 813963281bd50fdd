"""Tables and figures for ``sigprop train`` / ``sigprop trainability`` (gg25 Fig. 1(f), Fig. 4
style loss curves). Consumes Trajectory rows and the trainability table only."""

from __future__ import annotations

import math

from rich.console import Console

from ..plotting.figures import finish, new_figure

_REGIME_STYLE = {"trainable": "green", "rank_collapse": "yellow", "entropy_collapse": "red"}
_REGIME_COLOUR = {"trainable": "#4c72b0", "rank_collapse": "#e0a100",
                  "entropy_collapse": "#d1495b"}


def _f(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}"


def _curve(traj, observable: str, split: str | None = None, layer: int | None = None):
    sub = traj[traj["observable"] == observable]
    if split is not None:
        sub = sub[sub["split"] == split]
    if layer is not None:
        sub = sub[sub["layer"] == layer]
    return sub.sort_values("step")


def loss_unit(task: str) -> str:
    """The unit of a task's loss: cross-entropy tasks in nats, the Heaviside regression as
    a mean squared error."""
    return "MSE" if task == "heaviside" else "nats"


#: regime names shortened to fit 80 columns
_SHORT = {"trainable": "trainable", "rank_collapse": "rank coll.",
          "entropy_collapse": "entropy coll."}


def print_training(result, console: Console | None = None, wide: bool = False) -> None:
    """Train and eval loss, last-layer cos and mean attention entropy at every evaluation."""
    from . import tables

    console = console or tables.console(wide)
    traj, spec = result.trajectory, result.spec
    unit = loss_unit(result.config.task)
    ev = _curve(traj, "loss", "eval")
    tr = _curve(traj, "loss", "train")
    cos = _curve(traj, "cos", layer=spec.depth).set_index("step")["value"]
    ent = _curve(traj, "entropy").groupby("step")["value"].mean()
    console.print(f"[bold]sigprop train[/] {result.config.task} on {result.info['data']}, "
                  f"L={spec.depth}, d={spec.d_model}, H={spec.heads}, T={spec.seq_len}, "
                  f"beta_eff={spec.beta_eff:.3g}, {result.config.seeds} seed(s)")
    names = ("step", f"train ({unit})", f"eval ({unit})", f"cos L{spec.depth}",
             "entropy (mean)")
    t = tables.table(*names, right=names)
    train_at = tr.set_index("step")["value"]
    steps = [int(s) for s in ev["step"]]
    cols = [tables.column([train_at.get(s) for s in steps]), tables.column(list(ev["value"])),
            tables.column([cos.get(s) for s in steps]), tables.column([ent.get(s) for s in steps])]
    for i, s in enumerate(steps):
        t.add_row(str(s), *(c[i] for c in cols))
    console.print(t)
    gap = result.baseline - float(result.final_eval.mean())
    console.print(f"final eval loss {result.final_eval.mean():.4f} {unit}; context-free "
                  f"baseline {result.baseline:.4f} (gain {gap:.3f} {unit}); "
                  f"{result.seconds:.1f} s")


def print_trainability(table, criterion: str, console: Console | None = None,
                       wide: bool = False) -> None:
    """beta x alpha table: theory regime, outcome, final loss (nats), agreement."""
    from . import tables

    console = console or tables.console(wide)
    console.print("[bold]sigprop trainability[/] theory regime vs training outcome")
    names = ("beta", "alpha", "theory", "outcome", "eval (nats)", "baseline", "gain", "agree")
    t = tables.table(*names, right=("beta", "alpha", "eval (nats)", "baseline", "gain"))
    ev = tables.column(list(table["final_eval"]), list(table["final_eval_stderr"]))
    base = tables.column(list(table["baseline"]))
    gain = tables.column(list(table["gain"]))
    for i, (_, r) in enumerate(table.iterrows()):
        st = _REGIME_STYLE[r["theory"]]
        theory = r["theory"] if wide else _SHORT.get(r["theory"], r["theory"])
        t.add_row(_f(r["beta"]), _f(r["alpha"]), f"[{st}]{theory}[/]", r["outcome"], ev[i],
                  base[i], gain[i], "yes" if r["agree"] else "[bold red]NO[/]")
    console.print(t)
    n_bad = int((~table["agree"]).sum())
    console.print(f"criterion: {criterion}")
    console.print(f"disagreements: {n_bad} of {len(table)}")


def plot_training(traj, path: str | None = None, title: str = "", labels=None,
                  baseline: float | None = None, unit: str = "nats", dpi: int = 150):
    """gg25 Fig. 4 style: train (thin) and eval (markers) loss vs step with the context-free
    baseline dotted (one colour per ``beta`` / ``alpha`` group when the rows carry those
    columns), the last layer's cos and the mean attention entropy during training beside
    them. Returns the Figure; writes it when ``path`` is given."""
    keys = [k for k in ("alpha", "beta") if k in traj.columns]
    groups = traj.groupby(keys, dropna=False) if keys else [((), traj)]
    fig = new_figure((12, 3.6))
    axes = fig.subplots(1, 3)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.16, top=0.86, wspace=0.28)
    for i, (key, sub) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v:g}" for k, v in zip(keys, key, strict=True)) or "run"
        if labels and key in labels:
            name += f" ({labels[key]})"
        colour = f"C{i % 10}"  # one colour per group, whatever the number of groups
        tr = _curve(sub, "loss", "train")
        if len(tr):
            axes[0].plot(tr["step"], tr["value"], lw=0.8, alpha=0.6, color=colour)
        ev = _curve(sub, "loss", "eval")
        axes[0].plot(ev["step"], ev["value"], marker="o", ms=3, color=colour,
                     label=f"{name} eval" + (" (thin: train)" if len(tr) else ""))
        depth = int(sub["layer"].max())
        cos = _curve(sub, "cos", layer=depth)
        axes[1].plot(cos["step"], cos["value"], marker="o", ms=3, color=colour)
        ent = _curve(sub, "entropy").groupby("step")["value"].mean()
        axes[2].plot(ent.index, ent.values, marker="o", ms=3, color=colour)
    if baseline is not None and math.isfinite(baseline):
        axes[0].axhline(baseline, color="k", ls=":", lw=1.0, label="context-free baseline")
    axes[0].set(xlabel="step", ylabel=f"loss ({unit})", title="loss")
    axes[1].set(xlabel="step", ylabel="cos", title="last-layer token cosine", ylim=(-0.05, 1.05))
    axes[2].set(xlabel="step", ylabel="entropy / log(#keys)", title="attention entropy",
                ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig, path, dpi)


def plot_trainability(traj, table, path: str | None = None, dpi: int = 150):
    """gg25 Fig. 1(c, f) style grid: the theory's regime of every (beta, alpha_attn) point as
    the cell colour, the training outcome as a marker (filled circle: learned, cross: stuck)
    with the loss gain below the baseline written in the cell; a red frame where training
    and theory disagree. Returns the Figure; writes it when ``path`` is given."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    betas = sorted(table["beta"].unique())
    alphas = sorted(table["alpha"].unique())
    order = ("trainable", "rank_collapse", "entropy_collapse")
    grid = np.full((len(alphas), len(betas)), np.nan)
    for _, r in table.iterrows():
        grid[alphas.index(r["alpha"]), betas.index(r["beta"])] = order.index(r["theory"])
    fig = new_figure((1.6 + 1.3 * len(betas), 1.4 + 1.1 * len(alphas)))
    ax = fig.subplots()
    fig.subplots_adjust(left=0.16, right=0.97, bottom=0.2, top=0.86)
    ax.imshow(grid, origin="lower", cmap=ListedColormap([_REGIME_COLOUR[k] for k in order]),
              vmin=0, vmax=2, alpha=0.45, aspect="auto", interpolation="nearest")
    for _, r in table.iterrows():
        x, y = betas.index(r["beta"]), alphas.index(r["alpha"])
        learned = r["outcome"] == "learned"
        ax.plot([x], [y + 0.1], marker="o" if learned else "X", ms=11,
                mfc="k" if learned else "none", mec="k", mew=1.5, ls="none")
        ax.text(x, y - 0.28, f"{r['gain']:+.2f}", ha="center", va="center", fontsize=8)
        if not r["agree"]:
            ax.add_patch(Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, fill=False, ec="red",
                                   lw=2))
    ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
    ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set_xlabel("β (score scale)")
    ax.set_ylabel("α_attn (attention residual)")
    ax.set_title("trainability: theory regime (colour) vs training (marker);\n"
                 "number: eval-loss gain below the baseline (nats)", fontsize=9)
    handles = [Patch(color=_REGIME_COLOUR[k], alpha=0.45, label=k.replace("_", " "))
               for k in order]
    handles += [Line2D([], [], marker="o", mfc="k", mec="k", ls="none", label="learned"),
                Line2D([], [], marker="X", mfc="none", mec="k", ls="none", label="stuck")]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=7, frameon=False)
    return finish(fig, path, dpi)
