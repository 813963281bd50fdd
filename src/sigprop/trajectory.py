"""The tidy Trajectory table (ARCHITECTURE.md, CLI.md "JSON rows").

A Trajectory is a :class:`pandas.DataFrame` with one row per (layer, observable, source) and
the columns ``layer, observable, source, value, stderr``, optional command-specific columns
(``head``, ``step``, ``seq_len`` ...) and, when built with a spec, the spec's fields prefixed
``spec.``. Everything downstream (compare, store, plot, report) consumes this one shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from .jsonutil import clean, clean_json  # noqa: F401  (re-exported)
from .spec import ArchSpec

OBSERVABLES = (
    "cos", "q", "ipr", "ipr_cross", "entropy", "wmax", "stable_rank", "gap",
    "grad_qk", "grad_v", "loss",
)
SOURCES = ("theory", "theory_asymptotic", "measured")
CORE_COLUMNS = ["layer", "observable", "source", "value", "stderr"]


def make(records: Iterable[Mapping[str, Any]], spec: ArchSpec | None = None) -> pd.DataFrame:
    """Build a Trajectory from row dicts with at least ``layer, observable, source, value``."""
    df = pd.DataFrame.from_records(list(records))
    if df.empty:
        df = pd.DataFrame(columns=CORE_COLUMNS)
    if "stderr" not in df:
        df["stderr"] = np.nan
    bad = set(df["observable"]) - set(OBSERVABLES)
    if bad:
        raise ValueError(f"unknown observable(s) {sorted(bad)}; allowed: {OBSERVABLES}")
    bad = set(df["source"]) - set(SOURCES)
    if bad:
        raise ValueError(f"unknown source(s) {sorted(bad)}; allowed: {SOURCES}")
    df["layer"] = df["layer"].astype(int)
    df["value"] = df["value"].astype(float)
    df["stderr"] = df["stderr"].astype(float)
    extra = [c for c in df.columns if c not in CORE_COLUMNS]
    df = df[CORE_COLUMNS + extra]
    if spec is not None:
        for k, v in spec.to_dict().items():
            df[f"spec.{k}"] = v
    return df


def to_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON rows per CLI.md (spec columns dropped; NaN/inf become null)."""
    cols = [c for c in df.columns if not c.startswith("spec.")]
    return [{k: clean(v) for k, v in zip(cols, row, strict=True)}
            for row in df[cols].itertuples(index=False, name=None)]


def wide(df: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Layer x observable table of values (for display), optionally one source only."""
    sub = df if source is None else df[df["source"] == source]
    return sub.pivot_table(index="layer", columns="observable", values="value", aggfunc="first")
