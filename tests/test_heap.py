"""sigprop.measurement._heap: heap thresholds set on import (glibc), opt-out by environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = ("import ctypes, resource, sigprop, sigprop.measurement._heap as h\n"
        "import numpy as np\n"
        "a = np.ones(2**23); del a\n"  # 64 MB: above glibc's largest dynamic mmap threshold
        "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(5):\n"
        "    a = np.ones(2**23); del a\n"
        "print(h.applied(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n")


def _run(env_extra: dict) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("SIGPROP_MALLOC", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_new_page_faults():
    # a 64 MB block freed and allocated again five times: glibc's defaults map it afresh
    # each time (>= 16k faults of 4 KiB pages each time, fewer with huge pages); with the
    # thresholds set the heap keeps it and the reuse takes next to no faults
    on, faults_on = _run({})
    off, faults_off = _run({"SIGPROP_MALLOC": "system"})
    assert on and not off
    assert faults_on < 100, faults_on
    assert faults_off > 5 * max(faults_on, 20), (faults_on, faults_off)
