"""One self-contained HTML report of a diagnosis (``sigprop diagnose --report FILE.html``).

Everything is inline: CSS in a ``<style>`` element, figures as base64 SVG ``data:`` URIs
(vector: sharp at any zoom), no scripts, no external assets, so the file can be mailed or
attached to a paper's supplement. The header records the command line, the sigprop version,
the seeds and the sequences measured.
Every string that comes from the user or the model (names, paths, notes) goes through
:func:`html.escape`. Figures: depth curves (theory lines, measured dots with standard errors),
a per-head heat map of attention entropy (:func:`sigprop.plotting.heads.plot_head_heatmap`),
and the (beta, alpha_attn) trainability diagram with the model's own point (docs/theory.md
§2.7).
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

from ..plotting.figures import plot_depth, plot_diagram
from ..plotting.heads import plot_head_heatmap, plot_head_roles

PAGE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.88em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
.verdict{display:inline-block;padding:.2em .7em;border-radius:4px;color:#fff;font-weight:600}
.trainable{background:#4c72b0}.rank_collapse{background:#c28f00}
.entropy_collapse{background:#d1495b}
img{max-width:100%;height:auto;border:1px solid #eee}
.muted{color:#666;font-size:.9em}ul{margin:.3em 0}
"""


_WEIGHTS = {"init": "weights: fresh init", "folder": "weights: the folder's files",
            "module": "weights: the module's own"}


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def num(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return esc(x)
    if isinstance(x, float) and math.isnan(x):
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return esc(x)
    return f"{x:.4g}"


def svg_of(draw, *args, **kwargs) -> str:
    """Run a figure function; return its SVG as an ``<img>`` data URI."""
    fig = draw(*args, **kwargs)
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


#: the closing line of sigprop's own reports
FOOTER = ('<p class="muted">sigprop: predict, measure and prevent rank and entropy collapse at '
          'initialisation.</p>')


def document(title: str, body: list[str], css: str = PAGE_CSS) -> str:
    """A self-contained HTML page: ``title`` (escaped), the style sheet ``css`` and the
    ``body`` parts joined."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{css}</style></head><body>"
            + "".join(body) + "</body></html>\n")


def write_text(path, text: str) -> None:
    """Write a rendered page to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def html_table(rows: list[dict], cols: list[str], left: tuple[str, ...] = ()) -> str:
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in cols)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in left else ""}">{num(r.get(c))}</td>'
                         for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _layer_rows(traj) -> tuple[list[dict], list[str]]:
    """Per layer: measured mean ± stderr beside the theory, for each observable."""
    from . import tables

    obs = ("cos", "ipr", "entropy", "wmax", "stable_rank")
    sub = traj[traj["observable"].isin(obs)]
    val = sub.pivot_table(index="layer", columns=["observable", "source"], values="value",
                          aggfunc="mean")
    err = sub.pivot_table(index="layer", columns=["observable", "source"], values="stderr",
                          aggfunc="mean")
    names, cells = ["layer"], {}
    for o in obs:
        for src, label in (("measured", "meas ± se"), ("theory", "theory")):
            if (o, src) not in val.columns:
                continue
            v = list(val[(o, src)])
            e = list(err[(o, src)]) if (o, src) in err.columns and src == "measured" else None
            name = f"{o} ({label})"
            names.append(name)
            cells[name] = tables.column(v, e)
    rows = [{"layer": int(layer), **{n: cells[n][i] for n in names[1:]}}
            for i, layer in enumerate(val.index)]
    return rows, names


def _diagnosis_body(d, *, diagram_grid: int = 64) -> str:
    from ..analysis.diagnosis import head_extremes
    from ..theory import diagram as dg

    spec = d.spec
    parts = [f'<p>verdict <span class="verdict {esc(d.verdict)}">{esc(d.verdict)}</span>']
    if d.first_failing_layer is not None:
        parts.append(f" from layer {esc(d.first_failing_layer)}")
    if d.failing_heads:
        parts.append(" (heads " + esc(", ".join(str(h) for h in d.failing_heads)) + ")")
    parts.append(f'</p><p class="muted">{esc(spec.depth)} layers, d={esc(spec.d_model)}, '
                 f'{esc(spec.heads)} heads, T={esc(spec.seq_len)}, {esc(spec.norm)}-LN, '
                 f'{esc(spec.activation)}; {_WEIGHTS.get(d.weights, "at init")} '
                 f'({esc(getattr(d, "weights_state", "init"))}); '
                 f'{esc(d.seeds)} seed(s) from {esc(d.seed)} x {esc(d.sequences)} sequence(s); '
                 f'measured in {d.seconds:.1f} s</p>')
    if getattr(d, "inputs", ""):
        parts.append(f'<p class="muted">inputs: {esc(d.inputs)}</p>')
    has_theory = bool((d.trajectory["source"] == "theory").any())
    if d.recommendations:
        parts.append("<h2>Recommendations</h2><ul>")
        parts += [f"<li>{esc(r.get('text', r.get('what')))}</li>" for r in d.recommendations]
        parts.append("</ul>")
    if has_theory:
        parts.append("<h2>Derived parameters</h2>")
        parts.append(html_table([{"name": k, "value": v} for k, v in d.derived.items()],
                            ["name", "value"], left=("name",)))
    parts.append("<h2>Depth curves: theory (lines) and measured (dots)</h2>")
    obs = tuple(o for o in ("cos", "ipr", "entropy", "stable_rank")
                if o in set(d.trajectory["observable"]))
    src = svg_of(plot_depth, d.trajectory, spec=spec, observables=obs)
    parts.append(f'<img alt="depth curves" src="{src}">')
    if len(d.heads) and "entropy" in set(d.heads["observable"]):
        parts.append("<h2>Attention entropy per head</h2>")
        parts.append(f'<img alt="per-head entropy" src="{svg_of(plot_head_heatmap, d.heads)}">')
        ext = head_extremes(d.heads)
        parts.append(html_table(ext, ["layer", "min_entropy_head", "min_entropy",
                                  "max_entropy_head", "max_entropy"]))
    roles = getattr(d, "roles", None)
    if roles is not None and len(roles):
        parts.append("<h2>Head roles on this text</h2>")
        parts.append(f'<img alt="head roles" src="{svg_of(plot_head_roles, roles)}">')
        cols = ["layer", "head", "role", "sink", "prev", "self", "entropy", "content_entropy",
                "max_logit", "why"]
        parts.append(html_table(roles[cols].to_dict("records"), cols, left=("role", "why")))
    if has_theory:  # a measured-only diagnosis has no spec to place on the diagram
        parts.append("<h2>Trainability diagram with this model's point</h2>")
        diag = dg.compute(spec, n_beta=diagram_grid, n_alpha=diagram_grid, rho0=d.rho0)
        src = svg_of(plot_diagram, diag, spec=spec)
        parts.append(f'<img alt="trainability diagram" src="{src}">')
    rows, names = _layer_rows(d.trajectory)
    parts.append("<h2>Per layer</h2>" + html_table(rows, names))
    if d.notes:
        parts.append("<h2>What the theory does not cover</h2><ul>")
        parts += [f"<li>{esc(n)}</li>" for n in d.notes]
        parts.append("</ul>")
    return "".join(parts)


def provenance(command: str | None) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("sigprop")
    except PackageNotFoundError:
        v = "unknown"
    cmd = f"<code>{esc(command)}</code>; " if command else ""
    return f'<p class="muted">{cmd}sigprop {esc(v)}</p>'


def _fix_layers(before, after) -> str:
    """Before / after per layer: measured cos and entropy, theory cos."""
    from .. import trajectory
    from . import tables

    mb, ma = (trajectory.wide(x.trajectory, "measured") for x in (before, after))
    tb, ta = (trajectory.wide(x.trajectory, "theory") for x in (before, after))
    layers = [x for x in mb.index if x in ma.index]
    cols = {}
    for name, frame, obs in (("cos before", mb, "cos"), ("cos after", ma, "cos"),
                             ("theory before", tb, "cos"), ("theory after", ta, "cos"),
                             ("entropy before", mb, "entropy"), ("entropy after", ma, "entropy")):
        cols[name] = tables.column([frame[obs].get(x) if obs in frame.columns else None
                                    for x in layers])
    rows = [{"layer": int(x), **{k: v[i] for k, v in cols.items()}}
            for i, x in enumerate(layers)]
    return html_table(rows, ["layer", *cols])


def render(d, *, fix: tuple[Any, Any] | None = None, diagram_grid: int = 64,
           command: str | None = None) -> str:
    """The report as one HTML string. ``fix = (before_diagnosis, FixReport)`` adds the fix's
    changes, the before/after verdicts and a before/after table per layer (then ``d`` is the
    re-diagnosis after the fix). ``command`` is recorded in the header."""
    title = f"sigprop diagnosis: {d.model}"
    body = [f"<h1>{esc(title)}</h1>", provenance(command)]
    if fix is not None:
        before, rep = fix
        body.append("<h2>Fix</h2><ul>" + "".join(f"<li>{esc(c)}</li>" for c in rep.changes)
                    + "</ul>")
        body.append(html_table([
            {"": "before", "model": before.model, "verdict": before.verdict,
             "predicted final cos": rep.predicted["before"]["final_cos"]},
            {"": "after", "model": d.model, "verdict": d.verdict,
             "predicted final cos": rep.predicted["after"]["final_cos"]}],
            ["", "model", "verdict", "predicted final cos"], left=("", "model", "verdict")))
        body.append("<h3>Per layer, before and after</h3>" + _fix_layers(before, d))
    body.append(_diagnosis_body(d, diagram_grid=diagram_grid))
    body.append(FOOTER)
    return document(title, body)


def write_report(d, path, **kwargs) -> None:
    """Write :func:`render`'s HTML to ``path`` (UTF-8)."""
    write_text(path, render(d, **kwargs))
