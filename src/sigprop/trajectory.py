"""The tidy Trajectory table (docs/architecture.md, docs/cli.md "JSON rows").

A Trajectory is a :class:`pandas.DataFrame` with one row per (layer, observable, source) and
the columns ``layer, observable, source, value, stderr``, optional command-specific columns
(``head``, ``step``, ``seq_len`` ...) and, when built with a spec, the spec's fields prefixed
``spec.``. Everything downstream (compare, store, plot, report) consumes this one shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from .spec import ArchSpec

OBSERVABLES = (
    "cos", "q", "ipr", "ipr_cross", "entropy", "wmax", "stable_rank", "gap",
    "grad_qk", "grad_v", "loss", "sigma_s",
    # the per-head anatomy (measurement.anatomy_stats): mass on the first token, on special
    # tokens, on the previous / own / next position, on content keys and its entropy, and the
    # largest logit
    "sink", "special", "prev", "self", "next", "content_mass", "content_entropy", "max_logit",
    "top_key", "copy", "induction",
)
SOURCES = ("theory", "theory_asymptotic", "measured", "weights")
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
            if k == "layers":  # per-layer parameters: a flag here, the values in the spec
                df["spec.layers"] = "weights" if v is not None else None
            else:
                df[f"spec.{k}"] = v
    return df


def to_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON rows per docs/cli.md (spec columns dropped; NaN/inf become null)."""
    cols = [c for c in df.columns if not c.startswith("spec.")]
    columns = []
    for c in cols:  # column-wise (C-level tolist), not value by value: 60k rows in ~50 ms
        arr = df[c].to_numpy()
        if arr.dtype.kind == "f":
            vals = arr.tolist()
            for i in np.flatnonzero(~np.isfinite(arr)).tolist():
                vals[i] = None
        elif arr.dtype.kind in "iub":
            vals = arr.tolist()
        else:
            vals = [clean(v) for v in arr.tolist()]
        columns.append(vals)
    return [dict(zip(cols, row, strict=True)) for row in zip(*columns, strict=True)]


def wide(df: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Layer x observable table of values (for display), optionally one source only."""
    sub = df if source is None else df[df["source"] == source]
    return sub.pivot_table(index="layer", columns="observable", values="value", aggfunc="first")


# ---- JSON-safe values (every --format json output) ---------------------------------------
def clean(x: Any) -> Any:
    """One scalar: NumPy types to Python, NaN/inf to None."""
    if isinstance(x, float | np.floating):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


_PLAIN = (str, int, bool, type(None))


def _plain(d: dict) -> bool:
    """A flat dict of JSON-safe scalars (finite floats), as :func:`to_rows` makes them."""
    for v in d.values():
        if not (isinstance(v, _PLAIN) or (type(v) is float and math.isfinite(v))):
            return False
    return True


def clean_json(obj: Any) -> Any:
    """Recursively make ``obj`` JSON-safe (arrays are converted whole, not element by element;
    flat dicts that are already safe, such as Trajectory rows, are kept as they are)."""
    if isinstance(obj, dict):
        if all(type(k) is str for k in obj) and _plain(obj):
            return obj
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "iub":
            return obj.tolist()
        if obj.dtype.kind == "f":
            return np.where(np.isfinite(obj), obj, None).tolist() if obj.size else []
        return clean_json(obj.tolist())
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    return clean(obj)


def parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """A copy Parquet can store: object columns holding several types (or non-strings)
    become strings, since a Parquet column has one type; column names become strings."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if v is not None and v == v}
            if len(kinds) > 1 or (kinds and not kinds <= {str}):
                df[c] = df[c].map(lambda v: v if v is None else str(v))
    df.columns = [str(c) for c in df.columns]
    return df
