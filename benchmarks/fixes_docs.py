"""The comparison tables of docs/fixes.md, generated: ``sigprop fix MODEL --compare all`` on the
presets (through :func:`sigprop.analysis.ranking.rank_fixes`), the JSON kept in
benchmarks/results/fixes_<model>.json and a Markdown table written between the page's
``<!-- fixes-table:start -->`` / ``end`` markers.

    python benchmarks/fixes_docs.py                 # bert-deep-48 T 128, gpt2 T 256, qwen2 T 128
    python benchmarks/fixes_docs.py --model gpt2    # one of them (then --render for the page)
    python benchmarks/fixes_docs.py --model gpt2 --seeds 2  # 2 initialisations per row
    python benchmarks/fixes_docs.py --quick         # a small BERT config (seconds)
    python benchmarks/fixes_docs.py --train         # bert-tiny-collapse, T 64, 200 steps each
    python benchmarks/fixes_docs.py --render        # the page's tables from the saved JSON
    python benchmarks/fixes_docs.py --refresh dyt,mix-ln  # those rows again in every saved
                                                    # JSON (after their theory changed)
    python benchmarks/fixes_docs.py --train --refresh sinks,dyt  # those trained, merged

``--train`` writes benchmarks/results/fixes_bert-tiny-collapse_train.json (the JSON of
``sigprop fix bert-tiny-collapse --compare all --seq-len 64 --train-steps 200 --format
json``) and its table between ``<!-- fixes-train:start -->`` / ``end``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

from sigprop.analysis.ranking import RANKING, fix_command, rank_fixes, ranked_rows

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "fixes.md"
RESULTS = ROOT / "benchmarks" / "results"
CASES = (("bert-deep-48", 128), ("gpt2", 256), ("qwen2-0.5b", 128))
TRAIN = ("bert-tiny-collapse", 64, 200)


def _f(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"


def _params(r: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in r["params"].items())


def table(c: dict) -> str:
    """A Markdown table of one comparison (``FixComparison.to_dict()``, the JSON of ``sigprop fix
    MODEL --compare all --format json``)."""
    head = ("| fix | parameters | measured cos | theory cos | ent min | ent median | kept | "
            "verdict |\n|---|---|---|---|---|---|---|---|\n")
    b = c["baseline"]
    lines = [f"| *baseline* | | {_f(b['measured']['cos_final'])} | "
             f"{_f((b['predicted'] or {}).get('cos_final'))} | "
             f"{_f(b['measured']['entropy_min'])} | {_f(b['measured']['entropy_median'])} | "
             f"{_f(b['measured'].get('kept'))} | {b['verdict']} |"]
    for r in c["methods"]:
        if r["error"]:
            lines.append(f"| {r['method']} | | | | | | | n/a: {r['error']} |")
            continue
        m, p = r["measured"], r["predicted"] or {}
        lines.append(f"| {r['method']} | {_params(r)} | {_f(m['cos_final'])} | "
                     f"{_f(p.get('cos_final'))} | {_f(m['entropy_min'])} | "
                     f"{_f(m['entropy_median'])} | {_f(m.get('kept'))} | {r['verdict']} |")
    rec = c["recommendation"]
    secs = f", {c['seconds']:.0f} s" if c.get("seconds") else ""
    only = [f"- {r['note'] if r['note'].startswith(r['method'] + ':') else r['method'] + ': '}"
            f"{'' if r['note'].startswith(r['method'] + ':') else r['note']}"
            for r in c["methods"]
            if not r["error"] and (r["predicted"] or {}).get("cos_final") is None
            and r.get("note")]
    tail = ("\nMeasured only (no theory cos), and why:\n\n" + "\n".join(only) + "\n"
            if only else "")
    n = c["seeds"]
    return (f"**{c['model']}**, T = {c['seq_len']}, {n} seed{'s' if n != 1 else ''} x "
            f"{c['sequences']} sequences{secs}: recommended `{rec['command']}`\n\n" + head
            + "\n".join(lines) + "\n" + tail)


def train_table(c: dict) -> str:
    """The training comparison: per fix its measured verdict at init and the loss gain after
    the steps (nats below the unigram baseline), in the comparison's rank order."""
    b = c["baseline"]
    lines = [f"| *baseline* | | {_f(b['measured']['cos_final'])} | "
             f"{_f(b['measured'].get('kept'))} | {b['verdict']} | {_f(b.get('train_gain'))} |"]
    for r in c["methods"]:
        if r["error"]:
            lines.append(f"| {r['method']} | | | | n/a: {r['error']} | |")
            continue
        lines.append(f"| {r['method']} | {_params(r)} | {_f(r['measured']['cos_final'])} | "
                     f"{_f(r['measured'].get('kept'))} | {r['verdict']} | "
                     f"{_f(r.get('train_gain'))} |")
    ok = [r for r in c["methods"] if not r["error"] and r["verdict"] == "trainable"]
    below = all(r["train_gain"] is not None and b.get("train_gain") is not None
                and b["train_gain"] < r["train_gain"] for r in ok)
    secs = f", {c['seconds'] / 60:.0f} min on 2 cores" if c.get("seconds") else ""
    return (f"**{c['model']}**, T = {c['seq_len']}, {c.get('train_steps', TRAIN[2])} steps "
            f"per fix{secs}: the baseline's gain is "
            f"{'below' if below else 'NOT below'} every fix measured trainable "
            f"({len(ok)} of them).\n\n"
            "| fix | parameters | measured cos | kept | verdict | loss gain (nats) |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def _replace(text: str, marker: str, block: str) -> str:
    return re.sub(rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)",
                  lambda m: m.group(1) + block + m.group(2), text, flags=re.S)


def _recommend(model: str, r: dict) -> dict:
    """The comparison's recommendation from its top row (as sigprop.analysis.ranking)."""
    return {"method": r["method"], "params": r["params"], "verdict": r["verdict"],
            "measured": r["measured"], "predicted": r["predicted"],
            "command": fix_command(model, r["method"], r["params"])}


def _saved_tables() -> str:
    """The page's comparison block from every saved JSON of :data:`CASES`."""
    parts = [table(json.loads((RESULTS / f"fixes_{m}.json").read_text()))
             for m, _ in CASES if (RESULTS / f"fixes_{m}.json").exists()]
    return "\n".join(parts) + f"\nRanking: {RANKING}.\n"


def train_merge(names: list[str]) -> None:
    """Train ``names`` (and the baseline) as ``--train`` does and merge their rows into the
    saved training comparison, re-ranked; the baseline's gain must equal the saved one (the
    same run, so the rows compare), else nothing is written."""
    path = RESULTS / f"fixes_{TRAIN[0]}_train.json"
    d = json.loads(path.read_text())
    t0 = time.perf_counter()
    c = rank_fixes(TRAIN[0], names, seq_len=TRAIN[1], train_steps=TRAIN[2]).to_dict()
    secs = round(time.perf_counter() - t0, 1)
    old, new = d["baseline"].get("train_gain"), c["baseline"].get("train_gain")
    if old is None or new is None or abs(old - new) > 1e-6:
        raise SystemExit(f"baseline gain {new} differs from the saved run's {old}: not merged")
    rows = {r["method"]: r for r in d["methods"]}
    rows.update({r["method"]: r for r in c["methods"]})
    d["methods"] = ranked_rows(rows.values())
    d["seconds"] = round(d.get("seconds", 0) + secs, 1)
    d.setdefault("merged", {})[",".join(names)] = secs
    path.write_text(json.dumps(d, indent=1, default=str) + "\n")
    print(f"{TRAIN[0]}: {len(names)} methods trained in {secs:.0f} s, baseline gain {new:.6f}")
    PAGE.write_text(_replace(PAGE.read_text(), "fixes-train", train_table(d)))


def refresh(names: list[str], cases) -> None:
    """Recompute ``names``' rows of each saved comparison (same model, length and seeds: the
    measured numbers are those of the full run; what changed is the code, e.g. a new theory)
    and render the page's tables again."""
    for model, T in cases:
        path = RESULTS / f"fixes_{model}.json"
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        t0 = time.perf_counter()
        new = {r["method"]: r for r in rank_fixes(model, names, seq_len=T,
                                                  seeds=int(d.get("seeds", 1))
                                                  ).to_dict()["methods"]}
        d["methods"] = ranked_rows(new.get(r["method"], r) for r in d["methods"])
        d["recommendation"] = _recommend(model, d["methods"][0])
        d.setdefault("refreshed", {})[",".join(names)] = round(time.perf_counter() - t0, 1)
        path.write_text(json.dumps(d, indent=1, default=str) + "\n")
        print(f"{model}: {', '.join(names)} again in {time.perf_counter() - t0:.0f} s")
    PAGE.write_text(_replace(PAGE.read_text(), "fixes-table", _saved_tables()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--model", choices=[m for m, _ in CASES], help="compute this preset only")
    ap.add_argument("--seeds", type=int, default=1,
                    help="initialisations per row (a comparison's mean; default 1)")
    ap.add_argument("--refresh", metavar="NAMES",
                    help="recompute these methods' rows in the saved JSON, then render")
    args = ap.parse_args()
    if args.refresh and not args.train:
        refresh([m for m in args.refresh.split(",") if m],
                [c for c in CASES if args.model in (None, c[0])])
        return
    if args.train and args.refresh:  # these methods trained, merged into the saved run
        train_merge([m for m in args.refresh.split(",") if m])
        return
    if args.train or args.render:
        path = RESULTS / f"fixes_{TRAIN[0]}_train.json"
        if args.train:
            t0 = time.perf_counter()
            c = rank_fixes(TRAIN[0], "all", seq_len=TRAIN[1], train_steps=TRAIN[2])
            d = {**c.to_dict(), "seconds": round(time.perf_counter() - t0, 1),
                 "train_steps": TRAIN[2]}
            path.write_text(json.dumps(d, indent=1, default=str) + "\n")
        text = PAGE.read_text()
        if path.exists():
            text = _replace(text, "fixes-train", train_table(json.loads(path.read_text())))
        if args.render:
            text = _replace(text, "fixes-table", _saved_tables())
        PAGE.write_text(text)
        return
    cases = tuple(c for c in CASES if args.model in (None, c[0]))
    if args.quick:
        from sigprop.models.presets import PRESETS, shrink

        cases = ((shrink(PRESETS["bert-deep-48"], layers=12, hidden=64, heads=4,
                         intermediate=128, vocab=200), 32),)
    parts = []
    for model, T in cases:
        t0 = time.perf_counter()
        c = rank_fixes(model, "all", seq_len=T, seeds=args.seeds)
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
    if args.model:  # one preset: the page is rendered from every saved JSON
        block = _saved_tables()
    PAGE.write_text(_replace(PAGE.read_text(), "fixes-table", block))


if __name__ == "__main__":
    main()
