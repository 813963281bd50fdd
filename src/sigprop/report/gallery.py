"""The reproduction gallery: ``DIR/index.html`` of ``sigprop reproduce ... --out DIR``.

One page next to the files each item wrote (``NAME.svg``, ``NAME.png``, ``NAME.parquet``,
``NAME.table.parquet``, ``NAME.json``): a table of every item and its verdict at the top, the
findings where sigprop's measurement departs from a paper, then one card per item by paper —
the paper's claim with its number, the figure, its checks (measured value, band, verdict, the
tolerance's reason), the shrinking from the paper's set-up and links to the data. Figures are
linked by relative path (the folder can be zipped and opened anywhere); no scripts, CSS
inline, every string escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .html import PAGE_CSS, document, esc, num, provenance

_GALLERY_CSS = """
.pass{background:#2e7d32}.differs{background:#b26a00}.fail{background:#c62828}
.error{background:#6a1b9a}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:1.2em 0}
.card h3{margin:.2em 0 .4em 0;font-size:1.05em}
blockquote{margin:.4em 0;padding:.2em .8em;border-left:3px solid #bbb;color:#333}
.status{display:inline-block;padding:.05em .5em;border-radius:3px;color:#fff;
font-size:.85em;font-weight:600}
td.w{text-align:left;max-width:34em}
.fig img{max-height:420px}
"""

PAPER_TITLES = {
    "gg25": "Giorlandino & Goldt: two failure modes of deep transformers (gg25)",
    "clpr25": "Chen, Lin, Polyanskiy & Rigollet: critical attention scaling (clpr25)",
    "noci22": "Noci et al.: signal propagation and rank collapse (noci22)",
    "deshpande26": "Deshpande: a phase transition of attention collapse (deshpande26)",
    "mindthegap": "Naderi, Nait Saada & Tanner: mind the gap (mindthegap)",
}


def _status(s: str) -> str:
    return f'<span class="status {esc(s)}">{esc(s)}</span>'


def _anchor(name: str) -> str:
    return name.replace(".", "-")


def counts(results: Sequence) -> dict[str, int]:
    """Items per status (pass / differs / fail / error)."""
    out = {"pass": 0, "differs": 0, "fail": 0, "error": 0}
    for r in results:
        out[r.status] += 1
    return out


def _check_rows(results, items) -> str:
    """One row per item: its paper reference, title, checks held and verdict (each card lists
    the checks themselves)."""
    rows = []
    for r in results:
        it = items.get(r.name)
        held = sum(c.status != "fail" for c in r.checks)
        what = r.error or (it.title if it else "")
        secs = "" if math.isnan(r.seconds) else f"{r.seconds:.1f}"
        rows.append(f'<tr><td class=l><a href="#{_anchor(r.name)}">{esc(r.name)}</a></td>'
                    f"<td class=l>{esc(it.ref if it else '')}</td><td class=w>{esc(what)}</td>"
                    f"<td>{held}/{len(r.checks)}</td><td>{_status(r.status)}</td>"
                    f"<td>{secs}</td></tr>")
    return ("<table><tr><th class=l>item</th><th class=l>paper ref.</th><th class=l>what it "
            "shows</th><th>checks held</th><th>verdict</th><th>seconds</th></tr>"
            + "".join(rows) + "</table>")


def _differs(results, items) -> str:
    rows = []
    for r in results:
        it = items.get(r.name)
        for c in r.checks:
            if c.status == "differs":
                rows.append(f"<li><a href=\"#{_anchor(r.name)}\">{esc(r.name)}</a> "
                            f"({esc(it.ref if it else '')}): {esc(c.paper or c.claim)} "
                            f"<b>Measured: {num(c.measured)}</b> ({esc(c.expected)}).</li>")
    if not rows:
        return "<p>None in this run.</p>"
    return "<ul>" + "".join(rows) + "</ul>"


def _card(r, it, out: Path) -> str:
    ref = f"{it.paper} {it.ref}" if it else r.name
    head = (f'<div class="card" id="{_anchor(r.name)}"><h3>{esc(r.name)} — {esc(ref)}: '
            f"{esc(it.title if it else '')} {_status(r.status)}</h3>")
    parts = [head]
    if it is not None:
        parts.append(f"<blockquote>{esc(it.claim)}</blockquote>")
    if r.error:
        parts.append(f"<p><b>Error:</b> {esc(r.error)}</p>")
    for ext in ("svg", "png"):
        if (out / f"{r.name}.{ext}").exists():
            parts.append(f'<p class="fig"><img src="{esc(r.name)}.{ext}" '
                         f'alt="{esc(r.name)} figure"></p>')
            break
    if r.checks:
        rows = "".join(
            f"<tr><td class=w>{esc(c.claim)}</td><td>{num(c.measured)}</td>"
            f"<td class=l>{esc(c.expected)}</td><td>{_status(c.status)}</td>"
            f"<td class=w>{esc(c.why)}"
            f"{('<br><i>Paper: ' + esc(c.paper) + '</i>') if c.paper else ''}"
            f"</td></tr>" for c in r.checks)
        parts.append("<table><tr><th class=l>claim</th><th>measured</th><th class=l>held to"
                     "</th><th>verdict</th><th class=l>tolerance, and where the paper differs"
                     "</th></tr>" + rows + "</table>")
    if it is not None and it.differs:
        parts.append(f"<p><b>Differs from the paper:</b> {esc(it.differs)}</p>")
    if r.notes:
        parts.append(f"<p class=muted><b>Set-up:</b> {esc(r.notes)}</p>")
    if r.table is not None and len(r.table) and len(r.table) <= 40:
        parts.append(r.table.to_html(index=False, border=0, float_format=lambda x: f"{x:.4g}",
                                     na_rep="", escape=True))
    secs = "" if math.isnan(r.seconds) else f"{r.seconds:.1f} s"
    links = " · ".join(f'<a href="{esc(r.name)}{suf}">{esc(label)}</a>'
                       for suf, label in ((".parquet", "data (Parquet)"),
                                          (".table.parquet", "summary (Parquet)"),
                                          (".json", "checks (JSON)"))
                       if (out / f"{r.name}{suf}").exists())
    parts.append(f'<p class=muted>{esc(r.size)} size · {secs} · '
                 f'{"trains" if it and it.trains else "no training"} · {links}</p></div>')
    return "".join(parts)


def render_gallery(results: Sequence, out: str | Path, *, command: str | None = None,
                   items: dict | None = None) -> str:
    """The gallery page for ``results`` (Experiments already saved into ``out``)."""
    from ..reproduce.core import PAPERS
    from ..reproduce.core import items as registered

    out = Path(out)
    items = registered() if items is None else items
    n = counts(results)
    figs = sum(1 for r in results if (out / f"{r.name}.svg").exists())
    total = sum(r.seconds for r in results if not math.isnan(r.seconds))
    checks = sum(len(r.checks) for r in results)
    body = ["<h1>sigprop: the five seed papers, reproduced</h1>", provenance(command),
            f"<p>{len(results)} items, {figs} figures, {checks} checks in {total / 60:.1f} min: "
            + ", ".join(f"{_status(k)} {v}" for k, v in n.items() if v) + ".</p>",
            "<p class=muted>Each check states a paper's claim as a number held to a band; "
            "<i>differs</i> marks a claim where sigprop measures something other than the paper "
            "states, held to sigprop's corrected band (it can still fail).</p>",
            "<h2>Items</h2>", _check_rows(results, items),
            "<h2>Where sigprop's measurement differs from the papers</h2>",
            _differs(results, items)]
    for p in PAPERS:
        mine = [r for r in results if r.name.split(".", 1)[0] == p]
        if mine:
            body.append(f'<h2 id="{p}">{esc(PAPER_TITLES.get(p, p))}</h2>')
            body += [_card(r, items.get(r.name), out) for r in mine]
    return document("sigprop reproduce", body, PAGE_CSS + _GALLERY_CSS)


def write_gallery(results: Sequence, out: str | Path, **kwargs) -> Path:
    """Write ``out/index.html``; return its path."""
    path = Path(out) / "index.html"
    path.write_text(render_gallery(results, out, **kwargs), encoding="utf-8")
    return path
