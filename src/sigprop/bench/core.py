"""What every benchmark returns and how ``sigprop bench`` runs them (docs/bench.md).

A benchmark is a function registered with :func:`register`; it times a sigprop workload and
its reference **in the same run** and returns :class:`Figure` s, each holding both times and
their ratio, so a figure never depends on another machine or another day::

    @register("diagnose", title="diagnose against the bare HF forward", runtime=40)
    def diagnose_vs_bare(*, size: str = "default", device: str = "cpu") -> list[Figure]:
        ...
        return [Figure("diagnose/bert-base", "sigprop diagnose, 2 seeds x 2 seqs x T 512",
                       sigprop_s=t1, reference="BertModel init + forward, same inputs",
                       reference_s=t0, target="<= 1.5", ok=t1 / t0 <= 1.5)]

``ratio`` defaults to ``sigprop_s / reference_s`` (< 1: sigprop is faster); a figure that is
a rate (the engine's fraction of the machine's matmul rate) sets ``ratio`` itself and says so
in ``unit``. ``size``: ``quick`` (seconds; the test suite) or ``default`` (the stated sizes);
``runtime``: expected seconds at ``default`` on the 2-core development machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measurement import heap

__all__ = ["BENCHMARKS", "Bench", "Figure", "MODULES", "SIZES", "benchmarks", "best_of",
           "machine", "register", "run"]

SIZES = ("quick", "default")
#: the n of the n x n float32 product that rates the machine and the engine, per size
MATMUL_N = {"quick": 512, "default": 2048}
#: modules holding registered benchmarks (imported by :func:`benchmarks`)
MODULES: list[str] = ["diagnose", "measure", "monitor", "sweep", "theory", "training"]


@dataclass
class Figure:
    """One timed comparison: ``sigprop_s`` against ``reference_s`` measured in the same run;
    ``ratio`` (default ``sigprop_s / reference_s``), the ``target`` it is held to in words
    (``"<= 1.5"``) and whether it holds (``ok``; None when there is no target)."""

    name: str
    what: str
    sigprop_s: float
    reference: str
    reference_s: float
    target: str = ""
    ok: bool | None = None
    ratio: float | None = None
    unit: str = "sigprop time / reference time"
    size: dict = field(default_factory=dict)
    notes: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None:
            self.ratio = (self.sigprop_s / self.reference_s if self.reference_s > 0
                          else math.nan)

    def to_json(self) -> dict[str, Any]:
        from ..trajectory import clean_json

        d = clean_json(asdict(self))  # NumPy scalars (a np.bool_ ``ok``) to Python
        for k in ("sigprop_s", "reference_s", "ratio"):
            v = d[k]
            d[k] = None if v is None or not math.isfinite(v) else round(float(v), 6)
        return d


@dataclass(frozen=True)
class Bench:
    name: str
    title: str
    fn: Callable[..., list[Figure]]
    runtime: float


BENCHMARKS: dict[str, Bench] = {}


def register(name: str, *, title: str, runtime: float) -> Callable:
    """Register ``fn(*, size, device) -> list[Figure]`` under ``name``."""
    def wrap(fn: Callable[..., list[Figure]]) -> Callable[..., list[Figure]]:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} registered twice")
        BENCHMARKS[name] = Bench(name, title, fn, float(runtime))
        return fn
    return wrap


def benchmarks() -> dict[str, Bench]:
    """Every registered benchmark (importing the modules of :data:`MODULES`)."""
    import importlib

    for m in MODULES:
        importlib.import_module(f"sigprop.bench.{m}")
    return BENCHMARKS


def best_of(fn: Callable[[], Any], repeat: int = 3, sync: Callable[[], None] | None = None
            ) -> tuple[float, Any]:
    """Best wall-clock seconds of ``repeat`` calls of ``fn`` (``sync`` after each: a CUDA
    synchronise) and the last call's value."""
    best, out = math.inf, None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        if sync is not None:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


def machine(device: str = "cpu", n: int = 2048) -> dict[str, Any]:
    """This machine as the benchmarks see it: float32 matmul rate (GFLOP/s, best of 5
    ``n x n`` products on ``device``; ``sigprop bench`` uses the product size that
    ``measure`` rates the engine against, so the two rates are of the same product), memory
    bandwidth (GB/s, best of 5 copies of a 256 MiB tensor: read + write), CPU cores, torch
    threads, torch version and the device name."""
    import os
    import platform

    import torch

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    a @ b
    t, _ = best_of(lambda: a @ b, 5, sync)
    x = torch.empty(64 * 2**20, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    tc, _ = best_of(lambda: y.copy_(x), 5, sync)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or \
        platform.machine()
    return {"device": str(dev), "device_name": name, "cpu_cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "matmul_gflops": round(2 * n**3 / t / 1e9, 1),
            "memory_gbs": round(2 * x.numel() * 4 / tc / 1e9, 1),
            "heap_kept": heap.applied()}  # docs/bench.md, "Memory the process keeps"


def run(names: Sequence[str] = (), *, size: str = "default", device: str = "cpu",
        on_start: Callable[[Bench], None] | None = None) -> dict[str, Any]:
    """Run the named benchmarks (default all) and return the JSON of ``sigprop bench``:
    ``machine``, ``size``, ``benchmarks`` (name, title, seconds, figures or error). Sets the
    heap thresholds the command line sets (:func:`sigprop.measurement.heap.tune`)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES} (got {size!r})")
    known = benchmarks()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; known: {', '.join(known)}")
    heap.tune()  # measured with the allocator the command line runs with (measurement.heap)
    out: dict[str, Any] = {"machine": machine(device, MATMUL_N[size]), "size": size,
                           "benchmarks": []}
    for name in names or list(known):
        b = known[name]
        if on_start is not None:
            on_start(b)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"name": b.name, "title": b.title}
        try:
            figs = b.fn(size=size, device=device)
            entry["figures"] = [f.to_json() for f in figs]
        except Exception as err:  # noqa: BLE001 - one benchmark failing leaves the others
            entry["figures"] = []
            entry["error"] = f"{type(err).__name__}: {err}".splitlines()[0]
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        out["benchmarks"].append(entry)
    return out
