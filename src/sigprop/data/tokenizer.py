"""WordPiece tokenizer training with HuggingFace ``tokenizers``, cached on disk (gg25 A.1:
BERT-style MLM on TinyStories with a vocabulary of 2,000 and the BERT special tokens).

The tokenizer is BERT's recipe (lower-casing normaliser, whitespace-and-punctuation
pre-tokeniser, WordPiece with ``##`` continuation pieces) trained on the corpus itself. The
trained tokenizer is written as JSON under the cache directory (``$SIGPROP_CACHE_DIR`` or
``~/.cache/sigprop``) in ``tokenizers/``, named by a hash of the corpus text and the vocabulary
size, so the same corpus never trains twice.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_VOCAB = 2000


def cache_dir() -> Path:
    """``$SIGPROP_CACHE_DIR`` or ``~/.cache/sigprop``."""
    root = os.environ.get("SIGPROP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "sigprop")
    return Path(root)


def corpus_hash(texts: Sequence[str]) -> str:
    """SHA-256 (first 16 hex digits) of the texts, separated by a NUL byte."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def _new_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def train_wordpiece(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB, *,
                    cache: bool = True):
    """A ``tokenizers.Tokenizer`` (WordPiece, ``vocab_size`` entries at most, the five special
    tokens first with ids 0-4) trained on ``texts``; loaded from the cache when present."""
    from tokenizers import Tokenizer, decoders, trainers

    if not 16 <= vocab_size <= 1_000_000:
        raise ValueError(f"vocab_size must be in [16, 1000000] (got {vocab_size})")
    path = cache_dir() / "tokenizers" / f"wordpiece-{corpus_hash(texts)}-{vocab_size}.json"
    if cache and path.exists():
        return Tokenizer.from_file(str(path))
    tok = _new_tokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size,
                                        special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.decoder = decoders.WordPiece()
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tok.save(str(tmp))
        os.replace(tmp, path)  # atomic: concurrent runs never read a half-written file
    return tok


def special_ids(tok) -> dict[str, int]:
    """``{"[PAD]": 0, ...}`` for the special tokens."""
    return {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}


def encode_stream(tok, texts: Sequence[str]):
    """One int64 NumPy stream: each text's ids followed by ``[SEP]`` (no [CLS]; the batcher
    puts one at the start of every window)."""
    import numpy as np

    sep = tok.token_to_id("[SEP]")
    enc = tok.encode_batch(list(texts), add_special_tokens=False)
    parts = []
    for e in enc:
        parts.append(np.asarray(e.ids, dtype=np.int64))
        parts.append(np.array([sep], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
