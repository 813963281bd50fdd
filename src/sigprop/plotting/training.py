"""Figures of ``sigprop train`` and ``sigprop trainability`` (gg25 Fig. 4 style loss curves
beside the last layer's cosine and the attention entropy; the gg25 Fig. 1(c, f) style grid of
theory regime against training outcome). Consumes Trajectory rows and the trainability table
only; ``ax`` as in :mod:`sigprop.plotting.figures`."""

from __future__ import annotations

import math

import numpy as np

from .figures import finish, panels

_REGIME_COLOUR = {"trainable": "#4c72b0", "rank_collapse": "#e0a100",
                  "entropy_collapse": "#d1495b"}


def curve(traj, observable: str, split: str | None = None, layer: int | None = None):
    """The rows of one observable (of one ``split``, at one ``layer`` when given) in step
    order: one curve of a training run."""
    sub = traj[traj["observable"] == observable]
    if split is not None:
        sub = sub[sub["split"] == split]
    if layer is not None:
        sub = sub[sub["layer"] == layer]
    return sub.sort_values("step")


def plot_training(traj, path: str | None = None, title: str = "", labels=None,
                  baseline: float | None = None, unit: str = "nats", dpi: int = 150, *,
                  ax=None):
    """gg25 Fig. 4 style: train (thin) and eval (markers) loss vs step with the context-free
    baseline dotted (one colour per ``beta`` / ``alpha`` group when the rows carry those
    columns), the last layer's cos and the mean attention entropy during training beside
    them. ``ax``: None, three Axes, or a Figure / SubFigure (:mod:`sigprop.plotting.figures`).
    Returns the Figure; writes it when ``path`` is given."""
    keys = [k for k in ("alpha", "beta") if k in traj.columns]
    groups = traj.groupby(keys, dropna=False) if keys else [((), traj)]
    own = ax is None
    fig, host, axes = panels(ax, (12, 3.6), 1, 3)
    if own:
        fig.subplots_adjust(left=0.06, right=0.98, bottom=0.16, top=0.86, wspace=0.28)
    for i, (key, sub) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v:g}" for k, v in zip(keys, key, strict=True)) or "run"
        if labels and key in labels:
            name += f" ({labels[key]})"
        colour = f"C{i % 10}"  # one colour per group, whatever the number of groups
        tr = curve(sub, "loss", "train")
        if len(tr):
            axes[0].plot(tr["step"], tr["value"], lw=0.8, alpha=0.6, color=colour)
        ev = curve(sub, "loss", "eval")
        axes[0].plot(ev["step"], ev["value"], marker="o", ms=3, color=colour,
                     label=f"{name} eval" + (" (thin: train)" if len(tr) else ""))
        depth = int(sub["layer"].max())
        cos = curve(sub, "cos", layer=depth)
        axes[1].plot(cos["step"], cos["value"], marker="o", ms=3, color=colour)
        ent = curve(sub, "entropy").groupby("step")["value"].mean()
        axes[2].plot(ent.index, ent.values, marker="o", ms=3, color=colour)
    if baseline is not None and math.isfinite(baseline):
        axes[0].axhline(baseline, color="k", ls=":", lw=1.0, label="context-free baseline")
    axes[0].set(xlabel="step", ylabel=f"loss ({unit})", title="loss")
    axes[1].set(xlabel="step", ylabel="cos", title="last-layer token cosine", ylim=(-0.05, 1.05))
    axes[2].set(xlabel="step", ylabel="entropy / log(#keys)", title="attention entropy",
                ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=7)
    if title and host is not None:
        host.suptitle(title, fontsize=10)
    return finish(fig, path, dpi)


def plot_trainability(traj, table, path: str | None = None, dpi: int = 150, *, ax=None):
    """gg25 Fig. 1(c, f) style grid: the theory's regime of every (beta, alpha_attn) point as
    the cell colour, the training outcome as a marker (filled circle: learned, cross: stuck)
    with the loss gain below the baseline written in the cell; a red frame where training
    and theory disagree. ``traj`` is not read (the table holds every cell). One panel;
    ``ax`` as in :mod:`sigprop.plotting.figures` (given an Axes, the key is its legend).
    Returns the Figure; writes it when ``path`` is given."""
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    betas = sorted(table["beta"].unique())
    alphas = sorted(table["alpha"].unique())
    order = ("trainable", "rank_collapse", "entropy_collapse")
    grid = np.full((len(alphas), len(betas)), np.nan)
    for _, r in table.iterrows():
        grid[alphas.index(r["alpha"]), betas.index(r["beta"])] = order.index(r["theory"])
    own = ax is None
    fig, host, (ax,) = panels(ax, (1.6 + 1.3 * len(betas), 1.4 + 1.1 * len(alphas)))
    if own:
        fig.subplots_adjust(left=0.16, right=0.97, bottom=0.2, top=0.86)
    ax.imshow(grid, origin="lower", cmap=ListedColormap([_REGIME_COLOUR[k] for k in order]),
              vmin=0, vmax=2, alpha=0.45, aspect="auto", interpolation="nearest")
    for _, r in table.iterrows():
        x, y = betas.index(r["beta"]), alphas.index(r["alpha"])
        learned = r["outcome"] == "learned"
        ax.plot([x], [y + 0.1], marker="o" if learned else "X", ms=11,
                mfc="k" if learned else "none", mec="k", mew=1.5, ls="none")
        ax.text(x, y - 0.28, f"{r['gain']:+.2f}", ha="center", va="center", fontsize=8)
        if not r["agree"]:
            ax.add_patch(Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, fill=False, ec="red",
                                   lw=2))
    ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
    ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set_xlabel("β (score scale)")
    ax.set_ylabel("α_attn (attention residual)")
    ax.set_title("trainability: theory regime (colour) vs training (marker);\n"
                 "number: eval-loss gain below the baseline (nats)", fontsize=9)
    handles = [Patch(color=_REGIME_COLOUR[k], alpha=0.45, label=k.replace("_", " "))
               for k in order]
    handles += [Line2D([], [], marker="o", mfc="k", mec="k", ls="none", label="learned"),
                Line2D([], [], marker="X", mfc="none", mec="k", ls="none", label="stuck")]
    if host is None:
        ax.legend(handles=handles, fontsize=7)
    else:
        host.legend(handles=handles, loc="lower center", ncol=5, fontsize=7, frameon=False)
    return finish(fig, path, dpi)
