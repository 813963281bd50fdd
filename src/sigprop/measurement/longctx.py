"""Long context for one layer: one attention layer's statistics against context length T
(docs/theory.md §2.3, §3.2), measured by streaming (:mod:`sigprop.measurement.streaming`)
beside the finite-T theory and its T -> infinity limit.

Semantics. The weights are drawn once, from the spec as it stands (``spec.seq_len`` is the
reference, i.e. training, length ``T_ref``: Q/K std ``spec.rem_qk_std()``), and only the context
length varies. The base score std is ``sigma_0 = spec.sigma_s / m(T_ref)`` and a length scaling
multiplies the logits by ``m(n)`` at ``n`` keys, so at length T

    sigma_s(T) = spec.sigma_s * m(T) / m(T_ref)        (docs/theory.md §2.1, §3.2).

(``spec.replace(seq_len=T).sigma_s`` is *not* this when the spec is given by ``beta``: it would
redraw the weights for every T, i.e. hold beta fixed, which is the ``sqrt-log-n`` scaling below.)
Causal rows see ``t`` keys and use ``m(t)`` for the n-dependent scalings, as
:class:`sigprop.nn.attention.BatchedAttention` does.

Comparison mode runs, on the same tokens, weights and sampled rows (one streaming pass shares the
K/V projections), three logit multipliers normalised to 1 at ``T_ref``: ``none``;
``sqrt-log-n`` = ``sqrt(log n / log T_ref)`` (gg25: beta = sigma_s / sqrt(log T) held fixed);
``log-n`` = ``log n / log T_ref`` (clpr25's critical log-length scaling); plus the spec's own
scaling when it is another one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..spec import ArchSpec, SpecError, score_multiplier

INPUTS = ("rho", "isometric", "rem")
COMPARE = ("none", "sqrt-log-n", "log-n")
MAX_QUERIES = 65536


def default_lengths() -> list[int]:
    """2^9, 2^10, ..., 2^20."""
    return [2**k for k in range(9, 21)]


def relative_multiplier(kind: str, spec: ArchSpec, n) -> np.ndarray:
    """Logit multiplier at ``n`` keys relative to the weights drawn at ``spec.seq_len``, so that
    the score std is ``sigma_0 * result`` with ``sigma_0 = spec.sigma_s / spec.multiplier``.

    ``kind``: ``spec`` (the spec's own scaling: ``score_multiplier(spec.scaling, n,
    spec.scaling_param)``), ``none`` / ``sqrt-log-n`` / ``log-n`` (comparison mode: times the
    spec's multiplier at ``T_ref``, each ratio 1 at ``n = T_ref``)."""
    n = np.asarray(n, dtype=np.float64)
    t_ref = spec.seq_len
    if kind == "spec":
        return score_multiplier(spec.scaling, n, spec.scaling_param)
    base = spec.multiplier
    if kind == "none":
        return np.full_like(n, base)
    logn = np.log(np.maximum(n, 1.0))
    if kind == "sqrt-log-n":
        return base * np.sqrt(logn / math.log(t_ref))
    if kind == "log-n":
        return base * logn / math.log(t_ref)
    raise ValueError(f"unknown multiplier kind {kind!r}")


def _per_row(kind: str, spec: ArchSpec) -> bool:
    """Whether causal rows use their own n = t (n-dependent scalings)."""
    if kind == "spec":
        return spec.scaling in ("log-n", "sqrt-log-n", "qwen", "sqrt-qwen", "ssmax")
    return kind in ("sqrt-log-n", "log-n")


def scaling_kinds(spec: ArchSpec, compare: bool) -> list[tuple[str, str]]:
    """(label for the ``scaling`` column, multiplier kind) of a run."""
    if not compare:
        return [(spec.scaling, "spec")]
    kinds = [(k, k) for k in COMPARE]
    if spec.scaling not in ("none", "log-n", "sqrt-log-n"):
        kinds.append((spec.scaling, "spec"))
    return kinds


# ------------------------------------------------------------------------------------ theory
def theory_rows(spec: ArchSpec, T: int, kind: str, *, rho: float, rem: bool,
                asymptotic: bool) -> dict[str, float]:
    """ipr, entropy, wmax and the output cosine of the layer at length T (docs/theory.md
    §2.3-2.4), through :func:`sigprop.theory.attention.attention_stats` and
    :func:`sigprop.theory.blocks.attention_map` with score std ``sigma_s(T)``. Key-query rows: a
    REM at variance ``sigma_s^2 (1 - rho)`` averaged over the chi2(d_head) query norms; ``rem``:
    i.i.d. scores of std ``sigma_s`` (row variance exactly ``sigma_s^2``, rows independent),
    values still from tokens at cosine ``rho``. Causal with an n-dependent scaling: the causal
    position average of ``attention_stats`` with each node's own ``sigma_s(t)`` (the same nodes
    and pair weights)."""
    from ..theory import attention as att
    from ..theory import blocks

    sigma0 = spec.sigma_s / spec.multiplier
    r_scores = 0.0 if rem else rho
    d_head = None if rem else spec.d_head
    if spec.attention == "uniform":
        st = att.uniform_stats((), T, causal=spec.causal, asymptotic=asymptotic)
    elif spec.causal and _per_row(kind, spec) and not asymptotic:
        st = _causal_per_node(spec, T, kind, sigma0, r_scores, d_head)
    else:
        sig = sigma0 * float(relative_multiplier(kind, spec, T))
        st = att.attention_stats(sig, r_scores, T, d_head=d_head, causal=spec.causal,
                                 asymptotic=asymptotic, full=True)
    qa, pa = blocks.attention_map(1.0, rho, st, variant=spec.attention, var_v=spec.var_v,
                                  var_b=spec.sigma_b2, var_o=spec.var_o)
    cos = float(pa / qa) if qa > 0 else 1.0
    return {"ipr": float(st.y2), "entropy": float(st.entropy), "wmax": float(st.wmax),
            "cos": cos}


def _causal_per_node(spec, T, kind, sigma0, rho, d_head):
    """Causal average of docs/theory.md §2.4 with the score std of the node's own length."""
    from ..theory import attention as att
    from ..theory import causal_positions

    nodes, weights = att.causal_position_nodes(T)
    pair, inv_cross = causal_positions.causal_pair_weights(T, nodes)
    acc = np.zeros(4)
    for t, w, pw in zip(nodes, weights, pair, strict=True):
        if t == 1:
            vals = (1.0, 1.0, 1.0, 1.0)
        else:
            sig = sigma0 * float(relative_multiplier(kind, spec, t))
            st = att.attention_stats(sig, rho, int(t), d_head=d_head, full=True)
            vals = (st.y2, st.yx, st.entropy, st.wmax)
        acc += np.array([w, w * pw, w, w]) * np.array(vals, dtype=np.float64)
    return att.AttentionStats(acc[0], acc[1], acc[2], acc[3],
                              np.float64(np.sum(weights / nodes)), np.float64(inv_cross))


@dataclass
class StreamedLengths:
    """The Trajectory of :func:`stream_lengths` and what produced it."""

    trajectory: object  # pandas DataFrame
    seconds: float
    info: dict = field(default_factory=dict)


def check_args(lengths, queries, chunk, input, spec):
    if not lengths:
        raise SpecError("lengths", "give at least one length")
    for T in lengths:
        if isinstance(T, bool) or not isinstance(T, int | np.integer) or not 2 <= T <= 2**30:
            raise SpecError("lengths", f"each length must be an integer in [2, 2^30] (got {T!r})")
    if not 2 <= queries <= MAX_QUERIES:  # the output cosine is a mean over pairs of rows
        raise SpecError("queries", f"must be an integer in [2, {MAX_QUERIES}] (got {queries})")
    if not 16 <= chunk <= 2**20:
        raise SpecError("chunk", f"must be an integer in [16, 1048576] (got {chunk})")
    if input not in INPUTS:
        raise SpecError("input", f"must be one of {', '.join(INPUTS)} (got {input!r})")
    if spec.attention == "uniform" and input == "rem":
        raise SpecError("input", "rem scores need softmax or centred attention")


def check_resources(spec: ArchSpec, lengths, *, queries: int, chunk: int, input: str,
                    n_scalings: int, workers: int | None = None) -> float:
    """Refuse (``SpecError``) a run of :func:`stream_lengths` above the work bound or the
    available memory (:func:`sigprop.measurement.memory.check_work` / ``check`` with the
    ``longctx`` model)."""
    import torch

    from . import memory

    need = memory.check("longctx", spec=spec, lengths=lengths, queries=queries, chunk=chunk,
                        n_scalings=n_scalings, workers=workers or torch.get_num_threads(),
                        rem=input == "rem", shrink={"chunk": 16, "queries": 1, "lengths": 2**20})
    memory.check_work(lengths, queries, n_scalings)
    return need


def stream_lengths(spec: ArchSpec, lengths: Sequence[int] | None = None, *, queries: int = 256,
                   input: str = "rho", compare: bool = False, chunk: int = 8192,
                   seed: int = 0, workers: int | None = None,
                   on_progress: Callable[[int], None] | None = None) -> StreamedLengths:
    """Measure ipr, entropy, wmax (rows of ``measured``: mean over the R sampled rows of the
    head-averaged value, stderr = std over rows / sqrt(R); one weight draw, so seed-to-seed
    spread is not included) and the output cosine (mean over pairs of sampled rows; stderr
    null) of ``spec``'s first attention layer at every length, with ``theory`` (finite T) and
    ``theory_asymptotic`` beside them. Layer 0 carries the inputs' cosine, layer 1 the
    attention (as in ``sigprop predict``). Rows carry ``seq_len``, ``scaling`` and ``sigma_s``.
    ``on_progress(keys)`` is called with the number of keys streamed since the last call."""
    import torch

    from .. import trajectory
    from . import observables as obs
    from . import stream_inputs as si
    from . import streaming as st

    lengths = default_lengths() if lengths is None else [int(t) if isinstance(t, np.integer)
                                                         else t for t in lengths]
    check_args(lengths, queries, chunk, input, spec)
    rho = spec.rho_init
    if input == "isometric" and spec.rho0 not in (None, 0.0):
        raise SpecError("rho0", "isometric inputs are orthogonal (rho0 = 0); use --input rho")
    kinds = scaling_kinds(spec, compare)
    check_resources(spec, lengths, queries=queries, chunk=chunk, input=input,
                    n_scalings=len(kinds), workers=workers)
    sigma0 = spec.sigma_s / spec.multiplier
    t0 = time.perf_counter()
    weights = st.LayerWeights.from_spec(spec, seed)
    records = []
    for T in lengths:
        source = si.token_source(input, T, spec.d_model, rho=rho, seed=seed)
        R = min(queries, T)
        g = torch.Generator().manual_seed(int(seed))
        rows = torch.randperm(T, generator=g)[:R].sort().values
        n_keys = (rows + 1).numpy() if spec.causal else np.full(R, T)
        mults = [relative_multiplier(kind, spec, n_keys if _per_row(kind, spec) else T)
                 for _, kind in kinds]
        done = [0]

        def tick(stop, done=done):
            if on_progress is not None:
                on_progress(stop - done[0])
                done[0] = stop

        res = st.stream_attention(source, weights, rows, multipliers=mults,
                                  causal=spec.causal, variant=spec.attention,
                                  rem_std=sigma0 if input == "rem" else None, chunk=chunk,
                                  seed=seed, workers=workers, on_chunk=tick)
        x_rows = source.rows(rows).double()
        base = dict(seq_len=T)
        records.append(dict(layer=0, observable="cos", source="measured",
                            value=float(obs.mean_cos(x_rows)), scaling="inputs", **base))
        records.append(dict(layer=0, observable="cos", source="theory", value=rho,
                            scaling="inputs", **base))
        for (label, kind), r in zip(kinds, res, strict=True):
            sig = sigma0 * float(relative_multiplier(kind, spec, T))
            extra = dict(scaling=label, sigma_s=sig, **base)
            for name in ("ipr", "entropy", "wmax"):
                per_row = getattr(r, name).nanmean(dim=1)  # head average
                ok = ~torch.isnan(per_row)
                v = per_row[ok]
                err = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
                records.append(dict(layer=1, observable=name, source="measured",
                                    value=float(v.mean()), stderr=err, **extra))
            records.append(dict(layer=1, observable="cos", source="measured",
                                value=float(obs.mean_cos(r.out)), **extra))
            for asym, src_name in ((False, "theory"), (True, "theory_asymptotic")):
                th = theory_rows(spec, T, kind, rho=rho, rem=input == "rem", asymptotic=asym)
                for name, val in th.items():
                    records.append(dict(layer=1, observable=name, source=src_name, value=val,
                                        **extra))
    traj = trajectory.make(records, spec)
    return StreamedLengths(traj, time.perf_counter() - t0,
                           {"input": input, "queries": queries, "chunk": chunk,
                            "compare": compare, "scalings": [k for k, _ in kinds], "rho0": rho,
                            "seed": seed, "lengths": lengths, "t_ref": spec.seq_len})


# ---- reading a run ------------------------------------------------------------------------
def layer1(traj):
    return traj[traj["layer"] == 1]


def trends(traj) -> dict[str, dict]:
    """Per scaling: measured ipr and entropy at the shortest and longest length and the
    direction as T grows: ``condenses`` (ipr up by more than max(0.02, 3 stderr): towards
    entropy collapse), ``spreads`` (ipr down by as much: towards uniform attention, i.e. rank
    collapse after a few layers) or ``steady``; ``n/a`` with a single length."""
    out = {}
    m = layer1(traj)
    m = m[m["source"] == "measured"]
    for scaling, sub in m.groupby("scaling", sort=False):
        ipr = sub[sub["observable"] == "ipr"].sort_values("seq_len")
        ent = sub[sub["observable"] == "entropy"].sort_values("seq_len")
        first, last = ipr.iloc[0], ipr.iloc[-1]
        row = {"T_first": int(first["seq_len"]), "T_last": int(last["seq_len"]),
               "ipr_first": float(first["value"]), "ipr_last": float(last["value"]),
               "entropy_first": float(ent.iloc[0]["value"]),
               "entropy_last": float(ent.iloc[-1]["value"])}
        if len(ipr) < 2:
            row["direction"] = "n/a"
        else:
            err = np.nan_to_num(math.hypot(first["stderr"], last["stderr"]))
            tol = max(0.02, 3.0 * float(err))
            delta = row["ipr_last"] - row["ipr_first"]
            row["direction"] = ("condenses" if delta > tol else
                                "spreads" if delta < -tol else "steady")
        out[str(scaling)] = row
    return out
