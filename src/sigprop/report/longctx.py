"""``sigprop longctx`` console output: the rich table and the trend per scaling (the figure
is :func:`sigprop.plotting.longctx.plot_sweep`)."""

from __future__ import annotations

from ..measurement.longctx import _layer1, trends


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
