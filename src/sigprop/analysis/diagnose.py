"""Diagnose a real HuggingFace architecture at initialisation (the main job).

The model is built from its config with its own ``_init_weights`` (no download), S seeds x B
sequences of built-in text go through it with :class:`sigprop.measurement.probe.Probe` (the model's
own attention implementation; probabilities recomputed from Q/K under SDPA, RoPE applied), the
theory of the equivalent :class:`ArchSpec` is put beside it, and a verdict with concrete,
quantified recommendations comes out.

Verdict (docs/theory.md §2.7, read on the measurement where it can be):
* ``entropy_collapse``: beta > beta_c(rho0) (the theory's first-layer condensation), or some
  layer's head-averaged normalised attention entropy falls below ``ENTROPY_MIN``;
* ``rank_collapse``: otherwise, if the measured cosine reaches ``rho_max`` (0.9) at some layer;
* ``trainable``: neither.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..spec import ArchSpec, SpecError
from .result import Result

if TYPE_CHECKING:
    import pandas as pd

    from ..models.arch import HFInfo

#: head-averaged normalised entropy below which a layer counts as entropy-collapsed
ENTROPY_MIN = 0.5
#: embedding rows used when the model is built (i.i.d. rows at init: size is irrelevant)
VOCAB_AT_INIT = 4096
#: longest sequence the position-resolved (Gram-matrix) theory of causal stacks runs at: its
#: sampled attention costs O(T^3) per layer and sequence (~0.3 s at T = 256, ~2.5 s at 512)
GRAM_MAX_LEN = 512
#: precision of the probe's statistics: the model runs in float32, so float64 statistics of its
#: float32 activations change nothing but the cost (tests/measurement/test_probe_precision.py:
#: every per-layer statistic within 1e-5 relative of float64); 5x less memory traffic
STATS_DTYPE = "float32"


@dataclass
class Diagnosis(Result):
    """A model measured layer by layer with the theory of its ArchSpec beside it:
    ``trajectory`` (theory + measured rows), ``heads`` (per layer and head), ``verdict``, the
    first failing layer and heads, ``recommendations`` with their predicted effect, ``notes``
    on what the theory does not cover."""

    model: str
    spec: ArchSpec
    info: HFInfo
    trajectory: pd.DataFrame
    heads: pd.DataFrame
    derived: dict
    verdict: str
    first_failing_layer: int | None
    failing_heads: list[int]
    recommendations: list[dict]
    rho0: float
    seconds: float
    trained: bool = False
    notes: list[str] = field(default_factory=list)
    seeds: int = 0  # initialisations measured (1 for a folder's trained weights)
    sequences: int = 0  # sequences per initialisation
    seed: int = 0  # first seed
    #: where the measured weights came from: ``"init"`` (the model's own init under ``seed``),
    #: ``"folder"`` (a model folder's weight files) or ``"module"`` (the nn.Module given)
    weights: str = "init"
    #: the measured stack: ``"encoder"`` (every single-stack model) or ``"decoder"``
    stack: str = "encoder"
    #: per block: beta (RMS over heads, from the weights), rho_in, beta_c, their ratio, the
    #: heads above beta_c (docs/theory.md §2.8); empty for a measured-only diagnosis
    layers: list[dict] = field(default_factory=list)
    #: the measured block list's qualified name (``encoder.layer``, ``model.language_model.
    #: layers`` of a composite model ...)
    stack_path: str = ""
    #: ``stack="decoder"``: the decoder blocks' cross-attention statistics (measured rows,
    #: per layer: ipr, ipr_cross, entropy, wmax, sigma_s over the encoder positions), else None
    cross: Any = None

    @property
    def embed_q(self) -> float | None:
        """The first block's input squared norm per dimension as measured (mean over the
        seeds), None when not measured: the unit of a pre-LN spec's branch variances."""
        return measured_q0(self.trajectory)


def measured_q0(traj) -> float | None:
    """Mean measured ``q`` at layer 0 of a trajectory table; None when absent or not > 0."""
    q = traj[(traj.source == "measured") & (traj.observable == "q") & (traj.layer == 0)]
    if not len(q):
        return None
    v = float(q["value"].mean())
    return v if math.isfinite(v) and v > 0 else None


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


def vocab_at_init(config, vocab_size: int) -> int:
    """Embedding rows to build: at most ``VOCAB_AT_INIT`` (rows are i.i.d. at init), at least
    ``pad_token_id + 1`` (the padding row must exist)."""
    from ..models.config import config_attr

    pad = config_attr(config, "pad_token_id")
    low = pad + 1 if isinstance(pad, int) and not isinstance(pad, bool) and \
        0 <= pad < vocab_size else 1
    return min(vocab_size, max(VOCAB_AT_INIT, low))


def _text_ids(sequences: int, T: int, vocab: int, seed: int):
    import torch

    from ..measurement.inputs import text_ids

    ids, _ = text_ids(sequences, T, seed)
    return torch.remainder(ids, vocab)


def repeats_of(config) -> int:
    """Applications of each block per forward pass: ALBERT shares ``num_hidden_groups`` layer
    groups over ``num_hidden_layers`` layers; 1 elsewhere."""
    groups = getattr(config, "num_hidden_groups", None)
    L = getattr(config, "num_hidden_layers", None)
    if isinstance(groups, int) and isinstance(L, int) and 0 < groups < L and L % groups == 0:
        return L // groups
    return 1


def text_inputs(sequences: int, T: int, vocab: int, seed: int, device) -> dict:
    """``input_ids`` + ``attention_mask`` of built-in text (every other input, and what a
    model of another kind takes, comes from :func:`model_inputs`)."""
    import torch

    ids = _text_ids(sequences, T, vocab, seed).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


#: what a made input is, for the notes (text needs none)
_INPUT_KINDS = {"pixel_values": "image", "pixel_values_videos": "video",
                "input_values": "audio", "input_features": "audio", "hidden_states": "image"}


def model_inputs(m, config, kind: str, *, sequences: int, T: int, vocab: int, seed: int,
                 device, enc_dec: bool = False, decoder: bool = False,
                 prefer: str | None = None, decoder_ids=None) -> tuple[dict, str, list[str]]:
    """``(inputs, block list, notes)`` for model ``m``: :func:`_settle` learns what its
    forward needs and which block list those inputs reach, then the inputs are made at full
    size (``sequences`` x ``T`` tokens of built-in text where it takes text; images, audio
    ... from :mod:`sigprop.models.inputs`), each non-text one named in a note."""
    from ..models.inputs import make_input

    names, stack, notes = _settle(m, config, kind, enc_dec, decoder, prefer, vocab, seed,
                                  str(device))
    t_text = T
    beside = [_INPUT_KINDS[n] for n in (x.split("@")[0] for x in names) if n in _INPUT_KINDS]
    if beside and "input_ids" in names:  # text beside an image / audio input: at most the
        cap = _text_positions(config)  # text tower's positions (CLIP-like towers included)
        if cap is not None and cap < T:
            t_text = cap
            notes = notes + [f"text input beside the {beside[0]} input: {cap} tokens (the "
                             "text model's max_position_embeddings)"]
    text = text_inputs(sequences, t_text, vocab, seed, device)
    out = {n.split("@")[0]: text[n] if n in text else
           make_input(n, config, m, sequences, T, vocab, seed)
           for n in names if n != "decoder_input_ids"}
    if decoder:
        out["decoder_input_ids"] = decoder_ids
    out = {k: v.to(device) for k, v in out.items() if v is not None}
    made = [f"{_INPUT_KINDS[k]} input: {k} i.i.d. N(0, 1) ({'x'.join(map(str, v.shape[1:]))} "
            "per sequence)" for k, v in out.items() if k in _INPUT_KINDS]
    return out, stack, made + notes


def _text_positions(config) -> int | None:
    """The fewest positions any (sub-)config's text embeddings hold (``max_position_embeddings``
    and the like), or None when none says."""
    from ..models.config import config_attr
    from ..models.inputs import sub_configs

    caps = [config_attr(c, n) for c in sub_configs(config)
            for n in ("max_position_embeddings", "max_text_len", "max_text_length")]
    caps = [c for c in caps if isinstance(c, int) and not isinstance(c, bool) and c > 0]
    return min(caps) if caps else None


def _run(model, inputs: dict, enc_dec: bool, returned: bool = False,
         decoder: bool = False) -> None:
    """:func:`forward_once` at full size: the model's own error on the inputs (a length beyond
    what the config allows, ...) becomes one line, as in :func:`sigprop.models.inputs.settle`."""
    from ..models.inputs import forward_error

    try:
        forward_once(model, inputs, enc_dec, returned=returned, decoder=decoder)
    except SpecError:
        raise
    except Exception as err:  # noqa: BLE001 - the model's own forward on valid inputs
        raise forward_error(model, inputs, err) from None


def forward_once(model, inputs: dict, enc_dec: bool, returned: bool = False,
             decoder: bool = False) -> None:
    """One forward pass; an encoder-decoder model runs its encoder only. ``returned``: ask
    for the attention probabilities (``output_attentions=True``, eager attention), so that
    the Probe reads the model's own maps (relative-position terms included) where a module
    returns them only on request (DeBERTa-v2). ``decoder``: the whole encoder-decoder model
    runs (``inputs`` then hold ``decoder_input_ids``)."""
    if enc_dec and not decoder and hasattr(model, "get_encoder"):
        from ..models.inputs import forward_params

        enc = model.get_encoder()  # DETR-like encoders read backbone features: the whole model
        if set(inputs) <= set(forward_params(enc)[0]):  # named: **kwargs may swallow them
            model = enc
    if returned:
        try:
            model(**inputs, output_attentions=True)
            return
        except TypeError:  # a forward without output_attentions
            pass
    model(**inputs)


def _main_inputs(model, kind: str, decoder: bool) -> list[str]:
    """The inputs a model of this kind is fed first: its class's ``main_input_name`` (token
    ids with their mask for text), plus ``decoder_input_ids`` for the decoder stack."""
    main = getattr(model, "main_input_name", None)
    main = main if isinstance(main, str) else {"image": "pixel_values",
                                               "audio": "input_features"}.get(kind, "input_ids")
    names = [main] + (["attention_mask"] if main == "input_ids" else [])
    return names + (["decoder_input_ids"] if decoder else [])


def sub_models(model) -> list[tuple[str, Any]]:
    """``[(path, module)]``: the HF models inside a composite model (a vision tower, an audio
    encoder, a language model: sub-modules that are ``PreTrainedModel``s with a config of
    their own), outermost first."""
    from transformers import PreTrainedModel

    out = []
    for n, m in model.named_modules():
        if n and isinstance(m, PreTrainedModel) and not any(
                n.startswith(p + ".") for p, _ in out):
            out.append((n, m))
    return out


def _sub_model(model, stack: str, seed: int, device: str):
    """``(module, path)`` of the sub-model ``stack`` names (its path or last component), or
    None where ``stack`` names no sub-model (a block list, then)."""
    from torch import nn

    from .. import models as hf

    if isinstance(model, nn.Module):
        m = model
    else:
        config = hf.load_config(model)
        m = hf.model_at_init(config, seed=seed, attn_implementation="eager").to(device)
        if (folder := model_folder(model)) is not None:
            hf.load_local_weights(m, folder)
    for path, sub in sub_models(m):
        if path == stack or path.split(".")[-1] == stack:
            return sub, path
    return None


def _settle(m, config, kind: str, enc_dec: bool, decoder: bool, prefer: str | None,
            vocab: int, seed: int, device: str):
    """``(input names, block list to measure, note)`` for model ``m``: refuses a model
    without attention and one whose forward needs inputs sigprop cannot make, in one line;
    a composite model is measured on the best-ranked block list its inputs reach."""
    from ..measurement.probe_sites import candidate_stacks, stack_has_attention
    from ..models.inputs import settle
    from ..models.zoo import has_self_attention

    cands = candidate_stacks(m, prefer)
    if prefer not in (None, "decoder") and not any(
            prefer == c or prefer in c.split(".") for c in cands):
        raise SpecError("stack", f"no block list named {prefer[:60]!r} (block lists: "
                                 f"{', '.join(cands[:6]) or 'none'}; or encoder, decoder)")
    if not any(stack_has_attention(m, c) for c in cands) and not has_self_attention(m):
        raise SpecError("model", f"{type(m).__name__} has no attention layer: sigprop "
                                 "diagnoses attention (rank and entropy collapse), so there "
                                 "is nothing to diagnose (docs/cli.md: models without "
                                 "attention)")
    if not cands:
        raise SpecError("model", f"{type(m).__name__}: no list of transformer blocks found "
                                 "(a ModuleList or Sequential of one block class)")
    st = settle(m, config, _main_inputs(m, kind, decoder), cands,
                lambda inp: forward_once(m, inp, enc_dec, decoder=decoder), B=1, T=8,
                vocab=vocab, seed=seed, device=device)
    ran = [c for c in cands if c in st.ran]
    if not ran:
        raise SpecError("model", f"{type(m).__name__}: none of its block lists ran on the "
                                 f"inputs {', '.join(st.names)}")
    best = next((c for c in ran if stack_has_attention(m, c)), ran[0])
    notes = [st.note] if st.note else []
    if len(ran) > 1 or best != cands[0]:
        notes.append(f"stack measured: {best} (block lists that ran: {', '.join(ran)}; "
                     "--stack NAME picks another)")
    subs = [p for p, _ in sub_models(m)]
    if subs:
        notes.append(f"composite model: sub-models {', '.join(subs[:6])}; --stack NAME "
                     "diagnoses one as a model of its own")
    return st.names, best, notes


def _probe_notes(probe, meas) -> list[str]:
    """Notes on layers whose attention statistics are missing or approximate."""
    n = len(probe.info)
    have = {int(x) for x in meas[meas.observable == "entropy"]["layer"]}
    out = []
    missing = [i for i in range(1, n + 1) if i not in have]
    if missing:
        why = ("no attention module with recognised Q/K projections"
               if all(probe.sites[(i - 1) // probe.repeats] is None for i in missing)
               else "the attention module did not run or returned nothing readable")
        out.append(f"attention statistics could not be read for layer(s) "
                   f"{', '.join(map(str, missing))} ({why}); their cos / q / stable rank are "
                   "measured")
    odd = [(i + 1, d["unreadable"]) for i, d in enumerate(probe.info) if d.get("unreadable")]
    if odd:
        out.append(f"attention statistics of layer(s) {', '.join(str(i) for i, _ in odd)} not "
                   f"read: the module's q / k or output are not in the layout read from it "
                   f"({odd[0][1]})")
    rope = [i + 1 for i, d in enumerate(probe.info) if d.get("rope") == "missing"]
    bias = [i + 1 for i, d in enumerate(probe.info) if d.get("bias") == "missing"]
    if rope:
        out.append(f"layer(s) {', '.join(map(str, rope))}: attention recomputed without RoPE "
                   "(the module gets no (cos, sin)); approximate")
    if bias:
        out.append(f"layer(s) {', '.join(map(str, bias))}: attention recomputed without its "
                   "ALiBi / relative position bias; approximate")
    return out


def verdict_of(spec: ArchSpec, meas, heads, theory: bool = True, layers: list[dict] | None = None
             ) -> tuple[str, int | None, list[int]]:
    """``theory=False``: the measurement alone (no beta_c condition). ``layers``: the
    per-block beta table (:func:`sigprop.theory.depth.layer_table`); a block whose beta
    exceeds beta_c of its input cosine condenses (docs/theory.md §2.7-2.8), and its heads
    above beta_c are failing heads with the measured low-entropy ones."""
    from ..theory import rem

    cos = meas[meas.observable == "cos"].set_index("layer")["value"]
    ent = meas[meas.observable == "entropy"].set_index("layer")["value"]
    over_layers = [r["layer"] for r in layers or [] if r["beta"] > r["beta_c"]]
    if layers is None:
        over_layers = [1] if theory and spec.beta_eff > float(rem.beta_c(spec.rho_init)) else []
    over_layers = over_layers if theory else []
    low_ent = [int(layer) for layer, v in ent.items() if v < ENTROPY_MIN]
    if spec.attention != "uniform" and (over_layers or low_ent):
        first = min(low_ent[:1] + over_layers[:1])
        h = heads[(heads.layer == first) & (heads.observable == "entropy")]
        bad = {int(x) for x in h[h.value < ENTROPY_MIN]["head"]}
        bad |= {int(x) for r in layers or [] if r["layer"] == first for x in r["heads_over"]}
        return "entropy_collapse", first, sorted(bad)
    high = [int(layer) for layer, v in cos.items() if layer > 0 and v >= spec.rho_max]
    if high:
        return "rank_collapse", high[0], []
    return "trainable", None, []


def recommend(spec: ArchSpec, rho0: float, qk_norm: bool = False) -> list[dict]:
    """Concrete changes with the theory's predicted effect on the final cosine / regime.
    ``qk_norm``: q and k are normalised per head (Qwen3, OLMo-2, Gemma 3/4), so the Q/K init
    does not set beta; the window is stated for the product of the q / k norm gains
    (docs/theory.md §2.8: sigma_s = multiplier x rms(g_q g_k))."""
    from ..theory import depth, diagram, rem

    out = []
    bc = float(rem.beta_c(rho0))
    logt = math.sqrt(math.log(spec.seq_len))
    base = float(depth.final_cos(spec, rho0=rho0))
    row = {"what": "beta window", "current": spec.beta_eff, "limit": bc,
           "qk_std_max": math.sqrt(bc * logt / spec.d_model / spec.multiplier),
           "text": f"keep beta below beta_c(rho0)={bc:.3g} (now {spec.beta_eff:.3g}): "
                   f"Q/K init std below {math.sqrt(bc * logt / spec.d_model):.3g} at "
                   f"T={spec.seq_len}"}
    if qk_norm:
        gmax = bc * logt / spec.multiplier
        row.pop("qk_std_max")
        row.update(gain_product_max=gmax,
                   text=f"keep beta below beta_c(rho0)={bc:.3g} (now {spec.beta_eff:.3g}): "
                        f"QK-norm sets beta, not the Q/K init; the q / k norm gains' product "
                        f"(RMS over a head) below {gmax:.3g} at T={spec.seq_len} (logit "
                        f"multiplier {spec.multiplier:.3g} x 1/sqrt(d_head))")
    out.append(row)
    if spec.beta_eff > bc:
        target = 0.5 * bc
        fixed = spec.with_beta(target)
        out.append({"what": "lower beta", "beta": target,
                    "predicted_cos_L": float(depth.final_cos(fixed, rho0=rho0)),
                    "predicted_verdict": depth.verdict(fixed, rho0=rho0),
                    "text": f"re-initialise Q/K for beta={target:.3g} (sigprop fix --beta "
                            f"{target:.3g})"})
    causal_sinks = spec.causal and spec.layers is not None and any(
        x.sink_logit is not None for x in spec.layers)
    # the search re-runs the stack ~30 times; causal sink rows cost ~1 s per layer each
    a_crit = math.nan if causal_sinks else float(diagram.alpha_crit(spec, rho0=rho0)[0])
    item = {"what": "attention residual", "alpha_crit": None if causal_sinks else a_crit,
            "current": spec.alpha_attn, "predicted_cos_L_now": base}
    if causal_sinks:
        item["text"] = ("alpha_crit not searched: the causal theory of attention sinks costs "
                        "about a second per layer and evaluation (docs/theory.md §2.4.3)")
    elif math.isfinite(a_crit) and a_crit > spec.alpha_attn:
        a_new = 1.1 * a_crit
        fixed = spec.replace(alpha_attn=a_new)
        new_cos = float(depth.final_cos(fixed, rho0=rho0))
        item.update(alpha=a_new, predicted_cos_L=new_cos,
                    predicted_verdict=depth.verdict(fixed, rho0=rho0),
                    text=f"scale the attention skip to alpha_attn={a_new:.3g} (alpha_crit(L="
                         f"{spec.depth})={a_crit:.3g}): predicted final cos {base:.3g} -> "
                         f"{new_cos:.3g}")
    elif not math.isfinite(a_crit):
        item["text"] = ("alpha_crit is undefined above beta_c (the attention condenses whatever "
                        "the residual strength): lower beta first")
    else:
        item["text"] = (f"alpha_attn={spec.alpha_attn:g} is above alpha_crit(L={spec.depth})="
                        f"{a_crit:.3g}: no change needed")
    out.append(item)
    # attention sinks dropped: centred rows sum to 0, no mass for a sink to take
    sinks = spec.layers is not None and any(x.sink_logit is not None for x in spec.layers)
    if sinks:
        import dataclasses

        centred = spec.replace(attention="centred", layers=tuple(
            dataclasses.replace(x, sink_logit=None) for x in spec.layers))
    else:
        centred = spec.replace(attention="centred")
    c_cos = float(depth.final_cos(centred, rho0=rho0))
    out.append({"what": "centred attention", "predicted_cos_L": c_cos,
                "predicted_verdict": depth.verdict(centred, rho0=rho0),
                "text": f"centred attention (A - 11^T/T, mindthegap"
                        f"{', without the sinks' if sinks else ''}): predicted final cos "
                        f"{base:.3g} -> {c_cos:.3g}"})
    long_t = min(spec.seq_len * 16, 2**20)
    row = {"what": "length scaling", "seq_len": long_t}
    for kind, param in (("none", None), ("log-n", float(spec.seq_len))):
        s = spec.replace(seq_len=long_t, scaling=kind, scaling_param=param)
        row[f"beta_{kind}"] = s.beta_eff
    row["beta_c"] = bc
    row["text"] = (f"at T={long_t}: beta {row['beta_none']:.3g} with fixed Q/K, "
                   f"{row['beta_log-n']:.3g} with log-n scaling from T={spec.seq_len} "
                   f"(beta_c={bc:.3g})")
    out.append(row)
    return out


def model_folder(model) -> Path | None:
    """``model`` as a local folder, or None (preset names, config files and dicts)."""
    if not isinstance(model, str | Path):
        return None
    p = Path(model).expanduser()
    return p if p.is_dir() else None


def module_config(module):
    """The ``transformers`` config an ``nn.Module`` carries (``.config``), or a SpecError."""
    from transformers import PretrainedConfig

    cfg = getattr(module, "config", None)
    if not isinstance(cfg, PretrainedConfig):
        raise SpecError("model", f"{type(module).__name__} has no transformers config "
                                 "(.config): give a HuggingFace model, a preset, a path or a "
                                 "config")
    return cfg


def diagnose(model: Any = "bert-base-uncased", *, seq_len: int | None = None, seeds: int = 2,
             sequences: int = 2, device: str = "cpu", seed: int = 0,
             on_seed: Callable[[int], None] | None = None, stack: str = "encoder",
             recommendations: bool = True) -> Diagnosis:
    """Measure ``model`` and set the theory beside it, with a verdict and recommendations.

    ``model``: a preset name, a local ``config.json`` or model folder (its safetensors
    weights are measured), a ``PretrainedConfig``, a config dict (built with the model's own
    ``_init_weights`` under ``seed``, ``seeds`` draws), or an ``nn.Module`` HuggingFace model,
    measured as it is with the weights it has (one realisation; its train/eval mode is
    restored afterwards). ``seq_len`` defaults to min(512, the model's maximum).
    ``stack``: for an encoder-decoder model, ``"encoder"`` (default) or ``"decoder"``: the
    decoder's self-attention stack, fed built-in text as ``decoder_input_ids`` of ``seq_len``
    tokens while the encoder reads its usual input (cross-attention reads that encoder output;
    its contribution to the decoder's residual stream is outside the theory).
    ``recommendations=False`` skips the recommendations (their alpha_crit search is the
    slowest part of the theory on some stacks; ``sigprop fix --compare`` needs none)."""
    import pandas as pd
    import torch
    from torch import nn

    from .. import models as hf
    from ..measurement.probe import Probe, to_trajectory
    from ..measurement.probe_sites import blocks_of
    from ..measurement.weights import WeightReader, WeightTable
    from ..models.arch import FAMILIES, generic_spec_and_info, input_kind, structure_spec
    from ..theory import depth

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
    t0 = time.perf_counter()
    if stack not in ("encoder", "decoder"):  # a sub-model of a composite, as a model of its own
        sub = _sub_model(model, stack, seed, device)
        if sub is not None:
            part, path = sub
            d = diagnose(part, seq_len=seq_len, seeds=1, sequences=sequences, device=device,
                         seed=seed, on_seed=on_seed, recommendations=recommendations)
            d.model = f"{model if isinstance(model, str | Path) else type(model).__name__}:" \
                      f"{path}"
            d.stack_path = f"{path}.{d.stack_path}" if d.stack_path else path
            d.notes.append(f"sub-model {path} ({type(part).__name__}) diagnosed as a model of "
                           "its own, with its own config and inputs" + (
                               ", at its init under --seed" if not isinstance(model, nn.Module)
                               else ""))
            d.weights = "init" if not isinstance(model, nn.Module) else d.weights
            d.trained = isinstance(model, nn.Module) or d.trained
            return d
    module = model if isinstance(model, nn.Module) else None
    config = module_config(module) if module is not None else hf.load_config(model)
    name = type(module).__name__ if module is not None else (
        str(model) if isinstance(model, str | Path) else getattr(config, "model_type", "config"))
    mapped = config.model_type in FAMILIES
    spec, info = (hf.spec_and_info(config, seq_len) if mapped
                  else generic_spec_and_info(config, seq_len))
    notes = list(getattr(info, "notes", ()))
    vocab = vocab_at_init(config, info.vocab_size)
    check_memory(config, spec, sequences, vocab)
    kind = input_kind(config)
    if seq_len is not None and kind != "text" and seq_len != spec.seq_len and \
            stack == "encoder":
        notes.append(f"seq_len {seq_len} ignored: the {kind} input fixes T={spec.seq_len}")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    decoder = stack == "decoder"
    if decoder and not enc_dec:
        raise SpecError("stack", f"decoder needs an encoder-decoder model ({config.model_type} "
                                 "has one stack: use encoder)")
    prefer = "decoder" if decoder else None if stack == "encoder" else stack
    T_in, dec_ids = spec.seq_len, None
    if decoder:
        spec, dec_note = _decoder_spec(config, spec, seq_len)
        dec_ids = _text_ids(sequences, spec.seq_len, vocab, seed + 7919)
        notes.append(dec_note)
    elif enc_dec:
        notes.append("encoder-decoder: the encoder stack is measured (model.get_encoder()); "
                     "the decoder: --stack decoder")
    made = dict(kind=kind, sequences=sequences, T=T_in, vocab=vocab, seed=seed,
                enc_dec=enc_dec, decoder=decoder, prefer=prefer, decoder_ids=dec_ids)
    repeats = repeats_of(config)
    if repeats > 1:
        notes.append(f"shared layers ({config.model_type}): each of "
                     f"{getattr(config, 'num_hidden_groups', 1)} layer group(s) is applied "
                     f"{repeats} times; every application is measured as one layer (the "
                     "theory treats the applications as independent draws: re-applying the "
                     "same weights is outside it, ~0.08 on cos after 6 applications at "
                     "d = 256)")
    probes, trained, tables, source = [], False, [], "init"
    runtime, bounds = None, []
    memories: list[_Memory] = []
    grams: list[_InputGram] = []
    cross_probes: list = []
    rope_freq = None
    if module is not None:  # the user's model, as it is
        was_training = module.training
        module.eval()
        try:
            inputs, stack_name, snotes = model_inputs(
                module, config, device=next(module.parameters()).device, **made)
            notes += snotes
            p = Probe(module, layers=blocks_of(module, stack_name), keep_hidden=False,
                      repeats=repeats, dtype=getattr(torch, STATS_DTYPE),
                      batch=sequences)
            w = WeightReader(module, blocks=p.blocks, sites=p.sites, repeats=repeats)
            if decoder:
                memories.append(_Memory(module))
            grams.append(_InputGram(p.blocks[0][1], p))
            pc = _cross_probe(p) if decoder else None
            br = _bounds(module, p, spec, decoder)
            with p, w, (pc if pc is not None else nullcontext()), br, torch.no_grad():
                _run(module, inputs, enc_dec, decoder=decoder)
            bounds.append(br.bounds() if br is not nullcontext_ else None)
        finally:
            module.train(was_training)
            for mem in memories:
                mem.close()
            for g in grams:
                g.close()
        rope_freq = _rope_frequencies(module)
        causal_seen, pos_bias = _causal_seen(p), _position_bias(p)
        qk_norm = _has_qk_norm(p)
        runtime = _runtime_effect(module, spec.depth)
        probes, trained, seeds, source = [p], True, 0, "module"
        if pc is not None:
            cross_probes.append(pc)
        tables.append(_read_weights(w, notes))
        if on_seed is not None:
            on_seed(0)
    # a model folder's weights (safetensors, or weights_only pickles) replace the init
    folder = model_folder(model)
    for s in range(seeds):
        # unmapped families: eager attention (probabilities returned as the model forms them,
        # biases and soft-capping included; some families have no SDPA path)
        m = hf.model_at_init(config, seed=seed + s, attn_implementation="sdpa" if mapped
                             else "eager", vocab_size=vocab).to(device)
        if folder is not None:
            trained = hf.load_local_weights(m, folder).trained or trained
        if s == 0:  # the inputs the forward needs and the block list they reach
            inputs, stack_name, snotes = model_inputs(m, config, device=device, **made)
            notes += snotes
        p = Probe(m, layers=blocks_of(m, stack_name), keep_hidden=False, repeats=repeats,
                  dtype=getattr(torch, STATS_DTYPE), batch=sequences)
        w = WeightReader(m, blocks=p.blocks, sites=p.sites, repeats=repeats)
        if decoder:
            memories.append(_Memory(m))
        grams.append(_InputGram(p.blocks[0][1], p))
        pc = _cross_probe(p) if decoder else None
        br = _bounds(m, p, spec, decoder)
        with p, w, (pc if pc is not None else nullcontext()), br, torch.no_grad():
            _run(m, inputs, enc_dec, returned=not mapped, decoder=decoder)
        bounds.append(br.bounds() if br is not nullcontext_ else None)
        if pc is not None:
            cross_probes.append(pc.release())
        if decoder:
            memories[-1].close()
        grams[-1].close()
        if rope_freq is None:
            rope_freq = _rope_frequencies(m)
        if s == 0:  # facts about the modules, read before the probe lets the model go
            causal_seen, pos_bias = _causal_seen(p), _position_bias(p)
            qk_norm = _has_qk_norm(p)
            runtime = _runtime_effect(m, spec.depth)
        probes.append(p.release())
        tables.append(_read_weights(w, notes if s == 0 else []))
        del w
        source = "folder" if trained else source
        del m
        if on_seed is not None:
            on_seed(s)
        if trained:  # the folder's weights replace every draw: one realisation to measure
            break
    if "cos" not in probes[0].hidden_stats[0]:
        raise SpecError("model", f"{name}: the measured block list did not run")
    t_seen = grams[0].xs[0].shape[-2] if grams and grams[0].xs else None
    if t_seen and t_seen >= 2 and not decoder and kind != "text":
        again = t_seen != spec.seq_len
        notes.append(f"T = {t_seen} tokens reach the blocks ({kind} input)"
                     + ("; the theory runs at that length" if again else ""))
        spec = spec.replace(seq_len=int(t_seen)) if again else spec
    meas_all = to_trajectory(probes, spec=spec, per_head=True)
    has_head = "head" in meas_all.columns
    heads = meas_all[meas_all["head"].notna()] if has_head else meas_all.iloc[:0]
    meas = meas_all[meas_all["head"].isna()].drop(columns=["head"]) if has_head else meas_all
    rho0 = float(meas[(meas.observable == "cos") & (meas.layer == 0)]["value"].iloc[0])
    if not math.isfinite(rho0):
        raise SpecError("model", f"{name}: the input of {probes[0].blocks[0][0]} is not a "
                                 "(batch, tokens, width) state sigprop can read (its token "
                                 "cosine is NaN)")
    rho0 = min(max(rho0, 0.0), 1.0)
    spec = spec.replace(rho0=rho0)
    notes += _probe_notes(probes[0], meas)
    table = WeightTable.average(tables) if tables and all(tables) else None
    if table is not None and len(table.layers) != spec.depth:
        notes.append(f"weights: {len(table.layers)} attention layers read, the config has "
                     f"{spec.depth}; theory from the config")
        table = None
    if not mapped and table is not None:  # the block layout read from the model itself
        laid, why = structure_spec(spec, config, table, causal_seen,
                                   rope=probes[0].model_has_rope, position_bias=pos_bias)
        if laid is not None:
            table = _per_layer_scales(table, laid.multiplier if laid.scaling == "tau" else 1.0,
                                      notes)
            notes[:] = [n for n in notes if not n.startswith("theory: model type")]
            notes.append(f"model type {config.model_type!r}: no config mapping; the block "
                         "layout and every parameter are read from the model")
            spec, mapped = laid, True
        notes += why
    if mapped and table is not None:
        mem = _merge_memory(memories)
        if any(x.cross_sigma_s is not None for x in table.layers):
            if mem is None:
                table.layers = tuple(_no_cross(x) for x in table.layers)
            else:
                notes.append(f"cross-attention in the theory: over the encoder output as "
                             f"measured (T={mem['memory_len']}, q={mem['memory_q']:.3g}, "
                             f"cos={mem['memory_rho']:.3g})")
        spec = _weights_spec(spec, table, meas, notes, mem)
        if runtime is not None:  # recorded `sigprop fix` methods beyond the weights
            spec = _with_runtime(spec, runtime, notes, measured_q0(meas))
    elif mapped:
        notes.append("theory parameters from the config (initializer_range), not the weights")
    heads = _with_weight_heads(heads, table, spec)
    heads = _with_bounds(heads, bounds)
    layer_rows: list[dict] = []
    if mapped:
        theory = depth.propagate(spec, rho0=rho0)
        theory = _position_resolved(theory, spec, kind, grams, rope_freq, notes)
        traj = pd.concat([theory, meas], ignore_index=True)
        layer_rows = depth.layer_table(spec, theory)
        verdict, first, bad_heads = verdict_of(spec, meas, heads, layers=layer_rows)
        derived = spec.derived(rho0)
        recs = recommend(spec, rho0, qk_norm=qk_norm) if recommendations else []
        derived["beta_measured"] = _measured_beta(heads, spec.seq_len)
    else:  # measured-only: the verdict reads the measurement alone
        traj = meas.reset_index(drop=True)
        verdict, first, bad_heads = verdict_of(spec, meas, heads, theory=False)
        derived, recs = {}, []
    cross = None
    if cross_probes:
        ct = to_trajectory(cross_probes, spec=None)
        cross = ct[ct.observable.isin(("ipr", "ipr_cross", "entropy", "wmax", "sigma_s"))]
        cross = cross.reset_index(drop=True)
    return Diagnosis(model=name, spec=spec, info=info, trajectory=traj, heads=heads,
                     derived=derived, verdict=verdict, first_failing_layer=first,
                     failing_heads=bad_heads, recommendations=recs,
                     rho0=rho0, seconds=time.perf_counter() - t0, trained=trained,
                     notes=notes, seeds=len(probes), sequences=sequences, seed=seed,
                     weights=source, layers=layer_rows, stack=stack, cross=cross,
                     stack_path=stack_name)


nullcontext_ = nullcontext()


def _has_qk_norm(probe) -> bool:
    """Whether the probed attention normalises q and k per head (a ``q_norm``/``k_norm``
    pair after the projections) in most layers."""
    sites = [x for x in probe.sites if x is not None and not isinstance(x, str)]
    return bool(sites) and sum(x.q_post is not None for x in sites) * 2 > len(sites)


def _per_layer_scales(table, m: float, notes: list[str]):
    """Layers whose logit scale times sqrt(d_head) differs from the spec's multiplier ``m``
    (per-layer head dims, Gemma 4's full-attention layers): the ratio goes into that layer's
    score stds, so each layer's beta is its own."""
    import dataclasses

    sc = [float(x) for x in table.scale]
    if not sc or m <= 0 or max(abs(x / m - 1) for x in sc) < 1e-9:
        return table
    table.layers = tuple(dataclasses.replace(lay, sigma_s=tuple(v * x / m for v in lay.sigma_s))
                         for lay, x in zip(table.layers, sc, strict=False))
    notes.append("per-layer logit scales (" + ", ".join(f"{x:.3g}" for x in sc) + " x "
                 "1/sqrt(d_head)): each layer's score std carries its own")
    return table


def _bounds(model, probe, spec: ArchSpec, decoder: bool):
    """A :class:`~sigprop.measurement.bounds.BoundRecorder` on the probe's attention sites
    (Zhai et al.'s entropy floor, docs/fixes.md), or a no-op where the theorem's logits
    ``X W X^T`` do not hold (rotary embeddings, position biases, the decoder stack)."""
    from ..measurement.bounds import BoundRecorder, rope_free

    if decoder or not rope_free(model):
        return nullcontext_
    return BoundRecorder(probe.sites, spec.causal)


def _with_bounds(heads, bounds):
    """``heads`` plus, per layer and head, rows ``entropy_bound`` (Zhai et al.'s floor) and
    ``entropy_bound_centred`` (its centred refinement), source ``bound``, averaged over the
    recorded seeds (:mod:`sigprop.measurement.bounds`)."""
    import pandas as pd

    got = [b for b in bounds if b is not None]
    if not got or not len(heads):
        return heads
    rows = []
    for i in range(len(got[0])):
        per = [b[i] for b in got if b[i] is not None]
        for k, name in enumerate(("entropy_bound", "entropy_bound_centred")):
            if not per:
                continue
            val = np.mean(np.stack([p[k] for p in per]), axis=0)
            rows += [{"layer": i + 1, "head": h, "observable": name, "source": "bound",
                      "value": float(v)} for h, v in enumerate(val) if np.isfinite(v)]
    if not rows:
        return heads
    return pd.concat([heads, pd.DataFrame(rows)], ignore_index=True)


def _runtime_effect(model, depth: int):
    from ..models.methods import runtime_effect

    return runtime_effect(model, depth)


def _with_runtime(spec: ArchSpec, effect, notes: list[str], embed_q: float | None = None
                  ) -> ArchSpec:
    """The weights' spec with the recorded methods' runtime parts (gates, q/k norms, removed
    norms); a note for each part the theory does not reach (its theory rows then ignore
    that part)."""
    from ..models.methods import theory_spec

    notes.extend(f"theory without {line}" for line in effect.measured_only)
    return theory_spec(spec, effect, embed_q)


def _cross_probe(probe):
    """A probe of the decoder blocks' cross-attention (the second attention module of each
    block), recording no hidden states; None where a block has none."""
    from ..measurement.probe import Probe
    from ..measurement.probe_sites import describe_attention

    sites = []
    for name, block in probe.blocks:
        found = [describe_attention(m, f"{name}.{n}", False) for n, m in block.named_modules()]
        found = [x for x in found if x is not None]
        if len(found) < 2:
            return None
        sites.append(found[1])
    return Probe(probe.model, layers=probe.blocks, attention=sites, keep_hidden=False,
                 hidden_stats=())


class _InputGram:
    """Forward pre-hook on the first block: the cosine matrix of its input tokens per
    sequence (the embeddings the theory starts from), averaged over draws. The inputs are
    kept and the matrices formed in :meth:`mean`, which only causal stacks call (~40 ms per
    draw of 2 x 512 tokens saved elsewhere)."""

    def __init__(self, block, probe=None):
        self._xs: list = []
        self.probe = probe  # whose layout (batch-first or time-major) the inputs have
        self.handle = block.register_forward_pre_hook(self._hook, with_kwargs=True)

    @property
    def xs(self) -> list:
        if self.probe is not None and self.probe.time_major:
            return [x.transpose(0, 1) for x in self._xs]
        return self._xs

    def _hook(self, m, args, kwargs):
        from ..measurement.probe import first_tensor

        x = first_tensor(list(args) + list(kwargs.values()))
        if x is None or x.ndim != 3 or self._xs and self._xs[0].shape[-2] != x.shape[-2]:
            return
        self._xs.append(x.detach().clone())

    def close(self):
        self.handle.remove()

    def mean(self):
        import torch

        if not self.xs:
            return None
        total = None
        with torch.no_grad():
            for x in self.xs:
                xd = x.double()
                xn = xd / xd.norm(dim=-1, keepdim=True).clamp_min(1e-300)
                c = (xn @ xn.transpose(-1, -2)).cpu().numpy()
                total = c if total is None else total + c
        return total / len(self.xs)


def _rope_frequencies(model):
    """The model's RoPE frequencies (the ``inv_freq`` buffer of its rotary module), or None."""
    import torch

    for m in model.modules():
        f = getattr(m, "inv_freq", None)
        if torch.is_tensor(f) and f.ndim == 1 and f.numel():
            return f.detach().double().cpu().numpy()
    return None


def _gram_applies(spec: ArchSpec, kind: str) -> str | None:
    """Why the position-resolved theory does not apply to this spec (None: it does)."""
    if not spec.causal:
        return "bidirectional"
    if kind != "text":
        return "not token input"
    if spec.norm not in ("pre", "post") or spec.attention != "softmax":
        return "layout"
    if spec.layers is None or spec.memory_len is not None or spec.q0 is not None:
        return "layout"
    if any(x.measured for x in spec.layers):  # measured mixers: no Gram map (§2.8.1)
        return "layout"
    if spec.seq_len > GRAM_MAX_LEN:
        return "length"
    return None


class _Memory:
    """Forward hook on an encoder-decoder model's encoder: the state of its output (the
    memory every cross-attention reads): length, q and mean pairwise cosine, over draws."""

    def __init__(self, model):
        self.rows: list[tuple[int, float, float]] = []
        enc = model.get_encoder() if hasattr(model, "get_encoder") else None
        self.handle = None if enc is None else enc.register_forward_hook(self._hook)

    def _hook(self, m, args, out):
        from ..measurement import observables as obs
        from ..measurement.probe import first_tensor

        x = first_tensor(out)
        if x is not None:
            xd = x.detach().double()
            self.rows.append((int(xd.shape[-2]), float(obs.mean_q(xd).mean()),
                              float(obs.mean_cos(xd).mean())))

    def close(self):
        if self.handle is not None:
            self.handle.remove()

    def state(self) -> dict | None:
        if not self.rows:
            return None
        return {"memory_len": self.rows[0][0],
                "memory_q": float(np.mean([r[1] for r in self.rows])),
                "memory_rho": float(np.clip(np.mean([r[2] for r in self.rows]), 0.0, 1.0))}


def _merge_memory(memories: list[_Memory]) -> dict | None:
    states = [st for st in (m.state() for m in memories) if st is not None]
    if not states:
        return None
    return {"memory_len": states[0]["memory_len"],
            "memory_q": float(np.mean([s["memory_q"] for s in states])),
            "memory_rho": float(np.mean([s["memory_rho"] for s in states]))}


def _no_cross(lay):
    from dataclasses import replace

    return replace(lay, cross_sigma_s=None, cross_var_v=None, cross_var_o=None)


def _decoder_spec(config, spec: ArchSpec, seq_len: int | None) -> tuple[ArchSpec, str]:
    """The placeholder spec of an encoder-decoder model's decoder stack (its depth, heads and
    MLP width from the config's decoder fields; every theory parameter is then read from the
    weights) and the note saying what is measured."""
    from ..models.arch import first_attr

    L = int(first_attr(config, ("decoder_layers", "num_decoder_layers"), spec.depth))
    H = int(first_attr(config, ("decoder_attention_heads", "num_heads"), spec.heads))
    ff = int(first_attr(config, ("decoder_ffn_dim", "d_ff"), spec.ff))
    top = first_attr(config, ("max_target_positions", "max_position_embeddings"))
    T = int(seq_len) if seq_len is not None else int(min(top or 512, 512))
    if top is not None and T > top:
        raise SpecError("seq_len", f"must be <= {int(top)} for the {config.model_type} "
                                   f"decoder (got {T})")
    heads = H if spec.d_model % H == 0 else math.gcd(spec.d_model, H)
    try:
        new = spec.replace(depth=L, heads=heads, d_ff=ff, seq_len=max(T, 2))
    except SpecError as err:
        raise SpecError("model", f"decoder of {config.model_type}: {err}") from None
    return new, (f"encoder-decoder: the decoder's self-attention stack is measured "
                 f"(decoder_input_ids: built-in text, T={new.seq_len}); cross-attention reads "
                 "the encoder output of the same inputs (its statistics: the cross_attention "
                 "rows)")


def _causal_seen(probe) -> bool:
    """Every measured attention map hid all later keys (a causal mask given as an argument,
    CLIP's text encoder, BLOOM ...)."""
    seen = [i.get("causal") for i in probe.info if i.get("causal") is not None]
    return bool(seen) and all(seen)


def _position_bias(probe) -> bool:
    """Some attention module takes a position bias for its logits (ALiBi, T5's relative bias,
    DeBERTa's relative positions)."""
    import inspect

    names = {"alibi", "position_bias", "relative_pos", "rel_embeddings"}
    for s in probe.sites:
        if s is None:
            continue
        try:
            params = inspect.signature(s.module.forward).parameters
        except (TypeError, ValueError):
            continue
        if names & set(params):
            return True
    return any(i.get("bias") == "missing" for i in probe.info)


def _position_resolved(theory, spec: ArchSpec, kind: str, grams, rope_freq, notes):
    """Causal stacks on token input: the theory's cosine from the position- and token-resolved
    Gram-matrix theory (:mod:`sigprop.theory.gram`, docs/theory.md §2.9) on the measured
    input cosine matrix of every sequence, averaged over sequences; the other rows stay the
    homogeneous theory's. Elsewhere ``theory`` unchanged (with a note where it matters)."""
    from ..theory import gram

    why = _gram_applies(spec, kind)
    c0 = [] if why is not None else [c for c in (g.mean() for g in grams) if c is not None]
    if why is None and not c0:
        why = "no input"
    if why is not None:
        if why in ("length", "layout") and spec.causal:
            notes.append("theory cos: homogeneous (every pair at one overlap); the position-"
                         "resolved theory of causal stacks is not run here ("
                         + (f"T above {GRAM_MAX_LEN}" if why == "length" else
                            "a block layout it does not cover") + ")")
        return theory
    C0 = np.mean(c0, axis=0)  # the same sequences in every draw: expected input geometry
    cos = gram.propagate_gram(spec, C0, rope=rope_freq).mean(axis=-1)
    rows = theory["observable"] == "cos"
    layers = theory.loc[rows, "layer"].to_numpy()
    theory = theory.copy()
    theory.loc[rows, "value"] = np.clip(cos[layers], -1.0, 1.0)
    notes[:] = [n for n in notes if not n.startswith("RoPE: the theory ignores")]
    notes.append("theory cos: position- and token-resolved (the expected Gram matrix of each "
                 "measured input sequence, causal rows, repeated tokens"
                 + (", RoPE" if rope_freq is not None else "") + "; docs/theory.md §2.9); "
                 "ipr / entropy / q rows: the homogeneous theory")
    return theory


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


def _weights_spec(spec: ArchSpec, table, meas, notes: list[str], memory: dict | None = None
                  ) -> ArchSpec:
    """``spec`` with per-layer parameters from the weights (docs/theory.md §2.8). Pre-LN: the
    stream starts at the measured embedding norm q0, absorbed into the branch output
    variances as the config mapping does; post-LN / no norm: the first block reads the
    embeddings at their measured q0 (``spec.q0``). Residual strengths are 1: a sigprop alpha fix
    lives in the output projections, which the weights carry."""
    from dataclasses import replace

    layers = table.layers
    extra = dict(memory) if memory and any(x.cross_sigma_s is not None for x in layers) else {}
    q0 = measured_q0(meas) or 1.0
    if spec.norm == "pre":
        layers = tuple(replace(x, var_o=None if x.var_o is None else x.var_o / q0,
                               var_w_out=x.var_w_out / q0,
                               cross_var_o=None if x.cross_var_o is None
                               else x.cross_var_o / q0,
                               branch_gain2=None if x.branch_gain2 is None
                               else tuple(g / q0 for g in x.branch_gain2)) for x in layers)
    else:  # the first block reads the embeddings as they are (ALBERT's are projected)
        extra["q0"] = q0
    if any(x.measured for x in layers):  # hybrid stacks: the other mixers' measured maps
        layers = _fill_mixers(layers, meas, q0 if spec.norm == "pre" else 1.0)
    if spec.alpha_attn != 1.0:
        notes.append(f"alpha_attn={spec.alpha_attn:g} of the sigprop fix is in the output "
                     "projections: read from the weights")
    notes.append("theory parameters read from the weights, per layer and head "
                 "(docs/theory.md §2.8)")
    return spec.replace(layers=layers, qk_std=None, beta=None, alpha_attn=1.0, alpha_mlp=1.0,
                        **extra)


def _fill_mixers(layers, meas, unit: float):
    """``layers`` with each measured mixer's ``mixer_map`` (docs/theory.md §2.8.1) from the
    measured trajectory: ``(q_in, cos_in, q_out, cos_out)`` of its block (its input: layer
    l - 1, its output: layer l), q in units of ``unit`` (pre-LN: the embedding norm q0, the
    theory's unit)."""
    from dataclasses import replace

    m = meas[meas.source == "measured"] if "source" in meas.columns else meas
    val = m.groupby(["observable", "layer"])["value"].mean()

    def get(name, layer):
        try:
            return float(val.loc[(name, layer)])
        except KeyError:
            return math.nan

    out = []
    for i, x in enumerate(layers):
        if x.measured:
            mp = (get("q", i) / unit, get("cos", i), get("q", i + 1) / unit, get("cos", i + 1))
            x = replace(x, mixer_map=mp)
        out.append(x)
    return tuple(out)


def _with_weight_heads(heads, table, spec: ArchSpec):
    """Per-head rows of the weights' score std (source ``weights``, observable
    ``sigma_s``: the effective one, model scale and length scaling included)."""
    import pandas as pd

    if table is None:
        return heads
    rows = [{"layer": h["layer"], "observable": "sigma_s", "source": "weights",
             "value": h["sigma_s"] * (spec.multiplier if spec.layers is not None
                                      else table.scale[h["layer"] - 1]),
             "stderr": float("nan"), "head": h["head"]}
            for h in table.heads]
    return pd.concat([heads, pd.DataFrame(rows)], ignore_index=True) if rows else heads


def _measured_beta(heads, seq_len: int) -> float:
    """beta from the measured score std: RMS over layers and heads of each head's measured
    sigma_s, over sqrt(log T) (the same aggregate as the spec's beta from the weights);
    NaN where no scores were recomputed."""
    m = heads[(heads.observable == "sigma_s") & (heads.source == "measured")]["value"]
    if not len(m):
        return float("nan")
    return float(np.sqrt(np.mean(np.square(m.to_numpy())))) / math.sqrt(math.log(seq_len))


def head_extremes(heads) -> list[dict]:
    """Per layer: the heads with the lowest and highest attention entropy."""
    ent = heads[(heads.observable == "entropy") & np.isfinite(heads["value"].astype(float))]
    out = []
    for layer, g in ent.groupby("layer"):
        i, j = g["value"].idxmin(), g["value"].idxmax()
        out.append({"layer": int(layer), "min_entropy_head": int(g.loc[i, "head"]),
                    "min_entropy": float(g.loc[i, "value"]),
                    "max_entropy_head": int(g.loc[j, "head"]),
                    "max_entropy": float(g.loc[j, "value"])})
    return out


def per_head(d: Diagnosis) -> list[dict]:
    """One entry per layer and head: ``sigma_s`` (from the weights), ``beta``,
    ``beta_over_beta_c`` (beta_c of the layer's theory input cosine), the measured
    ``sigma_s_measured``, ``entropy``, ``ipr``, and the entropy floors from the weights
    ``entropy_bound`` / ``entropy_bound_centred`` (None where not available)."""
    h = d.heads
    if h is None or not len(h):
        return []
    key = h["observable"] + ":" + h["source"]
    wide = h.assign(key=key).pivot_table(index=["layer", "head"], columns="key",
                                         values="value", aggfunc="first")
    logt = math.sqrt(math.log(d.spec.seq_len))
    bc = {r["layer"]: r["beta_c"] for r in d.layers}
    out = []
    for (layer, head), row in wide.iterrows():
        def get(k, row=row):
            v = row.get(k)
            return None if v is None or not np.isfinite(v) else float(v)

        sig = get("sigma_s:weights")
        beta = None if sig is None else sig / logt
        c = bc.get(int(layer))
        out.append({"layer": int(layer), "head": int(head), "sigma_s": sig, "beta": beta,
                    "beta_over_beta_c": None if beta is None or c is None else beta / c,
                    "sigma_s_measured": get("sigma_s:measured"),
                    "entropy": get("entropy:measured"), "ipr": get("ipr:measured"),
                    "entropy_bound": get("entropy_bound:bound"),
                    "entropy_bound_centred": get("entropy_bound_centred:bound")})
    return out


def to_json(d: Diagnosis, *, timing: bool = True) -> dict:
    """The diagnosis as the CLI's JSON; ``timing=False`` leaves out the wall-clock
    ``seconds`` (same seed -> byte-identical output)."""
    from .. import trajectory

    out = {"model": d.model, "spec": d.spec.to_dict(), "derived": d.derived,
            "architecture": d.info.to_dict() if hasattr(d.info, "to_dict") else {},
            "rows": trajectory.to_rows(d.trajectory), "heads": head_extremes(d.heads),
            "verdict": d.verdict, "first_failing_layer": d.first_failing_layer,
            "failing_heads": d.failing_heads, "recommendations": d.recommendations,
            "rho0": d.rho0, "trained_weights": d.trained, "notes": d.notes,
            "seeds": d.seeds, "sequences": d.sequences, "seed": d.seed,
            "weights": d.weights, "stack": d.stack, "stack_path": d.stack_path,
            "layers": d.layers,
            "cross_attention": [] if d.cross is None else trajectory.to_rows(d.cross),
            "per_head": per_head(d),
            "seconds": d.seconds, "n_layers_measured": int(np.sum(
                (d.trajectory.source == "measured") & (d.trajectory.observable == "ipr")))}
    if not timing:
        del out["seconds"]
    return out
