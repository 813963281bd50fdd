"""Fuzz the command line against its contract (issue 13 item 5; docs/cli.md "Errors").

For every command, Hypothesis builds a small valid command line and mutates 0-3 options to
bad or edge values (tests/fuzz_strategies.py). Whatever comes in, ``sigprop.cli.run`` must

* exit 2 with exactly one non-empty stderr line ``sigprop: error: ...`` that names an option
  (``--something``) or the broken config.json field, or
* exit 0; with ``--format json`` stdout is JSON without NaN/inf, the rows' values are non-null
  and in range (entropy in [0, 1], ipr in [1/T, 1], cos in [-1, 1], wmax in (0, 1]) and the
  verdict is one of trainable / rank_collapse / entropy_collapse.

Any other exit code, an exception escaping ``run`` (a traceback) or a run past the per-example
time limit is a failure whose message starts with the command line. The default suite runs
>= 1,000 examples (derandomized, so CI is reproducible); ``-m slow`` runs ten times more.
A summary line "fuzz: N examples in S s" is printed at the end of the module.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import resource
import shlex
import signal
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sigprop.cli import run

from .fuzz_strategies import Paths, command_line

PATHS = Paths(Path(tempfile.mkdtemp(prefix="sigprop-fuzz-")))
VERDICTS = {"trainable", "rank_collapse", "entropy_collapse"}
OPTION = re.compile(r"--[a-z][a-z0-9-]*")
SLACK = 1e-9
MEMORY_CAP = 8 * 2**30  # bytes of address space while fuzzing
# seconds per example: a hang is a failure, not a stuck suite; the first training / model run
# builds the corpus and tokenizer or imports transformers, hence the longer limits there
TIME_LIMIT = {"default": 15.0, "measure": 30.0, "train": 60.0, "trainability": 60.0,
              "diagnose": 60.0, "fix": 60.0}

# examples run and outcomes, per command (printed by the module fixture at the end)
STATS: Counter = Counter()
SECONDS: Counter = Counter()


class FuzzTimeout(BaseException):
    """Raised by the alarm inside a run that took too long."""


@dataclass
class Result:
    rc: int | None
    out: str
    err: str
    exc: str | None = None  # last traceback line + where it was raised, if run raised
    seconds: float = 0.0


def _alarm(signum, frame):
    raise FuzzTimeout


def invoke(argv: list[str], limit: float | None = None) -> Result:
    """``run(argv)`` in this process, stdout/stderr captured, exceptions caught."""
    out, err = io.StringIO(), io.StringIO()
    if limit is None:
        limit = TIME_LIMIT.get(argv[0] if argv else "", TIME_LIMIT["default"])
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    t0 = time.perf_counter()
    rc, exc = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = run(list(argv))
    except FuzzTimeout:
        exc = f"did not finish within {limit:.0f} s"
    except BaseException as e:  # noqa: BLE001 - any escape is the finding (SystemExit too)
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        last = (str(e).strip().splitlines() or [""])[-1]
        exc = f"{type(e).__name__}: {last}{where}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Result(rc, out.getvalue(), err.getvalue(), exc, time.perf_counter() - t0)


# ---- the contract ---------------------------------------------------------------------------
def _bad_constant(name):
    raise ValueError(f"non-finite constant {name} in JSON")


def _row_violation(row: dict, T: int | None) -> str | None:
    obs, val = row.get("observable"), row.get("value")
    if "value" not in row or "observable" not in row:
        return f"row without observable/value: {row}"
    if val is None:
        return f"null (non-finite) value in row {row}"
    if isinstance(val, bool) or not isinstance(val, int | float) or not math.isfinite(val):
        return f"non-finite / non-numeric value in row {row}"
    t = row.get("seq_len", T)
    # T -> inf theory: ipr and wmax tend to 0 (1/T -> 0), so their lower bound is 0 there
    asymptotic = row.get("source") == "theory_asymptotic"
    lo_ipr = 1.0 / t if isinstance(t, int) and t > 0 and not asymptotic else 0.0
    bounds = {"entropy": (0.0, 1.0), "ipr": (lo_ipr, 1.0), "cos": (-1.0, 1.0),
              "wmax": (0.0, 1.0)}
    if obs in bounds:
        lo, hi = bounds[obs]
        zero_wmax = obs == "wmax" and val <= 0 and not asymptotic
        if not lo - SLACK <= val <= hi + SLACK or zero_wmax:
            return f"{obs} = {val!r} out of range [{lo:.6g}, {hi}] in row {row}"
    return None


def _json_violation(out: str) -> str | None:
    try:
        doc = json.loads(out, parse_constant=_bad_constant)
    except ValueError as e:
        return f"stdout is not finite JSON ({e}); starts {out[:80]!r}"

    def walk(node, T):
        if isinstance(node, dict):
            spec = node.get("spec")
            if isinstance(spec, dict) and isinstance(spec.get("seq_len"), int):
                T = spec["seq_len"]
            if "verdict" in node and node["verdict"] not in VERDICTS:
                return f"verdict {node['verdict']!r} not in {sorted(VERDICTS)}"
            rows = node.get("rows")
            if isinstance(rows, list):
                for row in rows:
                    if isinstance(row, dict) and (v := _row_violation(row, T)):
                        return v
            for k, v in node.items():
                if k != "rows" and (found := walk(v, T)):
                    return found
        elif isinstance(node, list):
            for v in node:
                if found := walk(v, T):
                    return found
        elif isinstance(node, float) and not math.isfinite(node):
            return f"non-finite number {node} in JSON"
        return None

    return walk(doc, None)


def _broken_field(argv: list[str]) -> str | None:
    """The config field a broken config.json on this command line breaks (or "model")."""
    if argv[0] in ("diagnose", "fix") and len(argv) > 1:
        if argv[1] in PATHS.broken_configs:
            return PATHS.broken_configs[argv[1]]
        if argv[1] in PATHS.bad_models():
            return "model"
    return None


def violation(argv: list[str], r: Result) -> str | None:
    """None if ``r`` keeps the contract, else what went wrong (one line)."""
    if r.exc is not None:
        return f"exception escaped run(): {r.exc}"
    if r.rc == 2:
        lines = r.err.splitlines()
        if len(lines) != 1 or not lines[0].strip():
            shown = " | ".join(lines[-3:])[:300]
            return f"exit 2 with {len(lines)} stderr lines (want 1): {shown!r}"
        line = lines[0]
        if not line.startswith("sigprop: error: "):
            return f"stderr line lacks 'sigprop: error: ': {line!r}"
        field = _broken_field(argv)
        if OPTION.search(line):
            return None
        if field is not None and field != "model" and field in line:
            return None
        if field == "model" and ("model" in line.lower() or (argv[1] and argv[1] in line)):
            return None
        return f"stderr names no option{' or field ' + field if field else ''}: {line!r}"
    if r.rc == 0:
        at = [i for i, a in enumerate(argv) if a == "--format"]
        if at and argv[at[-1] + 1:at[-1] + 2] == ["json"]:
            return _json_violation(r.out)
        return None
    tail = (r.err.strip().splitlines() or [""])[-1][:300]
    return f"exit code {r.rc} (want 0 or 2); stderr ends {tail!r}"


def check(argv: list[str], limit: float | None = None) -> Result:
    """Run ``argv`` and fail with the command line if the contract is broken."""
    r = invoke(argv, limit)
    STATS[argv[0]] += 1
    STATS[f"{argv[0]}:rc={r.rc if r.exc is None else 'exc'}"] += 1
    SECONDS[argv[0]] += r.seconds
    v = violation(argv, r)
    assert v is None, f"sigprop {shlex.join(argv)}\n  -> {v}"
    return r


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    """Cap the address space while fuzzing (a runaway allocation must surface as MemoryError,
    not get the machine's OOM killer to end the run) and print the example counts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = MEMORY_CAP if soft == resource.RLIM_INFINITY else min(soft, MEMORY_CAP)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    t0 = time.perf_counter()
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    n = sum(v for k, v in STATS.items() if ":" not in k)
    wall = time.perf_counter() - t0
    per = ", ".join(f"{k} {v} ({SECONDS[k]:.1f} s)" for k, v in sorted(STATS.items())
                    if ":" not in k)
    rcs = ", ".join(f"{k} {v}" for k, v in sorted(STATS.items()) if ":" in k)
    msg = f"fuzz: {n} examples in {wall:.1f} s [{per}]\nfuzz outcomes: {rcs}"
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if rep is not None:
        with cap.global_and_fixture_disabled() if cap else contextlib.nullcontext():
            rep.write_line("\n" + msg)
    Path(tempfile.gettempdir(), "sigprop_fuzz_stats.txt").write_text(msg + "\n")


# ---- the fuzz tests -------------------------------------------------------------------------
# examples per command in the default suite: the theory / validation paths get most, the
# simulations fewer; make test-slow runs SLOW_FACTOR times as many (halved again, factor
# doubled, when the trained-model tests joined the default suite: the fuzz tests were ~5 of
# its 10 minutes of test time on 2 cores; the slow suite runs as many examples as before)
BUDGET = {"predict": 40, "translate": 125, "diagram": 25, "measure": 40, "longctx": 40,
          "train": 20, "trainability": 5, "diagnose": 30, "fix": 15}
SLOW_FACTOR = 20


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much],
                    print_blob=False)


def _fuzz(command: str, n: int):
    @_settings(n)
    @given(argv=command_line(command, PATHS))
    def test(argv):
        check(argv)

    test.__name__ = f"test_fuzz_{command}"
    return test


test_fuzz_predict = _fuzz("predict", BUDGET["predict"])
test_fuzz_translate = _fuzz("translate", BUDGET["translate"])
test_fuzz_diagram = _fuzz("diagram", BUDGET["diagram"])
test_fuzz_measure = _fuzz("measure", BUDGET["measure"])
test_fuzz_longctx = _fuzz("longctx", BUDGET["longctx"])
test_fuzz_train = _fuzz("train", BUDGET["train"])
test_fuzz_trainability = _fuzz("trainability", BUDGET["trainability"])
test_fuzz_diagnose = _fuzz("diagnose", BUDGET["diagnose"])
test_fuzz_fix = _fuzz("fix", BUDGET["fix"])


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(BUDGET))
def test_fuzz_slow(command):
    _fuzz(command, BUDGET[command] * SLOW_FACTOR)()


@_settings(6)
@given(t=st.sampled_from(["2", "5", "16"]), norm=st.sampled_from(["post"]),
       act=st.sampled_from(["relu", "gelu"]))
def test_fuzz_causal_post_ln_finite_t(t, norm, act):
    """Causal post-LN finite-T theory (slow table builds): few examples, own time limit."""
    check(["predict", "--causal", "--norm", norm, "--activation", act, "--seq-len", t,
           "--depth", "2", "--d-model", "16", "--heads", "2", "--format", "json"], limit=120)


# ---- valid edge cases, each once ------------------------------------------------------------
SMALL = ["--depth", "1", "--d-model", "8", "--heads", "2", "--seq-len", "8", "--format", "json"]
EDGES = [
    ["predict", "--seq-len", "2", "--depth", "1", "--d-model", "8", "--heads", "8",
     "--format", "json"],
    ["predict", *SMALL, "--beta", "0"],
    ["predict", *SMALL, "--alpha-attn", "0", "--alpha-mlp", "0"],
    ["predict", *SMALL, "--rho0", "1"],
    ["predict", *SMALL, "--rho0", "1", "--asymptotic"],
    ["predict", *SMALL, "--norm", "none", "--attention", "uniform"],
    ["predict", *SMALL, "--attention", "centred", "--beta", "0"],
    ["measure", *SMALL, "--seeds", "1", "--sequences", "1", "--rho0", "1"],
    ["measure", *SMALL, "--seeds", "1", "--sequences", "1", "--beta", "0", "--seq-len", "2"],
    ["longctx", *SMALL, "--lengths", "2", "--queries", "2", "--chunk", "16"],
    ["longctx", *SMALL, "--lengths", "2,3", "--queries", "2", "--chunk", "16", "--input",
     "rem"],
    ["train", *SMALL, "--steps", "1", "--batch-size", "1", "--task", "reverse"],
    # slow-suite findings: uniform attention never uses W_Q/W_K (their gradient is 0, not an
    # autograd error)
    ["measure", *SMALL, "--seeds", "1", "--sequences", "1", "--attention", "uniform",
     "--grads"],
    ["diagram", *SMALL, "--grid", "2"],
    ["translate", *SMALL, "--beta", "0"],
]


@pytest.mark.parametrize("argv", EDGES, ids=[" ".join(a[:1] + a[11:]) for a in EDGES])
def test_valid_edges_exit_0(argv):
    r = check(argv)
    assert r.rc == 0, f"sigprop {shlex.join(argv)}\n  -> valid edge case exited {r.rc}: " \
                      f"{r.err.strip()[:300]!r}"


# ---- determinism under --no-timing ----------------------------------------------------------
DETERMINISM = {
    "measure": ["measure", "--depth", "2", "--d-model", "16", "--heads", "2", "--seq-len", "8",
                "--seeds", "2", "--sequences", "2"],
    "longctx": ["longctx", "--depth", "1", "--d-model", "16", "--heads", "2", "--seq-len", "8",
                "--lengths", "8,32", "--queries", "4", "--chunk", "16"],
    "train": ["train", "--depth", "1", "--d-model", "16", "--heads", "2", "--seq-len", "8",
              "--steps", "3", "--batch-size", "2", "--vocab-size", "100", "--documents", "20"],
    "diagnose": ["diagnose", PATHS.valid_configs[0], "--seq-len", "8", "--seeds", "1",
                 "--sequences", "2"],
}


@pytest.mark.parametrize("command", sorted(DETERMINISM))
def test_same_seed_same_json_without_timing(command):
    argv = DETERMINISM[command] + ["--seed", "3", "--format", "json", "--no-timing"]
    first, second = check(argv), check(argv)
    assert first.rc == 0 and second.rc == 0, f"sigprop {shlex.join(argv)}\n  -> exit " \
        f"{first.rc}/{second.rc}: {first.err.strip()[:300]!r}"
    assert first.out == second.out, f"sigprop {shlex.join(argv)}\n  -> two runs differ"
    assert '"seconds"' not in first.out, f"sigprop {shlex.join(argv)}\n  -> --no-timing " \
        "left a 'seconds' field"
