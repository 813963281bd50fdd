"""The comparison tables of docs/fixes.md, generated: ``sigprop fix MODEL --compare all`` on the
presets (through :func:`sigprop.analysis.compare.compare`), the JSON kept in
benchmarks/results/fixes_<model>.json and a Markdown table written between the page's
``<!-- fixes-table:start -->`` / ``end`` markers.

    python benchmarks/fixes_docs.py                 # bert-deep-48 at T 128, gpt2 at T 256
    python benchmarks/fixes_docs.py --quick         # a small BERT config (seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

from sigprop.analysis.compare import RANKING, compare

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "fixes.md"
RESULTS = ROOT / "benchmarks" / "results"
CASES = (("bert-deep-48", 128), ("gpt2", 256))


def _f(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"


def table(c: dict) -> str:
    """A Markdown table of one comparison (``FixComparison.to_dict()``, the JSON of ``sigprop fix
    MODEL --compare all --format json``)."""
    head = ("| fix | parameters | measured cos | theory cos | ent min | ent median | verdict |\n"
            "|---|---|---|---|---|---|---|\n")
    b = c["baseline"]
    lines = [f"| *baseline* | | {_f(b['measured']['cos_final'])} | "
             f"{_f((b['predicted'] or {}).get('cos_final'))} | "
             f"{_f(b['measured']['entropy_min'])} | {_f(b['measured']['entropy_median'])} | "
             f"{b['verdict']} |"]
    for r in c["methods"]:
        ps = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in r["params"].items())
        if r["error"]:
            lines.append(f"| {r['method']} | | | | | | n/a: {r['error']} |")
            continue
        m, p = r["measured"], r["predicted"] or {}
        lines.append(f"| {r['method']} | {ps} | {_f(m['cos_final'])} | "
                     f"{_f(p.get('cos_final'))} | {_f(m['entropy_min'])} | "
                     f"{_f(m['entropy_median'])} | {r['verdict']} |")
    rec = c["recommendation"]
    secs = f", {c['seconds']:.0f} s" if c.get("seconds") else ""
    return (f"**{c['model']}**, T = {c['seq_len']}, {c['seeds']} seed x {c['sequences']} "
            f"sequences{secs}: recommended `{rec['command']}`\n\n" + head
            + "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cases = CASES
    if args.quick:
        from sigprop.models.presets import PRESETS, shrink

        cases = ((shrink(PRESETS["bert-deep-48"], layers=12, hidden=64, heads=4,
                         intermediate=128, vocab=200), 32),)
    parts = []
    for model, T in cases:
        t0 = time.perf_counter()
        c = compare(model, "all", seq_len=T)
        d = {**c.to_dict(), "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{c.model}: {d['seconds']:.0f} s")
        if not args.quick:
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"fixes_{model}.json").write_text(json.dumps(d, indent=1,
                                                                    default=str) + "\n")
        parts.append(table(d))
    block = "\n".join(parts) + f"\nRanking: {RANKING}.\n"
    if args.quick:
        print(block)
        return
    text = PAGE.read_text()
    new = re.sub(r"(<!-- fixes-table:start -->\n).*?(<!-- fixes-table:end -->)",
                 lambda m: m.group(1) + block + m.group(2), text, flags=re.S)
    PAGE.write_text(new)


if __name__ == "__main__":
    main()
