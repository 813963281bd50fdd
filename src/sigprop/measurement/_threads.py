"""Process-wide torch CPU settings for a block of work, and a small worker pool.

Used by streaming, spectra and training: torch's own intra-op pool is set to ``threads``
(restored after), and denormals can be flushed to zero meanwhile (reset to False after:
torch has no getter for the flag). :func:`run_workers` runs ``work`` in ``n`` threads (the
caller's included) with torch at one intra-op thread each; ``work`` collects its own errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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


def run_workers(work: Callable[[], None], n: int, flush_denormal: bool = False) -> None:
    with cpu_settings(threads=1, flush_denormal=flush_denormal):
        pool = [threading.Thread(target=work, daemon=True) for _ in range(n - 1)]
        for th in pool:
            th.start()
        work()
        for th in pool:
            th.join()
