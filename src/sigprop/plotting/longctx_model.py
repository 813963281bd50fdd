"""Per-layer long-context figure of a real model (``sigprop longctx MODEL``).

A grid of panels: the top row is the normalised attention entropy (entropy / log T), the
bottom row the ipr, one column per context-length scaling. Within a panel each attention
layer is one colour of a sequential colour map: its theory as a line against log2 T, its
measurements as markers with standard-error bars, and (entropy row only) the entropy band
stated for that layer as a faint shaded strip. Deep models draw an evenly spaced subset of
layers, always including the first and the last, so the panels stay readable.

Like :mod:`.figures`, the Figure is built outside pyplot: no backend switch, nothing left
open, written only when a path is given (the format follows the suffix), and ``ax`` follows
that module's convention (here: ``2 x`` the number of scalings Axes, or a Figure / SubFigure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .figures import finish, panels

#: the two rows of the grid, top to bottom, with their axis labels
ROWS = (("entropy", "entropy / log T"), ("ipr", "ipr"))
#: the lightest part of viridis (yellow) is hard to see on white; stop short of it
_CMAP_TOP = 0.9
#: opacity of one layer's entropy band, and the most that all bands together may add up to
#: where they overlap (deep models often state the same band for every layer)
BAND_ALPHA = 0.07
_BAND_ALPHA_SUM = 0.4
#: at most this many tick labels on the log2 T axis; the rest keep an unlabelled tick
_MAX_TICK_LABELS = 7


def layer_subset(layers: Sequence[int], max_lines: int) -> list[int]:
    """At most ``max_lines`` of ``layers`` (sorted, unique), evenly spaced through the list,
    always keeping the first and the last."""
    layers = sorted({int(x) for x in layers})
    if max_lines < 1:
        raise ValueError(f"max_lines must be at least 1, got {max_lines}")
    if len(layers) <= max_lines:
        return layers
    k = max(max_lines, 2)  # the first and the last layer are always drawn
    idx = np.unique(np.rint(np.linspace(0, len(layers) - 1, k)).astype(int))
    return [layers[i] for i in idx]


def _length_label(t: int) -> str:
    """``2^12`` (as mathtext) for a power of two, the plain number otherwise."""
    if t > 0 and t & (t - 1) == 0:
        return f"$2^{{{t.bit_length() - 1}}}$"
    return str(t)


def band_of(band: Mapping | None, layer: int) -> tuple[float, float] | None:
    """The finite (lo, hi) band of ``layer``, or None (keys may be ints or strings)."""
    if not band:
        return None
    b = band.get(layer, band.get(str(layer)))
    if b is None:
        return None
    try:
        lo, hi = (float(x) for x in b)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return min(lo, hi), max(lo, hi)


def _series(df, layer: int, source: str):
    """Rows of one layer and source, one per length (duplicates averaged), sorted by T."""
    s = df[(df["layer"] == layer) & (df["source"] == source)]
    if not len(s):
        return s
    return (s.groupby("seq_len", as_index=False)[["value", "stderr"]].mean()
            .sort_values("seq_len"))


def _entropy_limits(df, bands: list[tuple[float, float]]) -> tuple[float, float]:
    """Entropy axis: the drawn values (± stderr) and bands with a small margin, inside
    [0, 1.02]."""
    v = df["value"].to_numpy(dtype=float)
    e = np.nan_to_num(df["stderr"].to_numpy(dtype=float), nan=0.0)
    pts = np.concatenate([v - e, v + e, np.asarray(bands, dtype=float).ravel()])
    pts = pts[np.isfinite(pts)]
    if not len(pts):
        return 0.0, 1.02
    lo, hi = float(pts.min()), float(pts.max())
    pad = max(0.05 * (hi - lo), 0.02)
    lo, hi = max(0.0, lo - pad), min(1.02, hi + pad)
    if hi <= lo:
        return 0.0, 1.02
    return lo, hi


def _use_log_ipr(df) -> bool:
    """ipr spans decades at long contexts (about 1/T when attention spreads): a log axis when
    the values are positive and span more than a factor of 20."""
    v = df["value"].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return bool(len(v)) and v.min() > 0 and v.max() / v.min() > 20


def _set_length_axis(ax, lengths: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(lengths)
    n = len(lengths)
    step = max(1, math.ceil(n / _MAX_TICK_LABELS))
    # counted from the longest length, which is always labelled
    ax.set_xticklabels([_length_label(t) if (n - 1 - i) % step == 0 else ""
                        for i, t in enumerate(lengths)])
    ax.set_xlim(lengths[0] / 2 ** 0.4, lengths[-1] * 2 ** 0.4)


def _rows(traj, asymptotic: bool):
    """The entropy and ipr rows of the drawn sources, with integer layers and lengths."""
    sources = ["theory", "measured", "real"] + (["theory_asymptotic"] if asymptotic else [])
    df = traj[traj["observable"].isin([o for o, _ in ROWS])]
    df = df[df["source"].isin(sources)]
    if not len(df):
        raise ValueError("no entropy or ipr rows to plot")
    return df.assign(layer=df["layer"].astype(int), seq_len=df["seq_len"].astype(int))


def _layer_colours(all_layers: list[int]):
    """The colour map (viridis short of its yellow end) and the layer normalisation."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap, Normalize

    base = colormaps["viridis"]
    cmap = ListedColormap(base(np.linspace(0.0, _CMAP_TOP, 256)), name="viridis_part")
    lo_l, hi_l = all_layers[0], all_layers[-1]
    norm = Normalize(lo_l - 0.5, hi_l + 0.5) if lo_l == hi_l else Normalize(lo_l, hi_l)
    return cmap, norm


def _draw_panel(ax, sub, drawn: list[int], colour: dict, bands: dict, alpha: float,
                asymptotic: bool) -> None:
    """One panel's layers: the band strip (when ``bands`` has the layer), the theory line,
    the dashed limit (``asymptotic``) and the measured markers with their errors."""
    for layer in drawn:
        c = colour[layer]
        if layer in bands:
            ax.axhspan(*bands[layer], color=c, alpha=alpha, lw=0, zorder=0, gid="band")
        th = _series(sub, layer, "theory")
        if len(th):  # a single length gets a short dash, or it would not show
            ax.plot(th["seq_len"], th["value"], "-", color=c, lw=1.3,
                    marker="_" if len(th) == 1 else None, ms=12,
                    label=f"layer {layer}", zorder=2)
        if asymptotic:
            asy = _series(sub, layer, "theory_asymptotic")
            if len(asy):
                ax.plot(asy["seq_len"], asy["value"], "--", color=c, lw=0.9,
                        alpha=0.7, label=f"_layer {layer} asymptotic", zorder=2)
        me = _series(sub, layer, "measured")
        if len(me):
            ax.errorbar(me["seq_len"], me["value"], yerr=me["stderr"].fillna(0.0),
                        fmt="o", ms=3.5, color=c, mec="white", mew=0.4, elinewidth=0.9,
                        capsize=0, label=f"_layer {layer} measured", zorder=3)
        re = _series(sub, layer, "real")
        if len(re):  # the model itself on real text (trained weights)
            ax.errorbar(re["seq_len"], re["value"], yerr=re["stderr"].fillna(0.0),
                        fmt="s", ms=5, color=c, mfc="none", mew=1.0, elinewidth=0.7,
                        capsize=0, label=f"_layer {layer} real", zorder=4)
    ax.grid(alpha=0.25)


def _set_axes(axes, df, drawn: list[int], bands: dict, lengths: list[int]) -> None:
    """The entropy row's limits, the ipr row's log scale when it spans decades, and the
    log2 length axis of every panel."""
    ent = df[(df["observable"] == "entropy") & df["layer"].isin(drawn)]
    limits = _entropy_limits(ent, list(bands.values()))
    for ax in axes[0]:
        ax.set_ylim(*limits)
    ipr = df[(df["observable"] == "ipr") & df["layer"].isin(drawn)]
    if _use_log_ipr(ipr):
        for ax in axes[1]:
            ax.set_yscale("log", nonpositive="clip")
    for ax in axes.ravel():
        _set_length_axis(ax, lengths)


def _colour_bar(where, axes, cmap, norm, all_layers: list[int]) -> None:
    """The ``layer`` colour bar beside ``axes``, drawn by the (sub)figure ``where``."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.ticker import MaxNLocator

    sm = ScalarMappable(norm=norm, cmap=cmap)
    cb = where.colorbar(sm, ax=axes.ravel().tolist(), label="layer", shrink=0.9, pad=0.02)
    if len(all_layers) <= 10:
        cb.set_ticks(all_layers)
    else:
        cb.locator = MaxNLocator(integer=True)
        cb.update_ticks()


def _key(measured: bool, asymptotic: bool, banded: bool, real: bool = False) -> list:
    """The legend's grey handles: theory, and what else is drawn."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grey = "#555555"
    handles = [Line2D([], [], color=grey, lw=1.3, label="theory")]
    if measured:
        handles.append(Line2D([], [], color=grey, marker="o", ls="none", ms=4,
                              label="measured ± se"))
    if real:
        handles.append(Line2D([], [], color=grey, marker="s", mfc="none", ls="none", ms=5,
                              label="real text ± se"))
    if asymptotic:
        handles.append(Line2D([], [], color=grey, ls="--", lw=0.9, label="T → ∞ limit"))
    if banded:
        handles.append(Patch(color=grey, alpha=0.25, lw=0, label="stated entropy band"))
    return handles


def plot_model_longctx(traj, path=None, *, band: Mapping | None = None,
                       title: str | None = None, max_lines: int = 16,
                       asymptotic: bool = False, dpi: int = 130, ax=None):
    """Normalised entropy (top row) and ipr (bottom row) against context length T on a log2
    axis, one column per scaling (in order of first appearance in ``traj``) and one colour
    per attention layer (viridis, with a ``layer`` colour bar).

    ``traj``: tidy rows with columns layer, observable, source, value, stderr, seq_len,
    scaling (other columns are ignored). Theory (source ``theory``) is drawn as lines,
    measurements as markers with standard-error bars (the model itself on real text, source
    ``real``, as hollow squares); ``asymptotic=True`` adds the
    ``theory_asymptotic`` rows as dashed lines. ``band``: ``{layer: (lo, hi)}``, the stated
    entropy band per layer, shaded faintly in that layer's colour on the entropy row.
    More than ``max_lines`` layers: an evenly spaced subset (first and last included) is
    drawn and the title says so. ``ax``: None (a new Figure), a Figure or SubFigure to lay
    the grid, colour bar, legend and title into, or ``2 x`` (number of scalings) Axes, the
    entropy row first (then the legend goes on the top right panel and there is no title).
    Returns the Figure; writes it when ``path`` is given.
    """
    df = _rows(traj, asymptotic)
    scalings = list(dict.fromkeys(df["scaling"]))
    all_layers = sorted(set(df["layer"]))
    drawn = layer_subset(all_layers, max_lines)
    lengths = sorted(set(df["seq_len"]))
    cmap, norm = _layer_colours(all_layers)
    colour = {layer: cmap(norm(layer)) for layer in drawn}

    ncol = len(scalings)
    fig, host, flat = panels(ax, (2.9 * ncol + 1.4, 5.6), 2, ncol, layout="constrained",
                             sharex=True, sharey="row")
    axes = np.array(flat, dtype=object).reshape(2, ncol)
    bands = {layer: b for layer in drawn if (b := band_of(band, layer)) is not None}
    alpha = min(BAND_ALPHA, _BAND_ALPHA_SUM / max(len(bands), 1))

    for j, scaling in enumerate(scalings):
        col = df[df["scaling"] == scaling]
        measured = bool((col["source"] == "measured").any())
        real = bool((col["source"] == "real").any())
        for i, (obs, label) in enumerate(ROWS):
            ax = axes[i, j]
            _draw_panel(ax, col[col["observable"] == obs], drawn, colour,
                        bands if obs == "entropy" else {}, alpha, asymptotic)
            if i == 0:
                # labels are data, not mathtext: a "$" in one must not be parsed
                ax.set_title(str(scaling) + ("" if measured else " (theory, real text)"
                                             if real else " (theory only)"),
                             fontsize=9, parse_math=False)
            else:
                ax.set_xlabel("context length T")
            if j == 0:
                ax.set_ylabel(label)
    _set_axes(axes, df, drawn, bands, lengths)
    _colour_bar(host if host is not None else axes[0, 0].figure, axes, cmap, norm, all_layers)
    handles = _key(bool((df["source"] == "measured").any()), asymptotic, bool(bands),
                   bool((df["source"] == "real").any()))
    if host is None:
        axes[0, -1].legend(handles=handles, fontsize=7)
        return finish(fig, path, dpi)
    host.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8,
                frameon=False)
    head = title if title is not None else "attention per layer against context length"
    if len(drawn) < len(all_layers):
        head += f" ({len(drawn)} of {len(all_layers)} layers shown, evenly spaced)"
    host.suptitle(head, fontsize=10, parse_math=False)
    return finish(fig, path, dpi)


#: the name before the long-context sweep became ``plot_model_longctx``
plot_model_sweep = plot_model_longctx
