"""A small seeded generator of simple English sentences and a word-level tokenizer.

Sentences come from a handful of templates over fixed word lists; names and objects recur
across the sentences of one text, so sequences have real token-frequency structure (repeated
tokens, function words) rather than i.i.d. ids.
"""

from __future__ import annotations

import numpy as np

NAMES = ("Tom", "Lily", "Max", "Sue", "Ben", "Mia", "Sam", "Anna", "Leo", "Zoe")
ANIMALS = ("cat", "dog", "bird", "fish", "frog", "duck", "bunny", "bear", "fox", "owl")
OBJECTS = ("ball", "box", "kite", "cake", "book", "hat", "toy", "boat", "tree", "cup",
           "apple", "flower", "car", "drum", "shoe", "bed")
ADJS = ("big", "small", "red", "blue", "happy", "sad", "old", "new", "shiny", "soft", "funny",
        "green", "little", "kind", "brave", "sleepy")
VERBS = ("saw", "found", "liked", "wanted", "took", "gave", "made", "lost", "had", "hugged")
PLACES = ("park", "garden", "house", "forest", "school", "beach", "lake", "farm", "room", "hill")
FEEL = ("happy", "sad", "scared", "proud", "tired", "excited", "angry", "surprised")
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PUNCT = (".", ",", "!")
FUNCTION = ("the", "a", "and", "to", "was", "with", "in", "one", "day", "went", "said", "it",
            "is", "my", "then", "very", "felt", "they", "played", "together", "at", "her",
            "his", "friend", "so", "but", "not", "there", "lived", "who")


def _sentence(rng: np.random.Generator, who: str, pet: str, thing: str) -> list[str]:
    adj = rng.choice(ADJS)
    place = rng.choice(PLACES)
    k = rng.integers(6)
    if k == 0:
        return ["one", "day", who, "went", "to", "the", place, "."]
    if k == 1:
        return [who, rng.choice(VERBS), "a", adj, thing, "in", "the", place, "."]
    if k == 2:
        return ["the", pet, "was", "very", rng.choice(FEEL), "!"]
    if k == 3:
        return [who, "and", "the", pet, "played", "together", "with", "the", thing, "."]
    if k == 4:
        return [who, "said", ",", "my", thing, "is", adj, "!"]
    return ["then", who, "felt", rng.choice(FEEL), "and", "hugged", "the", pet, "."]


def generate_text(n_words: int, seed: int = 0) -> list[str]:
    """At least ``n_words`` words of simple text (seeded); characters change every few lines."""
    rng = np.random.default_rng(seed)
    words: list[str] = []
    while len(words) < n_words:
        who, pet, thing = rng.choice(NAMES), rng.choice(ANIMALS), rng.choice(OBJECTS)
        words += ["there", "lived", "a", rng.choice(ADJS), pet, "."]
        for _ in range(int(rng.integers(3, 7))):
            words += _sentence(rng, who, pet, thing)
    return words


class WordTokenizer:
    """Word-level vocabulary over the generator's words plus the BERT special tokens."""

    def __init__(self) -> None:
        vocab = list(SPECIAL)
        for group in (FUNCTION, PUNCT, NAMES, ANIMALS, OBJECTS, ADJS, VERBS, PLACES, FEEL):
            vocab += [w for w in group if w not in vocab]
        self.vocab = vocab
        self.index = {w: i for i, w in enumerate(vocab)}

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, words: list[str]) -> np.ndarray:
        unk = self.index["[UNK]"]
        return np.array([self.index.get(w, unk) for w in words], dtype=np.int64)


def token_batch(n_seq: int, seq_len: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """``(ids (n_seq, seq_len), vocab_size)``: consecutive windows of generated text, each
    starting with [CLS]."""
    tok = WordTokenizer()
    ids = tok.encode(generate_text(n_seq * seq_len + 16, seed))
    out = ids[: n_seq * (seq_len - 1)].reshape(n_seq, seq_len - 1)
    cls = np.full((n_seq, 1), tok.index["[CLS]"], dtype=np.int64)
    return np.concatenate([cls, out], axis=1), len(tok)
