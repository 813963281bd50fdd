"""Run a sweep's tasks on a local process pool or a Ray cluster and store each result as it
arrives (docs/sweeps.md).

The driver (this process) is the only writer of the store: workers return their tables and
the driver writes each one atomically (:meth:`sigprop.runs.store.Store.write`). Tasks already
in the store are skipped by their config hash before any worker starts, so a sweep killed at
any moment and started again with the same tasks does only what is missing, and a finished
sweep does no work at all.

* ``local``: :class:`concurrent.futures.ProcessPoolExecutor` with ``spawn`` workers (a fresh
  interpreter each, so no torch thread pool is inherited through ``fork``); each worker watches
  its parent and exits when the driver is gone, so killing the driver leaves no orphans behind.
* ``ray``: :func:`ray.init` starts a fresh local cluster of ``workers`` CPUs, or joins the
  cluster at ``address`` (``auto``: the one ``ray start --head`` started on this machine or
  ``RAY_ADDRESS`` names; ``host:6379`` from a node of the cluster; ``ray://host:10001``, Ray
  Client, from outside it); every task declares its CPUs and GPUs (:func:`.tasks.resources`), so
  Ray places GPU work on GPU nodes. Ray retries nothing by itself here (``max_retries=0``):
  ``retries`` is sigprop's.

A task that raises is recorded in the store with its one-line error and the sweep goes on;
with ``retries`` it is tried that many more times first. A worker process that dies takes its
task with it (recorded the same way) and the pool is rebuilt.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .grid import Task
from .store import Store
from .tasks import execute, resources, worker_setup

__all__ = ["EXECUTORS", "SweepReport", "pending", "run_sweep", "sweep"]

EXECUTORS = ("local", "ray")


@dataclass
class SweepReport:
    """How a sweep went: task counts, wall-clock seconds (``startup``: starting the pool or
    joining / starting the Ray cluster), the executor and its workers, and the failures as
    ``(task, error)``."""

    total: int
    skipped: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    seconds: float = 0.0
    startup: float = 0.0
    executor: str = "local"
    workers: int = 1
    failures: list[tuple[Task, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "skipped": self.skipped, "done": self.done,
                "failed": self.failed, "retried": self.retried, "executor": self.executor,
                "workers": self.workers, "seconds": round(self.seconds, 3),
                "startup_seconds": round(self.startup, 3),
                "failures": [{"command": t.command, "config_hash": t.key, "config": t.config,
                              "error": e} for t, e in self.failures]}


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def run_task(command: str, config: dict, threads: int) -> tuple[str, Any, float]:
    """A worker's unit: ``("ok", table, seconds)`` or ``("error", message, seconds)``."""
    t0 = time.perf_counter()
    try:
        frame, seconds = execute(command, config, threads)
        return "ok", frame, seconds
    except Exception as err:  # noqa: BLE001 - recorded in the store, the sweep goes on
        return "error", one_line(err), time.perf_counter() - t0


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(threads: int, parent: int) -> None:
    worker_setup(threads)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


Progress = Callable[[dict[str, int]], None]


class _Driver:
    """The bookkeeping both executors share: a queue of (task, attempt), the store, counts."""

    def __init__(self, tasks: Sequence[Task], store: Store, report: SweepReport, retries: int,
                 progress: Progress | None):
        self.queue = deque((t, 0) for t in tasks)
        self.store, self.report, self.retries = store, report, retries
        self.progress = progress
        self.running = 0

    def tick(self) -> None:
        if self.progress is not None:
            r = self.report
            self.progress({"total": r.total, "done": r.done, "failed": r.failed,
                           "skipped": r.skipped, "running": self.running})

    def fill(self, flight: dict, workers: int, submit: Callable[[Task], Any]) -> None:
        """Submit queued tasks (``submit(task) -> handle``) until ``2 * workers`` are in
        flight: one queued behind each running one, so no worker waits for the driver."""
        while self.queue and len(flight) < 2 * workers:
            task, attempt = self.queue.popleft()
            flight[submit(task)] = (task, attempt)
        self.running = min(len(flight), workers)
        self.tick()

    def settle(self, flight: dict, handle: Any, workers: int,
               outcome: tuple[str, Any, float]) -> None:
        """Take ``handle``'s task out of ``flight`` and record its outcome."""
        task, attempt = flight.pop(handle)
        self.running = min(len(flight), workers)
        self.finish(task, attempt, outcome)

    def finish(self, task: Task, attempt: int, outcome: tuple[str, Any, float]) -> None:
        status, value, seconds = outcome
        if status == "ok":
            self.store.write(task.command, task.config, value,
                             meta={"seconds": seconds, "attempts": attempt + 1})
            self.report.done += 1
        elif attempt < self.retries:
            self.report.retried += 1
            self.queue.append((task, attempt + 1))
        else:
            self.store.write_failure(task.command, task.config, value, attempts=attempt + 1)
            self.report.failed += 1
            self.report.failures.append((task, value))
        self.tick()


def _run_local(driver: _Driver, workers: int, threads: int) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    def pool():
        return ProcessPoolExecutor(max_workers=workers,
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(threads, os.getpid()))

    t0 = time.perf_counter()
    ex = pool()  # workers start on the first submissions: start-up is measured at the first
    first = True  # result, less that task's own run time
    flight: dict = {}
    try:
        while driver.queue or flight:
            driver.fill(flight, workers,
                        lambda t, ex=ex: ex.submit(run_task, t.command, t.config, threads))
            ready, _ = wait(list(flight), timeout=1.0, return_when=FIRST_COMPLETED)
            broken = False
            for fut in ready:
                try:
                    outcome = fut.result()
                except BrokenProcessPool as err:
                    broken = True
                    outcome = ("error", f"worker process died ({one_line(err)})", 0.0)
                if first:
                    driver.report.startup = max(0.0, time.perf_counter() - t0 - outcome[2])
                    first = False
                driver.settle(flight, fut, workers, outcome)
            if broken:  # every task still in flight died with the pool
                for task, attempt in list(flight.values()):
                    driver.finish(task, attempt, ("error", "worker process died", 0.0))
                flight.clear()
                ex.shutdown(wait=False, cancel_futures=True)
                ex = pool()
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def _run_ray(driver: _Driver, workers: int | None, threads: int, address: str | None,
             cpus: float, gpus: float | None) -> int:
    import ray
    from ray.exceptions import RayError

    t0 = time.perf_counter()
    started = not ray.is_initialized()
    if started:
        kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                  logging_level="ERROR")
        if address:
            ray.init(address=address, **kw)
        else:
            # "local": a fresh cluster even when one from `ray start` is running here (that
            # one is joined with address="auto")
            ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, **kw)
    driver.report.startup = time.perf_counter() - t0
    try:
        if workers is None:  # everything the cluster can run at once
            workers = max(1, int(ray.cluster_resources().get("CPU", 1) // max(cpus, 1e-9)))
        remote = ray.remote(max_retries=0)(run_task)
        flight: dict = {}

        def submit(t: Task):
            res = resources(t.command, t.config, cpus, gpus)
            return remote.options(**res).remote(t.command, t.config, threads)

        while driver.queue or flight:
            driver.fill(flight, workers, submit)
            ready, _ = ray.wait(list(flight), num_returns=1, timeout=1.0)
            for ref in ready:
                try:
                    outcome = ray.get(ref)
                except RayError as err:
                    outcome = ("error", one_line(err), 0.0)
                driver.settle(flight, ref, workers, outcome)
    finally:
        if started:
            ray.shutdown()
    return workers


def pending(tasks: Sequence[Task], store: Store) -> tuple[list[Task], int]:
    """Tasks not yet in the store (duplicates dropped) and how many were skipped."""
    done: dict[str, set[str]] = {}
    out, seen = [], set()
    for t in tasks:
        if (t.command, t.key) in seen:
            continue
        seen.add((t.command, t.key))
        if t.command not in done:
            done[t.command] = store.done(t.command)
        if t.key not in done[t.command]:
            out.append(t)
    return out, len(seen) - len(out)


def run_sweep(tasks: Sequence[Task], store: Store, *, executor: str = "local",
              workers: int | None = None, address: str | None = None, retries: int = 0,
              cpus_per_task: float = 1.0, gpus_per_task: float | None = None,
              progress: Progress | None = None) -> SweepReport:
    """Run every task not already in ``store`` and store its table (module docstring).

    ``workers``: tasks run at once (local default: the CPU count; Ray default: what the
    cluster's CPUs allow at ``cpus_per_task`` each). Each task runs torch on
    ``cpus_per_task`` threads (at least 1), the same under both executors, so their results
    agree row for row. ``progress(counts)`` is called as counts change (total, done, running,
    failed, skipped)."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS} (got {executor!r})")
    t0 = time.perf_counter()
    todo, skipped = pending(tasks, store)
    report = SweepReport(total=len(todo) + skipped, skipped=skipped, executor=executor,
                         workers=workers or 0)
    driver = _Driver(todo, store, report, retries, progress)
    driver.tick()
    threads = max(1, int(cpus_per_task))
    if todo:
        if executor == "local":
            report.workers = min(workers or os.cpu_count() or 1, len(todo))
            _run_local(driver, report.workers, threads)
        else:
            report.workers = _run_ray(driver, workers, threads, address, cpus_per_task,
                                      gpus_per_task)
    report.seconds = time.perf_counter() - t0
    driver.running = 0
    driver.tick()
    return report


def sweep(command: str, grid: dict | str | None = None, *, store: str | os.PathLike,
          configs: Sequence[dict] | None = None, fixed: dict | None = None,
          executor: str = "local", workers: int | None = None, address: str | None = None,
          retries: int = 0, cpus_per_task: float = 1.0, gpus_per_task: float | None = None,
          progress: Progress | None = None) -> SweepReport:
    """``sigprop sweep`` from Python: ``command`` over ``grid`` (a dict of value lists, or
    the command line's grid text) times ``configs`` on top of ``fixed``, into the store at
    ``store`` (resumed when it holds some of these tasks). Every task is validated first
    (:func:`sigprop.runs.tasks.check`: a bad key or value raises before anything runs)."""
    from .grid import expand, parse_grid
    from .tasks import check

    if isinstance(grid, str):
        grid = parse_grid(grid)
    tasks = expand(command, grid, configs, fixed)
    for t in tasks:
        check(t.command, t.config)
    return run_sweep(tasks, Store(store), executor=executor, workers=workers, address=address,
                     retries=retries, cpus_per_task=cpus_per_task, gpus_per_task=gpus_per_task,
                     progress=progress)
