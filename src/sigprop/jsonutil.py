"""JSON-safe values: NumPy scalars/arrays to Python, non-finite floats to null (light import)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


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


def clean_json(obj: Any) -> Any:
    """Recursively make ``obj`` JSON-safe (arrays are converted whole, not element by element)."""
    if isinstance(obj, dict):
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
