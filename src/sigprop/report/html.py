"""One self-contained HTML report of a diagnosis (``sigprop diagnose --report FILE.html``).

Everything is inline: CSS in a ``<style>`` element, figures as base64 PNG ``data:`` URIs, no
scripts, no external assets, so the file can be mailed or attached to a paper's supplement.
Every string that comes from the user or the model (names, paths, notes) goes through
:func:`html.escape`. Figures: depth curves (theory lines, measured dots with standard errors),
a per-head heat map of attention entropy, and the (beta, alpha_attn) trainability diagram with
the model's own point (THEORY §2.7).
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

from .figures import _pyplot, plot_depth, plot_diagram

_CSS = """
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


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return _e(x)
    if isinstance(x, float) and math.isnan(x):
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return _e(x)
    return f"{x:.4g}"


def _png(draw, *args, **kwargs) -> str:
    """Run a path-taking figure function into memory; return an ``<img>`` data URI."""
    buf = io.BytesIO()
    draw(*args, buf, **kwargs)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plot_head_heatmap(heads, path, observable: str = "entropy", dpi: int = 130) -> None:
    """Layers x heads heat map of a per-head statistic (mean over seeds and sequences);
    entropy is THEORY §1's normalised row entropy (1 = uniform, 0 = one-hot)."""
    plt = _pyplot()
    sub = heads[heads["observable"] == observable]
    grid = sub.pivot_table(index="layer", columns="head", values="value", aggfunc="mean")
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * grid.shape[1], 9),
                                    min(1.6 + 0.16 * grid.shape[0], 9)), constrained_layout=True)
    im = ax.imshow(grid.to_numpy(), aspect="auto", cmap="viridis", origin="lower",
                   extent=(-0.5, grid.shape[1] - 0.5, grid.index.min() - 0.5,
                           grid.index.max() + 0.5), interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    label = "entropy / log(#keys)" if observable == "entropy" else observable
    fig.colorbar(im, ax=ax, label=label)
    ax.set_title(f"per-head {observable}", fontsize=10)
    fig.savefig(path, dpi=dpi, format="png")
    plt.close(fig)


def _table(rows: list[dict], cols: list[str], left: tuple[str, ...] = ()) -> str:
    head = "".join(f'<th class="{"l" if c in left else ""}">{_e(c)}</th>' for c in cols)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if c in left else ""}">{_num(r.get(c))}</td>'
                         for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _layer_rows(traj) -> tuple[list[dict], list[str]]:
    obs = ("cos", "ipr", "entropy", "wmax", "stable_rank")
    sub = traj[traj["observable"].isin(obs)]
    wide = sub.pivot_table(index="layer", columns=["observable", "source"], values="value",
                           aggfunc="mean")
    cols = [c for o in obs for c in ((o, "measured"), (o, "theory")) if c in wide.columns]
    names = ["layer"] + [f"{o} ({'meas' if s == 'measured' else 'theory'})" for o, s in cols]
    rows = [{"layer": int(layer), **{n: float(wide.loc[layer, c])
                                     for n, c in zip(names[1:], cols, strict=True)}}
            for layer in wide.index]
    return rows, names


def _diagnosis_body(d, *, diagram_grid: int = 64) -> str:
    from ..diagnose import head_extremes
    from ..theory import diagram as dg

    spec = d.spec
    parts = [f'<p>verdict <span class="verdict {_e(d.verdict)}">{_e(d.verdict)}</span>']
    if d.first_failing_layer is not None:
        parts.append(f" from layer {_e(d.first_failing_layer)}")
    if d.failing_heads:
        parts.append(" (heads " + _e(", ".join(str(h) for h in d.failing_heads)) + ")")
    parts.append(f'</p><p class="muted">{_e(spec.depth)} layers, d={_e(spec.d_model)}, '
                 f'{_e(spec.heads)} heads, T={_e(spec.seq_len)}, {_e(spec.norm)}-LN, '
                 f'{_e(spec.activation)}; {"trained weights" if d.trained else "at init"}; '
                 f'measured in {d.seconds:.1f} s</p>')
    parts.append("<h2>Recommendations</h2><ul>")
    parts += [f"<li>{_e(r.get('text', r.get('what')))}</li>" for r in d.recommendations]
    parts.append("</ul>")
    parts.append("<h2>Derived parameters (THEORY §6)</h2>")
    parts.append(_table([{"name": k, "value": v} for k, v in d.derived.items()],
                        ["name", "value"], left=("name",)))
    parts.append("<h2>Depth curves: theory (lines) and measured (dots)</h2>")
    obs = tuple(o for o in ("cos", "ipr", "entropy", "stable_rank")
                if o in set(d.trajectory["observable"]))
    src = _png(plot_depth, d.trajectory, spec=spec, observables=obs, dpi=110)
    parts.append(f'<img alt="depth curves" src="{src}">')
    if len(d.heads) and "entropy" in set(d.heads["observable"]):
        parts.append("<h2>Attention entropy per head</h2>")
        parts.append(f'<img alt="per-head entropy" src="{_png(plot_head_heatmap, d.heads)}">')
        ext = head_extremes(d.heads)
        parts.append(_table(ext, ["layer", "min_entropy_head", "min_entropy",
                                  "max_entropy_head", "max_entropy"]))
    parts.append("<h2>Trainability diagram with this model's point</h2>")
    diag = dg.compute(spec, n_beta=diagram_grid, n_alpha=diagram_grid, rho0=d.rho0)
    src = _png(plot_diagram, diag, spec=spec, dpi=110)
    parts.append(f'<img alt="trainability diagram" src="{src}">')
    rows, names = _layer_rows(d.trajectory)
    parts.append("<h2>Per layer</h2>" + _table(rows, names))
    if d.notes:
        parts.append("<h2>What the theory does not cover</h2><ul>")
        parts += [f"<li>{_e(n)}</li>" for n in d.notes]
        parts.append("</ul>")
    return "".join(parts)


def render(d, *, fix: tuple[Any, Any] | None = None, diagram_grid: int = 64) -> str:
    """The report as one HTML string. ``fix = (before_diagnosis, FixReport)`` adds the fix's
    changes and the before/after verdicts (then ``d`` is the re-diagnosis after the fix)."""
    title = f"sigprop diagnosis: {d.model}"
    body = [f"<h1>{_e(title)}</h1>"]
    if fix is not None:
        before, rep = fix
        body.append("<h2>Fix</h2><ul>" + "".join(f"<li>{_e(c)}</li>" for c in rep.changes)
                    + "</ul>")
        body.append(_table([
            {"": "before", "model": before.model, "verdict": before.verdict,
             "predicted final cos": rep.predicted["before"]["final_cos"]},
            {"": "after", "model": d.model, "verdict": d.verdict,
             "predicted final cos": rep.predicted["after"]["final_cos"]}],
            ["", "model", "verdict", "predicted final cos"], left=("", "model", "verdict")))
    body.append(_diagnosis_body(d, diagram_grid=diagram_grid))
    body.append('<p class="muted">sigprop: predict, measure and prevent rank and entropy '
                'collapse at initialisation.</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            + "".join(body) + "</body></html>\n")


def write_report(d, path, **kwargs) -> None:
    """Write :func:`render`'s HTML to ``path`` (UTF-8)."""
    text = render(d, **kwargs)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
