"""Rich tables for the CLI's default ``--format table`` output."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from ..spec import ArchSpec

_VERDICT_STYLE = {"trainable": "bold green", "rank_collapse": "bold yellow",
                  "entropy_collapse": "bold red"}
_COLUMNS = ("cos", "q", "ipr", "ipr_cross", "entropy", "wmax")


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "inf" if x == math.inf else "–"
    return f"{x:.4g}"


def _derived_table(derived: dict) -> Table:
    t = Table(title="derived (THEORY §6)", show_header=False, box=None)
    for k, v in derived.items():
        t.add_row(k, _fmt(float(v)))
    return t


def print_prediction(spec: ArchSpec, traj, derived: dict, verdict: str,
                     alpha_crit: float, console: Console | None = None) -> None:
    import pandas as pd

    from .. import trajectory

    console = console or Console()
    src = traj["source"].iloc[0]
    w = trajectory.wide(traj)
    t = Table(title=f"sigprop predict — {spec.norm}-LN, L={spec.depth}, T={spec.seq_len}, "
                    f"{spec.attention} attention, {spec.activation} ({src})")
    t.add_column("layer", justify="right")
    cols = [c for c in _COLUMNS if c in w.columns]
    for c in cols:
        t.add_column(c, justify="right")
    for layer, row in w.iterrows():
        t.add_row(str(layer), *(_fmt(row[c]) if pd.notna(row[c]) else "" for c in cols))
    console.print(t)
    console.print(_derived_table(derived))
    console.print(f"verdict: [{_VERDICT_STYLE[verdict]}]{verdict}[/]   "
                  f"alpha_crit(L={spec.depth}) = {_fmt(alpha_crit)}   "
                  f"(spec alpha_attn = {spec.alpha_attn:g}, rho_max = {spec.rho_max:g})")


def print_diagram(spec: ArchSpec, d, out: str | None, console: Console | None = None) -> None:
    import numpy as np

    console = console or Console()
    t = Table(title=f"trainability diagram — L={d.depth}, rho0={d.rho0:g}, "
                    f"beta_c={d.beta_c:.4g}, rho_max={d.rho_max:g}")
    t.add_column("beta", justify="right")
    t.add_column("alpha_crit", justify="right")
    idx = np.unique(np.linspace(0, len(d.betas) - 1, 12).round().astype(int))
    for i in idx:
        t.add_row(_fmt(float(d.betas[i])), _fmt(float(d.alpha_crit[i])))
    console.print(t)
    shares = np.bincount(d.regime.ravel(), minlength=3) / d.regime.size
    console.print("grid shares: " + ", ".join(
        f"[{_VERDICT_STYLE[n]}]{n}[/] {s:.0%}" for n, s in
        zip(("trainable", "rank_collapse", "entropy_collapse"), shares, strict=True)))
    p = d.point
    console.print(f"this spec: beta={p['beta']:.4g}, alpha_attn={p['alpha']:g} -> "
                  f"[{_VERDICT_STYLE[p['regime']]}]{p['regime']}[/] "
                  f"(rho_L={p['rho_L']:.4g}, alpha_crit={_fmt(p['alpha_crit'])})")
    if out:
        console.print(f"wrote {out}")


_PAPER = {"sigma_s": "score std", "beta": "gg25 (Eq. 11)", "beta_c": "gg25 (THEORY §2.2)",
          "beta_over_beta_c": "gg25", "gamma": "clpr25 (sigma_s / log T)",
          "gamma_c": "clpr25 (1/(1-rho))", "gamma_one_minus_rho": "clpr25",
          "deshpande_ratio": "deshpande26 (beta/beta_c)", "sigma_A": "mindthegap",
          "tau": "noci22 temperature", "tau_star": "noci22 Eq. 47"}


def print_translation(spec: ArchSpec, derived: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title=f"one parameter, five names (THEORY §6) — T={spec.seq_len}, "
                    f"d_head={spec.d_head}, rho0={derived['rho0']:g}")
    t.add_column("name")
    t.add_column("value", justify="right")
    t.add_column("paper")
    for k, v in derived.items():
        t.add_row(k, _fmt(float(v)), _PAPER.get(k, ""))
    console.print(t)


def print_measurement(spec: ArchSpec, traj, agreement: dict, verdict: str, m,
                      console: Console | None = None) -> None:
    """Theory vs measured per layer for the main observables."""
    import pandas as pd

    from .. import trajectory

    console = console or Console()
    theory = traj[traj["source"] != "measured"]
    meas = traj[traj["source"] == "measured"]
    tw, mw = trajectory.wide(theory), trajectory.wide(meas)
    se = meas.pivot_table(index="layer", columns="observable", values="stderr", aggfunc="first")
    cols = [c for c in ("cos", "ipr", "entropy", "wmax", "stable_rank") if c in mw.columns]
    t = Table(title=f"sigprop measure — {m.info['seeds']} seeds x {m.info['sequences']} "
                    f"sequences, input {m.info['input']} ({m.seconds:.1f} s)")
    t.add_column("layer", justify="right")
    for c in cols:
        t.add_column(f"{c}\ntheory / measured", justify="right")
    for layer in mw.index:
        cells = []
        for c in cols:
            tv = tw[c].get(layer) if c in tw.columns else None
            mv, sv = mw[c].get(layer), se[c].get(layer) if c in se.columns else None
            left = "–" if tv is None or pd.isna(tv) else _fmt(float(tv))
            right = "" if mv is None or pd.isna(mv) else _fmt(float(mv))
            if right and sv is not None and not pd.isna(sv):
                right += f"±{float(sv):.1g}"
            cells.append(f"{left} / {right}" if right else left)
        t.add_row(str(layer), *cells)
    console.print(t)
    console.print("max |theory - measured|: " + ", ".join(
        f"{k} {v:.3g}" for k, v in sorted(agreement.items())))
    console.print(f"verdict (theory): [{_VERDICT_STYLE[verdict]}]{verdict}[/]")


def print_diagnosis(d, console: Console | None = None) -> None:
    """Per-layer measurement with theory beside it, head extremes, verdict, recommendations."""
    import pandas as pd

    from .. import trajectory
    from ..diagnose import head_extremes

    console = console or Console()
    traj = d.trajectory
    mw = trajectory.wide(traj, "measured")
    tw = trajectory.wide(traj, "theory")
    ext = {e["layer"]: e for e in head_extremes(d.heads)}
    t = Table(title=f"sigprop diagnose {d.model} — L={d.spec.depth}, d={d.spec.d_model}, "
                    f"H={d.spec.heads}, T={d.spec.seq_len}, {d.spec.norm}-LN "
                    f"({d.seconds:.1f} s)")
    for name in ("layer", "cos", "cos theory", "ipr", "entropy", "wmax", "stable rank",
                 "entropy heads min/max"):
        t.add_column(name, justify="right")
    for layer in mw.index:
        row = mw.loc[layer]

        def g(col, src=row):
            v = src.get(col) if hasattr(src, "get") else None
            return "" if v is None or pd.isna(v) else _fmt(float(v))

        th = tw.loc[layer] if layer in tw.index else None
        e = ext.get(layer)
        heads = (f"h{e['min_entropy_head']} {e['min_entropy']:.2f} / h{e['max_entropy_head']} "
                 f"{e['max_entropy']:.2f}") if e else ""
        t.add_row(str(layer), g("cos"), g("cos", th) if th is not None else "", g("ipr"),
                  g("entropy"), g("wmax"), g("stable_rank"), heads)
    console.print(t)
    console.print(_derived_table(d.derived))
    where = "" if d.first_failing_layer is None else f" from layer {d.first_failing_layer}"
    heads = f", heads {d.failing_heads}" if d.failing_heads else ""
    console.print(f"verdict: [{_VERDICT_STYLE[d.verdict]}]{d.verdict}[/]{where}{heads}")
    console.print("[bold]recommendations[/]")
    for r in d.recommendations:
        console.print(f"  • {r['text']}")
    if d.notes:
        console.print("[bold]where the theory does not cover this model[/]")
        for n in d.notes:
            console.print(f"  • {n}")


def print_fix(before, rep, after, out: str, console: Console | None = None) -> None:
    """What ``sigprop fix`` changed, and the diagnosis of the written model (re-measured)."""
    console = console or Console()
    console.print(f"[bold]sigprop fix[/] {before.model} -> {out}")
    for c in rep.changes:
        console.print(f"  • {c}")
    t = Table(title="before / after")
    for name in ("", "verdict (measured)", "final cos (measured)", "final cos (theory)",
                 "theory verdict"):
        t.add_column(name, justify="right")
    for label, d, key in (("before", before, "before"), ("after", after, "after")):
        m = d.trajectory[(d.trajectory.source == "measured") & (d.trajectory.observable == "cos")]
        last = float(m.sort_values("layer")["value"].iloc[-1]) if len(m) else float("nan")
        style = _VERDICT_STYLE[d.verdict]
        t.add_row(label, f"[{style}]{d.verdict}[/]", _fmt(last),
                  _fmt(rep.predicted[key]["final_cos"]), rep.predicted[key]["verdict"])
    console.print(t)
    print_diagnosis(after, console)
