"""``sigprop bench monitor`` (issue 37): the telemetry's overhead on a training step, at its
quick size through the command line. No timing is asserted (the machine is shared): only
that every variant gives a finite overhead and the JSON has its structure."""

from __future__ import annotations

import json
import math

from sigprop.bench import core
from sigprop.bench.monitor import VARIANTS, VOCAB_VARIANTS
from sigprop.cli import run


def test_monitor_bench_quick_json(capsys, tmp_path):
    assert "monitor" in core.benchmarks()
    saved = tmp_path / "bench.json"
    assert run(["bench", "monitor", "--size", "quick", "--format", "json", "--out",
                str(saved)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["size"] == "quick" and res["machine"]["device"] == "cpu"
    (b,) = res["benchmarks"]
    assert b["name"] == "monitor" and "error" not in b, b.get("error")
    figs = {f["name"]: f for f in b["figures"]}
    vocab = [f"monitor/gpt2-vocab-{v}" for v in VOCAB_VARIANTS[1:]]
    want = [f"monitor/{v}" for v in VARIANTS[1:]] + ["monitor/telemetry-compute"] + vocab
    assert sorted(figs) == sorted(want)
    for name in vocab:  # the second model: GPT-2's vocabulary (512 at the quick size)
        f = figs.pop(name)
        assert math.isfinite(f["ratio"]) and f["sigprop_s"] > 0 and f["reference_s"] > 0
        assert f["size"]["vocab"] == 512 and f["size"]["rounds"] == 1
        assert len(f["size"]["per_step_s"]) == 1 and f["target"] in ("<= 5%", "<= 1%")
    for name, f in figs.items():
        assert math.isfinite(f["ratio"]), name
        assert f["sigprop_s"] > 0 and f["reference_s"] > 0, name
        size = f["size"]
        m = size["machine"]
        assert m["cpu_model"] and m["threads"] == 1 and m["device"] == "cpu"
        assert size["rounds"] == 2 and size["steps_timed"] == 2 * size["steps_per_round"]
        assert size["steps_per_round"] % 10 == 0  # an every-10 variant reads once a block
    for v in VARIANTS[1:]:
        f = figs[f"monitor/{v}"]
        assert f["unit"].startswith("fraction: overhead")
        assert len(f["size"]["per_step_s"]) == len(f["size"]["reference_per_step_s"]) == 2
        assert all(x > 0 for x in f["size"]["per_step_s"])
    # targets beside the values, never a failure
    assert figs["monitor/telemetry-every-1"]["target"] == "<= 5%"
    assert figs["monitor/telemetry-every-10"]["target"] == "<= 1%"
    assert isinstance(figs["monitor/telemetry-every-1"]["ok"], bool)
    assert figs["monitor/held-batch-monitor-every-1"]["ok"] is None
    comp = figs["monitor/telemetry-compute"]
    assert comp["size"]["dominant"] in ("hooks", "compute", "end_step")
    assert {"hooks", "compute", "end_step", "rest"} <= set(comp["size"]["parts_s"])
    assert comp["size"]["compute_per_step_s"] and all(
        x > 0 for x in comp["size"]["compute_per_step_s"])
    assert comp["size"]["compute_ops"]  # the profiler named the operations
    assert "dominant" in comp["notes"]
    # the default output, the bench table (here of the saved run): overheads in percent
    assert run(["bench", "--from", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "monitor/telemetry-every-1" in out and "%" in out
