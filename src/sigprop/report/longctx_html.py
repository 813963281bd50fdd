"""One self-contained HTML page for the per-layer long-context analysis of a model
(``sigprop longctx MODEL``).

The page follows :mod:`.html` (the diagnosis report): CSS inline, the figure as a base64 SVG
``data:`` URI, no scripts and no external assets, every string from the user or the model
escaped. Sections: a header (model, lengths, training length, query rows, time, command line
and sigprop version), the recommended scaling with its fix command, the figure of
:func:`sigprop.plotting.longctx_model.plot_model_longctx`, a table with one row per attention
layer, and the notes. Missing values print as an em dash.

The result is duck-typed: any object with ``model``, ``trajectory``, ``band``, ``layers``,
``recommendation`` and ``info`` attributes will do.
"""

from __future__ import annotations

import math
from typing import Any

from ..plotting.longctx_model import band_of, plot_model_longctx
from .html import (
    FOOTER,
    PAGE_CSS,
    document,
    esc,
    html_table,
    num,
    provenance,
    svg_of,
    write_text,
)

MISSING = "—"

_EXTRA_CSS = """
.rec{border:1px solid #c9d6ea;background:#f3f7fc;border-radius:6px;padding:.6em 1em;
margin:.8em 0}.rec h2{margin-top:.2em;border:none}
.rec pre{background:#fff;border:1px solid #ddd;border-radius:4px;padding:.5em .8em;
overflow-x:auto;margin:.5em 0}
"""

#: per-layer table: (key in the layer dict, column heading)
LAYER_COLUMNS = (
    ("layer", "layer"),
    ("sigma_s", "σ_s at T_train"),
    ("beta", "β"),
    ("rho", "ρ (token cosine)"),
    ("gamma_c", "γ_c"),
    ("theory_fit", "theory"),
    ("spread_exponent", "spread exponent"),
    ("worst_gap", "worst ipr gap"),
    ("band", "entropy band"),
    ("in_band", "in band"),
)


def _missing(x: Any) -> bool:
    if x is None:
        return True
    try:
        return isinstance(x, float) and math.isnan(x)
    except TypeError:
        return False


def _cell(x: Any) -> Any:
    """A table cell: a dash when missing, yes / no for booleans, numbers to 4 significant
    digits; strings are left for :func:`.html.html_table` to escape."""
    if _missing(x):
        return MISSING
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return num(x)
    try:  # numpy scalars
        import numpy as np

        if isinstance(x, np.bool_):
            return "yes" if bool(x) else "no"
        if isinstance(x, np.integer | np.floating):
            return _cell(x.item())
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return str(x)


def _text(x: Any) -> str:
    """An escaped inline value, a dash when missing."""
    c = _cell(x)
    return c if c == MISSING else esc(c)


def _band_text(band: dict | None, layer: Any) -> str | None:
    b = None if layer is None else band_of(band, layer)
    return None if b is None else f"{b[0]:.3g} – {b[1]:.3g}"


def _lengths_text(lengths: Any) -> str:
    if not lengths:
        return MISSING
    return ", ".join(esc(t) for t in lengths)


def _header(result, command: str | None) -> str:
    info = getattr(result, "info", None) or {}
    try:
        seconds = float(info.get("seconds"))
    except (TypeError, ValueError):
        seconds = math.nan
    time = f"{seconds:.1f} s" if math.isfinite(seconds) else MISSING
    return (provenance(command)
            + '<p class="muted">'
            + f"context lengths T: {_lengths_text(info.get('lengths'))}; "
            + f"training length {_text(info.get('train_len'))}; "
            + f"{_text(info.get('queries'))} query rows; "
            + f"time {time}</p>")


def _recommendation(rec: dict | None) -> str:
    if not rec:
        return ('<div class="rec"><h2>Recommendation</h2>'
                f"<p>{MISSING} (no recommendation)</p></div>")
    scaling = rec.get("scaling")
    param = rec.get("scaling_param")
    holds = rec.get("holds_measured")
    verdict = {True: "the measurements bear it out",
               False: "the measurements do not bear it out",
               None: "not checked against measurements"}.get(holds, esc(holds))
    parts = ['<div class="rec"><h2>Recommendation</h2>',
             f"<p>scaling <b>{_text(scaling)}</b>"]
    if not _missing(param):
        parts.append(f" (parameter {_text(param)})")
    parts.append(f"; size {_text(rec.get('size'))}; {verdict}.</p>")
    if rec.get("reason"):
        parts.append(f"<p>{esc(rec['reason'])}</p>")
    cmd = rec.get("fix_command")
    if cmd:
        parts.append(f"<p>To apply it:</p><pre><code>{esc(cmd)}</code></pre>")
    parts.append("</div>")
    return "".join(parts)


def _layer_table(layers: list[dict] | None, band: dict | None) -> str:
    if not layers:
        return f"<p>{MISSING} (no per-layer results)</p>"
    rows = []
    for d in layers:
        row = {key: _cell(d.get(key)) for key, _ in LAYER_COLUMNS if key != "band"}
        row["band"] = _cell(_band_text(band, d.get("layer")))
        rows.append({head: row[key] for key, head in LAYER_COLUMNS})
    heads = [head for _, head in LAYER_COLUMNS]
    return html_table(rows, heads, left=("theory",))


def _real_table(result) -> str:
    """The model itself on real text beside the stream (trained weights): one row per layer
    and length read, then which scalings hold on real text; empty without a real check."""
    info = getattr(result, "info", None) or {}
    real = info.get("real")
    if not real:
        return ""
    rows = []
    for d in getattr(result, "layers", None) or []:
        per = d.get("real") or {}
        for i, T in enumerate(per.get("seq_len", [])):
            rows.append({"layer": d.get("layer"), "T": T,
                         "entropy real": _cell(per["entropy_real"][i]),
                         "entropy stream": _cell(per["entropy_stream"][i]),
                         "ipr real": _cell(per["ipr_real"][i]),
                         "ipr stream": _cell(per["ipr_stream"][i]),
                         "within": _cell(d.get("real_within")),
                         "in band": _cell(d.get("real_in_band"))})
    heads = ["layer", "T", "entropy real", "entropy stream", "ipr real", "ipr stream",
             "within", "in band"]
    rec = getattr(result, "recommendation", None) or {}
    holds = rec.get("real_holds") or {}
    pick = rec.get("real_choice")
    tail = ""
    if holds:
        tail += "<p>On real text, in band in every layer: " + ", ".join(
            f"{esc(str(k))} {'yes' if v else 'no'}" for k, v in holds.items()) + ".</p>"
    if pick:
        tail += (f"<p>The smallest change that holds on real text up to T = {pick['up_to']}: "
                 f"<b>{esc(str(pick['label']))}</b></p><pre><code>"
                 f"{esc(str(pick['fix_command']))}</code></pre>")
    return (f"<h2>Real text read by the model itself</h2><p class=\"muted\">"
            f"{esc(str(real.get('source')))}, {real.get('sequences')} sequence(s) per length; "
            f"within: every difference of the layer at most {real.get('tolerance')}; in band: "
            "the real entropy, as it is, within the band of its value at the training "
            "length.</p>" + html_table(rows, heads) + tail)


def _figure(result) -> str:
    traj = getattr(result, "trajectory", None)
    if traj is None or not len(traj):
        return f"<p>{MISSING} (no trajectory to plot)</p>"
    obs = set(traj["observable"]) & {"entropy", "ipr"}
    if not obs:
        return f"<p>{MISSING} (no entropy or ipr rows to plot)</p>"
    src = svg_of(plot_model_longctx, traj, band=getattr(result, "band", None))
    measured = bool((traj["source"] == "measured").any())
    legend = ("lines: theory; markers: measured ± standard error"
              + ("; hollow squares: the model itself on real text" if
                 (traj["source"] == "real").any() else "")
              + "; shaded: the stated entropy band of each layer" if measured else
              "lines: theory (no measured rows); shaded: the stated entropy band of each layer")
    return (f'<img alt="entropy and ipr per layer against context length" src="{src}">'
            f'<p class="muted">{legend}.</p>')


def render_longctx_report(result, *, command: str | None = None) -> str:
    """The report as one HTML string; ``command`` (the command line) goes in the header."""
    model = getattr(result, "model", None)
    title = f"sigprop longctx: {model if model is not None else MISSING}"
    band = getattr(result, "band", None)
    info = getattr(result, "info", None) or {}
    body = [f"<h1>{esc(title)}</h1>", _header(result, command),
            _recommendation(getattr(result, "recommendation", None)),
            "<h2>Entropy and ipr against context length</h2>", _figure(result),
            "<h2>Per layer</h2>", _layer_table(getattr(result, "layers", None), band),
            _real_table(result)]
    notes = info.get("notes") or []
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes)
                    + "</ul>")
    body.append(FOOTER)
    return document(title, body, PAGE_CSS + _EXTRA_CSS)


def write_longctx_report(path, result, **kwargs) -> None:
    """Write :func:`render_longctx_report`'s HTML to ``path`` (UTF-8)."""
    write_text(path, render_longctx_report(result, **kwargs))
