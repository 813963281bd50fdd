"""WordPiece tokenizer training with HuggingFace ``tokenizers``, cached on disk (gg25 A.1:
BERT-style MLM on TinyStories with a vocabulary of 2,000 and the BERT special tokens).

The tokenizer is BERT's recipe (lower-casing normaliser, whitespace-and-punctuation
pre-tokeniser, WordPiece with ``##`` continuation pieces) trained on the corpus itself. The
trained tokenizer is written as JSON under the cache directory (``$SIGPROP_CACHE_DIR`` or
``~/.cache/sigprop``) in ``tokenizers/``, named by a hash of the corpus text and the vocabulary
size, so the same corpus never trains twice.

Determinism. ``tokenizers``' own ``WordPieceTrainer`` (0.23) is not reproducible: it gives the
``##`` continuation characters their ids in hash-map order, and those ids break ties between
equally frequent merges, so two trainings on the same texts can differ in a few dozen tokens
(huggingface/tokenizers#1794). We therefore train the library's ``BpeTrainer`` without a
continuation prefix on words whose non-initial characters are first replaced by stand-ins
from the Unicode private-use planes: the trainer sorts its whole alphabet (initial characters
and stand-ins alike) before assigning ids, so every tie is broken the same way in every run.
The stand-ins are then mapped back to ``##`` pieces and the vocabulary is loaded into a
WordPiece model. The result is the same WordPiece vocabulary up to the choice among tied
merges, and a pure function of the texts.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_VOCAB = 2000
TRAINER_VERSION = "v2"  # part of the cache keys: v1 was the non-deterministic library trainer
CONT_PREFIX = "##"
_PUA = [(0xF0000, 0xFFFFE), (0x100000, 0x10FFFE)]  # planes 15-16, private use


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


def _stand_ins(chars: set[str]) -> dict[str, str]:
    """Continuation stand-in for each character: private-use code points not in ``chars``,
    assigned in sorted order of the characters (a pure function of the character set)."""
    free = (chr(c) for lo, hi in _PUA for c in range(lo, hi) if chr(c) not in chars)
    out = {}
    for ch in sorted(chars):
        try:
            out[ch] = next(free)
        except StopIteration:
            raise ValueError("corpus uses too many distinct characters for the tokenizer "
                             "(at most ~130,000)") from None
    return out


def word_counts(tok, texts: Sequence[str]) -> Counter:
    """How often each word of ``tok``'s normaliser and pre-tokeniser occurs in ``texts``.

    The BERT pre-tokeniser splits at whitespace first, so the texts are split at whitespace in
    Python and each distinct chunk is normalised and pre-tokenised once by the library (a
    corpus repeats its chunks many times: ~10x faster than one library call per text)."""
    chunks = Counter(c for t in texts for c in t.split())
    norm, pre = tok.normalizer, tok.pre_tokenizer
    words: Counter = Counter()
    for chunk, n in chunks.items():
        for w, _ in pre.pre_tokenize_str(norm.normalize_str(chunk)):
            words[w] += n
    return words


def train_wordpiece(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB, *,
                    cache: bool = True):
    """A ``tokenizers.Tokenizer`` (WordPiece, ``vocab_size`` entries at most, the five special
    tokens first with ids 0-4) trained on ``texts``, the same in every run (module docstring);
    loaded from the cache when present."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not 16 <= vocab_size <= 1_000_000:
        raise ValueError(f"vocab_size must be in [16, 1000000] (got {vocab_size})")
    path = (cache_dir() / "tokenizers"
            / f"wordpiece-{TRAINER_VERSION}-{corpus_hash(texts)}-{vocab_size}.json")
    if cache and path.exists():
        return Tokenizer.from_file(str(path))
    tok = _new_tokenizer()
    counts = word_counts(tok, texts)
    cont = _stand_ins({c for w in counts for c in w})
    back = {v: k for k, v in cont.items()}
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  show_progress=False)
    # one string per distinct word, the word repeated as often as it occurs
    mapped = ((w[0] + "".join(cont[c] for c in w[1:]) + " ") * n
              for w, n in sorted(counts.items()))
    bpe.train_from_iterator(mapped, trainer=trainer, length=len(counts))

    def unmap(piece: str) -> str:
        if piece in SPECIAL_TOKENS:
            return piece
        text = "".join(back.get(c, c) for c in piece)
        return CONT_PREFIX + text if piece[0] in back else text

    vocab = {unmap(p): i for p, i in bpe.get_vocab().items()}
    tok.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix=CONT_PREFIX)
    tok.decoder = decoders.WordPiece(prefix=CONT_PREFIX)
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
