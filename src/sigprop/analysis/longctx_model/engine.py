"""The long-context engine: the five steps of the package docstring composed into one run
(:func:`run`) and its result (:class:`ModelLongContext`): checks, the reference pass, the
theory's moments, the recommendation, the stream of every layer, then the per-layer summary
against each layer's entropy band.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ...measurement.rates import matmul_rate
from ...spec import SpecError
from ..result import Result
from .capture import reference_pass
from .model import build_model, position_limit, train_length
from .real import DEFAULT_REAL_MAX, RealCheck, compare_layers, real_check
from .scaling import COMPARE_ALL, Scaling, change_size, own_scaling, parse_scaling, recommend
from .stream import LayerStream, stream_layer_lengths, value_at
from .theory import moments

DEFAULT_BAND = 0.05
#: the stream's input models (:func:`run`'s ``key_model``)
KEY_MODELS = ("gaussian", "resampled")
#: a layer whose measured ipr leaves the theory by more than this gets a note saying why
GAP_NOTE = 0.03
MAX_QUERIES = 4096


def default_lengths() -> list[int]:
    """2^12, 2^14, 2^16, 2^18, 2^20."""
    return [2**k for k in range(12, 21, 2)]


@dataclass
class ModelLongContext(Result):
    """Result of :func:`run` (``sigprop.longctx_model``): tidy rows (``layer, observable,
    source, value, stderr, seq_len, scaling, sigma_s, beta``), the per-layer summary, the
    entropy band per layer, the recommendation (its JSON object:
    :meth:`.scaling.Recommendation.to_dict`) and how the run went (``info``)."""

    model: str
    trajectory: Any  # pandas DataFrame
    layers: list[dict]
    band: dict[int, tuple[float, float]]
    recommendation: dict[str, Any]
    info: dict[str, Any]
    seconds: float

    def summary(self) -> str:
        r = self.recommendation
        out = sum(1 for x in self.layers if not x.get("in_band"))
        return (f"{self.model}: {len(self.layers)} attention layers, T up to "
                f"{max(self.info['lengths'])}; {out} layer(s) leave the entropy band as is; "
                f"recommended: {r['label']} ({r['fix_command']})")

    def plot(self, path: str | None = None, *, ax=None):
        """Entropy and ipr against log2 T, one line per layer, one column per scaling, the
        band shaded (:func:`sigprop.plotting.longctx_model.plot_model_longctx`; ``ax`` as
        there)."""
        from ...plotting.longctx_model import plot_model_longctx

        return plot_model_longctx(self.trajectory, path, band=self.band,
                                  title=f"{self.model}: attention against context length",
                                  ax=ax)

    def to_json(self, timing: bool = True) -> dict[str, Any]:
        """The JSON of ``sigprop longctx MODEL --format json`` (non-finite numbers as null;
        ``timing=False`` leaves out the wall-clock and rate fields)."""

        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {str(k): clean(v) for k, v in x.items()}
            if isinstance(x, list | tuple):
                return [clean(v) for v in x]
            if isinstance(x, np.generic):
                return clean(x.item())
            return x

        info = {k: v for k, v in self.info.items()
                if timing or not k.startswith("seconds") and k not in _RATE_KEYS}
        rows = self.trajectory.to_dict(orient="records")
        out = {"model": self.model, "rows": rows, "layers": self.layers,
               "band": {str(k): list(v) for k, v in self.band.items()},
               "recommendation": self.recommendation, **info}
        if timing:
            out["seconds"] = self.seconds
        return clean(out)


#: ``info`` keys that depend on this machine's speed (left out of ``to_json(timing=False)``)
_RATE_KEYS = ("stream_gflops", "matmul_gflops", "stream_fraction")


def check_options(lengths, queries, out_queries, chunk, band, device) -> None:
    """One :class:`SpecError` naming the first option out of range."""
    if not lengths:
        raise SpecError("lengths", "give at least one length")
    for T in lengths:
        if isinstance(T, bool) or not isinstance(T, int | np.integer) or not 2 <= T <= 2**30:
            raise SpecError("lengths", f"each length must be an integer in [2, 2^30] (got {T!r})")
    for name, n in (("queries", queries), ("out_queries", out_queries)):
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_QUERIES:
            raise SpecError(name, f"must be an integer in [2, {MAX_QUERIES}] (got {n!r})")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 16 <= chunk <= 2**20:
        raise SpecError("chunk", f"must be an integer in [16, 1048576] (got {chunk!r})")
    if not (isinstance(band, float | int) and 0 < band <= 1):
        raise SpecError("band", f"must be a number in (0, 1] (got {band!r})")
    if device not in ("cpu", "cuda"):
        raise SpecError("device", f"must be cpu or cuda (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", "cuda requested but no CUDA device is available")


def given_bands(bands, layers: list[int]) -> dict[int, tuple[float, float]]:
    """Bands carried over from an earlier run (``{layer: (lo, hi)}``, keys may be strings as
    in its JSON), checked: one per streamed layer, ``0 <= lo <= hi <= 1``."""
    if not bands:
        return {}
    if not isinstance(bands, dict):
        raise SpecError("bands", f"must map each attention layer to (lo, hi) (got {bands!r})")
    out = {}
    for L in layers:
        b = bands.get(L, bands.get(str(L)))
        if b is None:
            raise SpecError("bands", f"no band for attention layer {L} (the earlier run "
                                     "streamed other layers)")
        try:
            lo, hi = (float(x) for x in b)
        except (TypeError, ValueError):
            raise SpecError("bands", f"layer {L}: a band is a pair (lo, hi) (got {b!r})") \
                from None
        if not 0.0 <= lo <= hi <= 1.0:
            raise SpecError("bands", f"layer {L}: need 0 <= lo <= hi <= 1 (got {b!r})")
        out[L] = (lo, hi)
    return out


def summarise(traj, layer_rows: list[dict], bands: dict, own: Scaling, recommended: str,
              train_len: int, band: float, notes: list[str]) -> bool:
    """Completes each layer's row: its band (measured entropy at the training length +/-
    ``band``, unless ``bands`` carries one already: it is added there), whether the model as
    it is and the ``recommended`` scaling (its label) stay in it, the worst ipr gap to theory
    (a note says why when it is above :data:`GAP_NOTE`), sigma_s / beta at the training length
    and which theory describes the score spread. Returns whether the recommendation stays in
    band in every layer."""
    m = traj[traj.source == "measured"]
    t = traj[traj.source == "theory"]
    holds = True
    for row in layer_rows:
        L = row["layer"]

        def val(df, obs, scaling, T, L=L):
            return value_at(df, L, obs, scaling, T)

        centre = val(m, "entropy", own.label, train_len)
        if L not in bands:  # else a band carried over from an earlier run (--band-from)
            bands[L] = (centre - band, centre + band)
        lo, hi = bands[L]
        lens = sorted(int(T) for T in m[m.layer == L].seq_len.unique() if T >= train_len)

        def inside(scaling, lens=lens, val=val, lo=lo, hi=hi):
            return all(lo <= val(m, "entropy", scaling, T) <= hi for T in lens)

        row["entropy_train"] = centre
        row["in_band"] = inside(own.label)
        row["recommended_in_band"] = inside(recommended)
        holds = holds and row["recommended_in_band"]
        gi = m[(m.layer == L) & (m.observable == "ipr") & (m.scaling == own.label)]
        ti = t[(t.layer == L) & (t.observable == "ipr") & (t.scaling == own.label)]
        gap = (gi.set_index("seq_len")["value"] - ti.set_index("seq_len")["value"]).abs()
        row["worst_gap"] = float(gap.max()) if len(gap) else None
        if row["worst_gap"] is not None and row["worst_gap"] > GAP_NOTE:
            why = ("RoPE rotates an anisotropic key covariance, so the score variance varies "
                   "with the distance (a mixture with a heavier tail than the REM's one "
                   "Gaussian; docs/theory.md §3.2.3)" if row["rope"] else
                   "beyond the REM tables' accuracy at this beta, or sampling (stderr above)")
            notes.append(f"layer {L}: measured ipr {row['worst_gap']:.3f} from theory: {why}")
        tr = t[(t.layer == L) & (t.observable == "ipr") & (t.scaling == own.label)
               & (t.seq_len == train_len)]
        row["sigma_s"] = float(tr["sigma_s"].iloc[0]) if len(tr) else None
        row["beta"] = float(tr["beta"].iloc[0]) if len(tr) else None
        nu = row["spread_exponent"]
        row["theory_fit"] = "n/a" if nu is None else ("gg25" if nu >= 0.25 else "clpr25")
    return holds


def _scalings_of_run(own: Scaling, recommended: Scaling, extra: list[Scaling],
                     train_len: int) -> tuple[list[Scaling], list[Scaling]]:
    """``(streamed, theory_only)``: the model as it is, the recommendation and the requested
    scalings, each once, are streamed; the kinds of :data:`COMPARE_ALL` not among them get
    theory rows only."""
    streamed = [own]
    for s in [recommended, *extra]:
        if s.label not in {x.label for x in streamed}:
            streamed.append(s)
    theory_only = [parse_scaling(k, train_len) for k in COMPARE_ALL]
    theory_only = [x for x in theory_only if x.label not in {y.label for y in streamed}]
    return streamed, theory_only


def _speed(t_fit: float, streams: list[LayerStream], longest: int, device: str,
           workers: int | None) -> dict[str, Any]:
    """How fast the run went: seconds of the reference pass and of the stream, keys streamed,
    the stream's matmul rate and its fraction of this machine's
    (:func:`sigprop.measurement.rates.matmul_rate`, measured now, after the stream)."""
    t_stream = sum(s.seconds for s in streams)
    flops = sum(s.flops for s in streams)
    base_rate = matmul_rate(workers, device=device)
    return {"seconds_reference": t_fit, "seconds_stream": t_stream, "device": device,
            "keys_streamed": longest * len(streams),
            "stream_gflops": flops / max(t_stream, 1e-9) / 1e9, "matmul_gflops": base_rate,
            "stream_fraction": flops / max(t_stream, 1e-9) / 1e9 / base_rate}


def _reference_lengths(config, lengths: list[int], train_len: int | None,
                       seq_len: int | None) -> tuple[int, list[int], int]:
    """``(train_len, every length streamed, reference-pass length)``, checked: the training
    length (default :func:`train_length`) joins the requested lengths; the reference pass
    defaults to ``min(512, train_len)``."""
    tl = int(train_len) if train_len is not None else train_length(config)
    if tl < 2:
        raise SpecError("train_len", f"must be an integer >= 2 (got {train_len!r})")
    all_lengths = sorted(set(lengths) | {tl})
    if max(all_lengths) > 2**30:
        raise SpecError("lengths", "the longest length must be <= 2^30")
    t_ref = int(seq_len) if seq_len is not None else min(512, tl)
    if not 2 <= t_ref <= 8192:
        raise SpecError("seq_len", f"must be an integer in [2, 8192] (got {seq_len!r})")
    return tl, all_lengths, t_ref


def _check_positions(built, longest: int, notes: list[str]) -> None:
    """Trained weights with a learned position table cannot read past it: a SpecError naming
    the table and its size. At init the stream may go past it (the question is then the
    architecture's, positions aside), with a note."""
    limit = position_limit(built.module)
    if limit is None or longest <= limit[1]:
        return
    name, n = limit
    if built.trained:
        raise SpecError("lengths", f"{longest} is beyond {built.name}'s learned position "
                                   f"table ({name}: {n} positions); this model reads at most "
                                   f"{n} tokens")
    notes.append(f"lengths beyond the learned position table ({name}: {n} positions): the "
                 "stream models the attention there without position embeddings")


def _inputs_text(key_model: str, real: bool) -> str:
    """What the stream's keys, values and queries are, in words (``info["inputs"]``)."""
    what = ("Gaussian keys/values/queries with each layer's measured mean and covariance"
            if key_model == "gaussian" else
            "each layer's measured queries and (key, value) pairs resampled per position")
    return what + " (reference pass at seq_len" + (
        "; real text, the first token's key and value kept as measured)" if real else ")")


def _model_text(model, built, text, tokenizer, notes: list[str]):
    """The model's own tokenizer where the run reads real text (trained weights, or ``text``
    / ``tokenizer`` given), else None (sigprop's built-in token ids: the at-init default).
    ``text`` without a tokenizer to read it is a SpecError."""
    from ...data.model_text import find_tokenizer

    if not (built.trained or text is not None or tokenizer is not None):
        return None
    tok = find_tokenizer(built.module if isinstance(model, torch.nn.Module) else model,
                         tokenizer, notes)
    if tok is None and text is not None:
        raise SpecError("tokenizer", "--text needs the model's tokenizer: none beside the "
                                     "weights; pass --tokenizer FOLDER|NAME")
    if tok is None:
        notes.append("weights read as they are, but no tokenizer found: the reference pass "
                     "reads sigprop's built-in token ids and no real-text check is made "
                     "(--tokenizer)")
    return tok


def _real_choice(rec, read: list[Scaling], holds: dict[str, bool], own: Scaling,
                 lengths: list[int], train_len: int, name: str) -> dict | None:
    """The smallest change (:func:`.scaling.change_size` over the real lengths) among the scalings
    that keep every layer's real entropy in band, with its ``sigprop fix`` command; None
    when none was read beyond the training length or none holds."""
    span = sorted({T for T in lengths if T >= train_len} | {train_len})
    ok = [s for s in read if holds.get(s.label)]
    if len(span) < 2 or not ok:
        return None
    best = min(ok, key=lambda s: change_size(s, own, span))  # ties: the order read (own first)
    cmd = replace(rec, scaling=best).measured(True, name, own).fix_command
    return {"label": best.label, "scaling": best.kind, "scaling_param": best.param,
            "up_to": max(span), "size": change_size(best, own, span), "fix_command": cmd}


def _vocab_rows(module) -> int | None:
    """The rows of the model's input embedding (None where it does not say)."""
    try:
        emb = module.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # composite models (CLIP-like) do not say
        return None
    rows = getattr(emb, "num_embeddings", None)
    return rows if isinstance(rows, int) else None


def _token_inputs(tok, rows: int | None, sequences: int, T: int, text, seed: int):
    """``sequences`` windows of ``T`` tokens of real text through ``tok``
    (:func:`sigprop.data.model_text.token_batch`), checked against the model's vocabulary
    (``rows`` embedding rows)."""
    from ...data.model_text import token_batch
    from ..forward import token_vocab

    batch = token_batch(tok, sequences, T, text=text, seed=seed)
    if rows is not None:
        token_vocab(rows, batch)  # diagnose's check: ids beyond the embedding are refused
    return batch


@dataclass
class _RealInputs:
    """What a run reads (:func:`_real_inputs`): the tokenizer (None: sigprop's ids), the
    stream's input model, the reference pass's inputs, the embedding rows, the text's name."""

    tok: Any
    key_model: str
    ref_inputs: dict | None
    rows: int | None
    source: str


def _real_inputs(model, built, text, tokenizer, real_max, key_model, sequences: int,
                 t_ref: int, seed: int) -> _RealInputs:
    """The options of real text checked, the tokenizer found and the reference pass's windows
    of real text (a note says what they are)."""
    if real_max is not None and (isinstance(real_max, bool) or not isinstance(real_max, int)
                                 or real_max < 0):
        raise SpecError("real_max", f"must be an integer >= 0 (got {real_max!r})")
    if key_model not in (None, *KEY_MODELS):
        raise SpecError("key_model", f"must be one of {', '.join(KEY_MODELS)} (got "
                                     f"{key_model!r})")
    tok = _model_text(model, built, text, tokenizer, built.notes)
    key_model = key_model or ("resampled" if tok is not None else "gaussian")
    if tok is None:
        return _RealInputs(None, key_model, None, None, "")
    rows = _vocab_rows(built.module)
    batch = _token_inputs(tok, rows, sequences, t_ref, text, seed)
    built.notes.append(f"inputs: {batch.describe()}")
    return _RealInputs(tok, key_model, {"input_ids": batch.input_ids,
                                        "attention_mask": batch.attention_mask},
                       rows, batch.source)


def _real_lengths(all_lengths: list[int], real_max: int | None, tok) -> list[int]:
    """The lengths the model itself reads (real text, up to ``real_max``)."""
    if tok is None or not real_max:
        return []
    return [T for T in all_lengths if T <= real_max]


def run(model, lengths: Sequence[int] | None = None, *, queries: int = 128,
        out_queries: int = 32, train_len: int | None = None, seq_len: int | None = None,
        sequences: int = 2, scalings: Sequence[str] | None = None, compare: bool = False,
        band: float = DEFAULT_BAND, layers: Sequence[int] | None = None,
        bands: dict | None = None, chunk: int = 8192, seed: int = 0, device: str = "cpu",
        workers: int | None = None, text=None, tokenizer=None,
        real_max: int | None = DEFAULT_REAL_MAX, key_model: str | None = None,
        on_progress: Callable[[int], None] | None = None) -> ModelLongContext:
    """Every attention layer of ``model`` at every context length (package docstring).

    ``scalings``: extra scalings to stream (``kind`` or ``kind:param``); ``compare``: also every
    kind of :data:`COMPARE_ALL`. The model as it is and the recommendation are always streamed;
    every streamed scaling gets theory rows. ``band``: half-width of the entropy band
    (``bands``: an earlier run's bands instead). ``queries`` rows per length (``out_queries``
    of them also form the layer output for the output cosine). ``train_len``: the length the
    model was built for (default :func:`train_length`), added to the lengths; ``seq_len``: the
    reference pass (default ``min(512, train_len)``).

    Real text (trained weights, or ``text`` / ``tokenizer`` given; :func:`_model_text`): the
    reference pass reads windows of it through the model's own tokenizer, the first token's
    key and value are kept as measured in the stream, and every length up to ``real_max``
    (0: none) is also read by the model itself and set beside the stream (:mod:`.real`).
    ``key_model``: the stream's inputs, ``gaussian`` (each layer's measured mean and
    covariance) or ``resampled`` (the measured queries and (key, value) pairs themselves);
    default ``resampled`` on real text, else ``gaussian``."""
    import pandas as pd

    t0 = time.perf_counter()
    lengths = default_lengths() if lengths is None else [int(t) if isinstance(t, np.integer)
                                                         else t for t in lengths]
    check_options(lengths, queries, out_queries, chunk, band, device)
    built = build_model(model, seed=seed, device="cpu")
    module, config, name, notes = built.module, built.config, built.name, built.notes
    tl, all_lengths, t_ref = _reference_lengths(config, lengths, train_len, seq_len)
    _check_positions(built, max(all_lengths), notes)
    real_in = _real_inputs(model, built, text, tokenizer, real_max, key_model, sequences,
                           t_ref, seed)
    tok, key_model, ref_inputs = real_in.tok, real_in.key_model, real_in.ref_inputs
    own = own_scaling(config, tl)
    extra = [parse_scaling(s, tl) for s in (scalings or [])]
    if compare:
        extra += [parse_scaling(k, tl) for k in COMPARE_ALL]
    fits, pass_notes = reference_pass(module, config, bf16=built.bf16, layers=layers, seq_len=t_ref,
                                      sequences=sequences, seed=seed,
                                      long_T=max(all_lengths),
                                      mult=None if own.kind == "none" else own.mult,
                                      inputs=ref_inputs, pin_first=tok is not None,
                                      pools=key_model == "resampled")
    notes += pass_notes
    t_fit = time.perf_counter() - t0
    moms = [moments(f) for f in fits]
    bands = given_bands(bands, [f.index for f in fits])
    rec = recommend(moms, fits, own, tl, all_lengths, band, bands)
    streamed, theory_only = _scalings_of_run(own, rec.scaling, extra, tl)
    real_lens = _real_lengths(all_lengths, real_max, tok)
    also = [parse_scaling(k, tl) for k in COMPARE_ALL]  # cheap on real text: all kinds
    read = streamed + [x for x in also if x.label not in {y.label for y in streamed}]
    real = RealCheck() if not real_lens else real_check(
        module, config, fits, real_lens, read, tokens_for=lambda T: _token_inputs(
            tok, real_in.rows, sequences, T, text, seed + 1),
        source=real_in.source, layers=layers, bf16=built.bf16, sequences=sequences,
        queries=queries, out_queries=out_queries, seed=seed, chunk=chunk, workers=workers)
    notes += real.notes
    # the fits hold what the stream needs (moments, W_O, the rotary module): let a model we
    # built go before streaming (Llama-3.2-1B: 2 GB of weights)
    del module
    gc.collect()
    streams = [stream_layer_lengths(f, mom, all_lengths, streamed, theory_only,
                                    queries=queries, out_queries=out_queries, seed=seed,
                                    chunk=chunk, workers=workers, device=device,
                                    on_progress=on_progress)
               for f, mom in zip(fits, moms, strict=True)]
    traj = pd.DataFrame.from_records([r for s in streams for r in s.records] + real.records)
    layer_rows = [s.layer for s in streams]
    holds = summarise(traj, layer_rows, bands, own, rec.scaling.label, tl, band, notes)
    holds_real, real_holds = compare_layers(traj, layer_rows, own, rec.scaling.label, tl,
                                            band, notes)
    rec = rec.measured(holds, name, own)
    info = {"lengths": all_lengths, "requested_lengths": list(lengths), "train_len": tl,
            "seq_len": t_ref, "sequences": sequences, "queries": queries,
            "out_queries": out_queries, "band_width": band, "chunk": chunk, "seed": seed,
            "scalings": [s.label for s in streamed], "own_scaling": own.label,
            "n_layers": len(fits), "bf16_storage": built.bf16, "notes": notes,
            **_speed(t_fit, streams, max(all_lengths), device, workers),
            "theory_only": [x.label for x in theory_only],
            "key_model": key_model, "inputs": _inputs_text(key_model, tok is not None),
            "real": real.info() if real_lens else None, "seconds_real": real.seconds}
    rec_dict = rec.to_dict()
    rec_dict["holds_real"] = holds_real
    rec_dict["real_holds"] = real_holds
    rec_dict["real_choice"] = _real_choice(rec, read if real_lens else [], real_holds, own,
                                           real.lengths, tl, name)
    return ModelLongContext(name, traj, layer_rows, bands, rec_dict, info,
                            time.perf_counter() - t0)
