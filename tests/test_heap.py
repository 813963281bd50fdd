"""sigprop.measurement.heap: glibc heap thresholds set by the command line or an explicit
tune() call, never by importing sigprop; opt-out by environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = ("import ctypes, resource, sys, sigprop, sigprop.measurement.heap as h\n"
        "imported = h.applied()\n"
        "if sys.argv[1] == 'tune': h.tune()\n"
        "import numpy as np\n"
        "a = np.ones(2**23); del a\n"  # 64 MB: above glibc's largest dynamic mmap threshold
        "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(5):\n"
        "    a = np.ones(2**23); del a\n"
        "print(imported, h.applied(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n")


def _run(env_extra: dict, how: str = "tune") -> tuple[bool, bool, int]:
    """(tuned at import, tuned at the end, page faults of the reuse loop) in a fresh
    interpreter that calls ``tune()`` when ``how == "tune"``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("SIGPROP_MALLOC", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CODE, how], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    return out[0] == "True", out[1] == "True", int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_new_page_faults():
    # a 64 MB block freed and allocated again five times: glibc's defaults map it afresh
    # each time (>= 16k faults of 4 KiB pages each time, fewer with huge pages); with the
    # thresholds set the heap keeps it and the reuse takes next to no faults
    imported, on, faults_on = _run({})
    _, off, faults_off = _run({"SIGPROP_MALLOC": "system"})
    assert not imported, "importing sigprop must not touch the allocator"
    assert on and not off
    assert faults_on < 100, faults_on
    assert faults_off > 5 * max(faults_on, 20), (faults_on, faults_off)


def test_the_command_line_tunes_the_heap():
    from sigprop.cli import run
    from sigprop.measurement import heap

    run(["--version"])
    assert heap.applied() == (sys.platform.startswith("linux")
                              and os.environ.get("SIGPROP_MALLOC", "").lower() != "system")
