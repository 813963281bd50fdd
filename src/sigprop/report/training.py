"""Tables for ``sigprop train`` / ``sigprop trainability``. Consumes Trajectory rows and the
trainability table only. Their figures are in :mod:`sigprop.plotting.training`."""

from __future__ import annotations

import math

from rich.console import Console

from ..plotting.training import curve

_REGIME_STYLE = {"trainable": "green", "rank_collapse": "yellow", "entropy_collapse": "red"}


def _f(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}"


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
    ev = curve(traj, "loss", "eval")
    tr = curve(traj, "loss", "train")
    cos = curve(traj, "cos", layer=spec.depth).set_index("step")["value"]
    ent = curve(traj, "entropy").groupby("step")["value"].mean()
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
