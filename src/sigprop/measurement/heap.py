"""Keep freed memory in the process heap instead of handing it back to the system (glibc only).

sigprop's heavy paths (the measurement engine, ``diagnose``, the training steps, the theory's
chunked tables) allocate and free the same large tensors over and over: a layer's
activations, its attention maps, an MLP's hidden layer. With glibc's defaults a block above
the dynamic mmap threshold (128 KiB, growing to at most 32 MiB) gets its own ``mmap`` and is
unmapped on ``free``, and free memory at the top of the heap above twice that threshold is
trimmed; either way the next allocation of that size takes fresh pages, which the kernel
zeroes and maps one fault at a time. Measured on the 2-core development machine (a VM):
first-touching 512 MB of fresh pages took 0.23-5.5 s against 0.1 s to rewrite the same
memory, and one ``diagnose`` of bert-base took ~135,000 page faults, the engine benchmark's
forward ~230,000, against ~0 of each (and 15-20% less CPU time for the engine) once the
thresholds below were set.

:func:`tune` raises the mmap threshold to :data:`MMAP_THRESHOLD` (larger blocks still get
their own mapping) and the trim threshold to :data:`TRIM_THRESHOLD` (at most that much free
memory is kept at the top of the heap), through ``mallopt``. The cost: the resident size
stays near its peak after a large job. Importing ``sigprop`` changes nothing in the process:
the command line calls :func:`tune` once when it starts, and a library user who wants the same
calls ``sigprop.measurement.heap.tune()``. The environment variable ``SIGPROP_MALLOC=system``
keeps glibc's defaults even then. On other C libraries (macOS, Windows, musl) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap (glibc's dynamic default stops at 32 MiB)
MMAP_THRESHOLD = 256 * 2**20
#: free memory at the top of the heap kept for reuse before it is trimmed
TRIM_THRESHOLD = 2**30

_state: dict[str, object] = {"done": False, "applied": False}


def tune() -> bool:
    """Set the thresholds once per process (module docstring). Returns whether they are in
    effect (False: opted out with ``SIGPROP_MALLOC=system``, or not glibc)."""
    if _state["done"]:
        return bool(_state["applied"])
    _state["done"] = True
    if os.environ.get("SIGPROP_MALLOC", "").strip().lower() == "system":
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _state["applied"] = ok
    return ok


def applied() -> bool:
    """Whether :func:`tune` set the thresholds in this process."""
    return bool(_state["applied"])
