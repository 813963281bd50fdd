"""``sigprop.longctx``: one attention layer's statistics against context length, streamed
without a T x T matrix, with the finite-T and T -> infinity theory beside them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..spec import ArchSpec
from .longctx_model import ModelSweep
from .predict import spec_with
from .result import Result

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


@dataclass
class LongContext(Result):
    """Rows per (scaling, seq_len, observable, source); ``trends`` per scaling (does
    attention condense, spread or stay as T grows)."""

    spec: ArchSpec
    trajectory: pd.DataFrame
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def trends(self) -> dict[str, dict]:
        from ..measurement.longctx import trends

        return trends(self.trajectory)

    def summary(self) -> str:
        parts = [f"{k} {v['direction']}" for k, v in self.trends.items()]
        return f"LongContext: T in {self.info.get('lengths')}: " + ", ".join(parts)

    def plot(self, path: str | None = None) -> Figure:
        """ipr, entropy, wmax and output cosine against log2 T, one colour per scaling."""
        from ..plotting.longctx import plot_sweep

        return plot_sweep(self.trajectory, path, spec=self.spec)


def longctx(spec: Any = None, lengths: Sequence[int] | None = None, *,
            queries: int | None = None, input: str = "rho", compare: bool = False,
            chunk: int = 8192, seed: int = 0, on_progress: Callable[[int], None] | None = None,
            **fields: Any) -> LongContext | ModelSweep:
    """Attention statistics against context length, streamed without a T x T matrix.

    ``spec`` an :class:`ArchSpec` (or None with spec fields as keywords): the spec's first
    attention layer, weights drawn once at ``spec.seq_len``, at every length in ``lengths``
    (default 2^9 .. 2^20) on ``queries`` (256) sampled rows; ``compare``: also gg25's
    sqrt(log T) and clpr25's log T scalings.

    Anything else (a preset name, a local path, an HF config or config dict, an ``nn.Module``):
    every attention layer of that model with its own weights, norm and rotary embedding
    (:func:`sigprop.analysis.longctx_model.sweep_model`, default lengths 2^12 .. 2^20,
    ``queries`` 128; keywords ``train_len``, ``seq_len``, ``scalings``, ``band``, ``layers``,
    ``out_queries``, ``sequences``, ``device``, ``workers`` go there), with a recommended
    length scaling."""
    from ..measurement.longctx import sweep

    if spec is not None and not isinstance(spec, ArchSpec):
        from .longctx_model import sweep_model

        return sweep_model(spec, lengths, queries=128 if queries is None else queries,
                           compare=compare, chunk=chunk, seed=seed, on_progress=on_progress,
                           **fields)
    queries = 256 if queries is None else queries
    spec = spec_with(spec, fields)
    sw = sweep(spec, lengths, queries=queries, input=input, compare=compare, chunk=chunk,
               seed=seed, on_progress=on_progress)
    return LongContext(spec=spec, trajectory=sw.trajectory, seconds=sw.seconds,
                       info=dict(sw.info))
