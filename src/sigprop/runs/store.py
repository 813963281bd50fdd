"""The results store: a folder of Parquet files, one per finished task, that a sweep killed at
any moment (SIGKILL included) can resume from without losing or repeating a row.

Layout (docs/sweeps.md)::

    DIR/_sigprop_store.json            marks the folder as a store (format version)
    DIR/command=measure/<key>.parquet  one finished task: its Trajectory rows + config columns
    DIR/_failed/<command>/<key>.json   one failed task: its config and one-line error
    DIR/_tmp/                          files being written (ignored, cleared on open)

``key`` is the task's config hash (:meth:`Store.key`): a hash of the command and its config in
canonical JSON, so the same task always lands in the same file. A task is written whole to
``_tmp`` and then renamed into place (``os.replace``, atomic on one filesystem): a reader, or a
sweep restarted after a kill, sees either the complete file or none, and a task done twice
replaces its file instead of adding rows. The guarantee covers the death of any process; after
a power cut the operating system decides what reached the disk (no fsync per task: it would
cost more than a ``predict`` point).

Rows: ``command``, ``config_hash``, ``config`` (the whole config as JSON), one column per config
key (lists and dicts as JSON text; where the task's own table already has a column of that name,
its column is kept and the config value stays in ``config``), then the task's Trajectory
columns. Run time, host and version go to the file's metadata (:meth:`Store.tasks`), never to
the rows, so two runs of one sweep store equal tables.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Mapping
from hashlib import sha256
from pathlib import Path
from typing import Any

import pandas as pd

from ..trajectory import parquet_safe

__all__ = ["FORMAT", "RESERVED", "Store", "StoreError", "canonical"]

FORMAT = 1
MARKER = "_sigprop_store.json"
#: column names a config key may not take
RESERVED = ("command", "config_hash", "config")


class StoreError(ValueError):
    """A folder that cannot be used as a store (one line, naming the folder)."""


def canonical(value: Any) -> Any:
    """A config value as plain JSON data (NumPy scalars to Python, tuples to lists; integral
    floats stay floats, so ``beta=1.0`` and ``beta=1`` are different configs only when their
    types differ). Non-finite floats are refused: a config hash must be well defined."""
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config values must be finite (got {value})")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"config values must be numbers, strings, booleans, lists or dicts "
                    f"(got {type(value).__name__})")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


class Store:
    """A results store at ``root`` (created when missing; an existing non-empty folder that is
    not a store is refused, so a typo never scatters files into a home directory)."""

    def __init__(self, root: str | os.PathLike, *, create: bool = True):
        self.root = Path(root)
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.root} is a file, not a results store folder")
        if not marker.exists():
            if not create:
                raise StoreError(f"{self.root} is not a sigprop results store (no {MARKER})")
            if self.root.exists() and any(self.root.iterdir()):
                raise StoreError(f"{self.root} exists, is not empty and is not a sigprop "
                                 f"results store (no {MARKER}); give a new or empty folder")
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({"format": FORMAT, "created": time.time()}))
            except OSError as err:
                raise StoreError(f"cannot create a store at {self.root} "
                                 f"({err.strerror or err})") from None
        else:
            fmt = json.loads(marker.read_text()).get("format")
            if fmt != FORMAT:
                raise StoreError(f"{self.root} is a store of format {fmt}; this sigprop "
                                 f"reads format {FORMAT}")
        self._tmp = self.root / "_tmp"
        if create:
            self._clear_tmp()

    # ---- keys and paths ----------------------------------------------------------------
    @staticmethod
    def key(command: str, config: Mapping[str, Any]) -> str:
        """The config hash: 20 hex digits of SHA-256 over the canonical JSON of the command
        and its config (key order does not matter)."""
        return sha256(_dumps({"command": command, "config": canonical(config)})
                      .encode()).hexdigest()[:20]

    def _dir(self, command: str) -> Path:
        return self.root / f"command={command}"

    def path(self, command: str, key: str) -> Path:
        return self._dir(command) / f"{key}.parquet"

    def _clear_tmp(self) -> None:
        """Remove what killed writers left in ``_tmp`` (files whose writing process is gone;
        another live process's file in progress stays)."""
        if not self._tmp.is_dir():
            return
        for p in self._tmp.iterdir():
            try:
                pid = int(p.name.split(".")[1])
                os.kill(pid, 0)
                continue  # its writer is alive
            except (IndexError, ValueError, ProcessLookupError):
                pass
            except PermissionError:  # alive, another user's
                continue
            p.unlink(missing_ok=True)

    def commands(self) -> list[str]:
        return sorted(p.name.split("=", 1)[1] for p in self.root.glob("command=*") if p.is_dir())

    def done(self, command: str) -> set[str]:
        """Keys of the tasks of ``command`` that finished (their file is in place)."""
        d = self._dir(command)
        return {p.stem for p in d.glob("*.parquet")} if d.is_dir() else set()

    def has(self, command: str, config: Mapping[str, Any]) -> bool:
        return self.path(command, self.key(command, config)).exists()

    # ---- writing -----------------------------------------------------------------------
    def _atomic(self, target: Path, write) -> Path:
        self._tmp.mkdir(exist_ok=True)
        tmp = self._tmp / f"{target.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}{target.suffix}"
        try:
            write(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def rows(self, command: str, config: Mapping[str, Any], frame: pd.DataFrame) -> pd.DataFrame:
        """The stored form of one task's table (see the module docstring)."""
        cfg = canonical(config)
        bad = sorted(set(cfg) & set(RESERVED))
        if bad:
            raise ValueError(f"config keys {bad} are reserved store columns")
        frame = frame.reset_index(drop=True)
        head = {"command": command, "config_hash": self.key(command, cfg), "config": _dumps(cfg)}
        for k, v in cfg.items():
            if k not in frame.columns:
                head[k] = _dumps(v) if isinstance(v, list | dict) else v
        lead = pd.DataFrame({k: [v] * len(frame) for k, v in head.items()}, index=frame.index)
        return parquet_safe(pd.concat([lead, frame], axis=1))

    def write(self, command: str, config: Mapping[str, Any], frame: pd.DataFrame, *,
              meta: Mapping[str, Any] | None = None) -> Path:
        """Store one finished task atomically (replacing an earlier copy) and clear its
        failure record. ``meta`` (run time, attempts ...) goes to the file's metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        key = self.key(command, config)
        table = pa.Table.from_pandas(self.rows(command, config, frame), preserve_index=False)
        info = {"command": command, "config": canonical(config), "finished": time.time(),
                "host": socket.gethostname(), "version": _version(), **dict(meta or {})}
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), b"sigprop": json.dumps(info, default=str)})
        out = self._atomic(self.path(command, key), lambda p: pq.write_table(table, p))
        (self.root / "_failed" / command / f"{key}.json").unlink(missing_ok=True)
        return out

    def write_failure(self, command: str, config: Mapping[str, Any], error: str,
                      attempts: int = 1) -> Path:
        """Record that a task failed (its one-line error); a later sweep tries it again."""
        key = self.key(command, config)
        rec = {"command": command, "config_hash": key, "config": canonical(config),
               "error": error.splitlines()[0] if error else "", "attempts": attempts,
               "time": time.time()}
        target = self.root / "_failed" / command / f"{key}.json"
        return self._atomic(target, lambda p: p.write_text(json.dumps(rec)))

    # ---- reading -----------------------------------------------------------------------
    def _files(self, command: str | None) -> list[tuple[str, Path]]:
        cmds = [command] if command else self.commands()
        return [(c, p) for c in cmds for p in sorted(self._dir(c).glob("*.parquet"))]

    def read(self, command: str | None = None, query: str | None = None) -> pd.DataFrame:
        """Every stored row (of ``command`` when given), tasks in key order, each task's rows
        in their own order; ``query``: a :meth:`pandas.DataFrame.query` expression (backticks
        around names with dots: ``\\`spec.depth\\` > 12``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(p) for _, p in self._files(command)]
        if not tables:
            df = pd.DataFrame(columns=list(RESERVED))
        else:
            df = pa.concat_tables([t.replace_schema_metadata(None) for t in tables],
                                  promote_options="permissive").to_pandas()
        if query:
            df = df.query(query, engine="python").reset_index(drop=True)
        return df

    def tasks(self, command: str | None = None) -> pd.DataFrame:
        """One row per finished task: command, config_hash, rows, seconds, finished, host."""
        import pyarrow.parquet as pq

        out = []
        for c, p in self._files(command):
            md = pq.read_metadata(p)
            info = json.loads((md.metadata or {}).get(b"sigprop", b"{}"))
            out.append({"command": c, "config_hash": p.stem, "rows": md.num_rows,
                        "seconds": info.get("seconds"), "finished": info.get("finished"),
                        "host": info.get("host"), "config": _dumps(info.get("config", {}))})
        return pd.DataFrame(out, columns=["command", "config_hash", "rows", "seconds",
                                          "finished", "host", "config"])

    def failures(self, command: str | None = None) -> pd.DataFrame:
        """One row per task whose last attempt failed: command, config_hash, error, attempts,
        config (JSON)."""
        cmds = [command] if command else sorted(
            p.name for p in (self.root / "_failed").glob("*") if p.is_dir())
        out = []
        for c in cmds:
            for p in sorted((self.root / "_failed" / c).glob("*.json")):
                rec = json.loads(p.read_text())
                out.append({"command": c, "config_hash": rec["config_hash"],
                            "error": rec["error"], "attempts": rec["attempts"],
                            "config": _dumps(rec["config"])})
        return pd.DataFrame(out, columns=["command", "config_hash", "error", "attempts",
                                          "config"])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sigprop")
    except PackageNotFoundError:
        return "unknown"
