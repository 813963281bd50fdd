"""One entry point for training corpora: ``load_corpus(data)`` with ``data`` = ``builtin``
(:mod:`.stories`, offline default), ``tinystories`` (:mod:`.hub`, only with a reachable hub) or
a path (:mod:`.text`). The documents are split into train and eval parts, a WordPiece tokenizer
(:mod:`.tokenizer`) is trained on the train part, and both parts are encoded into token streams.
Encoded streams are cached next to the tokenizer (same key: corpus hash + vocabulary size).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from . import tokenizer as _tok
from .text import CorpusError, read_texts

DEFAULT_DOCUMENTS = {"builtin": 10_000, "tinystories": 20_000, "path": 100_000}


@dataclass
class Corpus:
    """Token streams (int64) of the train and eval documents, and what produced them."""

    train: np.ndarray
    eval: np.ndarray
    vocab_size: int
    source: str
    n_documents: int
    tokenizer: object = field(repr=False, default=None)

    @property
    def cls_id(self) -> int:
        return self.tokenizer.token_to_id("[CLS]")

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_to_id("[MASK]")


def documents(data: str, n_documents: int | None = None, seed: int = 0) -> list[str]:
    """The documents of ``data`` (``builtin`` stories are drawn with ``seed``)."""
    if n_documents is not None and n_documents < 2:
        raise CorpusError(f"need at least 2 documents (got {n_documents})")
    if data == "builtin":
        from .stories import generate_stories

        return generate_stories(n_documents or DEFAULT_DOCUMENTS["builtin"], seed)
    if data == "tinystories":
        from .hub import load_tinystories

        return load_tinystories(n_documents or DEFAULT_DOCUMENTS["tinystories"])
    return read_texts(data, n_documents or DEFAULT_DOCUMENTS["path"])


def load_corpus(data: str = "builtin", *, n_documents: int | None = None,
                vocab_size: int = _tok.DEFAULT_VOCAB, eval_fraction: float = 0.05,
                seed: int = 0, cache: bool = True) -> Corpus:
    """Documents -> (train, eval) token streams. The last ``eval_fraction`` of the documents
    (at least one) is held out for evaluation; the tokenizer sees only the train part."""
    if not 0 < eval_fraction < 1:
        raise CorpusError(f"eval_fraction must be in (0, 1) (got {eval_fraction})")
    docs = documents(data, n_documents, seed)
    if len(docs) < 2:
        raise CorpusError(f"{data!r} gives {len(docs)} document(s); need at least 2 "
                          "(separate documents by blank lines)")
    n_eval = max(1, int(round(len(docs) * eval_fraction)))
    train_docs, eval_docs = docs[:-n_eval], docs[-n_eval:]
    tok = _tok.train_wordpiece(train_docs, vocab_size, cache=cache)
    key = f"{_tok.TRAINER_VERSION}-{_tok.corpus_hash(docs)}-{n_eval}-{vocab_size}"
    path = _tok.cache_dir() / "streams" / f"{key}.npz"
    if cache and path.exists():
        with np.load(path) as z:
            train, ev = z["train"], z["eval"]
    else:
        train, ev = _tok.encode_stream(tok, train_docs), _tok.encode_stream(tok, eval_docs)
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{key}.{os.getpid()}.tmp.npz")
            np.savez(tmp, train=train, eval=ev)
            os.replace(tmp, path)
    name = data if data in ("builtin", "tinystories") else "path"
    return Corpus(train, ev, tok.get_vocab_size(), name, len(docs), tok)
