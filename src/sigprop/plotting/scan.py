"""A sweep's scan drawn from the results store's rows (``sigprop results --plot``).

``y`` is an observable (``cos``, ``entropy`` ...: its rows at one layer, by default each task's
last) or any numeric column (``alpha_crit``, ``final_loss``); ``x`` a column; ``hue`` one line
per value; ``col`` one panel per value. Theory rows are drawn as lines, measured rows as
markers with their standard errors. Columns that still vary inside one (x, hue, col, source)
group are averaged over, and named in the returned note so nothing is averaged silently.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .figures import finish, panels

__all__ = ["PlotError", "config_keys", "parse_plot", "plot_scan", "scan_table"]

_OPTS = ("x", "y", "hue", "col")
_FLAGS = ("logx", "logy")
#: columns that describe a row, never a sweep coordinate
_NOT_COORDS = {"config", "config_hash", "command", "value", "stderr", "observable", "source",
               "layer"}


class PlotError(ValueError):
    """A plot request the rows cannot satisfy (names the missing column and the choices)."""


def parse_plot(text: str) -> dict:
    """``x=beta,y=cos,hue=depth[,col=alpha_attn][,logx][,logy]`` to a dict."""
    out: dict = {}
    for tok in (t.strip() for t in text.split(",")):
        if tok in _FLAGS:
            out[tok] = True
        elif "=" in tok and tok.split("=", 1)[0].strip() in _OPTS:
            k, v = (s.strip() for s in tok.split("=", 1))
            if not v:
                raise PlotError(f"{k} needs a column name")
            out[k] = v
        else:
            raise PlotError(f"{tok!r} is not x=, y=, hue=, col=, logx or logy")
    for k in ("x", "y"):
        if k not in out:
            raise PlotError(f"{k}= is required (e.g. x=beta,y=cos,hue=depth)")
    return out


def config_keys(df: pd.DataFrame) -> list[str]:
    """The config keys of a results store's rows (read from each distinct ``config`` JSON,
    in the order first seen) that are columns of ``df``."""
    import json

    keys: list[str] = []
    if "config" in df.columns:
        for text in df["config"].dropna().drop_duplicates():
            keys += [k for k in json.loads(text) if k not in keys]
    return [k for k in keys if k in df.columns]


def _coords(df: pd.DataFrame) -> list[str]:
    """The sweep's coordinates: config keys that vary across rows."""
    return [c for c in config_keys(df) if c not in _NOT_COORDS
            and df[c].nunique(dropna=False) > 1]


def scan_table(rows: pd.DataFrame, x: str, y: str, hue: str | None = None,
               col: str | None = None, layer: int | str = "last"
               ) -> tuple[pd.DataFrame, list[str]]:
    """The points to draw: one row per (col, hue, source, x) with ``value`` and ``stderr``,
    and the names of the columns averaged over."""
    df = rows
    if df.empty:
        raise PlotError("no rows to plot (is the store empty, or the query too narrow?)")
    is_obs = "observable" in df.columns and y in set(df["observable"].dropna())
    if is_obs:
        df = df[df["observable"] == y]
        if "head" in df.columns:
            df = df[df["head"].isna()]
        if "weight" in df.columns and df["weight"].notna().any():
            df = df[df["weight"].isna() | (df["weight"] == df["weight"].dropna().iloc[0])]
        if "layer" in df.columns and df["layer"].notna().any():
            if layer == "last":
                last = df.groupby("config_hash")["layer"].transform("max")
                df = df[df["layer"] == last]
            else:
                df = df[df["layer"] == int(layer)]
        df = df.assign(_y=df["value"], _se=df.get("stderr", np.nan))
    elif y in df.columns and pd.api.types.is_numeric_dtype(df[y]):
        df = df.drop_duplicates(subset=["config_hash", *([c for c in ("source",)
                                                          if c in df.columns])])
        df = df.assign(_y=df[y], _se=np.nan)
    else:
        obs = sorted(set(df["observable"].dropna())) if "observable" in df.columns else []
        num = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
        raise PlotError(f"y={y!r} is neither an observable ({', '.join(obs)}) nor a numeric "
                        f"column ({', '.join(num)})")
    for k, name in (("x", x), ("hue", hue), ("col", col)):
        if name is not None and name not in df.columns:
            cols = [c for c in df.columns if not c.startswith(("_", "spec."))]
            raise PlotError(f"{k}={name!r} is not a column (columns: {', '.join(cols)})")
    if df.empty:
        raise PlotError(f"no {y} rows at layer {layer}")
    if "source" not in df.columns:
        df = df.assign(source="measured")
    keys = [k for k in (col, hue, "source", x) if k is not None]
    averaged = [c for c in _coords(df) if c not in keys and c not in ("_y", "_se")
                and df.groupby(keys, dropna=False)[c].nunique(dropna=False).max() > 1]

    def agg(g: pd.DataFrame) -> pd.Series:
        v = g["_y"].to_numpy(dtype=float)
        if len(v) == 1:
            return pd.Series({"value": v[0], "stderr": float(g["_se"].iloc[0])})
        se = v.std(ddof=1) / np.sqrt(len(v))
        return pd.Series({"value": v.mean(), "stderr": se})

    pts = df.groupby(keys, dropna=False)[["_y", "_se"]].apply(agg).reset_index()
    return pts.sort_values(keys).reset_index(drop=True), averaged


def plot_scan(rows: pd.DataFrame, path: str | None = None, *, x: str, y: str,
              hue: str | None = None, col: str | None = None, layer: int | str = "last",
              logx: bool = False, logy: bool = False, title: str | None = None, dpi: int = 150,
              ax=None):
    """Draw the scan (module docstring); returns ``(figure, averaged_columns)`` and writes
    the figure to ``path`` when given. ``ax``: None, one Axes per ``col`` value (one Axes
    without ``col``), or a Figure / SubFigure (:mod:`sigprop.plotting.figures`)."""
    pts, averaged = scan_table(rows, x, y, hue, col, layer)
    values: Sequence = sorted(pts[col].unique(), key=_order) if col else [None]
    fig, host, axes = panels(ax, (4.2 * len(values) + 0.8, 3.4), 1, len(values),
                             layout="constrained", sharey=True)
    hues = sorted(pts[hue].unique(), key=_order) if hue else [None]
    cmap = _colours(len(hues))
    for ax, pv in zip(axes, values, strict=True):
        sub = pts if col is None else pts[pts[col] == pv]
        for i, hv in enumerate(hues):
            h = sub if hue is None else sub[sub[hue] == hv]
            label = None if hue is None else f"{hue}={_fmt(hv)}"
            for src, g in h.groupby("source"):
                g = g.sort_values(x)
                theory = str(src).startswith("theory")
                lab = label if (theory or not (h["source"].str.startswith("theory")).any()) \
                    else None
                if theory:
                    ax.plot(g[x], g["value"], "-" if src == "theory" else ":", color=cmap[i],
                            label=lab)
                else:
                    ax.errorbar(g[x], g["value"], yerr=g["stderr"].fillna(0).to_numpy(),
                                fmt="o", ms=3.5, capsize=2, color=cmap[i], label=lab)
        ax.set_xlabel(x)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        if col is not None:
            ax.set_title(f"{col}={_fmt(pv)}", fontsize=9)
        ax.grid(alpha=0.3)
    where = f" (layer {layer})" if layer != "last" else ""
    axes[0].set_ylabel(f"{y}{where}")
    srcs = set(pts["source"])
    kinds = " · ".join(k for k, ok in (("lines: theory", any(s.startswith("theory")
                                                             for s in srcs)),
                                       ("markers: measured", "measured" in srcs)) if ok)
    if host is not None:
        host.suptitle(title or f"{y} against {x}" + (f"  ({kinds})" if kinds else ""),
                      fontsize=10)
    if hue is not None:
        axes[-1].legend(fontsize=8, loc="best")
    return finish(fig, path, dpi), averaged


def _order(v):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float | np.floating) else str(v)


def _colours(n: int):
    from matplotlib import colormaps

    cm = colormaps["viridis"]
    return [cm(0.1 + 0.8 * i / max(1, n - 1)) for i in range(n)]
