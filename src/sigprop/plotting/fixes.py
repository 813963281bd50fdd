"""The fix ranking's figure (``sigprop fix --compare``,
:meth:`sigprop.analysis.ranking.FixRanking.plot`): one horizontal bar per method, measured
final cosine with the theory's as a marker, and the lowest head entropy beside it; bars
coloured by the measured verdict."""

from __future__ import annotations

import numpy as np

from .figures import REGIME_COLOURS, finish, panels

_COLOURS = dict(zip(("trainable", "rank_collapse", "entropy_collapse"), REGIME_COLOURS,
                    strict=True)) | {"input_lost": "#7b3294",  # the comparison's own failures
                                     "signal_lost": "#4d4d4d"}


def plot_ranking(c, path: str | None = None, dpi: int = 150, *, ax=None):
    """Two panels sharing the methods axis (ranked, baseline on top): final cos (measured
    bars, theory diamonds, the rank-collapse threshold dashed) and the lowest normalised
    head entropy (the entropy-collapse line dashed at 0.5). ``ax``: None, two Axes, or a
    Figure / SubFigure (:mod:`sigprop.plotting.figures`)."""
    rows = [("baseline", c.baseline["measured"], c.baseline["predicted"],
             c.baseline["verdict"])] + [(r.method, r.measured, r.predicted, r.verdict)
                                        for r in c.rows if r.error is None]
    n = len(rows)
    own = ax is None
    fig, host, (ax1, ax2) = panels(ax, (7.5, 0.32 * n + 1.4), 1, 2, sharey=True,
                                   gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(n)[::-1]
    colours = [_COLOURS.get(v, "#888888") for *_, v in rows]
    meas = [m.get("cos_final", np.nan) for _, m, _, _ in rows]
    ax1.barh(y, meas, color=colours, height=0.7, label="measured")
    th = [(p or {}).get("cos_final") for _, _, p, _ in rows]
    ty = [yy for yy, t in zip(y, th, strict=True) if t is not None]
    ax1.scatter([t for t in th if t is not None], ty, marker="D", s=18, color="black",
                zorder=3, label="theory")
    ax1.axvline(c.spec.rho_max, ls="--", lw=0.8, color="grey")
    ax1.set_xlim(min(-0.05, np.nanmin(meas) - 0.05), 1.02)
    ax1.set_xlabel("final cos")
    ax1.set_yticks(y, [name for name, *_ in rows])
    ax1.legend(loc="lower right", fontsize=7, frameon=False)
    ent = [m.get("entropy_min", np.nan) for _, m, _, _ in rows]
    ax2.barh(y, ent, color=colours, height=0.7)
    ax2.axvline(0.5, ls="--", lw=0.8, color="grey")
    ax2.set_xlim(0, 1.02)
    ax2.set_xlabel("lowest head entropy / log T")
    if host is not None:
        host.suptitle(f"{c.model}: fixes at T = {c.seq_len}", fontsize=9)
    if own:
        fig.tight_layout()
    return finish(fig, path, dpi)


#: the name before the fix comparison became the fix ranking
plot_compare = plot_ranking
