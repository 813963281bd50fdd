"""The command line run in this process, as a test sees a subprocess of it.

Starting ``python -m sigprop`` costs ~4.5 s of interpreter and imports (torch, pandas,
transformers) before any work, which the CLI tests paid once per call (about half of the
default suite's time). :func:`sigprop` calls :func:`sigprop.cli.run` -- the function the
``sigprop`` script runs -- with stdout and stderr captured and returns what
``subprocess.run(..., capture_output=True, text=True)`` would: ``returncode``, ``stdout``,
``stderr`` (and ``wall``, seconds). An exception escaping ``run`` becomes exit code 1 with its
traceback on stderr, as Python prints it when a script dies. Tests about the process itself
(start-up time, signals, ``ulimit``) keep a real subprocess."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import time
import traceback
import warnings
from dataclasses import dataclass


@dataclass
class Ran:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall: float

    @property
    def exit_code(self) -> int:  # the names typer's CliRunner result uses
        return self.returncode

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@contextlib.contextmanager
def _env(extra: dict | None):
    old = {k: os.environ.get(k) for k in (extra or {})}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sigprop(*args, timeout: float = 120, env: dict | None = None) -> Ran:
    """``sigprop ARGS`` in this process; ``subprocess.TimeoutExpired`` past ``timeout`` s."""
    from sigprop.cli import run

    argv = [str(a) for a in args]

    def expired(signum, frame):
        raise subprocess.TimeoutExpired(["sigprop", *argv], timeout)

    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, float(timeout))
    t0 = time.perf_counter()
    try:
        with _env(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            try:
                code = run(argv)
            except subprocess.TimeoutExpired:
                raise
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - what a dying script prints
                traceback.print_exc()
                code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Ran(argv, int(code or 0), out.getvalue(), err.getvalue(),
               time.perf_counter() - t0)
