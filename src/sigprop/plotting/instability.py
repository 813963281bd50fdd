"""The figure of ``sigprop instability`` (docs/instability.md): the largest attention logit,
the lowest attention entropy and the training loss against step (logit and loss in log
scale), one colour per fix, for one seed; each run's early warning (dotted) and loss spike
(dashed) marked. Consumes :class:`~sigprop.training.instability.InstabilityResult`'s
``steps`` and ``runs`` tables only; ``ax`` as in :mod:`sigprop.plotting.figures`."""

from __future__ import annotations

import math

import numpy as np

from .figures import finish, panels

_FIX_COLOUR = {"none": "#d1495b", "qk-clip": "#4c72b0", "qk-norm": "#2a9d3f",
               "sigma-reparam": "#e0a100"}


def _step_of(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def plot_instability(result, path: str | None = None, seed: int | None = None,
                     dpi: int = 150, *, ax=None):
    """Three panels against step -- max logit (log y), min entropy, loss -- one colour per
    fix at ``seed`` (default the result's first seed); a dotted line at each run's first
    early warning, a dashed one at its loss spike, QK-Clip's tau as a grey line. ``ax``:
    None, three Axes, or a Figure / SubFigure. Returns the Figure; writes it when ``path``
    is given."""
    steps, runs = result.steps, result.runs
    seed = result.seeds[0] if seed is None else seed
    own = ax is None
    fig, host, axes = panels(ax, (13, 3.8), 1, 3)
    if own:
        fig.subplots_adjust(left=0.06, right=0.98, bottom=0.15, top=0.80, wspace=0.26)
    for i, fix in enumerate(result.fixes):
        colour = _FIX_COLOUR.get(fix, f"C{i % 10}")
        sub = steps[(steps["fix"] == fix) & (steps["seed"] == seed)].sort_values("step")
        if not len(sub):
            continue
        ml = sub["max_logit"].to_numpy(dtype=float)
        axes[0].plot(sub["step"], np.where(ml > 0, ml, np.nan), lw=1.1, color=colour,
                     label=fix)
        axes[1].plot(sub["step"], sub["min_entropy"], lw=1.1, color=colour)
        axes[2].plot(sub["step"], sub["loss"], lw=0.9, color=colour)
        row = runs[(runs["fix"] == fix) & (runs["seed"] == seed)]
        if len(row):
            warn = _step_of(row["warning_step"].iloc[0])
            spike = _step_of(row["spike_step"].iloc[0])
            for a in axes:
                if warn is not None:
                    a.axvline(warn, color=colour, ls=":", lw=1.0)
                if spike is not None:
                    a.axvline(spike, color=colour, ls="--", lw=1.0)
    if "qk-clip" in result.fixes:
        axes[0].axhline(result.config.tau, color="0.5", lw=0.8,
                        label=f"tau = {result.config.tau:g}")
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].set_ylabel("largest attention logit")
    axes[1].set_ylabel("lowest head entropy (normalised)")
    axes[2].set_ylabel("training loss (nats, log)")
    for a in axes:
        a.set_xlabel("step")
    axes[0].plot([], [], color="k", ls=":", lw=1.0, label="early warning")
    axes[0].plot([], [], color="k", ls="--", lw=1.0, label="loss spike")
    c = result.config
    opt = "Muon" if c.optimizer == "muon" else "AdamW"
    clip = "" if "qk-clip" not in result.fixes else f", QK-Clip on {c.clip_on}"
    title = (f"provoked instability, seed {seed}: {opt} to lr {c.lr:g}, d={c.d_model}, "
             f"{c.layers} layers{clip}")
    if host is not None:
        host.suptitle(title, fontsize=10)
        handles, labels = axes[0].get_legend_handles_labels()
        host.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8,
                    bbox_to_anchor=(0.5, 0.93), frameon=False)
    else:
        axes[0].legend(fontsize=7)
    return finish(fig, path, dpi)
