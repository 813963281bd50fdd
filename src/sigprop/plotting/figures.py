"""Paper-ready matplotlib figures.

Figures are built as bare :class:`matplotlib.figure.Figure` objects, never through pyplot, so
a library call never switches the user's backend or leaves figures open: each ``plot_*``
returns its Figure (a notebook shows it) and writes it when given a path (the format follows
the extension: .png, .svg, .pdf ...).
"""

from __future__ import annotations

import numpy as np

from ..spec import ArchSpec

REGIME_COLOURS = ("#4c72b0", "#f2c14e", "#d1495b")  # trainable, rank, entropy collapse


def new_figure(figsize: tuple[float, float], layout: str | None = None):
    """A Figure outside pyplot (no backend, no global state)."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout=layout)


def finish(fig, path: str | None, dpi: int):
    """Write ``fig`` to ``path`` when given; return it."""
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def plot_diagram(d, path: str | None = None, spec: ArchSpec | None = None, dpi: int = 150):
    """gg25 Fig. 1(c)-style diagram: the three regimes over (beta, alpha_attn), the
    alpha_crit(L) curve, beta_c and the spec's own point."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    fig = new_figure((5.6, 4.2))
    ax = fig.subplots()
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
               observables=("cos", "ipr", "entropy"), dpi: int = 150):
    """gg25 Fig. 1(d, e)-style depth curves: theory as lines, measurements as dots with
    standard-error bars, one panel per observable."""
    obs = [o for o in observables if o in set(traj["observable"])]
    ncol = min(len(obs), 2)  # two panels a row: readable at a page's width
    nrow = -(-len(obs) // ncol)
    fig = new_figure((4.6 * ncol, 3.3 * nrow), layout="constrained")
    grid = fig.subplots(nrow, ncol, squeeze=False)
    axes = [list(grid.ravel()[: len(obs)])]
    for ax in grid.ravel()[len(obs):]:
        ax.set_visible(False)
    styles = {"theory": ("-", "C0"), "theory_asymptotic": ("--", "C2")}
    for ax, o in zip(axes[0], obs, strict=True):
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
    axes[0][0].legend(fontsize=7)
    if spec is not None:
        fig.suptitle(f"{spec.norm}-LN, L={spec.depth}, d={spec.d_model}, H={spec.heads}, "
                     f"T={spec.seq_len}, beta={spec.beta_eff:.3g}", fontsize=9)
    return finish(fig, path, dpi)
