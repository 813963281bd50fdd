"""The one memory estimator (sigprop.measurement.memory): refusals before allocation, suggested
settings that fit, monotone estimates, and (slow) accuracy against measured peak RSS."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest

from sigprop.cli import run
from sigprop.measurement import memory
from sigprop.spec import ArchSpec, SpecError

GB = 1e9


@pytest.mark.parametrize("args, field", [
    (["measure", "--depth", "1", "--d-model", "8", "--heads", "1", "--seq-len", "1000000"],
     "seq_len"),
    (["measure", "--seeds", "4096", "--sequences", "4096"], "sequences"),
    (["longctx", "--lengths", "2^30"], "lengths"),
    (["train", "--d-model", "1000000", "--heads", "1"], "d_model"),
    (["trainability", "--seq-len", "65536"], "seq_len"),
])
def test_refusals_are_fast_one_line_exit_2(args, field, capsys):
    t0 = time.perf_counter()
    rc = run(args)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip()
    # train / trainability: the CLI builds the corpus and tokenizer (~15 s with a cold cache)
    # before the library's check runs; nothing big is allocated either way
    limit = 60 if args[0] in ("train", "trainability") else 5
    assert rc == 2 and took < limit, (rc, took, err)
    assert len(err.splitlines()) == 1 and err.startswith("sigprop: error: ")
    opt = "--" + field.replace("_", "-")
    assert opt in err or f"error: {field}:" in err, err
    assert "fit" in err, err


def test_longctx_default_top_length_is_within_the_work_bound():
    memory.check_work([2**k for k in range(9, 21)], 256, 4)  # --compare, 2^9..2^20
    with pytest.raises(SpecError, match="lengths up to 2"):
        memory.check_work([2**30], 256)


def _suggested(msg: str) -> dict[str, int]:
    return {k.replace("-", "_"): int(v) for k, v in re.findall(r"--([a-z-]+) (\d+)", msg)}


def _apply(kw: dict, sug: dict) -> dict:
    out = dict(kw)
    for k, v in sug.items():
        if k in ("seq_len", "d_model"):
            out["spec"] = out["spec"].replace(**{k: v})
        else:
            out[k] = v
    return out


BERT = ArchSpec()
CASES = [
    ("measure", dict(spec=BERT.replace(seq_len=8192), seeds=4, sequences=2),
     {"seq_len": 2, "sequences": 1, "seeds": 1}),
    ("measure", dict(spec=BERT, seeds=512, sequences=64), {"seq_len": 2, "sequences": 1,
                                                          "seeds": 1}),
    ("train", dict(spec=BERT.replace(seq_len=4096), batch_size=64, slices=3, vocab=2000),
     {"seq_len": 2, "batch_size": 1, "d_model": 12}),
    ("train", dict(spec=ArchSpec(d_model=8192, heads=8, depth=2, seq_len=64), batch_size=8,
                   slices=1, vocab=2000), {"seq_len": 2, "batch_size": 1, "d_model": 8}),
    ("diagnose", dict(spec=BERT.replace(seq_len=4096), sequences=8, vocab=4096),
     {"seq_len": 16, "sequences": 1}),
    ("longctx", dict(spec=BERT, lengths=[2**20], queries=4096, chunk=2**20, n_scalings=4,
                     workers=2), {"chunk": 16, "queries": 1}),
]


@pytest.mark.parametrize("kind, kw, shrink", CASES)
def test_suggested_setting_passes_the_check(kind, kw, shrink):
    have = 4 * GB
    with pytest.raises(SpecError) as err:
        memory.check(kind, shrink=shrink, have=have, **kw)
    msg = str(err.value)
    assert "\n" not in msg and "GB are available" in msg
    sug = _suggested(msg)
    assert sug and err.value.field in sug, msg
    assert memory.check(kind, shrink=shrink, have=have, **_apply(kw, sug)) > 0


def test_spectra_dense_refused_before_allocating():
    import torch

    from sigprop.measurement import spectra

    q = torch.zeros(2**20, 2, dtype=torch.float64)
    op = spectra.AttentionOperator(q, q)
    with pytest.raises(SpecError, match="GB"):
        op.to_dense()  # 8.8 TB


def test_diagnose_refuses_with_a_fitting_suggestion(monkeypatch):
    from sigprop import models as hf
    from sigprop.analysis import diagnose as dg

    monkeypatch.setattr(dg, "available_memory", lambda: 1.5 * GB)
    with pytest.raises(SpecError) as err:
        dg.diagnose("gpt2", seq_len=1024, seeds=1, sequences=64)
    sug = _suggested(str(err.value))
    assert sug and err.value.field in ("seq_len", "sequences")
    config = hf.load_config("gpt2")
    spec = hf.spec_and_info(config, sug.get("seq_len", 1024))[0]
    dg.check_memory(config, spec, sug.get("sequences", 64), 4096)


SIZES = {
    "measure": ("seeds", "sequences", "seq_len", "d_model", "depth"),
    "train": ("batch_size", "slices", "seq_len", "d_model", "depth"),
    "diagnose": ("sequences", "seq_len", "d_model", "depth"),
    "longctx": ("queries", "chunk", "n_scalings", "workers", "lengths", "d_model"),
    "spectra": ("seq_len", "n_keys", "width", "n_iter", "block", "workers"),
}
BASE = {
    "measure": dict(spec=ArchSpec(depth=2, d_model=64, heads=2, seq_len=64), seeds=2,
                    sequences=2),
    "train": dict(spec=ArchSpec(depth=2, d_model=64, heads=2, seq_len=64), batch_size=8,
                  slices=2, vocab=2000),
    "diagnose": dict(spec=ArchSpec(depth=2, d_model=64, heads=2, seq_len=64), sequences=2,
                     vocab=512),
    "longctx": dict(spec=ArchSpec(d_model=64, heads=2), lengths=[4096], queries=64,
                    chunk=1024, n_scalings=1, workers=1),
    "spectra": dict(seq_len=1024, n_keys=1024, width=15, n_iter=8, block=64, workers=1),
}


@pytest.mark.parametrize("kind", list(SIZES))
def test_estimate_is_monotone_in_every_size(kind):
    base = BASE[kind]
    e0 = memory.estimate(kind, **base)
    for name in SIZES[kind]:
        kw = dict(base)
        if name in ("seq_len", "d_model", "depth") and "spec" in kw:
            kw["spec"] = kw["spec"].replace(**{name: 2 * getattr(kw["spec"], name)})
        elif name == "lengths":
            kw["lengths"] = [2 * t for t in kw["lengths"]]
        else:
            kw[name] = 2 * kw[name]
        assert memory.estimate(kind, **kw) >= e0, (kind, name)
        if name not in ("lengths",):  # longctx memory depends on T only through min(., T)
            assert memory.estimate(kind, **kw) > e0, (kind, name)


def test_available_is_positive():
    assert memory.available() > 0


def _bench():
    path = Path(__file__).parents[2] / "benchmarks" / "bench_memory.py"
    spec = importlib.util.spec_from_file_location("bench_memory", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("label", [
    "d256 L4 S4 B2 T2048", "bert-base T512 B4", "d768 T2^18 chunk 2^17",
    "d128 L2 B64 T512", "T 8192 dense"])
def test_estimate_within_25_percent_of_peak_rss(label):
    bench = _bench()
    kind, _, kw = next(c for c in bench.CASES if c[1] == label)
    r = bench.run_case(kind, kw)
    assert 0.75 <= r["ratio"] <= 1.25, r
