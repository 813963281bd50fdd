"""Process-wide torch CPU settings for a block of work, and a small worker pool.

Used by streaming, spectra and training: torch's own intra-op pool is set to ``threads``
(restored after), and denormals can be flushed to zero meanwhile (reset to False after:
torch has no getter for the flag). :func:`run_workers` runs ``work`` in ``n`` threads (the
caller's included) with torch at one intra-op thread each; ``work`` collects its own errors.
:func:`map_tasks` is the simplest use of it: independent tasks, results in task order, the
first error re-raised.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch


@contextmanager
def cpu_settings(threads: int | None = None, flush_denormal: bool = False):
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    if flush_denormal:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if flush_denormal:
            torch.set_flush_denormal(False)


@functools.lru_cache(maxsize=1)
def _openblas():
    """NumPy's (and SciPy's) OpenBLAS pools as threadpoolctl sees them (once: finding the
    loaded libraries takes ~10 ms; each limit after that ~10 us)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(internal_api="openblas")


@contextmanager
def numpy_blas_single():
    """NumPy's OpenBLAS on one thread for a block of small NumPy products and LAPACK calls
    (torch's own pool is :func:`cpu_settings`'). OpenBLAS wakes its threads for every call,
    and a thread that waits for a core another process holds stalls the call: the Lanczos of
    :func:`.observables.top_eigenvalue` on bert-base's (2, 512, 512) Grams (tridiagonal
    ``eigh`` of size <= 64, matrix-vector products) took 131 ms a call on the 2-core machine
    with the other core busy, 34 ms on one thread."""
    try:
        ctl = _openblas()
    except Exception:  # noqa: BLE001 - threadpoolctl cannot read this process's libraries
        yield
        return
    with ctl.limit(limits=1):
        yield


def run_workers(work: Callable[[], None], n: int, flush_denormal: bool = False) -> None:
    with cpu_settings(threads=1, flush_denormal=flush_denormal):
        pool = [threading.Thread(target=work, daemon=True) for _ in range(n - 1)]
        for th in pool:
            th.start()
        work()
        for th in pool:
            th.join()


def take_each(items, lock, errors: list, fn: Callable) -> None:
    """One worker's share of a queue: ``fn(item)`` for each item it takes (under ``lock``) from
    the shared iterator ``items``, until the iterator runs out or some worker has failed (a
    non-empty ``errors``); an exception is appended to ``errors``, for the caller's thread to
    re-raise once :func:`run_workers` is done."""
    try:
        while not errors:
            with lock:
                item = next(items, None)
            if item is None:
                return
            fn(item)
    except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
        errors.append(err)


def map_tasks(fn: Callable, tasks: Sequence[tuple], n: int) -> list:
    """``[fn(*t) for t in tasks]`` shared among ``n`` workers (:func:`run_workers`; each takes
    the next task when done), results in task order whoever ran them; the first error in any
    worker is re-raised here and stops the others at their next task."""
    n = max(1, min(int(n), len(tasks)))
    if n == 1:
        return [fn(*t) for t in tasks]
    out: list = [None] * len(tasks)
    nxt, lock, errors = iter(range(len(tasks))), threading.Lock(), []

    def run(j):
        out[j] = fn(*tasks[j])

    def work():
        take_each(nxt, lock, errors, run)

    run_workers(work, n)
    if errors:
        raise errors[0]
    return out
