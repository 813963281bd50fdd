"""Tables and figures for ``sigprop train`` / ``sigprop trainability`` (gg25 Fig. 1(f), Fig. 4
style loss curves). Consumes Trajectory rows and the trainability table only."""

from __future__ import annotations

import math

from rich.console import Console

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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(traj, path: str, title: str = "", labels=None, dpi: int = 150) -> None:
    """gg25 Fig. 4 style: eval loss vs step (one curve per ``beta`` / ``alpha`` group when the
    rows carry those columns), with the last layer's cos and the mean attention entropy
    during training in two side panels."""
    plt = _pyplot()
    keys = [k for k in ("alpha", "beta") if k in traj.columns]
    groups = traj.groupby(keys, dropna=False) if keys else [((), traj)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.16, top=0.86, wspace=0.28)
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v:g}" for k, v in zip(keys, key, strict=True)) or "run"
        if labels and key in labels:
            name += f" ({labels[key]})"
        ev = _curve(sub, "loss", "eval")
        line, = axes[0].plot(ev["step"], ev["value"], marker="o", ms=3, label=name)
        depth = int(sub["layer"].max())
        cos = _curve(sub, "cos", layer=depth)
        axes[1].plot(cos["step"], cos["value"], marker="o", ms=3, color=line.get_color())
        ent = _curve(sub, "entropy").groupby("step")["value"].mean()
        axes[2].plot(ent.index, ent.values, marker="o", ms=3, color=line.get_color())
    axes[0].set(xlabel="step", ylabel="eval loss (nats)", title="loss")
    axes[1].set(xlabel="step", ylabel="cos", title="last-layer token cosine")
    axes[2].set(xlabel="step", ylabel="entropy / log T", title="attention entropy")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_trainability(traj, table, path: str, dpi: int = 150) -> None:
    """gg25 Fig. 1(f) style: eval-loss curves of every grid point, coloured by the theory's
    regime, dashed where training disagreed with it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)
    for _, r in table.iterrows():
        sub = traj[(traj["beta"] == r["beta"]) & (traj["alpha"] == r["alpha"])]
        ev = _curve(sub, "loss", "eval")
        ax.plot(ev["step"], ev["value"], color=_REGIME_COLOUR[r["theory"]],
                ls="-" if r["agree"] else "--", lw=1.4,
                label=f"β={r['beta']:g}, α={r['alpha']:g}: {r['theory']}")
    ax.axhline(float(table["baseline"].iloc[0]), color="k", lw=0.8, ls=":",
               label="context-free baseline")
    ax.set(xlabel="step", ylabel="eval loss (nats)", title="trainability: loss curves")
    ax.legend(fontsize=6, ncol=2)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
