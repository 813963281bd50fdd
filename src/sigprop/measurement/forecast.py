"""Early warning from a trajectory: each head's recent values of a quantity projected forward
to the step at which they cross a threshold (docs/monitor.md, "early warning").

A growing quantity (a head's largest logit, its beta) is fitted as exponential growth over the
last ``window`` measured steps, ``log x = a + b step`` by least squares; a falling one (its
entropy) as a straight line. The projected crossing is where the fit meets the threshold. A
projection counts only when the trend is clear -- the slope at least ``min_t`` standard errors
from zero, from at least ``min_points`` points -- and the crossing lies within ``horizon``
steps ahead; it is re-made every step, so a trend that fades stops warning. A rising
quantity may be projected only once it is within a factor ``reach`` of its threshold (the
attention health uses 4): the
growth of a head's logits in the first steps from init is a real trend, but carried over two
e-folds and more it warns of crossings that do not come.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

__all__ = ["Projection", "Trend"]


@dataclass(frozen=True)
class Projection:
    """A trend's projected crossing: ``at`` (step, fractional), from ``step`` where the last
    value was ``value``; ``slope`` per step (of log x for growth, of x for decay) and its
    ``t`` (slope / standard error)."""

    at: float
    step: int
    value: float
    threshold: float
    slope: float
    t: float


class Trend:
    """Recent values per key (e.g. ``(layer, head)``) of one quantity and their projection.

    ``rising``: True for a quantity that grows towards ``threshold`` (fitted in log), False
    for one that falls towards it (fitted as is)."""

    def __init__(self, threshold: float, *, rising: bool = True, window: int = 20,
                 min_points: int = 5, min_t: float = 3.0, horizon: float = 200.0,
                 reach: float | None = None):
        if not math.isfinite(threshold) or (rising and threshold <= 0):
            raise ValueError(f"threshold must be finite{' and > 0' if rising else ''} "
                             f"(got {threshold!r})")
        if window < 3 or min_points < 3 or min_points > window:
            raise ValueError("need 3 <= min_points <= window")
        self.threshold, self.rising = float(threshold), rising
        self.window, self.min_points, self.min_t, self.horizon = window, min_points, min_t, \
            float(horizon)
        if reach is not None and not (rising and reach > 1):
            raise ValueError("reach applies to a rising quantity and must be > 1")
        self.reach = reach
        self.points: dict = defaultdict(lambda: deque(maxlen=window))

    def add(self, key, step: int, value: float) -> None:
        """One measured value (non-finite values, and non-positive ones of a rising
        quantity, are not fitted)."""
        if not math.isfinite(value) or (self.rising and value <= 0):
            return
        self.points[key].append((float(step), math.log(value) if self.rising else value))

    def crossed(self, value: float) -> bool:
        return value >= self.threshold if self.rising else value <= self.threshold

    def project(self, key) -> Projection | None:
        """The projected crossing of ``key``'s trend, or None (too few points, no clear trend
        towards the threshold, already across it, or beyond the horizon)."""
        pts = self.points.get(key)
        if pts is None or len(pts) < self.min_points:
            return None
        x, y = np.array(pts).T
        xm, ym = x.mean(), y.mean()
        sxx = float(((x - xm) ** 2).sum())
        if sxx <= 0:
            return None
        b = float(((x - xm) * (y - ym)).sum() / sxx)
        a = ym - b * xm
        resid = y - (a + b * x)
        dof = len(x) - 2
        se = math.sqrt(float((resid ** 2).sum()) / dof / sxx) if dof > 0 else math.inf
        t = b / se if se > 0 else (math.inf if b != 0 else 0.0)
        towards = b > 0 if self.rising else b < 0
        if not towards or abs(t) < self.min_t:
            return None
        level = math.log(self.threshold) if self.rising else self.threshold
        last_step, last = x[-1], y[-1]
        value = math.exp(last) if self.rising else last
        if self.crossed(value):
            return None
        if self.reach is not None and value < self.threshold / self.reach:
            return None  # more than `reach` x below: an extrapolation too far to warn on
        at = (level - a) / b
        if not last_step < at <= last_step + self.horizon:
            return None
        return Projection(at=float(at), step=int(last_step), value=float(value),
                          threshold=self.threshold, slope=b, t=float(t))
