"""Sweeps end to end (sigprop.runs.executors): the local pool and a real Ray local cluster give
the same store row for row; a finished sweep does no work; failures are recorded and the sweep
goes on; a sweep killed with SIGKILL at random moments and resumed loses and repeats nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from sigprop.runs.executors import run_sweep
from sigprop.runs.grid import expand, parse_grid
from sigprop.runs.store import Store

#: small measure tasks (~0.05-0.2 s each on one thread): 6 x 2 x 2 = 24 tasks
N = 24
GRID = "beta=0.2:2.6:6,depth=2,4,alpha_attn=0.5,2,d_model=16,heads=2,seq_len=8,seeds=2"


def _tasks(grid=GRID, command="measure"):
    return expand(command, parse_grid(grid))


def _same_store(a: Store, b: Store) -> None:
    """Row for row: every task once, the same rows in the same order, bit-identical values
    (both runs use one torch thread per task and the same seeds)."""
    ra, rb = a.read(), b.read()
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    cols = [c for c in ("config_hash", "layer", "observable", "source", "head", "weight")
            if c in ra.columns]
    assert not ra.duplicated(subset=cols).any()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One uninterrupted local run of GRID (the reference every other store must equal), with
    the progress counts it reported."""
    st = Store(tmp_path_factory.mktemp("runs") / "baseline")
    seen: list[dict] = []
    rep = run_sweep(_tasks(), st, workers=2, progress=seen.append)
    assert rep.done == N and rep.failed == 0
    st.seen = seen
    return st


def test_progress_counts(baseline):
    seen = baseline.seen
    assert seen[0] == {"total": N, "done": 0, "failed": 0, "skipped": 0, "running": 0}
    assert seen[-1] == {"total": N, "done": N, "failed": 0, "skipped": 0, "running": 0}
    assert max(s["running"] for s in seen) == 2  # never more in flight than workers
    done = [s["done"] for s in seen]
    assert done == sorted(done) and set(range(N + 1)) <= set(done)  # one step per task


def test_finished_sweep_does_no_work(baseline):
    files = {p: p.stat().st_mtime_ns for p in baseline.root.rglob("*.parquet")}
    t0 = time.perf_counter()
    rep = run_sweep(_tasks(), baseline, workers=2)
    assert (rep.skipped, rep.done, rep.total) == (N, 0, N)
    assert time.perf_counter() - t0 < 1.0  # no pool was started
    assert {p: p.stat().st_mtime_ns for p in baseline.root.rglob("*.parquet")} == files


def test_failed_task_recorded_and_sweep_goes_on(tmp_path):
    """beta = -1 is refused by ArchSpec inside the worker: recorded with its one-line error
    after 1 + retries attempts; the other tasks are stored."""
    st = Store(tmp_path / "st")
    tasks = _tasks("beta=-1,0.5,1,depth=2,d_model=16,heads=2,seq_len=8", "predict")
    rep = run_sweep(tasks, st, workers=2, retries=2)
    assert (rep.done, rep.failed, rep.retried) == (2, 1, 2)
    f = st.failures()
    assert len(f) == 1 and "beta" in f["error"].iloc[0] and f["attempts"].iloc[0] == 3
    assert "\n" not in f["error"].iloc[0]
    assert sorted(st.read()["beta"].unique()) == [0.5, 1.0]


def _ray_or_skip():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'sigprop[ray]')")
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    except Exception as err:  # noqa: BLE001 - any failure to start is a reason to skip
        print(f"Ray could not start: {err}")
        pytest.skip(f"Ray could not start a local cluster: {err}")
    return ray


@pytest.mark.slow  # >10 s; in `make test-slow`
def test_ray_two_workers_equals_local(baseline, tmp_path):
    """A real Ray local cluster with 2 worker CPUs runs the sweep; its store equals the local
    executor's row for row. The cluster is started here and joined by run_sweep (which then
    leaves it running), as a sweep joins one given by --address."""
    ray = _ray_or_skip()
    try:
        assert ray.cluster_resources().get("CPU") == 2
        st = Store(tmp_path / "ray")
        rep = run_sweep(_tasks(), st, executor="ray")
        assert (rep.done, rep.failed, rep.workers) == (N, 0, 2)
        assert ray.is_initialized()  # a joined cluster is left as found
    finally:
        ray.shutdown()
    _same_store(st, baseline)


def _sweep_cmd(store, executor):
    return [sys.executable, "-m", "sigprop", "sweep", "--command", "measure", "--grid", GRID,
            "--store", str(store), "--executor", executor, "--workers", "2", "--format",
            "json"]


def _group_gone(pgid: int, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _stored(st_path) -> int:
    return len(list(st_path.glob("command=measure/*.parquet")))


def _kill_three_times_and_resume(tmp_path, baseline, executor, window, seed,
                                 groups=(True, True, True)):
    """Start the sweep and SIGKILL it three times, then let it finish; the store must equal
    the uninterrupted run's. The first kill comes at a random moment in ``window`` seconds
    after the start (start-up or the first tasks; earlier if 4 tasks are stored by then, so
    that a fast machine still leaves work for the next kills); the next ones while tasks are being
    finished: once the sweep has stored a random 1-3 more tasks, after a random 0-50 ms (a
    task takes about that long, so a kill lands anywhere in a task's life, its write
    included). ``groups[i]``: kill the whole process group (driver and workers) the i-th
    time, else the driver alone (as an OOM killer does), whose pool workers must notice and
    exit by themselves."""
    st_path = tmp_path / executor
    rng = np.random.default_rng(seed)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    stored = []
    for i, group in enumerate(groups):
        before = _stored(st_path) if st_path.exists() else 0
        p = subprocess.Popen(_sweep_cmd(st_path, executor), start_new_session=True, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i == 0:  # at the random moment, or once 4 tasks are stored (a fast machine)
            end = time.monotonic() + rng.uniform(*window)
            while time.monotonic() < end and _stored(st_path) < before + 4:
                time.sleep(0.005)
        else:
            end = time.monotonic() + 120
            k = before + int(rng.integers(1, 4))
            while _stored(st_path) < k and p.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
        if group:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert _group_gone(p.pid), "processes of the killed sweep are still running"
        stored.append(_stored(st_path))
    assert stored[-1] < N, f"the sweep finished before the last kill: {stored}"
    done = subprocess.run(_sweep_cmd(st_path, executor), env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json

    rep = json.loads(done.stdout)
    assert rep["skipped"] == stored[-1] and rep["done"] == N - stored[-1]
    _same_store(Store(st_path, create=False), baseline)
    return stored


@pytest.mark.slow  # >10 s; in `make test-slow`
def test_sigkill_local_three_times_then_resume(tmp_path, baseline):
    """Killed at three random moments (the second time the driver alone), resumed: 0 rows
    lost, 0 duplicated, no process of a killed sweep left running."""
    stored = _kill_three_times_and_resume(tmp_path, baseline, "local", (0.2, 1.0), seed=7,
                                          groups=(True, False, True))
    print(f"tasks in the store after each kill: {stored}")


@pytest.mark.slow
def test_sigkill_ray_three_times_then_resume(tmp_path, baseline):
    pytest.importorskip("ray")
    stored = _kill_three_times_and_resume(tmp_path, baseline, "ray", (1.0, 3.5), seed=3)
    print(f"tasks in the store after each kill: {stored}")


@pytest.mark.slow
def test_address_auto_joins_a_ray_start_cluster(tmp_path, baseline):
    """The documented cluster path: `ray start --head`, then `sigprop sweep --executor ray
    --address auto` joins it (and leaves it running); the store equals the local run's."""
    pytest.importorskip("ray")
    import json
    import shutil
    from pathlib import Path

    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray_cli is None:
        pytest.skip("the ray command is not installed next to this Python")
    start = subprocess.run([ray_cli, "start", "--head", "--num-cpus", "2",
                            "--include-dashboard=false", "--disable-usage-stats"],
                           capture_output=True, text=True, timeout=120)
    if start.returncode != 0:
        pytest.skip(f"ray start failed: {start.stderr.strip().splitlines()[-1:]}")
    try:
        cmd = _sweep_cmd(tmp_path / "joined", "ray")
        cmd[cmd.index("--workers"):cmd.index("--workers") + 2] = ["--address", "auto"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        rep = json.loads(done.stdout)
        assert rep["done"] == N and rep["workers"] == 2  # the cluster's 2 CPUs
        alive = subprocess.run([sys.executable, "-c", "import ray; ray.init(address='auto', "
                                "logging_level='ERROR'); print(ray.cluster_resources()['CPU'])"],
                               capture_output=True, text=True, timeout=120)
        assert alive.stdout.strip().splitlines()[-1] == "2.0"  # still running after the sweep
    finally:
        subprocess.run([ray_cli, "stop"], capture_output=True, timeout=120)
    _same_store(Store(tmp_path / "joined", create=False), baseline)
