"""Paper-ready matplotlib figures.

Figures are built as bare :class:`matplotlib.figure.Figure` objects, never through pyplot, so
a library call never switches the user's backend or leaves figures open: each ``plot_*``
returns its Figure (a notebook shows it) and writes it when given a path (the format follows
the extension: .png, .svg, .pdf ...).

Every ``plot_*`` of this package takes ``ax=None`` (the convention of seaborn's axes-level
functions and scikit-learn's ``Display.plot(ax=)``), read by :func:`panels`:

- ``None``: a new Figure of the plot's own size and layout (what the command line writes);
- one Axes, or a sequence (or array) of as many Axes as the plot has panels: the plot draws
  into them and leaves the figure to its owner: no layout change, no figure title, and a
  figure-wide legend goes on one of the panels instead;
- a Figure or SubFigure: the plot makes its panels in it and puts its title, legend and
  colour bar there, as in a figure of its own; the spacing stays the owner's (a plot adjusts
  the margins only of a figure it made).

The return value is always the root Figure that holds the panels (``ax.figure`` for Axes of a
plain figure), written to ``path`` only when one is given.
"""

from __future__ import annotations

import numpy as np

from ..spec import ArchSpec

REGIME_COLOURS = ("#4c72b0", "#f2c14e", "#d1495b")  # trainable, rank, entropy collapse


def new_figure(figsize: tuple[float, float], layout: str | None = None):
    """A Figure outside pyplot (no backend, no global state)."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout=layout)


def root_figure(artist):
    """The top-level Figure holding ``artist`` (an Axes, a Figure or a SubFigure)."""
    from matplotlib.figure import Figure, FigureBase

    fig = artist if isinstance(artist, FigureBase) else artist.figure
    while not isinstance(fig, Figure):  # a SubFigure's .figure is its parent (matplotlib 3.10+)
        fig = fig.figure
    return fig


def panels(ax, size: tuple[float, float], nrows: int = 1, ncols: int = 1, *,
           count: int | None = None, layout: str | None = None, **subplots):
    """The Axes a plot draws into, read from its ``ax`` argument (module docstring).

    Returns ``(figure, host, axes)``: the root Figure, the Figure or SubFigure that takes the
    plot's figure-level parts (title, legend, colour bar; None when ``ax`` gave the Axes), and
    a list of ``count`` Axes (default ``nrows * ncols``). A grid made here is ``nrows x ncols``
    (``subplots`` passed to ``subplots``: sharing, ratios), its cells past ``count`` hidden;
    ``ax=None`` makes a new Figure of ``size`` with ``layout``. Given Axes must number
    ``count``."""
    from matplotlib.figure import FigureBase

    count = nrows * ncols if count is None else count
    if ax is not None and not isinstance(ax, FigureBase):
        axes = list(np.atleast_1d(np.asarray(ax, dtype=object)).ravel())
        if len(axes) != count:
            raise ValueError(f"ax: this plot draws {count} panel(s), got {len(axes)} Axes")
        return root_figure(axes[0]), None, axes
    host = new_figure(size, layout=layout) if ax is None else ax
    grid = host.subplots(nrows, ncols, squeeze=False, **subplots).ravel()
    for extra in grid[count:]:
        extra.set_visible(False)
    return root_figure(host), host, list(grid[:count])


def finish(fig, path: str | None, dpi: int):
    """Write ``fig`` to ``path`` when given; return it."""
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def plot_diagram(d, path: str | None = None, spec: ArchSpec | None = None, dpi: int = 150,
                 *, ax=None):
    """gg25 Fig. 1(c)-style diagram: the three regimes over (beta, alpha_attn), the
    alpha_crit(L) curve, beta_c and the spec's own point. One panel; ``ax`` as in the module
    docstring."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    own = ax is None
    fig, _, (ax,) = panels(ax, (5.6, 4.2))
    if own:
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)  # one draw, not two
    extent = (d.betas[0], d.betas[-1], d.alphas[0], d.alphas[-1])
    ax.imshow(d.regime.T, origin="lower", aspect="auto", extent=extent,
              cmap=ListedColormap(REGIME_COLOURS), vmin=0, vmax=2, interpolation="nearest")
    below = d.betas <= d.beta_c
    crit = np.where(np.isfinite(d.alpha_crit), d.alpha_crit, np.nan)
    ax.plot(d.betas[below], crit[below], "k-", lw=1.6, label="α_crit(L)")
    if np.isfinite(d.beta_c):
        ax.axvline(d.beta_c, color="k", ls="--", lw=1.0, label="β_c(ρ0)")
    p = d.point
    ax.plot([p["beta"]], [p["alpha"]], marker="*", ms=14, mfc="white", mec="k",
            ls="none", label="this spec")
    ax.set_xlim(extent[0], extent[1])
    ax.set_ylim(extent[2], extent[3])
    ax.set_xlabel("β (score scale, gg25 Eq. 11)")
    ax.set_ylabel("α_attn (attention residual strength)")
    title = f"Trainability, L={d.depth}"
    if spec is not None:
        title += f", {spec.norm}-LN, {spec.activation}, T={spec.seq_len}"
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=c, label=n) for c, n in
               zip(REGIME_COLOURS, ("trainable", "rank collapse", "entropy collapse"),
                   strict=True)]
    h2, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + h2, fontsize=7, loc="upper right", framealpha=0.9)
    return finish(fig, path, dpi)


def plot_depth(traj, path: str | None = None, spec: ArchSpec | None = None,
               observables=("cos", "ipr", "entropy"), dpi: int = 150, *, ax=None):
    """gg25 Fig. 1(d, e)-style depth curves: theory as lines, measurements as dots with
    standard-error bars, one panel per observable of ``observables`` present in ``traj`` (two
    a row); ``ax`` as in the module docstring (as many Axes as those panels)."""
    obs = [o for o in observables if o in set(traj["observable"])]
    ncol = min(len(obs), 2)  # two panels a row: readable at a page's width
    nrow = -(-len(obs) // ncol)
    fig, host, axes = panels(ax, (4.6 * ncol, 3.3 * nrow), nrow, ncol, count=len(obs),
                             layout="constrained")
    styles = {"theory": ("-", "C0"), "theory_asymptotic": ("--", "C2")}
    for ax, o in zip(axes, obs, strict=True):
        sub = traj[traj["observable"] == o]
        for src, (ls, col) in styles.items():
            s = sub[sub["source"] == src].sort_values("layer")
            if len(s):
                ax.plot(s["layer"], s["value"], ls, color=col, lw=1.6,
                        label=src.replace("_", " "))
        m = sub[sub["source"] == "measured"].sort_values("layer")
        if len(m):
            ax.errorbar(m["layer"], m["value"], yerr=m["stderr"].fillna(0.0), fmt="o",
                        color="C3", ms=3.5, capsize=2, lw=1, label="measured")
        ax.set_xlabel("layer")
        ax.set_ylabel(o)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if spec is not None and host is not None:
        host.suptitle(f"{spec.norm}-LN, L={spec.depth}, d={spec.d_model}, H={spec.heads}, "
                      f"T={spec.seq_len}, beta={spec.beta_eff:.3g}", fontsize=9)
    return finish(fig, path, dpi)
