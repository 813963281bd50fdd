"""Breadth pass: ``sigprop diagnose`` on every model type the installed transformers builds.

Each type's default config is shrunk (:func:`sigprop.models.zoo.small_config`), written to
``OUT/configs/TYPE/config.json`` and diagnosed through the command line in this process
(``sigprop.cli.run``), as a user would: ``diagnose TYPE/config.json --seq-len 32 --seeds 1
--sequences 1 --format json``. Every outcome is one JSON line in ``OUT/results.jsonl``:
``verdict`` (exit 0 and a verdict), ``refusal`` (exit 2, one line on stderr), ``traceback``
(an exception escaped the command: its class, message and innermost frames), ``timeout``, or
``no_build`` (transformers builds no small model of the type: not a sigprop outcome).
``has_attention`` says whether the built model holds self-attention. ``--shrink auto`` (the
default) retries a type whose width-shrunk model does not run on the inputs made for it with
the layers-only shrink (default widths: the width shrink can leave coupled sizes such as a
stage width and the hidden size inconsistent); the record keeps ``width_outcome``, and the
summary gives the share with and without those retries.

    python benchmarks/breadth.py --jobs 2 --out out/breadth          # every type
    python benchmarks/breadth.py --types bert,whisper --out out/b    # some
    python benchmarks/breadth.py --summary out/breadth               # the counts
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

ARGS = ["--seq-len", "32", "--seeds", "1", "--sequences", "1", "--format", "json",
        "--no-timing"]


#: how configs shrink: "width" (width 64, 2 layers), "layers" (2 layers, default widths), or
#: "auto" (width first; where the shrunk model does not run on the inputs made for it --
#: widths the shrink left inconsistent, such as a stage width and the hidden size -- layers)
SHRINK = ["auto"]


class Timeout(Exception):
    """A type ran past its time (``alarm``, set with ``signal.alarm``)."""


def alarm(signum, frame):
    raise Timeout


def read_results(root: Path) -> list[dict]:
    """Every record of the shards' ``results*.jsonl`` under ``root``, in file order."""
    return [json.loads(line) for p in sorted(root.glob("results*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()]


def run_shards(script: str, root: Path, jobs: int, args: list[str]) -> None:
    """``script --out root --shard i/jobs *args`` for every shard at once, each in its own
    process (one CPU thread each), and wait for them all."""
    procs = [subprocess.Popen([sys.executable, script, "--out", str(root), "--shard",
                               f"{i}/{jobs}", *args]) for i in range(jobs)]
    for p in procs:
        p.wait()


def one(mt: str, root: Path, timeout: int) -> dict:
    """The outcome for type ``mt`` under :data:`SHRINK`; ``"auto"`` records the width-shrink
    outcome it replaced as ``width_outcome``."""
    if SHRINK[0] != "auto":
        return _one(mt, root, timeout, SHRINK[0])
    rec = _one(mt, root, timeout, "width")
    if rec["outcome"] == "refusal" and "does not run on the" in rec.get("message", ""):
        again = _one(mt, root, timeout, "layers")
        if again["outcome"] not in ("no_build", "timeout"):
            again.update(width_outcome=rec["outcome"], width_message=rec["message"],
                         seconds=round(rec["seconds"] + again["seconds"], 2))
            return again
    return rec


def _one(mt: str, root: Path, timeout: int, mode: str) -> dict:
    import torch

    from sigprop.cli import run
    from sigprop.models import zoo

    rec: dict = {"type": mt, "shrink": mode}
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        d, why = zoo.small_config(mt, mode=mode)
        if d is None:
            rec.update(outcome="no_build", reason=why)
            return rec
        folder = root / "configs" / mt
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(d, default=str))
        try:
            from transformers import AutoConfig, AutoModel

            dd = dict(d)
            cfg = AutoConfig.for_model(dd.pop("model_type"), **dd)
            with torch.device("meta"):
                rec["has_attention"] = zoo.has_self_attention(AutoModel.from_config(cfg))
        except Exception:  # noqa: BLE001
            rec["has_attention"] = None
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                code = run(["diagnose", str(folder / "config.json"), *ARGS])
        except Timeout:
            raise
        except BaseException as exc:  # noqa: BLE001 - what we are counting
            tb = traceback.extract_tb(exc.__traceback__)
            rec.update(outcome="traceback", error=type(exc).__name__,
                       message=str(exc).splitlines()[0][:300] if str(exc) else "",
                       where=[f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb[-4:]])
            return rec
        if code == 0:
            try:
                js = json.loads(out.getvalue())
                rec.update(outcome="verdict", verdict=js.get("verdict"),
                           theory=any(r.get("source") == "theory" for r in js.get("rows", [])))
            except json.JSONDecodeError:
                rec.update(outcome="bad_output", message=out.getvalue()[:300])
        else:
            lines = [x for x in err.getvalue().splitlines() if x.strip()]
            rec.update(outcome="refusal" if code == 2 and len(lines) == 1 else "bad_exit",
                       code=code, message=(lines[-1] if lines else "")[:300],
                       lines=len(lines))
    except Timeout:
        rec.update(outcome="timeout")
    finally:
        signal.alarm(0)
        rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def shard(types: list[str], root: Path, timeout: int, path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    with path.open("a") as f:
        for mt in types:
            rec = one(mt, root, timeout)
            f.write(json.dumps(rec) + "\n")
            f.flush()


def summary(root: Path) -> dict:
    recs = {r["type"]: r for r in read_results(root)}
    from collections import Counter

    built = [r for r in recs.values() if r["outcome"] != "no_build"]
    att = [r for r in built if r.get("has_attention")]
    c = Counter(r["outcome"] for r in recs.values())
    out = {"types": len(recs), "outcomes": dict(c), "built": len(built),
           "self_attention": len(att),
           "verdict_self_attention": sum(r["outcome"] == "verdict" for r in att),
           "theory": sum(bool(r.get("theory")) for r in built)}
    out["verdict_share"] = round(out["verdict_self_attention"] / max(len(att), 1), 3)
    redone = [r for r in att if "width_outcome" in r]  # shrink "auto": the layers-only retries
    if redone:
        out["layers_retries"] = {"tried": len(redone), "verdict": sum(
            r["outcome"] == "verdict" for r in redone)}
        out["verdict_share_width_only"] = round(
            (out["verdict_self_attention"] - out["layers_retries"]["verdict"])
            / max(len(att), 1), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/breadth")
    ap.add_argument("--types", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--shard", default=None, help="i/n (internal)")
    ap.add_argument("--summary", default=None)
    ap.add_argument("--shrink", default="auto", choices=("auto", "width", "layers"))
    a = ap.parse_args()
    SHRINK[0] = a.shrink
    if a.summary:
        print(json.dumps(summary(Path(a.summary)), indent=1))
        return
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from sigprop.models import zoo

    types = a.types.split(",") if a.types else zoo.model_types()
    if a.shard:
        i, n = map(int, a.shard.split("/"))
        shard(types[i::n], root, a.timeout, root / f"results.{i}.jsonl")
        return
    for p in root.glob("results*.jsonl"):
        p.unlink()
    run_shards(__file__, root, a.jobs, ["--timeout", str(a.timeout), "--shrink", a.shrink]
               + (["--types", a.types] if a.types else []))
    print(json.dumps(summary(root), indent=1))


if __name__ == "__main__":
    main()
