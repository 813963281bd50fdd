"""The Parquet results store (sigprop.runs.store): atomic one-file-per-task writes, reading
back, failures, and refusing folders that are not stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sigprop.runs.store import Store, StoreError


def _frame(n=3, shift=0.0):
    return pd.DataFrame({"layer": np.arange(n), "observable": "cos", "source": "measured",
                         "value": np.linspace(0, 1, n) + shift, "stderr": np.nan})


def test_write_read_roundtrip(tmp_path):
    s = Store(tmp_path / "st")
    s.write("measure", {"beta": 0.5, "depth": 2, "lengths": [1, 2]}, _frame())
    s.write("measure", {"beta": 1.5, "depth": 2, "lengths": [1, 2]}, _frame(shift=1))
    s.write("predict", {"beta": 0.5}, _frame(2))
    df = s.read()
    assert len(df) == 3 + 3 + 2
    assert set(df["command"]) == {"measure", "predict"}
    m = s.read("measure")
    assert len(m) == 6 and sorted(m["beta"].unique()) == [0.5, 1.5]
    assert set(m["lengths"]) == {"[1,2]"}  # list-valued config as JSON text
    row = m[m["beta"] == 1.5].iloc[0]
    assert json.loads(row["config"]) == {"beta": 1.5, "depth": 2, "lengths": [1, 2]}
    assert row["config_hash"] == Store.key("measure", {"lengths": [1, 2], "depth": 2,
                                                       "beta": 1.5})
    np.testing.assert_allclose(m[m["beta"] == 1.5]["value"], np.linspace(0, 1, 3) + 1)
    q = s.read(query='command == "measure" and beta > 1')
    assert len(q) == 3 and (q["beta"] == 1.5).all()


def test_rewrite_replaces_not_duplicates(tmp_path):
    s = Store(tmp_path / "st")
    cfg = {"beta": 0.5}
    s.write("measure", cfg, _frame())
    s.write("measure", cfg, _frame(shift=2))
    df = s.read()
    assert len(df) == 3 and df["value"].min() == 2
    assert len(list((tmp_path / "st" / "command=measure").glob("*.parquet"))) == 1
    assert s.done("measure") == {Store.key("measure", cfg)}
    assert s.has("measure", cfg) and not s.has("measure", {"beta": 0.6})


def test_task_columns_win_over_config(tmp_path):
    """A config key the task's table already has (longctx's seq_len) keeps the table's column;
    the config value stays in ``config``."""
    s = Store(tmp_path / "st")
    f = _frame().assign(seq_len=[64, 128, 256])
    s.write("longctx", {"seq_len": 32, "beta": 1.0}, f)
    df = s.read()
    assert list(df["seq_len"]) == [64, 128, 256]
    assert json.loads(df["config"].iloc[0])["seq_len"] == 32


def test_failures_recorded_and_cleared(tmp_path):
    s = Store(tmp_path / "st")
    cfg = {"beta": -1}
    s.write_failure("predict", cfg, "SpecError: beta: must be >= 0\nsecond line", attempts=2)
    f = s.failures()
    assert len(f) == 1 and f["error"].iloc[0] == "SpecError: beta: must be >= 0"
    assert f["attempts"].iloc[0] == 2 and len(s.read()) == 0
    s.write("predict", cfg, _frame())
    assert s.failures().empty


def test_metadata_not_in_rows(tmp_path):
    s = Store(tmp_path / "st")
    s.write("predict", {"beta": 1.0}, _frame(), meta={"seconds": 1.25})
    assert "seconds" not in s.read().columns
    t = s.tasks()
    assert t["seconds"].iloc[0] == 1.25 and t["rows"].iloc[0] == 3


def test_refuses_foreign_folders(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a sigprop results store"):
        Store(tmp_path / "home")
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        Store(tmp_path / "file")
    with pytest.raises(StoreError, match="not a sigprop results store"):
        Store(tmp_path / "missing", create=False)
    Store(tmp_path / "empty")  # a new folder becomes a store
    assert Store(tmp_path / "empty", create=False).read().empty


def test_leftover_temp_files_of_dead_writers_are_cleared(tmp_path):
    s = Store(tmp_path / "st")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    tmp = tmp_path / "st" / "_tmp"
    tmp.mkdir(exist_ok=True)
    (tmp / f"abc.{dead}.1234.parquet").write_bytes(b"half a file")
    (tmp / f"abc.{os.getpid()}.5678.parquet").write_bytes(b"being written")
    Store(tmp_path / "st")
    left = sorted(p.name for p in tmp.iterdir())
    assert left == [f"abc.{os.getpid()}.5678.parquet"]
    assert s.read().empty  # temp files are never read as results


def test_config_values_must_be_finite_and_plain(tmp_path):
    s = Store(tmp_path / "st")
    with pytest.raises(ValueError, match="finite"):
        s.write("predict", {"beta": float("nan")}, _frame())
    with pytest.raises(TypeError, match="config values"):
        s.write("predict", {"beta": object()}, _frame())
    with pytest.raises(ValueError, match="reserved"):
        s.write("predict", {"config_hash": 1}, _frame())
