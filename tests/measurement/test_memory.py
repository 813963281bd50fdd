"""The one memory estimator (sigprop.measurement.memory): refusals before allocation, suggested
settings that fit, monotone estimates, and (slow) accuracy against measured peak RSS."""

from __future__ import annotations

import importlib.util
import math
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


# ---- the real limit: MemAvailable, RLIMIT_AS / RLIMIT_DATA, cgroup v2 / v1 (issue 34) ------
def _files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_cgroup_v2_tightest_level_less_reclaimable_cache(tmp_path):
    _files(tmp_path, {
        "proc": "0::/user.slice/job\n",
        "cg/memory.stat": "anon 1\n",  # the root: no memory.max
        "cg/user.slice/memory.max": "8000000000\n",
        "cg/user.slice/memory.current": "3000000000\n",
        "cg/user.slice/memory.stat": "anon 2000000000\ninactive_file 1000000000\n",
        "cg/user.slice/job/memory.max": "max\n",
        "cg/user.slice/job/memory.current": "2500000000\n",
    })
    got = memory.cgroup_headroom(tmp_path / "proc", tmp_path / "cg")
    assert got == {"memory.max": (8e9, 6e9)}  # the parent binds; 3 GB used less 1 GB cache
    (tmp_path / "cg/user.slice/job/memory.max").write_text("4000000000\n")
    assert memory.cgroup_headroom(tmp_path / "proc", tmp_path / "cg") == {
        "memory.max": (4e9, 1.5e9)}


def test_cgroup_v1_limit_and_unlimited_values(tmp_path):
    _files(tmp_path, {
        "proc": "9:name=systemd:/\n4:cpuacct,memory:/docker/abc\n0::/\n",
        "cg/memory/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
        "cg/memory/memory.usage_in_bytes": "20000000000\n",
        "cg/memory/docker/abc/memory.limit_in_bytes": "4000000000\n",
        "cg/memory/docker/abc/memory.usage_in_bytes": "1500000000\n",
        "cg/memory/docker/abc/memory.stat": "inactive_file 1\ntotal_inactive_file 500000000\n",
    })
    got = memory.cgroup_headroom(tmp_path / "proc", tmp_path / "cg")
    assert got == {"memory.limit_in_bytes": (4e9, 3e9)}
    (tmp_path / "cg/memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712")
    assert memory.cgroup_headroom(tmp_path / "proc", tmp_path / "cg") == {}


def test_cgroup_seen_as_the_root_of_its_mount(tmp_path):
    """A container whose /proc/self/cgroup path is not under its mount reads the mount root."""
    _files(tmp_path, {"proc": "0::/kubepods/pod1/c1\n", "cg/memory.max": "2000000000\n",
                      "cg/memory.current": "500000000\n"})
    assert memory.cgroup_headroom(tmp_path / "proc", tmp_path / "cg") == {
        "memory.max": (2e9, 1.5e9)}
    assert memory.cgroup_headroom(tmp_path / "missing", tmp_path / "cg") == {}


def test_rlimit_headroom_is_of_virtual_size(tmp_path):
    _files(tmp_path, {"status": "VmPeak:\t 900000 kB\nVmSize:\t  800000 kB\nVmRSS:\t 300000 kB\n"
                                "VmData:\t  200000 kB\n"})
    got = memory.rlimit_headroom(tmp_path / "status", {"AS": 4 * 2**30, "DATA": math.inf})
    assert got == {"AS": (4 * 2**30, 4 * 2**30 - 800000 * 1024)}
    got = memory.rlimit_headroom(tmp_path / "status", {"AS": 2.0**63, "DATA": 2**30})
    assert got == {"DATA": (2**30, 2**30 - 200000 * 1024)}


def test_available_is_the_tightest_bound_and_the_refusal_names_it(tmp_path):
    _files(tmp_path, {"meminfo": "MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n",
                      "status": "VmSize:\t 1000000 kB\n", "proc": "0::/\n",
                      "cg/memory.max": "max\n"})
    paths = dict(meminfo=tmp_path / "meminfo", status=tmp_path / "status",
                 proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg")
    free = memory.available(**paths, rlimits={})
    assert free == 20000000 * 1024
    assert memory.limits(**paths, rlimits={}) == [(free, "MemAvailable")]
    lim = 4 * 2**30
    have = memory.available(**paths, rlimits={"AS": lim})
    assert have == lim - 1000000 * 1024
    spec = ArchSpec(depth=1, d_model=8, heads=1, seq_len=40000)
    with pytest.raises(SpecError) as err:
        memory.check("measure", spec=spec, seeds=1, sequences=1, have=have,
                     shrink={"seq_len": 2, "sequences": 1, "seeds": 1})
    assert err.value.field == "seq_len" and "RLIMIT_AS 4.29 GB, ulimit -v" in str(err.value)
    _files(tmp_path, {"cg/memory.max": "1000000000\n", "cg/memory.current": "400000000\n"})
    assert memory.available(**paths, rlimits={"AS": lim}) == 6e8
    assert memory.limits(**paths, rlimits={"AS": lim})[0][1] == "cgroup memory.max 1 GB"


def test_allocation_failures_become_one_line():
    err = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                       "can't allocate memory: you tried to allocate 6400000000 bytes. Error "
                       "code 12 (Cannot allocate memory)")
    msg = memory.allocation_failure(err)
    assert msg and "\n" not in msg and "6.4 GB" in msg
    assert memory.allocation_failure(MemoryError()) is not None
    assert memory.allocation_failure(RuntimeError("shape mismatch")) is None
    assert memory.allocation_failure(ValueError("not enough memory")) is None


def _limited(code: str | list[str], limit: int = 4 * 2**30, timeout: float = 60):
    """Run python (``-c code``, or ``-m sigprop`` with the arguments) under RLIMIT_AS."""
    import resource
    import subprocess
    import sys

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    args = ["-c", code] if isinstance(code, str) else ["-m", "sigprop", *code]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


def test_available_within_the_address_space_headroom():
    p = _limited("import re, sigprop.cli\n"
                 "from sigprop.measurement import memory\n"
                 "vm = float(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read())"
                 "[1]) * 1024\n"
                 "print(memory.available(), vm, memory._LAST[1])")
    assert p.returncode == 0, p.stderr
    have, vm, what = p.stdout.split(maxsplit=2)
    assert 0 < float(have) <= 4 * 2**30 - float(vm), p.stdout
    assert what.strip() == "RLIMIT_AS 4.29 GB, ulimit -v"


@pytest.mark.parametrize("args, option", [
    (["measure", "--depth", "1", "--d-model", "8", "--heads", "1", "--seq-len", "40000",
      "--seeds", "1", "--sequences", "1"], "--seq-len"),
    (["longctx", "--lengths", "2^30", "--queries", "4"], "--"),
])
def test_refused_under_ulimit_v_not_killed_by_the_allocator(args, option):
    """Issue 34: under ``ulimit -v 4194304`` these died in torch's allocator (MemAvailable was
    the only bound); now one line naming the option and the limit, exit 2."""
    p = _limited(args)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, p.stderr
    assert err[0].startswith(f"sigprop: error: {option}") and "ulimit -v" in err[0], err
