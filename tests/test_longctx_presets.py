"""Acceptance of ``sigprop longctx MODEL`` on full-size presets (slow: minutes each; run with
``make test-slow``)."""

from __future__ import annotations

import json
import resource

import pytest

from sigprop.analysis import longctx_model as lm

pytestmark = pytest.mark.slow


def test_bert_base_ipr_within_003_of_theory_up_to_2_20():
    """bert-base-uncased (bidirectional, no RoPE): every layer and length within 0.03 on ipr
    (the Gaussian inputs are exactly a REM given the query; the error is the tables' and 128
    rows' sampling)."""
    r = lm.run("bert-base-uncased", [512, 8192, 131072, 1048576], queries=128, seed=0)
    m = r.trajectory
    own = m[(m.scaling == "none") & (m.observable == "ipr")]
    ipr = own.pivot_table(index=["layer", "seq_len"], columns="source", values="value")
    assert len(ipr) == 12 * 4
    assert float((ipr["measured"] - ipr["theory"]).abs().max()) <= 0.03


def test_llama_3_2_1b_acceptance_command(tmp_path):
    """The issue's command: 16 layers x 3 lengths (+ the training length 8192) x scalings in
    <= 10 min and <= 4 GB peak RSS on 2 cores (this test's process also holds pytest: the
    bound is checked on the child's own maximum)."""
    import subprocess
    import sys
    import time

    out = tmp_path / "run.json"
    t = time.perf_counter()
    with out.open("w") as fh:
        subprocess.run([sys.executable, "-m", "sigprop", "longctx", "llama-3.2-1b", "--lengths",
                        "4096,65536,1048576", "--queries", "128", "--format", "json"],
                       stdout=fh, check=True)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    d = json.loads(out.read_text())
    assert seconds <= 600
    assert peak <= 4e9
    assert len(d["layers"]) == 16 and d["lengths"] == [4096, 8192, 65536, 1048576]
    rows = d["rows"]
    for s in d["scalings"] + d["theory_only"]:
        th = [x for x in rows if x["scaling"] == s and x["source"] == "theory"
              and x["observable"] == "entropy"]
        assert len(th) == 16 * 4, s
    assert max(x["worst_gap"] for x in d["layers"]) <= 0.03


def test_gpt2_preset_recommendation_holds_after_fix(tmp_path):
    """gpt2 at init drifts by ~0.005 in entropy from its 1024 positions to 2^18; in a 0.003
    band the recommendation (a temperature, here) is re-measured in the run, applied with
    ``sigprop fix --longctx`` and the saved model, streamed again against the original bands,
    stays in band at 2^18. GPT-2 has no RoPE: theory within ~2e-4 of the measurement."""
    from typer.testing import CliRunner

    from sigprop.cli import app

    lengths = [1024, 16384, 262144]
    r = lm.run("gpt2", lengths, queries=128, seed=0, band=0.003)
    rec = r.recommendation
    assert not all(x["in_band"] for x in r.layers)
    assert rec["fix_command"] != "no change needed" and rec["holds_measured"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(r.to_json()))
    res = CliRunner().invoke(app, ["fix", "gpt2", "--out", str(tmp_path / "fixed"),
                                   "--longctx", str(run), "--seeds", "1", "--sequences", "1",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    again = lm.run(str(tmp_path / "fixed"), lengths, queries=128, seed=0,
                           bands=json.loads(run.read_text())["band"])
    assert again.info["own_scaling"] == rec["label"]
    assert all(x["in_band"] for x in again.layers)
