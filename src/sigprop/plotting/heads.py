"""The per-head figures of a diagnosis (layers x heads, ``sigprop diagnose --report``): the
heat map of a statistic and, on trained weights, the map of the heads' roles. Built outside
pyplot like every figure of :mod:`sigprop.plotting.figures`, whose ``ax`` convention they
follow."""

from __future__ import annotations

from .figures import finish, panels

#: fixed colour scales of the per-head heat map: entropy and wmax live on [0, 1]; a scale
#: fitted to the data would paint seed noise (0.995 vs 0.997) as structure
HEATMAP_RANGE = {"entropy": (0.0, 1.0), "wmax": (0.0, 1.0)}


def plot_head_heatmap(heads, path=None, observable: str = "entropy", dpi: int = 130, *,
                      ax=None):
    """Layers x heads heat map of a per-head statistic (mean over seeds and sequences) on a
    fixed colour scale (:data:`HEATMAP_RANGE`); entropy is the row entropy over log(#keys)
    (1 = uniform, 0 = one-hot). At most ~5.5 inches tall whatever the depth. One panel and
    its colour bar; ``ax`` as in :mod:`sigprop.plotting.figures`."""
    sub = heads[heads["observable"] == observable]
    grid = sub.pivot_table(index="layer", columns="head", values="value", aggfunc="mean")
    size = (min(2.5 + 0.3 * grid.shape[1], 9), min(1.8 + 0.09 * grid.shape[0], 5.5))
    fig, _, (ax,) = panels(ax, size, layout="constrained")
    lo, hi = HEATMAP_RANGE.get(observable, (None, None))
    im = ax.imshow(grid.to_numpy(), aspect="auto", cmap="viridis", origin="lower",
                   extent=(-0.5, grid.shape[1] - 0.5, grid.index.min() - 0.5,
                           grid.index.max() + 0.5), interpolation="nearest", vmin=lo, vmax=hi)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    label = "entropy / log(#keys)" if observable == "entropy" else observable
    ax.figure.colorbar(im, ax=ax, label=label)
    ax.set_title(f"per-head {observable}", fontsize=10)
    return finish(fig, path, dpi)


#: one colour per head role (:data:`sigprop.analysis.anatomy.ROLES`): the pathology in red,
#: the roles trained models are made of in calm colours
ROLE_COLOURS = {"sink": "#4c72b0", "positional": "#55a868", "content": "#8172b2",
                "selective": "#dd8452", "diffuse": "#cccccc", "collapsed": "#c44e52"}


def plot_head_roles(roles, path=None, dpi: int = 130, *, ax=None):
    """Layers x heads map of the heads' roles (:func:`sigprop.analysis.anatomy.head_roles`),
    each cell coloured by role (:data:`ROLE_COLOURS`) and labelled with the head's largest
    logit. One panel and its legend; ``ax`` as in :mod:`sigprop.plotting.figures`."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    names = list(ROLE_COLOURS)
    code = roles.assign(c=roles["role"].map(names.index))
    grid = code.pivot_table(index="layer", columns="head", values="c", aggfunc="first")
    logit = code.pivot_table(index="layer", columns="head", values="max_logit", aggfunc="first")
    size = (min(3.2 + 0.35 * grid.shape[1], 9), min(1.8 + 0.12 * grid.shape[0], 5.5))
    fig, _, (ax,) = panels(ax, size, layout="constrained")
    ax.imshow(grid.to_numpy(dtype=float), aspect="auto", origin="lower", vmin=-0.5,
              vmax=len(names) - 0.5, cmap=ListedColormap(list(ROLE_COLOURS.values())),
              extent=(-0.5, grid.shape[1] - 0.5, grid.index.min() - 0.5,
                      grid.index.max() + 0.5), interpolation="nearest")
    if grid.size <= 400:  # the largest logit in each cell, where the cells are large enough
        for layer in grid.index:
            for (j, head) in enumerate(grid.columns):
                v = logit.loc[layer, head] if head in logit.columns else np.nan
                if np.isfinite(v):
                    ax.text(j, layer, f"{v:.0f}", ha="center", va="center", fontsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    seen = [n for n in names if n in set(roles["role"])]
    ax.legend(handles=[Patch(color=ROLE_COLOURS[n], label=n) for n in seen], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("head roles (cell: largest logit)", fontsize=10)
    return finish(fig, path, dpi)
