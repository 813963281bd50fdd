"""This machine's float32 matrix-multiply rate: the baseline a streaming rate is stated
against (``sigprop longctx MODEL`` reports its stream as a fraction of it).

It lives on the measurement floor, not in :mod:`sigprop.bench`, because the analysis that
reports it (floor 4) may not import the benchmarks (floor 5): docs/architecture.md.
"""

from __future__ import annotations

import time

import torch

from .threads import cpu_settings


def matmul_rate(workers: int | None = None, n: int = 1024, repeats: int = 4,
                device: str = "cpu") -> float:
    """GFLOP/s of ``(4n, n) @ (n, n)`` float32 products on ``workers`` threads (default
    torch's own count) or on the GPU: one warm-up product, then the mean over ``repeats``."""
    a = torch.randn(4 * n, n, device=device)
    b = torch.randn(n, n, device=device)

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    with cpu_settings(threads=max(1, int(workers or torch.get_num_threads()))):
        a @ b
        sync()
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync()
        dt = time.perf_counter() - t
    return 2.0 * 4 * n * n * n * repeats / dt / 1e9
