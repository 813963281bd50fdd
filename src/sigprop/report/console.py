"""Rich tables for the CLI's default ``--format table`` output."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from ..spec import ArchSpec
from . import tables

_VERDICT_STYLE = {"trainable": "bold green", "rank_collapse": "bold yellow",
                  "entropy_collapse": "bold red", "input_lost": "bold magenta",
                  "signal_lost": "bold magenta"}
_COLUMNS = ("cos", "q", "ipr", "ipr_cross", "entropy", "wmax")
_ABBR = {"entropy": "ent", "stable_rank": "srank"}


def _fmt(x) -> str:
    """A lone number (not in a column): 4 significant digits."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "inf" if x == math.inf else "–"
    return f"{x:.4g}"


def _derived_table(derived: dict) -> Table:
    t = tables.table("derived", "value", right=("value",))
    for k, v in derived.items():
        t.add_row(k, _fmt(float(v)))
    return t


def _wide_columns(w, names) -> dict[str, list[str]]:
    """Formatted columns of a layer x observable frame (shared decimals per column)."""
    return {c: tables.column(list(w[c])) for c in names}


def _evenly(n: int, most: int) -> list[int]:
    """At most ``most`` evenly spaced indices of ``range(n)``, first and last included."""
    import numpy as np

    if n <= most:
        return list(range(n))
    return np.unique(np.linspace(0, n - 1, most).round().astype(int)).tolist()


def print_prediction(spec: ArchSpec, traj, derived: dict, verdict: str,
                     alpha_crit: float | None, console: Console | None = None,
                     wide: bool = False) -> None:
    """Per-layer theory table, derived quantities, verdict and alpha_crit. Deep stacks show at
    most ``max_rows`` evenly spaced layers (always the first, the last and the first layer
    whose cosine reaches rho_max) and say so; ``wide`` shows every layer."""
    import numpy as np

    from .. import trajectory

    max_rows = 40
    console = console or tables.console(wide)
    src = traj["source"].iloc[0]
    w = trajectory.wide(traj)
    console.print(f"[bold]sigprop predict[/] {spec.norm}-LN, L={spec.depth}, T={spec.seq_len}, "
                  f"{spec.attention}, {spec.activation} ({src})")
    n = len(w.index)
    if not wide and n > max_rows:
        keep = set(_evenly(n, max_rows - 1))
        if "cos" in w.columns:
            over = np.flatnonzero(w["cos"].to_numpy() >= spec.rho_max)
            if over.size:
                keep.add(int(over[0]))
        w = w.iloc[sorted(keep)]
    cols = [c for c in _COLUMNS if c in w.columns]
    t = tables.table("layer", *cols, right=("layer", *cols))
    cells = _wide_columns(w, cols)
    for i, layer in enumerate(w.index):
        t.add_row(str(layer), *(cells[c][i] if cells[c][i] != "–" else "" for c in cols))
    console.print(t)
    if len(w.index) < n:
        console.print(f"{len(w.index)} of {n} layers (--wide: all)")
    console.print(_derived_table(derived))
    console.print(f"verdict: [{_VERDICT_STYLE[verdict]}]{verdict}[/]   "
                  f"alpha_crit(L={spec.depth}) = {_fmt(alpha_crit)}")
    console.print(f"(spec alpha_attn = {spec.alpha_attn:g}, rho_max = {spec.rho_max:g})")


def print_diagram(spec: ArchSpec, d, out: str | None, console: Console | None = None,
                  wide: bool = False) -> None:
    import numpy as np

    console = console or tables.console(wide)
    console.print(f"[bold]trainability diagram[/] L={d.depth}, rho0={d.rho0:g}, "
                  f"beta_c={d.beta_c:.4g}, rho_max={d.rho_max:g}")
    t = tables.table("beta", "alpha_crit", right=("beta", "alpha_crit"))
    idx = _evenly(len(d.betas), len(d.betas) if wide else 12)
    b = tables.column([float(d.betas[i]) for i in idx])
    a = tables.column([float(d.alpha_crit[i]) for i in idx])
    for bi, ai in zip(b, a, strict=True):
        t.add_row(bi, ai)
    console.print(t)
    shares = np.bincount(d.regime.ravel(), minlength=3) / d.regime.size
    console.print("grid shares: " + ", ".join(
        f"[{_VERDICT_STYLE[n]}]{n}[/] {s:.0%}" for n, s in
        zip(("trainable", "rank_collapse", "entropy_collapse"), shares, strict=True)))
    p = d.point
    console.print(f"this spec: beta={p['beta']:.4g}, alpha_attn={p['alpha']:g} -> "
                  f"[{_VERDICT_STYLE[p['regime']]}]{p['regime']}[/]")
    console.print(f"  (rho_L={p['rho_L']:.4g}, alpha_crit={_fmt(p['alpha_crit'])})")
    if out:
        console.print(f"wrote {out}")


_PAPER = {"sigma_s": "score std", "beta": "gg25 (Eq. 11)", "beta_c": "gg25 (beta_c)",
          "beta_over_beta_c": "gg25", "gamma": "clpr25 (sigma_s / log T)",
          "gamma_c": "clpr25 (1/(1-rho))", "gamma_one_minus_rho": "clpr25",
          "deshpande_ratio": "deshpande26 (beta/beta_c)", "sigma_A": "mindthegap",
          "tau": "noci22 temperature", "tau_star": "noci22 Eq. 47"}


def print_translation(spec: ArchSpec, derived: dict, console: Console | None = None,
                      wide: bool = False) -> None:
    console = console or tables.console(wide)
    console.print(f"[bold]one parameter, five names[/] T={spec.seq_len}, d_head={spec.d_head}, "
                  f"rho0={derived['rho0']:g}")
    t = tables.table("name", "value", "paper", right=("value",))
    for k, v in derived.items():
        t.add_row(k, _fmt(float(v)), _PAPER.get(k, ""))
    console.print(t)


def print_measurement(spec: ArchSpec, traj, agreement: dict, verdict: str, m,
                      console: Console | None = None, wide: bool = False) -> None:
    """Theory beside measured ± stderr per layer; cos, ipr, entropy (``wide``: all)."""
    from .. import trajectory

    console = console or tables.console(wide)
    theory = traj[traj["source"] != "measured"]
    meas = traj[traj["source"] == "measured"]
    tw, mw = trajectory.wide(theory), trajectory.wide(meas)
    se = meas.pivot_table(index="layer", columns="observable", values="stderr", aggfunc="first")
    names = ("cos", "ipr", "entropy", "wmax", "stable_rank") if wide else ("cos", "ipr",
                                                                            "entropy")
    cols = [c for c in names if c in mw.columns]
    console.print(f"[bold]sigprop measure[/] {m.info['seeds']} seeds x {m.info['sequences']} "
                  f"sequences, input {m.info['input']} ({m.seconds:.1f} s)")
    heads = ["layer"]
    for c in cols:  # theory beside the measured mean ± stderr, headed by the observable
        heads += [f"{_ABBR.get(c, c)} th", _ABBR.get(c, c)]
    t = tables.table(*heads, right=heads)
    layers = list(mw.index)
    cells = []
    for c in cols:
        tv = [tw[c].get(layer) if c in tw.columns else None for layer in layers]
        mv = [mw[c].get(layer) for layer in layers]
        sv = [se[c].get(layer) if c in se.columns else None for layer in layers]
        dec = tables.decimals([*tv, *mv])
        cells.append([tables.fmt(v, dec) for v in tv])
        cells.append([tables.fmt_pm(v, s, dec) for v, s in zip(mv, sv, strict=True)])
    for i, layer in enumerate(layers):
        t.add_row(str(layer), *(col[i] for col in cells))
    console.print(t)
    shown = sorted(agreement) if wide else [k for k in ("cos", "ipr", "entropy", "wmax")
                                            if k in agreement]
    console.print("max |theory - measured|: " + ", ".join(
        f"{k} {agreement[k]:.2g}" for k in shown))
    console.print(f"verdict (theory): [{_VERDICT_STYLE[verdict]}]{verdict}[/]")


def print_diagnosis(d, console: Console | None = None, wide: bool = False) -> None:
    """Per-layer measurement with theory beside it, the range of head entropies, verdict,
    recommendations. ``wide`` adds ± on every measured column and the extreme heads."""
    from .. import trajectory
    from ..analysis.diagnosis import head_extremes

    console = console or tables.console(wide)
    traj = d.trajectory
    meas = traj[traj.source == "measured"]
    mw = trajectory.wide(traj, "measured")
    tw = trajectory.wide(traj, "theory")
    se = meas.pivot_table(index="layer", columns="observable", values="stderr", aggfunc="first")
    ext = {e["layer"]: e for e in head_extremes(d.heads)}
    has_theory = bool((traj.source == "theory").any())
    block = f", {d.spec.norm}-LN" if has_theory else ", measured only"
    console.print(f"[bold]sigprop diagnose[/] {d.model}: L={d.spec.depth}, d={d.spec.d_model}, "
                  f"H={d.spec.heads}, T={d.spec.seq_len}{block}")
    for line in _provenance_lines(d):
        console.print(line)
    layers = list(mw.index)
    # narrow terminals: beta/beta_c (from the weights) takes wmax's place; --wide shows both
    shown = ("ipr", "entropy", "wmax", "stable_rank") if wide or not getattr(d, "layers", None) \
        else ("ipr", "entropy", "stable_rank")
    obs = [c for c in shown if c in mw.columns]

    def col(c, with_se):
        vals = [mw[c].get(layer) for layer in layers]
        errs = [se[c].get(layer) if c in se.columns else None for layer in layers]
        return tables.column(vals, errs if with_se else None)

    cos_th = [tw["cos"].get(layer) if "cos" in tw.columns else None for layer in layers]
    dec = tables.decimals([*mw["cos"], *cos_th])  # measured and theory cos read alike
    cos_m = [tables.fmt_pm(mw["cos"].get(layer), se["cos"].get(layer) if "cos" in se else None,
                           dec) for layer in layers]
    cos_t = [tables.fmt(v, dec) for v in cos_th]
    other = {c: col(c, wide) for c in obs}
    lo = tables.column([ext[layer]["min_entropy"] if layer in ext else None for layer in layers])
    hi = tables.column([ext[layer]["max_entropy"] if layer in ext else None for layer in layers])
    head_cells = []
    for i, layer in enumerate(layers):
        e = ext.get(layer)
        if e is None:
            head_cells.append("")
        elif wide:
            head_cells.append(f"h{e['min_entropy_head']} {lo[i]} – h{e['max_entropy_head']} "
                              f"{hi[i]}")
        else:
            head_cells.append(f"{lo[i]}–{hi[i]}")
    # a measured mixer (theory §2.8.1) has no beta; trained weights: the measured ratio
    ratio = {r["layer"]: r.get("beta_over_beta_c_measured", r["beta_over_beta_c"])
             for r in getattr(d, "layers", []) if r.get("mixer") is None}
    rcol = tables.column([ratio.get(layer) for layer in layers]) if ratio else None
    names = ["layer", "cos", "cos th", *(["beta/bc"] if rcol else []),
             *[c.replace("stable_rank", "srank") for c in obs], "head entropy"]
    t = tables.table(*names, right=names)
    for i, layer in enumerate(layers):
        extra = [] if rcol is None else ["" if rcol[i] == "–" else rcol[i]]
        t.add_row(str(layer), cos_m[i], "" if cos_t[i] == "–" else cos_t[i], *extra,
                  *("" if other[c][i] == "–" else other[c][i] for c in obs), head_cells[i])
    console.print(t)
    if has_theory:
        console.print(_derived_table(d.derived))
    where = "" if d.first_failing_layer is None else f" from layer {d.first_failing_layer}"
    heads = f", heads {d.failing_heads}" if d.failing_heads else ""
    console.print(f"verdict: [{_VERDICT_STYLE[d.verdict]}]{d.verdict}[/]{where}{heads}")
    roles = getattr(d, "roles", None)
    if roles is not None and len(roles):
        console.print(_roles_table(roles, wide))
    if getattr(d, "vs_init", None) is not None:
        console.print(_vs_init_table(d.vs_init))
    if d.recommendations:
        console.print("[bold]recommendations[/]")
        for r in d.recommendations:
            _print_rec(console, r)
    if d.notes:
        console.print("[bold]where the theory does not cover this model[/]")
        for n in d.notes:
            console.print(f"  • {n}")
    console.print(f"{d.seconds:.1f} s")


def _roles_table(roles, wide: bool):
    """Per layer, its heads by role (``wide``: one row per head with its numbers)."""
    if wide:
        names = ("layer", "head", "role", "sink", "prev", "self", "entropy", "max logit")
        t = tables.table(*names, right=("layer", "head", "sink", "prev", "self", "entropy",
                                        "max logit"))
        for _, r in roles.iterrows():
            t.add_row(str(int(r["layer"])), str(int(r["head"])), r["role"],
                      *(tables.fmt(r[c], 2) for c in ("sink", "prev", "self", "entropy")),
                      tables.fmt(r["max_logit"], 1))
        t.title = "head roles"
        return t
    t = tables.table("layer", "head roles (heads)")
    for layer, g in roles.groupby("layer", sort=True):
        parts = [f"{role} {', '.join(str(int(h)) for h in grp['head'])}"
                 for role, grp in g.groupby("role", sort=False)]
        t.add_row(str(int(layer)), "; ".join(parts))
    return t


def _vs_init_table(v):
    """Per layer: trained -> fresh init on the same inputs (cos, entropy, RMS sigma_s)."""
    names = ("layer", "cos trained", "cos init", "entropy trained", "entropy init",
             "σs trained", "σs init")
    t = tables.table(*names, right=names)
    for _, r in v.layers.iterrows():
        t.add_row(str(int(r["layer"])), *(tables.fmt(r.get(c), 3) for c in (
            "cos_trained", "cos_init", "entropy_trained", "entropy_init", "sigma_s_trained",
            "sigma_s_init")))
    t.title = f"what training changed (a fresh init, seed {v.seed}, on the same inputs)"
    return t


def _provenance_lines(d) -> list[str]:
    """What was measured: the weights (their source and, when checked, their state) and
    the inputs."""
    out = []
    state = getattr(d, "weights_state", None)
    src = {"init": "the model's own init", "folder": "the folder's weight files",
           "module": "the module given"}.get(d.weights, d.weights)
    if state:
        out.append(f"weights: [bold]{state}[/] ({src})")
    elif d.weights != "init":
        out.append(f"weights: {src}")
    if getattr(d, "inputs", ""):
        out.append(f"inputs: {d.inputs}")
    return out


def _sampled_layers(layers: list, wide: bool, most: int = 13) -> list:
    """All layers (``wide`` or few), else ``most`` evenly spaced ones incl. first and last."""
    return [layers[i] for i in _evenly(len(layers), len(layers) if wide else most)]


def print_fix(before, rep, after, out: str, console: Console | None = None,
              wide: bool = False) -> None:
    """What ``sigprop fix`` changed; before / after per layer (measured cos and entropy, the
    theory's cos), a sample of layers on deep models (``wide``: all); the verdicts."""
    from .. import trajectory

    console = console or tables.console(wide)
    console.print(f"[bold]sigprop fix[/] {before.model} -> {out}")
    for c in rep.changes:
        console.print(f"  • {c}")
    mb, ma = trajectory.wide(before.trajectory, "measured"), trajectory.wide(
        after.trajectory, "measured")
    tb, ta = trajectory.wide(before.trajectory, "theory"), trajectory.wide(
        after.trajectory, "theory")
    layers = _sampled_layers([x for x in mb.index if x in ma.index], wide)

    def col(frame, name):
        return tables.column([frame[name].get(x) if name in frame.columns else None
                              for x in layers])

    cols = {"cos before": col(mb, "cos"), "cos after": col(ma, "cos"),
            "th before": col(tb, "cos"), "th after": col(ta, "cos"),
            "ent before": col(mb, "entropy"), "ent after": col(ma, "entropy")}
    names = ["layer", *cols]
    t = tables.table(*names, right=names)
    for i, x in enumerate(layers):
        t.add_row(str(x), *("" if v[i] == "–" else v[i] for v in cols.values()))
    if len(layers) < len(mb.index):
        console.print(f"{len(layers)} of {len(mb.index)} layers (--wide: all)")
    console.print(t)
    for label, d, key in (("before", before, "before"), ("after", after, "after")):
        style = _VERDICT_STYLE[d.verdict]
        console.print(f"{label}: measured [{style}]{d.verdict}[/], theory "
                      f"{rep.predicted[key]['verdict']} (final cos theory "
                      f"{_fmt(rep.predicted[key]['final_cos'])})")
    if after.recommendations:
        console.print("[bold]recommendations for the fixed model[/]")
        for r in after.recommendations:
            _print_rec(console, r)


def _print_rec(console, r: dict) -> None:
    """One recommendation, and the line of its measured effect where it has one."""
    console.print(f"  • {r['text']}")
    line = (r.get("measured") or {}).get("line")
    if line:
        console.print(f"    {line}")


def print_compare(c, console: Console | None = None, wide: bool = False) -> None:
    """``sigprop fix --compare``: one row per fix, ranked (measured final cos and head
    entropies, the theory's final cos, the measured verdict, the loss gain with training);
    the baseline first; the recommendation and the ranking rule below."""
    from ..analysis.ranking import RANKING
    from ..models import methods

    console = console or tables.console(wide)
    b = c.baseline
    console.print(f"[bold]sigprop fix --compare[/] {c.model}: {len(c.rows)} fixes at T="
                  f"{c.seq_len}, {c.seeds} seed(s) x {c.sequences} sequences")
    rows = [("baseline", b["measured"], b["predicted"], b["verdict"], b.get("train_gain"),
             "")] + [(r.method, r.measured, r.predicted, r.verdict, r.train_gain,
                      r.error or "") for r in c.rows]
    meas = lambda k: tables.column([(m or {}).get(k) for _, m, *_ in rows])  # noqa: E731
    th = tables.column([(p or {}).get("cos_final") for _, _, p, *_ in rows])
    cols = {"cos": meas("cos_final"), "th cos": th, "ent min": meas("entropy_min"),
            "ent med": meas("entropy_median"), "kept": meas("kept")}
    if c.train_steps:
        cols["gain"] = tables.column([g for *_, g, _ in rows])
    names = ["fix", *cols, "verdict"]
    t = tables.table(*names, right=list(cols))
    for i, (name, _m, _p, verdict, _g, err) in enumerate(rows):
        style = _VERDICT_STYLE.get(verdict, "")
        v = f"[{style}]{verdict}[/]" if style else (verdict if not err else "n/a")
        t.add_row(name, *(("" if x[i] == "–" else x[i]) for x in cols.values()), v)
    console.print(t)
    errs = [r for r in c.rows if r.error]
    for r in errs:
        console.print(f"  {r.method}: {r.error}")
    train_only = [r.method for r in c.rows if getattr(methods.REGISTRY.get(r.method),
                                                      "training_only", False)]
    if train_only and not c.train_steps:
        console.print(f"training-time only, the baseline itself at init (compared under "
                      f"--train-steps K only): {', '.join(train_only)}")
    console.print("th cos: theory (blank: measured only); ent: normalised head entropy, "
                  "lowest and median over every head; kept: cosine of each token's centred "
                  "input and centred output (~0: the depth scrambled the tokens)")
    rec = c.recommendation
    console.print(f"[bold]recommended[/]: {rec['method']} ({rec['verdict']}): "
                  f"{rec['command']}")
    console.print(f"ranking: {RANKING}")


def print_methods(rows: list[dict], console: Console | None = None) -> None:
    """``sigprop fix --list``: the registered fixes, what they act on, their parameters."""
    console = console or tables.console(False)
    t = tables.table("method", "acts on", "theory")
    t.columns[1].no_wrap = False  # the method names and the theory stay whole
    for r in rows:
        t.add_row(r["method"], r["acts"], r["theory"])
    console.print(t)
    for r in rows:
        if r["params"]:
            ps = "; ".join(f"{k}: {v}" for k, v in r["params"].items())
            console.print(f"  {r['method']} ({r['cite']}): {ps}")
        else:
            console.print(f"  {r['method']} ({r['cite']})")
