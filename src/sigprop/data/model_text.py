"""Real text for a model, through the model's own tokenizer: what a trained model reads in use.

:func:`find_tokenizer` finds the tokenizer a model comes with (one given, a model folder's
tokenizer files, or the local cache of the hub name a module was loaded from; never remote
code, never a download that could hang an offline run). :func:`token_batch` turns documents
(the built-in stories, or the user's ``--text FILE|DIR``) into ``sequences`` full windows of
``T`` tokens each, with the tokenizer's special tokens where it puts them ([CLS] ... [SEP], a
BOS), an all-ones attention mask (no padding: every window is full) and the positions of the
special tokens, which the per-head anatomy needs (a head on [SEP] is a sink, not a content
head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import SpecError

#: offset of the built-in stories' seed: stories no ``tiny_trained`` model saw in training
#: (they train on seeds 0, 1 ...)
HELD_OUT = 1_000_003

#: files that make a folder a tokenizer folder for ``AutoTokenizer``
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model",
                   "tokenizer.model", "vocab.json", "sentencepiece.bpe.model")


@dataclass(frozen=True, kw_only=True)
class TokenBatch:
    """``input_ids`` and ``attention_mask`` (sequences, T), ``special`` (bool, same shape:
    the tokenizer's special tokens), where the text came from (``source``: ``builtin
    stories`` or the path) and which tokenizer made the ids (``tokenizer``)."""

    input_ids: Any
    attention_mask: Any
    special: Any
    source: str
    tokenizer: str

    def describe(self) -> str:
        B, T = self.input_ids.shape
        return (f"real text ({self.source}) through the model's tokenizer "
                f"({self.tokenizer}), {B} x {T} tokens, special tokens as the tokenizer "
                "places them")


def _is_tokenizer(obj) -> bool:
    return callable(obj) and hasattr(obj, "convert_tokens_to_ids") and hasattr(
        obj, "all_special_ids")


def _from_folder(folder: Path):
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def find_tokenizer(model, given=None, notes: list[str] | None = None):
    """The tokenizer for ``model`` or None: ``given`` (a tokenizer object, or a folder /
    hub name, a SpecError when it cannot be loaded); else a model folder's tokenizer files;
    else, for an ``nn.Module``, its ``config._name_or_path`` as a folder or as a name already
    in the local hub cache (no download). A tokenizer that fails to load where one was not
    asked for is a note, not an error."""
    from transformers import AutoTokenizer

    notes = notes if notes is not None else []
    if given is not None:
        if _is_tokenizer(given):
            return given
        try:
            p = Path(str(given)).expanduser()
            tok = _from_folder(p) if p.is_dir() else AutoTokenizer.from_pretrained(
                str(given), trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - any loader failure is one line
            raise SpecError("tokenizer", f"cannot load {given!r}: "
                                         f"{str(err).splitlines()[0][:160]}") from None
        if tok is None:
            raise SpecError("tokenizer", f"{given} holds no tokenizer files "
                                         f"({', '.join(TOKENIZER_FILES[:3])} ...)")
        return tok
    where = None
    if isinstance(model, str | Path) and Path(model).expanduser().is_dir():
        where = Path(model).expanduser()
    elif hasattr(model, "config"):
        where = getattr(model.config, "_name_or_path", None) or None
    if where is None:
        return None
    try:
        p = Path(str(where)).expanduser()
        if p.is_dir():
            return _from_folder(p)
        return AutoTokenizer.from_pretrained(str(where), local_files_only=True,
                                             trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - the at-init inputs stand in, with a note
        notes.append(f"tokenizer of {where} not loaded ({type(err).__name__}); inputs: "
                     "sigprop's built-in token ids")
        return None


def _documents(text, n_tokens: int, seed: int) -> tuple[list[str], str]:
    """Documents of ``text`` (None: built-in stories, enough for about ``n_tokens``)."""
    from .stories import generate_stories
    from .text import CorpusError, read_texts

    if text is None:  # ~150 tokens a story: twice what is needed, at least 8
        return generate_stories(max(8, n_tokens // 75), seed + HELD_OUT), "builtin stories"
    try:
        return read_texts(text), str(text)
    except CorpusError as err:
        raise SpecError("text", str(err)) from None


def _template(tokenizer) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after one text (read from how it
    encodes a word with and without them: transformers 5's fast tokenizers have no
    ``build_inputs_with_special_tokens``)."""
    word = tokenizer("token", add_special_tokens=False)["input_ids"]
    full = tokenizer("token", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(word) + 1):
        if full[i:i + len(word)] == word:
            return full[:i], full[i + len(word):]
    raise SpecError("tokenizer", "its special tokens change the text's own tokens; give "
                                 "token ids instead")


def token_batch(tokenizer, sequences: int, T: int, *, text=None, seed: int = 0
                ) -> TokenBatch:
    """``sequences`` windows of ``T`` tokens of ``text`` (a file or folder of ``.txt``; None:
    the built-in stories drawn with ``seed``) through ``tokenizer``: the documents' tokens
    in one stream (the tokenizer's separator or end-of-text token between documents), cut
    into consecutive windows of ``T`` minus the special tokens the tokenizer adds, each
    wrapped with them. A SpecError (field ``text``) when the text is too short."""
    import torch

    n_special = tokenizer.num_special_tokens_to_add(pair=False)
    body = T - n_special
    if body < 1:
        raise SpecError("seq_len", f"must exceed the {n_special} special tokens the "
                                   f"tokenizer adds (got {T})")
    docs, source = _documents(text, sequences * T, seed)
    between = tokenizer.sep_token_id if tokenizer.sep_token_id is not None \
        else tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"]:
        stream += ids + ([between] if between is not None else [])
        if len(stream) >= sequences * body:
            break
    if len(stream) < sequences * body:
        raise SpecError("text", f"{source} gives {len(stream)} tokens; {sequences} sequences "
                                f"of {T} need {sequences * body}")
    before, after = _template(tokenizer)
    if len(before) + len(after) != n_special:
        raise SpecError("tokenizer", f"adds {n_special} special tokens but its template shows "
                                     f"{len(before) + len(after)}")
    ids = torch.tensor([before + stream[i * body:(i + 1) * body] + after
                        for i in range(sequences)], dtype=torch.long)
    special = torch.isin(ids, torch.tensor(sorted(set(tokenizer.all_special_ids))))
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    return TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), special=special,
                      source=source, tokenizer=str(name))
