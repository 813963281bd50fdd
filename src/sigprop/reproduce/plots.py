"""The figure helpers every reproduced item's ``plot_X(data, ax=None) -> Figure`` draws with.

A plot function draws on the Axes it is given, or on a new constrained-layout Figure when
``ax`` is None (:func:`axes_grid`, :func:`axes_row`), and returns the Figure; :func:`decorate`
puts the axis labels, the title and the legend on a panel in the gallery's house sizes (title
9 pt, legend 7 pt), :func:`titled` the figure's title (10 pt) on a figure the plot made.
Figures are built outside pyplot (:func:`sigprop.plotting.figures.new_figure`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["axes_grid", "axes_row", "decorate", "titled"]


def axes_grid(ax, nrows: int, ncols: int, size: tuple[float, float], *, sharex: bool = False,
              sharey: bool = False):
    """The figure and its ``nrows x ncols`` panels as a 2-D array: a new constrained-layout
    figure of ``size`` (panels sharing the x or y axis as asked) when ``ax`` is None, else
    ``ax`` (one Axes or a sequence of ``nrows * ncols``) and the figure it belongs to."""
    from ..plotting.figures import new_figure

    if ax is None:
        fig = new_figure(size, layout="constrained")
        return fig, fig.subplots(nrows, ncols, sharex=sharex, sharey=sharey, squeeze=False)
    axes = np.atleast_1d(np.asarray(ax, dtype=object)).ravel()
    if axes.size != nrows * ncols:
        raise ValueError(f"ax: must be {nrows * ncols} Axes (got {axes.size})")
    return axes[0].figure, axes.reshape(nrows, ncols)


def axes_row(ax, ncols: int, size: tuple[float, float], sharey: bool = False):
    """The figure and its ``ncols`` panels in a row, as a list (:func:`axes_grid`, one
    row)."""
    fig, axes = axes_grid(ax, 1, ncols, size, sharey=sharey)
    return fig, list(axes[0])


def decorate(ax, x: str | None = None, y: str | None = None, title: str | None = None, *,
             size: float = 9, legend: float | None = 7, legend_title: str | None = None,
             **legend_kw) -> None:
    """Label one panel: the x and y axis labels, the title at font size ``size`` and a legend
    at font size ``legend`` (``None``: no legend) headed ``legend_title``, ``legend_kw`` going
    to ``Axes.legend``. A part left None is left as it is."""
    if x is not None:
        ax.set_xlabel(x)
    if y is not None:
        ax.set_ylabel(y)
    if title is not None:
        ax.set_title(title, fontsize=size)
    if legend is not None:
        if legend_title is not None:
            legend_kw["title"] = legend_title
        ax.legend(fontsize=legend, **legend_kw)


def titled(fig, text: str, own: bool, *, size: float = 10):
    """``fig`` with ``text`` as its title (``size`` pt) when the plot made it (``own``: its
    ``ax`` was None); a plot drawing into Axes it was given leaves the caller's figure title
    alone."""
    if own:
        fig.suptitle(text, fontsize=size)
    return fig
