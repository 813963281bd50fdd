"""``sigprop longctx`` console output: for a spec's layer the rich table and the trend per
scaling (:func:`print_longctx`), for a model one line per attention layer and the
recommendation (:func:`print_model_longctx`). The figures are in :mod:`sigprop.plotting`."""

from __future__ import annotations

from ..measurement.longctx import layer1, trends


def print_longctx(run, spec, console=None, wide: bool = False) -> None:
    """``sigprop longctx`` for a spec's layer (``run`` from
    :func:`sigprop.measurement.longctx.stream_lengths`): rich table, one line per (scaling, T,
    observable): measured ± stderr, finite-T theory and the T -> infinity limit; then the
    trend per scaling."""
    from . import tables

    console = console or tables.console(wide)
    df = layer1(run.trajectory)
    console.print(f"[bold]sigprop longctx[/] d={spec.d_model}, H={spec.heads}, weights at "
                  f"T_ref={spec.seq_len}, {spec.attention}{' causal' if spec.causal else ''}, "
                  f"input {run.info['input']}, R={run.info['queries']} rows")
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
    for scaling, tr in trends(run.trajectory).items():
        what = {"condenses": "[bold red]condenses[/] (→ entropy collapse)",
                "spreads": "[bold yellow]spreads[/] (→ uniform: rank collapse)",
                "steady": "[bold green]steady[/]", "n/a": "n/a (one length)"}[tr["direction"]]
        console.print(f"{scaling}: ipr {tr['ipr_first']:.3g} → {tr['ipr_last']:.3g} "
                      f"(T {tr['T_first']} → {tr['T_last']}): {what}")
    console.print(f"{run.seconds:.1f} s")


def print_model_longctx(r, console=None, wide: bool = False) -> None:
    """``sigprop longctx MODEL``: one line per attention layer (token cosine, clpr25's
    gamma_c, score std and beta at the training length, which theory the score spread follows,
    the measured entropy at each length under the model as it is, worst ipr gap to theory,
    in band), then the recommendation and how fast the stream ran."""
    from . import tables

    console = console or tables.console(wide)
    info = r.info
    m = r.trajectory
    own = info["own_scaling"]
    ent = m[(m.observable == "entropy") & (m.source == "measured") & (m.scaling == own)]
    lengths = info["lengths"]
    console.print(f"[bold]sigprop longctx {r.model}[/]: {info['n_layers']} attention layers, "
                  f"training length {info['train_len']}, reference pass T={info['seq_len']}, "
                  f"R={info['queries']} rows per length; scalings streamed: "
                  f"{', '.join(info['scalings'])}")
    def short(T):
        k = int(T).bit_length() - 1
        return f"2^{k}" if T == 1 << k else str(T)

    heads = ["L", "cos", "γc", "σs", "β", "ν", "fit"]
    heads += [f"H {short(t)}" for t in lengths] + ["gap", "ok"]
    t = tables.table(*heads, right=tuple(h for h in heads if h not in ("fit", "ok")))
    for row in r.layers:
        L = row["layer"]
        e = ent[ent.layer == L].set_index("seq_len")["value"]
        nu = row.get("spread_exponent")
        lo, hi = r.band.get(L, (float("nan"), float("nan")))
        cells = [str(L), f"{row['rho']:.2f}", f"{row['gamma_c']:.3g}",
                 tables.fmt(row.get("sigma_s"), 2), tables.fmt(row.get("beta"), 2),
                 "—" if nu is None else f"{nu:.2f}", row.get("theory_fit", "n/a")]
        for T in lengths:
            v = float(e.get(T, float("nan")))
            out = T >= info["train_len"] and not lo <= v <= hi
            cells.append(f"[red]{v:.3f}[/]" if out else f"{v:.3f}")
        cells += [tables.fmt(row.get("worst_gap"), 3),
                  "[green]yes[/]" if row.get("in_band") else "[red]no[/]"]
        t.add_row(*cells)
    console.print(t)
    console.print("[dim]cos: token cosine of the layer input; γc = 1/(1 - cos) (clpr25); "
                  "σs, β: score std and gg25 beta at the training length; ν: growth of the "
                  "largest score, spread ∝ (log T)^ν (≈0.5-0.8: random scores, gg25; ≈0: a "
                  "fixed geometry, clpr25); H: measured entropy / log T; gap: worst |ipr "
                  "measured - theory|[/]")
    rec = r.recommendation
    held = rec.get("holds_measured")
    console.print(f"band: entropy at the training length ± {info['band_width']:g} per layer; "
                  f"recommended: [bold]{rec['label']}[/] ({rec['reason']}); re-measured: "
                  + ("[green]holds[/]" if held else "[red]does not hold[/]"))
    console.print(f"apply: {rec['fix_command']}")
    if info.get("real"):
        _print_real(r, console, short)
    for n in info.get("notes", []):
        console.print(f"[dim]note: {n}[/]")
    if "stream_gflops" in info:
        console.print(f"{r.seconds:.1f} s (reference pass {info['seconds_reference']:.1f} s, "
                      f"stream {info['seconds_stream']:.1f} s at "
                      f"{info['stream_gflops']:.0f} GFLOP/s = "
                      f"{100 * info['stream_fraction']:.0f}% of this machine's float32 "
                      f"matmul rate {info['matmul_gflops']:.0f} GFLOP/s)")


def _print_real(r, console, short) -> None:
    """The real-text check: per layer and length read by the model itself, entropy and ipr
    of the real text beside the stream's (the model as it is) and their largest difference;
    per layer whether that is within tolerance and whether the real entropy stays in band
    as it is and with the recommended scaling."""
    from . import tables

    real = r.info["real"]
    heads = ["L", "T", "H real", "H stream", "ipr real", "ipr stream", "|Δ|", "ok", "band",
             "rec"]
    t = tables.table(*heads, right=tuple(heads[1:7]))

    def yn(x):
        return "—" if x is None else ("[green]yes[/]" if x else "[red]no[/]")

    for row in r.layers:
        per = row.get("real") or {}
        lens = per.get("seq_len", [])
        for i, T in enumerate(lens):
            er, es = per["entropy_real"][i], per["entropy_stream"][i]
            ir, is_ = per["ipr_real"][i], per["ipr_stream"][i]
            last = i == len(lens) - 1
            cells = [str(row["layer"]) if i == 0 else "", short(T), f"{er:.3f}", f"{es:.3f}",
                     f"{ir:.3f}", f"{is_:.3f}", f"{max(abs(er - es), abs(ir - is_)):.3f}"]
            cells += [yn(row.get("real_within")), yn(row.get("real_in_band")),
                      yn(row.get("real_recommended_in_band"))] if last else ["", "", ""]
            t.add_row(*cells)
    console.print(f"real text ({real['source']}, {real['sequences']} sequence(s) per length) "
                  "read by the model itself, beside the stream (the model as it is):")
    console.print(t)
    held = r.recommendation.get("holds_real")
    console.print(f"[dim]ok: every |Δ| of the layer ≤ {real['tolerance']:g}; band: the real "
                  "entropy stays within the band of its value at the training length, as it "
                  "is / with the recommended scaling (rec; that layer's logits scaled on its "
                  "real inputs)[/]")
    console.print("recommended, re-measured on real text: " + (
        "— (no real length beyond the training length)" if held is None else
        "[green]holds[/]" if held else "[red]does not hold[/]"))
    holds = r.recommendation.get("real_holds") or {}
    if holds:
        console.print("on real text, in band in every layer: " + ", ".join(
            f"{k} " + ("[green]yes[/]" if v else "[red]no[/]") for k, v in holds.items()))
    pick = r.recommendation.get("real_choice")
    if pick and not held:
        console.print(f"on real text up to T={pick['up_to']}, the smallest change that holds: "
                      f"[bold]{pick['label']}[/] ({pick['fix_command']})")
