"""What a sweep runs: tasks (a command and one config each) from a grid text, a list of configs
or a YAML file (docs/sweeps.md).

Grid text, as ``sigprop sweep --grid`` takes it: ``key=v1,v2,...`` groups separated by commas,
a token with ``=`` starting the next key::

    beta=0.1:3:16,alpha_attn=0.5,1,2,depth=12,48

``start:stop:num`` is ``num`` evenly spaced values (both ends included, NumPy's ``linspace``),
``start:stop:num:log`` the same on a log scale; ``[a,b]`` is one list-valued value (``lengths``
of ``longctx``); ``true``/``false``, ``none``, integers and floats are read as such, anything
else is a string (model names, paths). The tasks are the Cartesian product of the keys, the
first key varying slowest.

YAML file::

    command: measure            # the default command of the entries below
    fixed: {d_model: 64, heads: 4, seq_len: 64, seeds: 2}
    grid: {beta: "0.1:3:16", alpha_attn: [0.5, 1, 2], depth: [12, 48]}
    configs: [{norm: pre}, {norm: post}]   # optional: each config x the grid
    sweeps:                     # optional: further entries, each like the top level
      - {command: diagnose, grid: {model: [gpt2, bert-base-uncased], seq_len: [128]}}
    store: results/             # optional run settings (the command line wins)
    executor: local
    workers: 2
    retries: 1
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .store import RESERVED, Store, canonical

__all__ = ["GridError", "MAX_TASKS", "RUN_KEYS", "Task", "expand", "load_yaml", "parse_grid",
           "parse_value"]

#: the most tasks one sweep may expand to
MAX_TASKS = 1_000_000
#: run settings a YAML file may carry (the command line overrides them)
RUN_KEYS = ("store", "executor", "workers", "address", "retries", "cpus_per_task",
            "gpus_per_task")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUM = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class GridError(ValueError):
    """A grid or sweep file that cannot be read; the message names the key or the line."""


@dataclass(frozen=True)
class Task:
    """One unit of work: ``command`` run with ``config``; ``key`` is its store hash."""

    command: str
    config: dict
    key: str

    @classmethod
    def make(cls, command: str, config: Mapping[str, Any]) -> Task:
        try:
            cfg = canonical(dict(config))
        except (TypeError, ValueError) as err:  # a YAML .inf, an object: name the key
            bad = next((k for k, v in config.items() if _unusable(v)), "config")
            raise GridError(f"{bad}: {err}") from None
        return cls(command, cfg, Store.key(command, cfg))


def _unusable(v: Any) -> bool:
    try:
        canonical(v)
        return False
    except (TypeError, ValueError):
        return True


def _split(text: str) -> list[str]:
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise GridError(f"--grid: unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise GridError(f"--grid: unbalanced '[' in {text!r}")
    out.append("".join(cur).strip())
    return out


def parse_value(text: str) -> Any:
    """One grid value from text: bool, None, int, float, a ``[...]`` list, else the string."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return [parse_value(v) for v in _split(inner)] if inner else []
    if _NUM.fullmatch(t):
        if re.fullmatch(r"[-+]?\d+", t):
            return int(t)
        x = float(t)
        if not math.isfinite(x):
            raise GridError(f"--grid: values must be finite (got {t!r})")
        return x
    return t


def _range(key: str, text: str) -> list[Any] | None:
    """``start:stop:num[:log]`` as a list, or None when ``text`` is not a range."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not all(_NUM.fullmatch(p.strip()) for p in parts[:3]):
        return None
    if len(parts) == 4 and parts[3].strip() != "log":
        raise GridError(f"{key}: a range is start:stop:num or start:stop:num:log (got {text!r})")
    a, b = float(parts[0]), float(parts[1])
    try:
        n = int(parts[2])
    except ValueError:
        raise GridError(f"{key}: the number of values in {text!r} must be an integer") from None
    if not 1 <= n <= 100_000:
        raise GridError(f"{key}: the number of values must be in [1, 100000] (got {n})")
    if len(parts) == 4:
        if a <= 0 or b <= 0:
            raise GridError(f"{key}: a log range needs start, stop > 0 (got {text!r})")
        vals = np.geomspace(a, b, n)
    else:
        vals = np.linspace(a, b, n)
    ints = all(re.fullmatch(r"[-+]?\d+", p.strip()) for p in parts[:2]) and \
        np.allclose(vals, np.round(vals))
    # round away the last-bit noise of linspace so that 0.1:0.3:3 gives 0.2, not 0.20000000000000004
    return [int(round(v)) if ints else float(f"{v:.12g}") for v in vals]


def _key(raw: str, where: str) -> str:
    k = raw.strip().replace("-", "_")
    if not _KEY.fullmatch(k):
        raise GridError(f"{where}: {raw!r} is not an option name")
    if k in RESERVED:
        raise GridError(f"{where}: {k!r} is a store column, not an option")
    return k


def parse_grid(text: str) -> dict[str, list[Any]]:
    """Grid text (module docstring) to ``{key: [values]}``, keys in the order given."""
    if not text or not text.strip():
        raise GridError("--grid: empty; give key=values groups, e.g. beta=0.1:3:16,depth=12,48")
    grid: dict[str, list[Any]] = {}
    current = None
    for tok in _split(text):
        if not tok:
            raise GridError(f"--grid: empty value in {text!r}")
        if "=" in tok and _KEY.fullmatch(tok.split("=", 1)[0].strip()):
            raw, val = tok.split("=", 1)
            current = _key(raw, "--grid")
            if current in grid:
                raise GridError(f"--grid: key {current!r} given twice")
            grid[current] = []
        elif current is None:
            raise GridError(f"--grid: must start with key=value (got {tok!r})")
        else:
            val = tok
        rng = _range(current, val.strip())
        grid[current].extend(rng if rng is not None else [parse_value(val)])
    for k, v in grid.items():
        if not v:
            raise GridError(f"--grid: key {k!r} has no values")
    return grid


def _values(key: str, v: Any) -> list[Any]:
    """A YAML grid entry as a list of values (a range string expands; a scalar is one value)."""
    if isinstance(v, str):
        rng = _range(key, v)
        return rng if rng is not None else [v]
    if isinstance(v, list | tuple):
        if not v:
            raise GridError(f"grid: key {key!r} has no values")
        return list(v)
    return [v]


def expand(command: str, grid: Mapping[str, Sequence[Any]] | None = None,
           configs: Sequence[Mapping[str, Any]] | None = None,
           fixed: Mapping[str, Any] | None = None) -> list[Task]:
    """Tasks for ``command``: every config of ``configs`` (default one empty config) times
    every point of ``grid``, on top of ``fixed``; duplicates (same hash) are dropped."""
    grid = {_key(k, "grid"): _values(k, v) for k, v in (grid or {}).items()}
    configs = list(configs or [{}])
    for c in configs:
        if not isinstance(c, Mapping):
            raise GridError(f"configs: every entry must be a mapping (got {c!r})")
    configs = [dict(c) for c in configs]
    n = len(configs) * math.prod(len(v) for v in grid.values())
    if n > MAX_TASKS:
        raise GridError(f"grid: {n} tasks; at most {MAX_TASKS} in one sweep")
    fixed = {_key(k, "fixed"): v for k, v in (fixed or {}).items()}
    tasks, seen = [], set()
    keys = list(grid)
    for c in configs:
        base = {**fixed, **{_key(k, "configs"): v for k, v in c.items()}}
        for point in itertools.product(*grid.values()):
            t = Task.make(command, {**base, **dict(zip(keys, point, strict=True))})
            if t.key not in seen:
                seen.add(t.key)
                tasks.append(t)
    return tasks


def load_yaml(path: str | Path) -> tuple[list[Task], dict[str, Any]]:
    """Tasks and run settings (:data:`RUN_KEYS`) from a sweep file (module docstring)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise GridError(f"{path}: cannot read ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise GridError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise GridError(f"{path}: a sweep file is a mapping with command and grid or configs")
    settings = {k: doc[k] for k in RUN_KEYS if k in doc}
    entries = [doc] + list(doc.get("sweeps") or [])
    tasks: list[Task] = []
    allowed = {"command", "grid", "configs", "fixed", "sweeps", *RUN_KEYS}
    for i, e in enumerate(entries):
        where = path if i == 0 else f"{path}: sweeps[{i - 1}]"
        if not isinstance(e, dict):
            raise GridError(f"{where}: an entry must be a mapping")
        extra = sorted(set(e) - allowed)
        if extra:
            raise GridError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")
        if i == 0 and "grid" not in e and "configs" not in e:
            continue  # a file of sweeps: entries only
        command = e.get("command", doc.get("command"))
        if not command:
            raise GridError(f"{where}: no command (e.g. command: measure)")
        grid = e.get("grid") or {}
        if not isinstance(grid, dict):
            raise GridError(f"{where}: grid must be a mapping of key: values")
        for t in expand(str(command), grid, e.get("configs"),
                        {**(doc.get("fixed") or {}), **(e.get("fixed") or {})}
                        if i else e.get("fixed")):
            tasks.append(t)
    if not tasks:
        raise GridError(f"{path}: no tasks (give grid or configs)")
    return tasks, settings
