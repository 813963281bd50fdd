"""The per-head heat map of a diagnosis (layers x heads, ``sigprop diagnose --report``):
built outside pyplot like every figure of :mod:`sigprop.plotting.figures`, whose ``ax``
convention it follows."""

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
