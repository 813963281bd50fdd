"""Running a HuggingFace model the way the analyses measure it: which model a name, folder or
module stands for, the inputs its forward needs (built-in text, images, audio ... at full
size), the block list those inputs reach, and one forward pass.

:func:`diagnose <sigprop.analysis.diagnose.diagnose>`, ``fix --compare``
(:mod:`~sigprop.analysis.ranking`) and the long-context model sweep
(:mod:`~sigprop.analysis.longctx_model`) share these. They compose :mod:`sigprop.models`
(configs, models at init, :mod:`~sigprop.models.inputs`) with the measurement floor's block
lists, and import both inside the functions: importing :mod:`sigprop.models` imports
``transformers``, which ``import sigprop`` leaves for the commands that need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..spec import SpecError

#: embedding rows used when the model is built (i.i.d. rows at init: size is irrelevant)
VOCAB_AT_INIT = 4096

#: what a made input is, for the notes (text needs none)
_INPUT_KINDS = {"pixel_values": "image", "pixel_values_videos": "video",
                "input_values": "audio", "input_features": "audio", "hidden_states": "image"}


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


def vocab_at_init(config, vocab_size: int) -> int:
    """Embedding rows to build: at most ``VOCAB_AT_INIT`` (rows are i.i.d. at init), at least
    ``pad_token_id + 1`` (the padding row must exist)."""
    from ..models.config import config_attr

    pad = config_attr(config, "pad_token_id")
    low = pad + 1 if isinstance(pad, int) and not isinstance(pad, bool) and \
        0 <= pad < vocab_size else 1
    return min(vocab_size, max(VOCAB_AT_INIT, low))


def repeats_of(config) -> int:
    """Applications of each block per forward pass: ALBERT shares ``num_hidden_groups`` layer
    groups over ``num_hidden_layers`` layers; 1 elsewhere."""
    groups = getattr(config, "num_hidden_groups", None)
    L = getattr(config, "num_hidden_layers", None)
    if isinstance(groups, int) and isinstance(L, int) and 0 < groups < L and L % groups == 0:
        return L // groups
    return 1


def text_token_ids(sequences: int, T: int, vocab: int, seed: int):
    """``(sequences, T)`` token ids of built-in text
    (:func:`sigprop.measurement.inputs.text_ids`) taken modulo ``vocab``."""
    import torch

    from ..measurement.inputs import text_ids

    ids, _ = text_ids(sequences, T, seed)
    return torch.remainder(ids, vocab)


def text_inputs(sequences: int, T: int, vocab: int, seed: int, device) -> dict:
    """``input_ids`` + ``attention_mask`` of built-in text (every other input, and what a
    model of another kind takes, comes from :func:`model_inputs`)."""
    import torch

    ids = text_token_ids(sequences, T, vocab, seed).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def model_inputs(m, config, kind: str, *, sequences: int, T: int, vocab: int, seed: int,
                 device, enc_dec: bool = False, decoder: bool = False,
                 prefer: str | None = None, decoder_ids=None, tokens=None
                 ) -> tuple[dict, str, list[str]]:
    """``(inputs, block list, notes)`` for model ``m``: :func:`settle_inputs` learns what its
    forward needs and which block list those inputs reach, then the inputs are made at full
    size (``sequences`` x ``T`` tokens of built-in text where it takes text; images, audio
    ... from :mod:`sigprop.models.inputs`), each non-text one named in a note. ``tokens``:
    a :class:`~sigprop.data.model_text.TokenBatch` of the model's own tokenizer, used for
    the text instead of sigprop's built-in ids."""
    from ..models.inputs import make_input

    names, stack, notes = settle_inputs(m, config, kind, enc_dec, decoder, prefer, vocab, seed,
                                        str(device))
    t_text = T
    beside = [_INPUT_KINDS[n] for n in (x.split("@")[0] for x in names) if n in _INPUT_KINDS]
    if beside and "input_ids" in names:  # text beside an image / audio input: at most the
        cap = _text_positions(config)  # text tower's positions (CLIP-like towers included)
        if cap is not None and cap < T:
            t_text = cap
            notes = notes + [f"text input beside the {beside[0]} input: {cap} tokens (the "
                             "text model's max_position_embeddings)"]
    if tokens is not None:
        text = {"input_ids": tokens.input_ids[:, :t_text].to(device),
                "attention_mask": tokens.attention_mask[:, :t_text].to(device)}
    else:
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


def run_forward(model, inputs: dict, enc_dec: bool, returned: bool = False,
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


def find_sub_model(model, stack: str, seed: int, device: str):
    """``(module, path)`` of the sub-model ``stack`` names (its path or last component) in
    ``model`` (an ``nn.Module``, or a name, folder or config built at init under ``seed``
    with a folder's weights), or None where ``stack`` names no sub-model (a block list,
    then)."""
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


def settle_inputs(m, config, kind: str, enc_dec: bool, decoder: bool, prefer: str | None,
                  vocab: int, seed: int, device: str) -> tuple[list[str], str, list[str]]:
    """``(input names, block list to measure, notes)`` for model ``m``: refuses a model
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


def has_weights_folder(model) -> bool:
    """True for a model folder holding weight files (a trained model to be read as it is)."""
    from ..models.loading import has_weights

    folder = model_folder(model)
    return folder is not None and has_weights(folder)


def model_tokens(model, module, kind: str, sequences: int, T: int, seed: int,
                 notes: list[str], *, loaded: bool, text, tokenizer):
    """``(TokenBatch or None, what the model reads in words)``: real text through the
    model's tokenizer for weights read as they are (``loaded``: a module, or a folder with
    weight files) or when ``text`` / ``tokenizer`` is given, else the at-init default
    (sigprop's built-in ids)."""
    from ..data.model_text import find_tokenizer, token_batch

    asked = text is not None or tokenizer is not None
    at_init = ("sigprop's built-in token ids (its own stories' word ids modulo the "
               "vocabulary; the at-init default)")
    if kind != "text":
        if text is not None:
            raise SpecError("text", f"this model reads {kind} inputs, not text")
        return None, f"{kind} input (sigprop's own, see the notes)"
    if not (loaded or asked):
        return None, at_init
    tok = find_tokenizer(module if module is not None else model, tokenizer, notes)
    if tok is None:
        if text is not None:
            raise SpecError("text", "needs the model's tokenizer: none comes with the model "
                                    "(give --tokenizer DIR|NAME)")
        return None, at_init + "; no tokenizer comes with the model"
    batch = token_batch(tok, sequences, T, text=text, seed=seed)
    return batch, batch.describe()


def token_vocab(vocab_size: int, tokens) -> int:
    """The embedding rows to build when the model reads its tokenizer's ids: all of them (a
    SpecError when the tokenizer's ids exceed the model's vocabulary)."""
    top = int(tokens.input_ids.max())
    if top >= vocab_size:
        raise SpecError("tokenizer", f"its ids reach {top} but the model's vocabulary has "
                                     f"{vocab_size} rows: not this model's tokenizer")
    return vocab_size
