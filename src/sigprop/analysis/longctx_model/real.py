"""Step 6 on real text, the stream's input model checked: the model itself reads windows of
real text (through its own tokenizer) at every length up to ``real_max``, its attention layers'
own queries, keys and values are captured in that forward pass, and the statistics of the
stream's query rows (the same positions, the same scalings) are computed exactly on them
(:func:`sigprop.measurement.stream_model.stream_layer` over the captured keys). These ``real``
rows sit beside the stream's ``measured`` ones: per layer the gap in entropy and ipr
(:data:`REAL_TOL`, else the gap is stated), and whether each streamed scaling -- the
recommendation among them -- keeps the real entropy in band.

A scaling's real rows multiply the logits of that layer only, on the inputs the model as it
is gives the layer: what the stream's rows mean too (the stream fits each layer's inputs once,
from the model as it is).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
import torch

from ...measurement import memory as mem
from ...measurement import stream_model as sm
from ...spec import SpecError
from .capture import Capture, LayerFit, chosen_sites
from .model import Float32Blocks
from .scaling import Scaling
from .stream import out_cos, row_stats, sample_rows, value_at

#: a layer's real entropy and ipr agree with the stream's within this (head means over the
#: sampled rows; with 2 sequences x 128 rows their standard errors are ~0.005-0.01)
REAL_TOL = 0.03
#: the longest real pass by default on trained weights (eager attention on a CPU reads
#: several thousand tokens in seconds for small models)
DEFAULT_REAL_MAX = 4096


@dataclass
class RealCheck:
    """The real-text rows (``records``, source ``real``), the lengths read, what was read
    (``source``), notes (lengths skipped and why) and the seconds it took."""

    records: list[dict] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    source: str = ""
    sequences: int = 0
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def info(self) -> dict:
        return {"lengths": self.lengths, "source": self.source, "sequences": self.sequences,
                "tolerance": REAL_TOL}


def _bytes_needed(module, sites, sequences: int, T: int) -> float:
    """float bytes of one real pass: the captured q, k, v (float64) of every chosen layer,
    the hidden states of the pass (float32, ~16 widths per block) and, where attention is
    eager, one layer's ``sequences x H x T x T`` probabilities (x3: scores, softmax, copy)."""
    widths = sum(s.n_heads * s.head_dim + 2 * s.n_kv_heads * s.head_dim for s in sites)
    hidden = int(getattr(getattr(module, "config", None), "hidden_size", 0) or 0)
    n_blocks = max(len(sites), 1)
    impl = getattr(getattr(module, "config", None), "_attn_implementation", "eager")
    eager = 3.0 * 4 * sequences * max(s.n_heads for s in sites) * T * T \
        if impl in (None, "eager") else 0.0
    return 8.0 * sequences * T * widths + 4.0 * 16 * sequences * T * hidden * n_blocks + eager


def _layer_rows(fit: LayerFit, data: dict, T: int, streamed: Sequence[Scaling], *,
                queries: int, out_queries: int, seed: int, chunk: int,
                workers: int | None) -> list[dict]:
    """The real rows of one layer at one length: each sequence's captured q, k, v streamed at
    the stream's own row positions (:func:`.stream.sample_rows` with the same seed) under every
    scaling; head means per row, stderr over rows (and sequences); the output cosine per
    sequence, averaged."""
    H, Hkv, dh = fit.heads, fit.kv_heads, fit.head_dim
    q_all = data["q"][0].reshape(-1, T, H * dh)  # the module's first call of the pass
    k_all = data["k"][0].reshape(-1, T, Hkv * dh)
    v_all = data["v"][0].reshape(q_all.shape[0], T, -1)
    rows = sample_rows([T], queries, out_queries, causal=fit.causal, window=fit.window,
                       seed=seed)
    mults = [s.mult(rows.n_keys) for s in streamed]
    rope = None if fit.rope is None else fit.rope(T if fit.length_dependent_rope else None)
    per_seq = []
    for b in range(q_all.shape[0]):
        q = q_all[b].view(T, H, dh)[rows.pos]
        src = sm.TensorKV(k_all[b].view(T, Hkv, dh), v_all[b].view(T, Hkv, -1))
        per_seq.append(sm.stream_layer(q, rows.pos, rows.lo, rows.hi, src, scale=fit.scale,
                                       multipliers=mults, rope=rope, out_rows=rows.out,
                                       w_o=fit.w_o, b_o=fit.b_o, chunk=chunk,
                                       workers=workers))
    out = []
    base = dict(layer=fit.index, seq_len=T, source="real", sigma_s=math.nan, beta=math.nan)
    for k, s in enumerate(streamed):
        res = [p[k] for p in per_seq]
        for obs in ("ipr", "entropy", "wmax"):
            v, e = row_stats(torch.cat([getattr(r, obs).nanmean(dim=1) for r in res]))
            out.append(dict(observable=obs, value=v, stderr=e, scaling=s.label, **base))
        cos = [out_cos(r.out) for r in res]
        vals = [c[0] for c in cos if math.isfinite(c[0])]
        value = float(np.mean(vals)) if vals else math.nan
        err = float(np.std(vals) / math.sqrt(len(vals))) if len(vals) > 1 else (
            cos[0][1] if len(cos) == 1 else math.nan)
        out.append(dict(observable="cos", value=value, stderr=err, scaling=s.label, **base))
    return out


def _read(module, inputs: dict, enc_dec: bool, blocks, bf16: bool, site_fit, T: int,
          streamed: Sequence[Scaling], *, queries: int, out_queries: int, seed: int,
          chunk: int, workers: int | None, notes: list[str]) -> list[dict]:
    """One forward pass at length ``T`` with capture hooks, then every layer's real rows."""
    from .. import forward as fw

    cap = Capture([s for s, _ in site_fit], check=False)
    with ExitStack() as stack, torch.no_grad():
        if bf16:
            stack.enter_context(Float32Blocks(blocks))
        stack.enter_context(cap)
        fw.forward_once(module, inputs, enc_dec)
    records: list[dict] = []
    for (_, f), data in zip(site_fit, cap.data, strict=True):
        if not data["q"] or not data["k"] or not data["v"]:
            notes.append(f"real text at T={T}: layer {f.index} was not called")
            continue
        records += _layer_rows(f, data, T, streamed, queries=queries,
                               out_queries=out_queries, seed=seed, chunk=chunk,
                               workers=workers)
    return records


def real_check(module, config, fits: list[LayerFit], lengths: Sequence[int],
               streamed: Sequence[Scaling], *, tokens_for: Callable[[int], object], source: str,
               layers, bf16: bool, sequences: int, queries: int, out_queries: int, seed: int,
               chunk: int, workers: int | None) -> RealCheck:
    """The real rows of every fitted layer at every length of ``lengths``: one forward pass
    of ``module`` per length on ``tokens_for(T)`` (a
    :class:`~sigprop.data.model_text.TokenBatch`; a SpecError of field ``text`` -- too
    little text -- skips the length with a note), attention through SDPA where the model can
    switch to it (the captured q, k, v are what the rows need; no T x T is kept), lengths
    whose pass would not fit in memory, or fails, skipped with a note."""
    t0 = time.perf_counter()
    out = RealCheck(source=source, sequences=sequences)
    blocks, sites, chosen = chosen_sites(module, layers)
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    fit_of = {f.index: f for f in fits}
    site_fit = [(s, fit_of[i]) for s, i in zip(sites, chosen, strict=True) if i in fit_of]
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    switched = False
    if impl == "eager" and hasattr(module, "set_attn_implementation"):
        try:
            module.set_attn_implementation("sdpa")
            switched = True
        except Exception:  # noqa: BLE001 - eager stays (memory is checked for it)
            switched = False
    was_training = module.training
    module.eval()
    try:
        for T in sorted(set(int(t) for t in lengths)):
            try:
                batch = tokens_for(T)
            except SpecError as err:
                out.notes.append(f"real text at T={T} skipped: {err}")
                continue
            need = _bytes_needed(module, [s for s, _ in site_fit], sequences, T)
            have = mem.available()
            if need > mem.SAFETY * have:
                out.notes.append(f"real text at T={T} skipped: its pass needs ~{mem.gb(need)} "
                                 f"but {mem.gb(have)} are available")
                continue
            inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
            try:
                records = _read(module, inputs, enc_dec, blocks, bf16, site_fit, T, streamed,
                                queries=queries, out_queries=out_queries, seed=seed,
                                chunk=chunk, workers=workers, notes=out.notes)
            except Exception as err:  # noqa: BLE001 - the stream's result stands without it
                why = mem.allocation_failure(err) or (
                    f"{type(err).__name__}: {str(err).splitlines()[0][:160]}" if str(err)
                    else type(err).__name__)
                out.notes.append(f"real text at T={T} not read: {why}")
                continue
            out.records += records
            out.lengths.append(T)
    finally:
        module.train(was_training)
        if switched:
            module.set_attn_implementation(impl)
    out.seconds = time.perf_counter() - t0
    return out


def _gap(per: dict, obs: str, i: int) -> float:
    g = abs(per[obs + "_real"][i] - per[obs + "_stream"][i])
    return g if math.isfinite(g) else -1.0


def compare_layers(traj, layer_rows: list[dict], own: Scaling, recommended: str,
                   train_len: int, band: float, notes: list[str]
                   ) -> tuple[bool | None, dict[str, bool]]:
    """Completes each layer's row with the real check: ``real`` (per length: the real and the
    streamed entropy and ipr of the model as it is), ``real_gap`` (the largest of those
    differences), ``real_within`` (``real_gap <= REAL_TOL``; a note states the gap
    otherwise), and whether the real entropy of the model as it is and of the
    ``recommended`` scaling stays within ``band`` of the real entropy at the training length
    (``real_in_band``, ``real_recommended_in_band``: None without a real length above the
    training length; ``real_band``: the same for every scaling read on real text). Returns
    whether the recommendation holds on real text in every layer (None when it could not be
    judged) and, per scaling read, whether it holds in every layer."""
    real = traj[traj.source == "real"]
    if not len(real):
        return None, {}
    labels = list(dict.fromkeys(real.scaling))
    by_scaling: dict[str, bool] = {}
    meas = traj[traj.source == "measured"]
    verdicts = []
    for row in layer_rows:
        L = row["layer"]

        def val(df, obs, scaling, T, L=L):
            return value_at(df, L, obs, scaling, T)

        lens = sorted(int(T) for T in real[real.layer == L].seq_len.unique())
        per = {"seq_len": lens}
        gaps = []
        for obs in ("entropy", "ipr"):
            r = [val(real, obs, own.label, T) for T in lens]
            m = [val(meas, obs, own.label, T) for T in lens]
            per[f"{obs}_real"], per[f"{obs}_stream"] = r, m
            gaps += [abs(a - b) for a, b in zip(r, m, strict=True)
                     if math.isfinite(a) and math.isfinite(b)]
        row["real"] = per
        row["real_gap"] = max(gaps) if gaps else None
        row["real_within"] = None if not gaps else bool(row["real_gap"] <= REAL_TOL)
        if row["real_within"] is False:
            obs, i = max(((o, j) for o in ("entropy", "ipr") for j in range(len(lens))),
                         key=lambda p: _gap(per, *p))
            notes.append(f"layer {L}: the stream departs from real text by {row['real_gap']:.3f}"
                         f" ({obs} at T={lens[i]}: real {per[obs + '_real'][i]:.3f}, stream "
                         f"{per[obs + '_stream'][i]:.3f}): the stream draws this layer's "
                         "inputs independently per position, and they depend on position and "
                         "on their neighbours")
        centre = val(real, "entropy", own.label, train_len)
        above = [T for T in lens if T > train_len]
        if not math.isfinite(centre) or not above:
            row["real_in_band"] = row["real_recommended_in_band"] = None
            continue

        def inside(scaling, above=above, centre=centre, val=val):
            return all(abs(val(real, "entropy", scaling, T) - centre) <= band for T in above)

        row["real_band"] = {x: inside(x) for x in labels}
        row["real_in_band"] = row["real_band"][own.label]
        row["real_recommended_in_band"] = row["real_band"].get(recommended)
        verdicts.append(row["real_recommended_in_band"])
        for x, ok in row["real_band"].items():
            by_scaling[x] = by_scaling.get(x, True) and ok
    return (all(verdicts) if verdicts else None), by_scaling
