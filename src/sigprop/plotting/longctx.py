"""Long-context figure: ipr, entropy, wmax and output cosine against context length T
(measured points with error bars, finite-T theory lines, the T -> infinity limit dashed)."""

from __future__ import annotations

from .figures import finish, panels

OBS = ("ipr", "entropy", "wmax", "cos")
_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
_TITLES = {"ipr": "ipr (1 = one key)", "entropy": "entropy / log T (1 = uniform)",
           "wmax": "largest weight", "cos": "output cosine"}


def _layer1(traj):
    return traj[traj["layer"] == 1]


def plot_longctx(traj, path: str | None = None, spec=None, dpi: int = 130, *, ax=None):
    """Four panels (ipr, entropy, wmax, cos) against T on a log2 axis: measured points with
    error bars, finite-T theory as lines, the T -> infinity limit dashed; one colour per
    scaling. ``ax``: None, four Axes, or a Figure / SubFigure
    (:mod:`sigprop.plotting.figures`). Returns the Figure; writes it when ``path`` is given."""
    df = _layer1(traj)
    own = ax is None
    fig, host, axes = panels(ax, (15, 3.6), 1, 4)
    if own:
        fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.85, wspace=0.28)
    for i, (scaling, sub) in enumerate(df.groupby("scaling", sort=False)):
        c = _COLOURS[i % len(_COLOURS)]
        for ax, name in zip(axes, OBS, strict=True):
            s = sub[sub["observable"] == name]
            for source, style in (("theory", "-"), ("theory_asymptotic", "--")):
                th = s[s["source"] == source].sort_values("seq_len")
                ax.plot(th["seq_len"], th["value"], style, color=c, lw=1.2,
                        alpha=1.0 if source == "theory" else 0.6,
                        label=f"{scaling} theory" if source == "theory" and name == "ipr"
                        else None)
            me = s[s["source"] == "measured"].sort_values("seq_len")
            ax.errorbar(me["seq_len"], me["value"], yerr=me["stderr"].fillna(0.0), fmt="o",
                        ms=4, color=c, label=f"{scaling} measured" if name == "ipr" else None)
    for ax, name in zip(axes, OBS, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length T")
        ax.set_title(_TITLES[name])
    axes[0].legend(fontsize=7)
    if spec is not None and host is not None:
        host.suptitle(f"one attention layer, d={spec.d_model}, H={spec.heads}, weights drawn "
                      f"at T_ref={spec.seq_len} (dashed: T → ∞ limit)", fontsize=10)
    return finish(fig, path, dpi)


#: the name before the long-context sweep became ``plot_longctx``
plot_sweep = plot_longctx
