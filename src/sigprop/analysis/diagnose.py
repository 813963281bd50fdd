"""Diagnose a real HuggingFace architecture at initialisation (the main job).

The model is built from its config with its own ``_init_weights`` (no download), S seeds x B
sequences of built-in text go through it with :class:`sigprop.measurement.probe.Probe` (the model's
own attention implementation; probabilities recomputed from Q/K under SDPA, RoPE applied), the
theory of the equivalent :class:`ArchSpec` is put beside it, and a verdict with concrete,
quantified recommendations comes out.

Verdict (docs/theory.md §2.7, read on the measurement where it can be;
:mod:`sigprop.analysis.recommend`):
* ``entropy_collapse``: beta > beta_c(rho0) (the theory's first-layer condensation), or some
  layer's head-averaged normalised attention entropy falls below ``ENTROPY_MIN``;
* ``rank_collapse``: otherwise, if the measured cosine reaches ``rho_max`` (0.9) at some layer;
* ``trainable``: neither.

The steps: :func:`diagnose` checks its options and reads the config (``_setup``), measures
one model per draw (``_draw``: the probe, the weight reader and the hooks of
:mod:`sigprop.measurement.hooks` around one forward pass, the same for an ``nn.Module`` as for
each seed's model at init), sets the theory of :mod:`sigprop.analysis.model_theory` beside
the measurement and concludes (``_conclude``). The model's inputs and forward pass:
:mod:`sigprop.analysis.forward`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..measurement.bounds import with_bound_rows
from ..measurement.hooks import (
    EncoderMemory,
    InputGram,
    causal_seen,
    cross_probe,
    has_qk_norm,
    merge_memory,
    position_bias,
    probe_notes,
    rope_frequencies,
)
from ..spec import ArchSpec, SpecError
from . import trained as tr
from .diagnosis import Diagnosis
from .forward import (
    find_sub_model,
    has_weights_folder,
    model_folder,
    model_inputs,
    model_tokens,
    module_config,
    repeats_of,
    run_forward,
    text_token_ids,
    token_vocab,
    vocab_at_init,
)
from .model_theory import (
    decoder_spec,
    gram_applies,
    gram_input,
    measured_beta,
    position_resolved,
    theory_spec,
    with_weight_heads,
)
from .recommend import recommend, verdict_of

if TYPE_CHECKING:
    from ..models.arch import HFInfo

#: precision of the probe's statistics: the model runs in float32, so float64 statistics of its
#: float32 activations change nothing but the cost (tests/measurement/test_probe_precision.py:
#: every per-layer statistic within 1e-5 relative of float64); 5x less memory traffic
STATS_DTYPE = "float32"


def available_memory() -> float:
    """Bytes available now (:func:`sigprop.measurement.memory.available`; a module attribute so
    that tests can pretend a smaller machine)."""
    from ..measurement.memory import available

    return available()


def check_memory(config, spec: ArchSpec, sequences: int, vocab: int) -> float:
    """Refuse (``SpecError``) a diagnosis that would not fit in memory, before building any
    model: :func:`sigprop.measurement.memory.check` with the ``diagnose`` model."""
    from ..measurement import memory
    from ..models.config import config_attr

    kv = config_attr(config, "num_key_value_heads") or spec.heads
    return memory.check("diagnose", spec=spec, sequences=sequences, vocab=vocab, kv_heads=kv,
                        have=available_memory(), shrink={"seq_len": 16, "sequences": 1})


def diagnose(model: Any = "bert-base-uncased", *, seq_len: int | None = None, seeds: int = 2,
             sequences: int = 2, device: str = "cpu", seed: int = 0,
             on_seed: Callable[[int], None] | None = None, stack: str = "encoder",
             recommendations: bool = True, text: str | Path | None = None,
             tokenizer: Any = None, vs_init: bool = False) -> Diagnosis:
    """Measure ``model`` and set the theory beside it, with a verdict and recommendations.

    ``model``: a preset name, a local ``config.json`` or model folder (its safetensors
    weights are measured), a ``PretrainedConfig``, a config dict (built with the model's own
    ``_init_weights`` under ``seed``, ``seeds`` draws), or an ``nn.Module`` HuggingFace model,
    measured as it is with the weights it has (one realisation; its train/eval mode is
    restored afterwards). ``seq_len`` defaults to min(512, the model's maximum).
    ``stack``: for an encoder-decoder model, ``"encoder"`` (default) or ``"decoder"``: the
    decoder's self-attention stack, fed built-in text as ``decoder_input_ids`` of ``seq_len``
    tokens while the encoder reads its usual input (cross-attention reads that encoder output;
    its contribution to the decoder's residual stream is outside the theory); or the name of
    a block list or of a composite model's sub-model (diagnosed as a model of its own).
    ``recommendations=False`` skips the recommendations (their alpha_crit search is the
    slowest part of the theory on some stacks; ``sigprop fix --compare`` needs none).

    Inputs: trained weights (a folder's weight files, an ``nn.Module``) read real text
    through the model's own tokenizer (``tokenizer``: one given, a folder or name; else the
    folder's or the module's own, :func:`sigprop.data.model_text.find_tokenizer`): the
    built-in stories, or ``text`` (a file or a folder of ``.txt``). A model at init reads
    sigprop's built-in token ids (the at-init default) unless ``text`` or ``tokenizer`` is
    given. ``Diagnosis.inputs`` says which. Weights from a folder or a module are checked
    against a fresh init of the same config, matrix by matrix (``Diagnosis.weights_state``:
    init, trained or mixed); on trained weights the verdict, the failing heads and the advice
    read the measured scores (:mod:`sigprop.analysis.trained`). ``vs_init``: also measure the
    fresh init on the same inputs (``Diagnosis.vs_init``: what training changed)."""
    _check_options(seeds, sequences, stack, device)
    t0 = time.perf_counter()
    if stack not in ("encoder", "decoder"):  # a sub-model of a composite, as a model of its own
        d = _sub_model_diagnosis(model, stack, seq_len=seq_len, sequences=sequences,
                                 device=device, seed=seed, on_seed=on_seed,
                                 recommendations=recommendations)
        if d is not None:
            return d
    setup = _setup(model, seq_len, sequences, seed, stack, text=text, tokenizer=tokenizer)
    run = _measure(model, setup, seeds=seeds, device=device, on_seed=on_seed, vs_init=vs_init)
    return _conclude(setup, run, recommendations, t0)


def _check_options(seeds, sequences, stack, device) -> None:
    """SpecError on a bad count, stack name or device."""
    import torch

    for name, v, hi in (("seeds", seeds, 64), ("sequences", sequences, 256)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise SpecError(name, f"must be an integer in [1, {hi}] (got {v!r})")
    if not isinstance(stack, str) or not stack or len(stack) > 200 or any(
            c.isspace() for c in stack):
        raise SpecError("stack", f"must be encoder, decoder or the name of a block list "
                                 f"(got {stack!r})")
    if device not in ("cpu", "cuda"):
        raise SpecError("device", f"must be cpu or cuda (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", "cuda requested but no CUDA device is available")


def _sub_model_diagnosis(model, stack: str, *, seed: int, device: str, **kw
                         ) -> Diagnosis | None:
    """The diagnosis of the sub-model ``stack`` names in composite ``model`` (one draw, with
    its own config and inputs; ``kw``: the other options of :func:`diagnose`), or None where
    ``stack`` names no sub-model."""
    from torch import nn

    sub = find_sub_model(model, stack, seed, device)
    if sub is None:
        return None
    part, path = sub
    d = diagnose(part, seeds=1, seed=seed, device=device, **kw)
    d.model = f"{model if isinstance(model, str | Path) else type(model).__name__}:{path}"
    d.stack_path = f"{path}.{d.stack_path}" if d.stack_path else path
    d.notes.append(f"sub-model {path} ({type(part).__name__}) diagnosed as a model of its own, "
                   "with its own config and inputs" + (
                       ", at its init under --seed" if not isinstance(model, nn.Module) else ""))
    d.weights = "init" if not isinstance(model, nn.Module) else d.weights
    d.trained = isinstance(model, nn.Module) or d.trained
    return d


@dataclass
class _Setup:
    """What the config settles before the first forward pass: the model's name, whether its
    family has a config mapping (``mapped``), the spec and facts of the config, the notes so
    far, the input kind, the embedding rows to build, the stack, the sequences per draw, the
    first seed and the keywords of :func:`~sigprop.analysis.forward.model_inputs` (``made``)."""

    module: Any  # the nn.Module given, or None
    config: Any
    name: str
    mapped: bool
    spec: ArchSpec
    info: HFInfo
    notes: list[str]
    kind: str
    vocab: int
    enc_dec: bool
    decoder: bool
    repeats: int
    stack: str
    sequences: int
    seed: int
    made: dict
    #: what the model reads, in words (:class:`~sigprop.data.model_text.TokenBatch` or the
    #: at-init default)
    inputs: str = ""
    #: record the per-head anatomy (trained-looking weights or real text), and the special
    #: tokens' positions ((sequences, T) bool) where the tokenizer placed them
    anatomy: bool = False
    special: Any = None
    #: the tokenizer's ids ((sequences, T)) where the model reads real text: the anatomy's
    #: copy and induction mass
    token_ids: Any = None


def _setup(model, seq_len: int | None, sequences: int, seed: int, stack: str, *,
           text=None, tokenizer=None) -> _Setup:
    """Read the config of ``model`` and settle what is measured (refusing, before any model
    is built, a diagnosis that would not fit in memory)."""
    from torch import nn

    from .. import models as hf
    from ..models.arch import FAMILIES, generic_spec_and_info, input_kind

    module = model if isinstance(model, nn.Module) else None
    config = module_config(module) if module is not None else hf.load_config(model)
    name = type(module).__name__ if module is not None else (
        str(model) if isinstance(model, str | Path) else getattr(config, "model_type", "config"))
    mapped = config.model_type in FAMILIES
    spec, info = (hf.spec_and_info(config, seq_len) if mapped
                  else generic_spec_and_info(config, seq_len))
    notes = list(getattr(info, "notes", ()))
    kind = input_kind(config)
    loaded = module is not None or has_weights_folder(model)  # weights read as they are
    tokens, inputs = model_tokens(model, module, kind, sequences, spec.seq_len, seed, notes,
                                  loaded=loaded, text=text, tokenizer=tokenizer)
    vocab = vocab_at_init(config, info.vocab_size) if tokens is None else token_vocab(
        info.vocab_size, tokens)
    check_memory(config, spec, sequences, vocab)
    if seq_len is not None and kind != "text" and seq_len != spec.seq_len and \
            stack == "encoder":
        notes.append(f"seq_len {seq_len} ignored: the {kind} input fixes T={spec.seq_len}")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    decoder = stack == "decoder"
    if decoder and not enc_dec:
        raise SpecError("stack", f"decoder needs an encoder-decoder model ({config.model_type} "
                                 "has one stack: use encoder)")
    T_in, dec_ids = spec.seq_len, None
    if decoder:
        spec, dec_note = decoder_spec(config, spec, seq_len)
        dec_ids = text_token_ids(sequences, spec.seq_len, vocab, seed + 7919)
        if tokens is not None and tokens.input_ids.shape[1] >= spec.seq_len:
            dec_ids = tokens.input_ids[:, :spec.seq_len]  # the decoder reads the same text
        notes.append(dec_note)
    elif enc_dec:
        notes.append("encoder-decoder: the encoder stack is measured (model.get_encoder()); "
                     "the decoder: --stack decoder")
    made = dict(kind=kind, sequences=sequences, T=T_in, vocab=vocab, seed=seed,
                enc_dec=enc_dec, decoder=decoder, decoder_ids=dec_ids,
                prefer="decoder" if decoder else None if stack == "encoder" else stack,
                tokens=tokens)
    repeats = repeats_of(config)
    if repeats > 1:
        notes.append(f"shared layers ({config.model_type}): each of "
                     f"{getattr(config, 'num_hidden_groups', 1)} layer group(s) is applied "
                     f"{repeats} times; every application is measured as one layer (the "
                     "theory treats the applications as independent draws: re-applying the "
                     "same weights is outside it, ~0.08 on cos after 6 applications at "
                     "d = 256)")
    return _Setup(module=module, config=config, name=name, mapped=mapped, spec=spec, info=info,
                  notes=notes, kind=kind, vocab=vocab, enc_dec=enc_dec, decoder=decoder,
                  repeats=repeats, stack=stack, sequences=sequences, seed=seed, made=made,
                  inputs=inputs, anatomy=(tokens is not None or loaded) and not decoder,
                  special=None if tokens is None else tokens.special,
                  token_ids=None if tokens is None else tokens.input_ids)


@dataclass
class _Facts:
    """What the first draw's model and attention sites show (read before the probe lets the
    model go): a causal mask seen, a position bias, QK-norm, the runtime effect of recorded
    ``sigprop fix`` methods, the RoPE frequencies."""

    causal_seen: bool
    position_bias: bool
    qk_norm: bool
    runtime: Any
    rope: Any


@dataclass
class _Draw:
    """What one forward pass leaves: the probe (released from the model), the weight table
    (None where unreadable), the first block's input (:class:`InputGram`), the encoder
    output's state (decoder stack), the cross-attention probe and the entropy bounds (None
    where not recorded), and the facts on the first draw."""

    probe: Any
    table: Any
    gram: InputGram
    memory: EncoderMemory | None
    cross: Any
    bounds: Any
    facts: _Facts | None


@dataclass
class _Run:
    """Every draw of a diagnosis, the block list measured, and where the weights came from."""

    draws: list[_Draw]
    stack_path: str
    trained: bool
    weights: str
    #: trained-looking weights beside a fresh init (:class:`~.vs_init.BesideInit`)
    side: Any = None
    #: trained weights: the measured model (the user's module, or the folder's weights this
    #: run loaded) and its inputs, for the measured effect of the advice; released after it
    model: Any = None
    inputs: Any = None


def _measure(model, s: _Setup, *, seeds: int, device: str,
             on_seed: Callable[[int], None] | None, vs_init: bool = False) -> _Run:
    """The draws: the ``nn.Module`` given as it is (in eval mode, its mode restored after),
    else a model at init per seed ``seed``, ``seed + 1`` ... (a folder's weights replace the
    init: then one draw, checked against a fresh init beside it). ``on_seed`` is called after
    each draw."""
    from .. import models as hf
    from .vs_init import beside_init

    def side_of(m, inputs, stack_path):
        return beside_init(m, s.config, seed=s.seed, vocab=s.vocab, mapped=s.mapped,
                           stack_path=stack_path, vs_init=vs_init,
                           draw_fn=lambda f, path: _draw(f, inputs, path, s, first=False))

    if s.module is not None:  # the user's model, as it is
        was_training = s.module.training
        s.module.eval()
        try:
            inputs, stack_path, notes = model_inputs(
                s.module, s.config, device=next(s.module.parameters()).device, **s.made)
            s.notes += notes
            draw = _draw(s.module, inputs, stack_path, s, first=True)
            side = side_of(s.module, inputs, stack_path)
        finally:
            s.module.train(was_training)
        if on_seed is not None:
            on_seed(0)
        return _Run(draws=[draw], stack_path=stack_path, trained=True, weights="module",
                    side=side, model=s.module, inputs=inputs)
    folder = model_folder(model)  # a model folder's weights replace the init
    draws, trained, side, kept = [], False, None, None
    for k in range(seeds):
        # unmapped families: eager attention (probabilities returned as the model forms them,
        # biases and soft-capping included; some families have no SDPA path)
        m = hf.model_at_init(s.config, seed=s.seed + k, attn_implementation="sdpa" if s.mapped
                             else "eager", vocab_size=s.vocab).to(device)
        if folder is not None:
            trained = hf.load_local_weights(m, folder).trained or trained
        if k == 0:  # the inputs the forward needs and the block list they reach
            inputs, stack_path, notes = model_inputs(m, s.config, device=device, **s.made)
            s.notes += notes
        draws.append(_draw(m, inputs, stack_path, s, first=k == 0))
        if trained:
            side = side_of(m, inputs, stack_path)
            kept = m
        del m
        if on_seed is not None:
            on_seed(k)
        if trained:  # the folder's weights replace every draw: one realisation to measure
            break
    return _Run(draws=draws, stack_path=stack_path, trained=trained,
                weights="folder" if trained else "init", side=side, model=kept,
                inputs=inputs if trained else None)


def _draw(m, inputs: dict, stack_path: str, s: _Setup, first: bool, extras: bool = True
          ) -> _Draw:
    """One forward pass of model ``m`` on ``inputs`` under the probe of block list
    ``stack_path``, the weight reader, the input and memory hooks, the cross-attention probe
    (decoder stack) and the bound recorder. ``first``: read the facts of the model and the
    weight notes. ``extras=False``: the probe alone (no weight reader, no bound recorder;
    ``table`` and ``bounds`` None). Unmapped families return their attention probabilities
    (eager)."""
    import torch

    from ..measurement.probe import Probe
    from ..measurement.probe_sites import blocks_of
    from ..measurement.weights import WeightReader
    from ..models.methods import runtime_effect

    device = next(m.parameters()).device
    special = None if s.special is None else s.special.to(device)
    ids = None if s.token_ids is None else s.token_ids.to(device)
    p = Probe(m, layers=blocks_of(m, stack_path), keep_hidden=False, repeats=s.repeats,
              dtype=getattr(torch, STATS_DTYPE), batch=s.sequences, anatomy=s.anatomy,
              special_keys=special if s.anatomy else None,
              token_ids=ids if s.anatomy else None)
    w = WeightReader(m, blocks=p.blocks, sites=p.sites, repeats=s.repeats) if extras else None
    memory = EncoderMemory(m) if s.decoder else None
    gram = InputGram(p.blocks[0][1], p)
    pc = cross_probe(p) if s.decoder else None
    br = _bounds(m, p, s.spec, s.decoder) if extras else None
    try:
        with p, _or_nothing(w), _or_nothing(pc), _or_nothing(br), torch.no_grad():
            run_forward(m, inputs, s.enc_dec, returned=s.module is None and not s.mapped,
                        decoder=s.decoder)
    finally:
        if memory is not None:
            memory.close()
        gram.close()
    facts = _Facts(causal_seen=causal_seen(p), position_bias=position_bias(p),
                   qk_norm=has_qk_norm(p), runtime=runtime_effect(m, s.spec.depth),
                   rope=rope_frequencies(m)) if first else None
    table = None if w is None else _read_weights(w, s.notes if first else [])
    return _Draw(probe=p.release(), table=table,
                 gram=gram, memory=memory, cross=None if pc is None else pc.release(),
                 bounds=None if br is None else br.bounds(), facts=facts)


def _read_weights(reader, notes: list[str]):
    """The reader's :class:`WeightTable`, or None (with a note) where the weights of some
    block could not be read."""
    from ..measurement.threads import cpu_settings

    try:
        with cpu_settings(threads=1):  # small reductions (probe_recompute)
            table = reader.read()
    except Exception as err:  # noqa: BLE001 - any model the reader does not understand
        notes.append(f"weights: not readable ({type(err).__name__}: {err}); theory "
                     "parameters from the config")
        return None
    notes += [f"weights: {n}" for n in table.notes]
    return table


def _bounds(model, probe, spec: ArchSpec, decoder: bool):
    """A :class:`~sigprop.measurement.bounds.BoundRecorder` on the probe's attention sites
    (Zhai et al.'s entropy floor, docs/fixes.md), or None where the theorem's logits
    ``X W X^T`` do not hold (rotary embeddings, position biases, the decoder stack)."""
    from ..measurement.bounds import BoundRecorder, rope_free

    if decoder or not rope_free(model):
        return None
    return BoundRecorder(probe.sites, spec.causal)


def _or_nothing(context):
    """``context``, or a context that does nothing where it is None."""
    return nullcontext() if context is None else context


def _conclude(s: _Setup, run: _Run, recommendations: bool, t0: float) -> Diagnosis:
    """The measured trajectory and per-head table of the draws, the theory of the spec read
    from the weights beside it, the verdict and the recommendations."""
    import pandas as pd

    from ..theory import depth

    probes, facts = [d.probe for d in run.draws], run.draws[0].facts
    if "cos" not in probes[0].hidden_stats[0]:
        raise SpecError("model", f"{s.name}: the measured block list did not run")
    spec, notes = _at_seen_length(s, run.draws[0].gram), s.notes
    meas, heads, rho0 = _measured(probes, spec, s.name)
    spec = spec.replace(rho0=rho0)
    notes += probe_notes(probes[0], meas)
    spec, mapped, table = theory_spec(
        spec, s.config, [d.table for d in run.draws], meas, notes, mapped=s.mapped,
        causal_seen=facts.causal_seen, position_bias=facts.position_bias,
        rope=probes[0].model_has_rope, runtime=facts.runtime,
        memory=merge_memory([d.memory for d in run.draws if d.memory is not None]))
    heads = with_bound_rows(with_weight_heads(heads, table, spec), [d.bounds for d in run.draws])
    layer_rows: list[dict] = []
    gi = None
    state, check = tr.weights_state(run.trained, run.side, notes)
    trained = state in ("trained", "mixed") and getattr(run.side, "structured", True) is not False
    roles = tr.roles_of(heads) if trained else None
    if mapped:
        theory = depth.propagate(spec, rho0=rho0)
        gi = gram_input(spec, s.kind, [d.gram for d in run.draws], facts.rope)
        theory = position_resolved(theory, spec, gi, gram_applies(spec, s.kind), notes)
        traj = pd.concat([theory, meas], ignore_index=True)
        layer_rows = depth.layer_table(spec, theory)
        if trained:  # one set of numbers: the measured scores (analysis/trained.py)
            scales = tr.head_scales(heads, meas, spec.seq_len)
            derived = tr.measured_derived(spec, rho0, scales)
            layer_rows = tr.theory_gaps(layer_rows, traj, scales)
            notes.append(tr.trained_note(derived, layer_rows))
            verdict, first, bad_heads = tr.verdict_trained(spec, meas, heads, roles)
            recs = tr.recommend_trained(spec, derived, scales, roles) if recommendations \
                else []
            if recs:  # the score-scale advice applied and measured (one more probe draw)
                recs[0] = _advice_effect(recs[0], run, s, spec, scales, heads, roles)
        else:
            verdict, first, bad_heads = verdict_of(spec, meas, heads, layers=layer_rows)
            derived = spec.derived(rho0)
            recs = recommend(spec, rho0, qk_norm=facts.qk_norm) if recommendations else []
            derived["beta_measured"] = measured_beta(heads, spec.seq_len)
    else:  # measured-only: the verdict reads the measurement alone
        traj = meas.reset_index(drop=True)
        verdict, first, bad_heads = tr.verdict_trained(spec, meas, heads, roles) if trained else \
            verdict_of(spec, meas, heads, theory=False)
        derived, recs = {}, []
    run.model = run.inputs = None  # the measured model is no longer needed
    return Diagnosis(model=s.name, spec=spec, info=s.info, trajectory=traj, heads=heads,
                     derived=derived, verdict=verdict, first_failing_layer=first,
                     failing_heads=bad_heads, recommendations=[r.to_dict() for r in recs],
                     rho0=rho0, seconds=time.perf_counter() - t0, trained=run.trained,
                     notes=notes, seeds=len(probes), sequences=s.sequences, seed=s.seed,
                     weights=run.weights, layers=layer_rows, stack=s.stack,
                     cross=_cross_rows(run.draws), stack_path=run.stack_path, inputs=s.inputs,
                     roles=roles, weights_state=state, weights_check=check,
                     vs_init=_vs_init(run, meas, heads, spec, s), gram_input=gi)


def _advice_effect(rec, run: _Run, s: _Setup, spec: ArchSpec, scales, heads, roles):
    """The score-scale advice ``rec`` with its measured effect
    (:func:`.advice_effect.measure`: the advised rescale, one more probe draw on the same
    inputs)."""
    from .advice_effect import measure

    def redraw(m):
        draw = _draw(m, run.inputs, run.stack_path, s, first=False, extras=False)
        meas1, heads1, _ = _measured([draw.probe], spec, s.name)
        return meas1, heads1

    return measure(rec, run.model, copy=run.weights == "module", stack_path=run.stack_path,
                   repeats=s.repeats, scales=scales, heads=heads, roles=roles,
                   seq_len=spec.seq_len, redraw=redraw)


def _vs_init(run: _Run, meas, heads, spec: ArchSpec, s: _Setup):
    """The fresh init's measurement beside this one (:func:`.vs_init.compare`), or None."""
    from .vs_init import compare

    fresh = None if run.side is None else run.side.draw
    if fresh is None:
        return None
    meas0, heads0, _ = _measured([fresh.probe], spec, s.name)
    return compare(meas, heads, meas0, heads0, spec.seq_len, s.seed)


def _at_seen_length(s: _Setup, gram: InputGram) -> ArchSpec:
    """The spec at the number of tokens that reached the first block where an image, video
    or audio input sets it (with a note)."""
    t_seen = gram.xs[0].shape[-2] if gram.xs else None
    if t_seen and t_seen >= 2 and not s.decoder and s.kind != "text":
        again = t_seen != s.spec.seq_len
        s.notes.append(f"T = {t_seen} tokens reach the blocks ({s.kind} input)"
                       + ("; the theory runs at that length" if again else ""))
        return s.spec.replace(seq_len=int(t_seen)) if again else s.spec
    return s.spec


def _measured(probes, spec: ArchSpec, name: str):
    """``(per-layer rows, per-head rows, rho0)`` of the probes: rho0 is the measured input
    cosine clipped to [0, 1] (a SpecError where it is NaN: no token state was read)."""
    from ..measurement.probe import to_trajectory

    meas_all = to_trajectory(probes, spec=spec, per_head=True)
    has_head = "head" in meas_all.columns
    heads = meas_all[meas_all["head"].notna()] if has_head else meas_all.iloc[:0]
    meas = meas_all[meas_all["head"].isna()].drop(columns=["head"]) if has_head else meas_all
    rho0 = float(meas[(meas.observable == "cos") & (meas.layer == 0)]["value"].iloc[0])
    if not math.isfinite(rho0):
        raise SpecError("model", f"{name}: the input of {probes[0].blocks[0][0]} is not a "
                                 "(batch, tokens, width) state sigprop can read (its token "
                                 "cosine is NaN)")
    return meas, heads, min(max(rho0, 0.0), 1.0)


def _cross_rows(draws: list[_Draw]):
    """The decoder blocks' cross-attention rows over the draws (ipr, ipr_cross, entropy,
    wmax, sigma_s over the encoder positions), or None without a cross-attention probe."""
    from ..measurement.probe import to_trajectory

    probes = [d.cross for d in draws if d.cross is not None]
    if not probes:
        return None
    ct = to_trajectory(probes, spec=None)
    cross = ct[ct.observable.isin(("ipr", "ipr_cross", "entropy", "wmax", "sigma_s"))]
    return cross.reset_index(drop=True)

