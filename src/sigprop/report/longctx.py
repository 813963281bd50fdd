"""``sigprop longctx`` output: the trend summary, the rich table and the figure (ipr, entropy,
wmax, cos against context length T; measured points with error bars, finite-T theory lines,
the T -> infinity limit dashed). Consumes the sweep's Trajectory only."""

from __future__ import annotations

import math

import numpy as np

OBS = ("ipr", "entropy", "wmax", "cos")
_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")


def _layer1(traj):
    return traj[traj["layer"] == 1]


def trends(traj) -> dict[str, dict]:
    """Per scaling: measured ipr and entropy at the shortest and longest length and the
    direction as T grows: ``condenses`` (ipr up by more than max(0.02, 3 stderr): towards
    entropy collapse), ``spreads`` (ipr down by as much: towards uniform attention, i.e. rank
    collapse after a few layers) or ``steady``; ``n/a`` with a single length."""
    out = {}
    m = _layer1(traj)
    m = m[m["source"] == "measured"]
    for scaling, sub in m.groupby("scaling", sort=False):
        ipr = sub[sub["observable"] == "ipr"].sort_values("seq_len")
        ent = sub[sub["observable"] == "entropy"].sort_values("seq_len")
        first, last = ipr.iloc[0], ipr.iloc[-1]
        row = {"T_first": int(first["seq_len"]), "T_last": int(last["seq_len"]),
               "ipr_first": float(first["value"]), "ipr_last": float(last["value"]),
               "entropy_first": float(ent.iloc[0]["value"]),
               "entropy_last": float(ent.iloc[-1]["value"])}
        if len(ipr) < 2:
            row["direction"] = "n/a"
        else:
            err = np.nan_to_num(math.hypot(first["stderr"], last["stderr"]))
            tol = max(0.02, 3.0 * float(err))
            delta = row["ipr_last"] - row["ipr_first"]
            row["direction"] = ("condenses" if delta > tol else
                                "spreads" if delta < -tol else "steady")
        out[str(scaling)] = row
    return out


def print_sweep(sw, spec, console=None, wide: bool = False) -> None:
    """Rich table, one line per (scaling, T, observable): measured ± stderr, finite-T theory
    and the T -> infinity limit; then the trend per scaling."""
    from . import tables

    console = console or tables.console(wide)
    df = _layer1(sw.trajectory)
    console.print(f"[bold]sigprop longctx[/] d={spec.d_model}, H={spec.heads}, weights at "
                  f"T_ref={spec.seq_len}, {spec.attention}{' causal' if spec.causal else ''}, "
                  f"input {sw.info['input']}, R={sw.info['queries']} rows")
    names = ("scaling", "T", "sigma_s", "observable", "measured", "theory", "T → ∞")
    t = tables.table(*names, right=("T", "sigma_s", "measured", "theory", "T → ∞"))
    piv = df.pivot_table(index=["scaling", "seq_len", "observable"], columns="source",
                         values=["value", "stderr"], aggfunc="first", sort=False)
    sig = df.groupby(["scaling", "seq_len"], sort=False)["sigma_s"].first()
    # one number of decimals per observable, shared by its measured, theory and limit cells
    dec = {name: tables.decimals(piv.xs(name, level="observable")["value"].to_numpy().ravel())
           for name in piv.index.get_level_values("observable").unique()}
    last = None
    for (scaling, T, name), row in piv.iterrows():
        if last is not None and last != (scaling, T):
            t.add_section()
        first = last != (scaling, T)
        last = (scaling, T)
        k = dec[name]
        t.add_row(str(scaling) if first else "", str(T) if first else "",
                  f"{sig[(scaling, T)]:.3g}" if first else "", name,
                  tables.fmt_pm(row[("value", "measured")], row[("stderr", "measured")], k),
                  tables.fmt(row[("value", "theory")], k),
                  tables.fmt(row[("value", "theory_asymptotic")], k))
    console.print(t)
    for scaling, tr in trends(sw.trajectory).items():
        what = {"condenses": "[bold red]condenses[/] (→ entropy collapse)",
                "spreads": "[bold yellow]spreads[/] (→ uniform: rank collapse)",
                "steady": "[bold green]steady[/]", "n/a": "n/a (one length)"}[tr["direction"]]
        console.print(f"{scaling}: ipr {tr['ipr_first']:.3g} → {tr['ipr_last']:.3g} "
                      f"(T {tr['T_first']} → {tr['T_last']}): {what}")
    console.print(f"{sw.seconds:.1f} s")


def plot_sweep(traj, path: str | None = None, spec=None, dpi: int = 130):
    """Four panels (ipr, entropy, wmax, cos) against T on a log2 axis: measured points with
    error bars, finite-T theory as lines, the T -> infinity limit dashed; one colour per
    scaling. Returns the Figure; writes it when ``path`` is given."""
    from .figures import finish, new_figure

    df = _layer1(traj)
    fig = new_figure((15, 3.6))
    axes = fig.subplots(1, 4)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.85, wspace=0.28)
    for i, (scaling, sub) in enumerate(df.groupby("scaling", sort=False)):
        c = _COLOURS[i % len(_COLOURS)]
        for ax, name in zip(axes, OBS, strict=True):
            s = sub[sub["observable"] == name]
            for source, style in (("theory", "-"), ("theory_asymptotic", "--")):
                th = s[s["source"] == source].sort_values("seq_len")
                ax.plot(th["seq_len"], th["value"], style, color=c, lw=1.2,
                        alpha=1.0 if source == "theory" else 0.6,
                        label=f"{scaling} theory" if source == "theory" and name == "ipr"
                        else None)
            me = s[s["source"] == "measured"].sort_values("seq_len")
            ax.errorbar(me["seq_len"], me["value"], yerr=me["stderr"].fillna(0.0), fmt="o",
                        ms=4, color=c, label=f"{scaling} measured" if name == "ipr" else None)
    for ax, name in zip(axes, OBS, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length T")
        ax.set_title({"ipr": "ipr (1 = one key)", "entropy": "entropy / log T (1 = uniform)",
                      "wmax": "largest weight", "cos": "output cosine"}[name])
    axes[0].legend(fontsize=7)
    if spec is not None:
        fig.suptitle(f"one attention layer, d={spec.d_model}, H={spec.heads}, weights drawn at "
                     f"T_ref={spec.seq_len} (dashed: T → ∞ limit)", fontsize=10)
    return finish(fig, path, dpi)
