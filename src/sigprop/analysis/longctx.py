"""``sigprop.longctx`` and ``sigprop.longctx_model``: attention statistics against context
length, streamed without a T x T matrix, with the finite-T and T -> infinity theory beside
them; ``longctx`` for one attention layer drawn from a spec (:class:`LongContext`),
``longctx_model`` for every attention layer of a real model (:class:`ModelLongContext`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..spec import ArchSpec
from .longctx_model import ModelLongContext
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

    def plot(self, path: str | None = None, *, ax=None) -> Figure:
        """ipr, entropy, wmax and output cosine against log2 T, one colour per scaling
        (:func:`sigprop.plotting.longctx.plot_longctx`; ``ax`` as there)."""
        from ..plotting.longctx import plot_longctx

        return plot_longctx(self.trajectory, path, spec=self.spec, ax=ax)


def longctx(spec: ArchSpec | None = None, lengths: Sequence[int] | None = None, *,
            queries: int | None = None, input: str = "rho", compare: bool = False,
            chunk: int = 8192, seed: int = 0, on_progress: Callable[[int], None] | None = None,
            **fields: Any) -> LongContext:
    """One attention layer's statistics against context length, streamed without a T x T
    matrix.

    ``spec`` an :class:`ArchSpec` (or None with spec fields as keywords): the spec's first
    attention layer, weights drawn once at ``spec.seq_len``, at every length in ``lengths``
    (default 2^9 .. 2^20) on ``queries`` (256) sampled rows; ``compare``: also gg25's
    sqrt(log T) and clpr25's log T scalings.

    A model (a preset name, a local path, an HF config or config dict, an ``nn.Module``) is
    :func:`longctx_model`'s: given here it still runs there, with a ``FutureWarning``
    (``queries`` default 128, ``input`` ignored)."""
    from ..measurement.longctx import stream_lengths

    if spec is not None and not isinstance(spec, ArchSpec):
        warnings.warn("sigprop.longctx(model) is deprecated and will take a spec only: call "
                      "sigprop.longctx_model(model) for a model", FutureWarning, stacklevel=2)
        return longctx_model(spec, lengths, queries=128 if queries is None else queries,
                             compare=compare, chunk=chunk, seed=seed,
                             on_progress=on_progress, **fields)
    queries = 256 if queries is None else queries
    spec = spec_with(spec, fields)
    run = stream_lengths(spec, lengths, queries=queries, input=input, compare=compare,
                         chunk=chunk, seed=seed, on_progress=on_progress)
    return LongContext(spec=spec, trajectory=run.trajectory, seconds=run.seconds,
                       info=dict(run.info))


def longctx_model(model: Any, lengths: Sequence[int] | None = None,
                  **options: Any) -> ModelLongContext:
    """Every attention layer of a model against context length, with its own weights, norm
    and rotary embedding, the per-head theory beside it and the length scaling that keeps
    each layer's entropy in band (:mod:`sigprop.analysis.longctx_model`).

    ``model``: a preset name, a local path, an HF config or config dict, or an ``nn.Module``;
    ``lengths`` default 2^12 .. 2^20 (step 4x). ``options`` (keywords) are those of
    :func:`sigprop.analysis.longctx_model.run`: ``queries`` (128), ``out_queries`` (32),
    ``train_len``, ``seq_len``, ``sequences`` (2), ``scalings``, ``compare``, ``band`` (0.05),
    ``layers``, ``bands``, ``chunk`` (8192), ``seed`` (0), ``device`` (cpu), ``workers``,
    ``on_progress``."""
    from .longctx_model import run

    return run(model, lengths, **options)
