"""The face every sigprop result shares: the tidy Trajectory (:meth:`Result.to_frame`), a
matplotlib Figure (:meth:`Result.plot`) and an HTML summary a notebook shows by itself
(``_repr_html_``). Nothing here prints or touches matplotlib's global state."""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: observables a result's default figure and HTML table show, in this order
SHOWN = ("cos", "q", "ipr", "entropy", "wmax", "stable_rank")


class Result:
    """Mixin for result dataclasses that carry ``trajectory`` (a tidy Trajectory) and
    ``spec``. Subclasses may override :meth:`plot` and :meth:`summary`."""

    trajectory: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        """The tidy Trajectory: one row per (layer, observable, source) with ``value`` and
        ``stderr`` (a copy: changing it leaves the result alone)."""
        return self.trajectory.copy()

    def summary(self) -> str:
        """One line: what was computed and the verdict, when there is one."""
        verdict = getattr(self, "verdict", None)
        return f"{type(self).__name__}" + (f": {verdict}" if verdict else "")

    def plot(self, path: str | None = None, *, ax=None) -> Figure:
        """Depth curves (theory lines, measured points with standard errors), one panel per
        observable; written to ``path`` when given (format from the extension). ``ax``: None
        (a new Figure), a Figure / SubFigure to draw into, or one Axes per panel
        (:mod:`sigprop.plotting.figures`); the Figure drawn into is returned."""
        from ..plotting.figures import plot_depth

        obs = [o for o in ("cos", "ipr", "entropy", "stable_rank")
               if o in set(self.trajectory["observable"])]
        return plot_depth(self.trajectory, path, spec=getattr(self, "spec", None),
                          observables=tuple(obs), ax=ax)

    def _table_html(self) -> str:
        t = self.trajectory
        t = t[t["observable"].isin(SHOWN)]
        key = [c for c in ("seq_len", "scaling") if c in t.columns]
        wide = t.pivot_table(index=[*key, "layer"], columns=["observable", "source"],
                             values="value", aggfunc="mean")
        wide.columns = [f"{o} ({s})" for o, s in wide.columns]
        return wide.to_html(float_format=lambda x: f"{x:.4g}", na_rep="", border=0)

    def _repr_html_(self) -> str:
        """Summary line, the figure as inline SVG and the per-layer table."""
        fig = self.plot()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg")
        svg = base64.b64encode(buf.getvalue()).decode("ascii")
        return (f"<div><p><b>{html.escape(self.summary())}</b></p>"
                f'<img alt="figure" src="data:image/svg+xml;base64,{svg}">'
                f"{self._table_html()}</div>")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython text repr
        p.text(self.summary())
