"""Long-context figure: ipr, entropy, wmax and output cosine against context length T
(measured points with error bars, finite-T theory lines, the T -> infinity limit dashed)."""

from __future__ import annotations

OBS = ("ipr", "entropy", "wmax", "cos")
_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")


def _layer1(traj):
    return traj[traj["layer"] == 1]


def plot_sweep(traj, path: str | None = None, spec=None, dpi: int = 130):
    """Four panels (ipr, entropy, wmax, cos) against T on a log2 axis: measured points with
    error bars, finite-T theory as lines, the T -> infinity limit dashed; one colour per
    scaling. Returns the Figure; writes it when ``path`` is given."""
    from ..plotting.figures import finish, new_figure

    df = _layer1(traj)
    fig = new_figure((15, 3.6))
    axes = fig.subplots(1, 4)
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
        ax.set_title({"ipr": "ipr (1 = one key)", "entropy": "entropy / log T (1 = uniform)",
                      "wmax": "largest weight", "cos": "output cosine"}[name])
    axes[0].legend(fontsize=7)
    if spec is not None:
        fig.suptitle(f"one attention layer, d={spec.d_model}, H={spec.heads}, weights drawn at "
                     f"T_ref={spec.seq_len} (dashed: T → ∞ limit)", fontsize=10)
    return finish(fig, path, dpi)
