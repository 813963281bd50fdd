"""Breadth pass of the in-step telemetry: ``AttentionTelemetry`` on one training-mode forward
of every model type the installed transformers builds.

Each type's default config is shrunk (:func:`sigprop.models.zoo.small_config`, width first,
then layers only where the width-shrunk model does not run on the inputs made for it), built
at init with SDPA attention where the type has it (:func:`sigprop.models.loading.
model_at_init`), given the inputs ``diagnose`` makes (2 sequences of 32 tokens, or images,
audio ...: :func:`sigprop.analysis.forward.model_inputs`), and run once in training mode
with gradients on while the telemetry's hooks are attached; ``end_step`` then gives the
step's statistics. Every outcome is one JSON line in ``OUT/results.jsonl``:

* ``read``: statistics for ``layers`` of the ``attention_layers`` the telemetry found
  (``unreadable``: layers it noted as unreadable, and the first reason in ``why``;
  ``finite``: every largest logit finite; ``nan_stats``: statistics that are NaN by design,
  e.g. entropy over rows with fewer than two visible keys);
* ``refusal``: the one-line SpecError naming what is missing (no Q/K projections found);
* ``traceback``: an exception escaped the telemetry (what this pass looks for);
* ``inputs_refused`` / ``forward_failed_model`` / ``no_build`` / ``timeout``: the model or
  its inputs, not the telemetry.

    python benchmarks/telemetry_breadth.py --jobs 2 --out out/telemetry_breadth
    python benchmarks/telemetry_breadth.py --types gpt2,llama --out out/tb
    python benchmarks/telemetry_breadth.py --summary out/telemetry_breadth
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from breadth import Timeout, alarm, read_results, run_shards  # noqa: E402 -- the harness


def _build(mt: str):
    """(model, config, inputs, enc_dec) or an outcome dict."""
    from transformers import AutoConfig

    from sigprop.analysis.forward import model_inputs, vocab_at_init
    from sigprop.models import zoo
    from sigprop.models.arch import input_kind
    from sigprop.models.loading import model_at_init
    from sigprop.spec import SpecError

    for mode in ("width", "layers"):
        d, why = zoo.small_config(mt, mode=mode)
        if d is None:
            return {"outcome": "no_build", "reason": str(why)[:200]}
        dd = dict(d)
        cfg = AutoConfig.for_model(dd.pop("model_type"), **dd)
        vs = getattr(cfg, "vocab_size", None)
        vocab = vocab_at_init(cfg, vs) if isinstance(vs, int) else 1024
        kw = {"vocab_size": vocab} if isinstance(vs, int) else {}
        try:
            m = model_at_init(cfg, seed=0, attn_implementation="sdpa", **kw)
        except (ValueError, ImportError, RuntimeError):  # no SDPA for this type
            m = model_at_init(cfg, seed=0, **kw)
        enc_dec = bool(getattr(cfg, "is_encoder_decoder", False))
        try:
            inputs, _, _ = model_inputs(m, cfg, input_kind(cfg), sequences=2, T=32,
                                        vocab=vocab, seed=0, device="cpu", enc_dec=enc_dec)
            return m, inputs, enc_dec
        except SpecError as e:
            if mode == "layers" or "does not run" not in str(e):
                return {"outcome": "inputs_refused", "message": str(e)[:200]}
    return {"outcome": "inputs_refused", "message": "no shrink ran"}


def one(mt: str, timeout: int = 120) -> dict:
    """The outcome for model type ``mt`` (module docstring)."""
    import torch

    from sigprop.analysis.forward import forward_once
    from sigprop.measurement.telemetry import AttentionTelemetry
    from sigprop.spec import SpecError

    rec: dict = {"type": mt}
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        built = _build(mt)
        if isinstance(built, dict):
            rec.update(built)
            return rec
        m, inputs, enc_dec = built
        try:
            tel = AttentionTelemetry(m, rows=4)
        except SpecError as e:
            rec.update(outcome="refusal", message=str(e)[:200])
            return rec
        m.train()
        try:
            forward_once(m, inputs, enc_dec)
        except Exception as e:  # noqa: BLE001 -- the model's own failure, hooks or not
            tel.close()
            rec.update(outcome="forward_failed_model",
                       message=f"{type(e).__name__}: {str(e)[:150]}")
            return rec
        st = tel.end_step(0)
        nan = sorted({k for v in st.values() for k, x in v.items()
                      if not k.startswith("slice:") and bool(torch.isnan(x).any())})
        rec.update(outcome="read", layers=len(st), attention_layers=len(tel.attention_layers),
                   unreadable=len(tel.unreadable), nan_stats=nan,
                   finite=all(bool(torch.isfinite(v["max_logit"]).all()) for v in st.values()))
        if tel.unreadable:
            rec["why"] = next(iter(tel.unreadable.values()))[:150]
        tel.close()
    except Timeout:
        rec.update(outcome="timeout")
    except BaseException as exc:  # noqa: BLE001 -- what this pass counts
        tb = traceback.extract_tb(exc.__traceback__)
        rec.update(outcome="traceback", error=type(exc).__name__,
                   message=str(exc).splitlines()[0][:200] if str(exc) else "",
                   where=[f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb[-4:]])
    finally:
        signal.alarm(0)
        rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def summary(root: Path) -> dict:
    rows = read_results(root)
    out = {"types": len(rows), "outcomes": dict(Counter(r["outcome"] for r in rows)),
           "tracebacks": [r for r in rows if r["outcome"] == "traceback"],
           "read_with_unreadable_layers": sorted(r["type"] for r in rows
                                                 if r["outcome"] == "read" and r["unreadable"]),
           "refusals": sorted(r["type"] for r in rows if r["outcome"] == "refusal")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/telemetry_breadth")
    ap.add_argument("--types", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--shard", default=None, help="i/n (internal)")
    ap.add_argument("--summary", default=None)
    a = ap.parse_args()
    if a.summary:
        print(json.dumps(summary(Path(a.summary)), indent=1))
        return
    import torch

    from sigprop.models import zoo

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    types = a.types.split(",") if a.types else zoo.model_types()
    if a.shard:
        i, n = map(int, a.shard.split("/"))
        with open(root / f"results{i}.jsonl", "w") as fh:
            for mt in types[i::n]:
                fh.write(json.dumps(one(mt, a.timeout)) + "\n")
                fh.flush()
        return
    run_shards(__file__, root, a.jobs,
               ["--timeout", str(a.timeout), *(["--types", a.types] if a.types else [])])
    print(json.dumps(summary(root), indent=1))


if __name__ == "__main__":
    main()
