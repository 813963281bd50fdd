"""Local text corpora: a file or a folder of files, split into documents.

A document is a block of text separated from the next by a blank line (TinyStories' own text
dumps separate stories that way; ``<|endoftext|>`` markers are treated as separators too).
A folder is read recursively, files with the suffixes in :data:`SUFFIXES`, in sorted path
order so the corpus (and its tokenizer hash) does not depend on the file system's order.
"""

from __future__ import annotations

import re
from pathlib import Path

SUFFIXES = (".txt", ".text", ".md")
_SPLIT = re.compile(r"\n\s*\n|<\|endoftext\|>")


class CorpusError(ValueError):
    """A corpus that cannot be used; the message is one line naming the problem."""


def split_documents(text: str) -> list[str]:
    """Blank-line separated blocks of ``text``, internal whitespace collapsed, empties dropped."""
    docs = (" ".join(block.split()) for block in _SPLIT.split(text))
    return [d for d in docs if d]


def read_texts(path: str | Path, max_documents: int | None = None) -> list[str]:
    """Documents of a text file or of every text file under a folder."""
    p = Path(path).expanduser()
    try:
        found = p.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        found = False
    if not found:
        raise CorpusError(f"{str(path)!r} does not exist (give builtin, tinystories, a text "
                          "file or a folder of .txt files)")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*")
                                           if f.is_file() and f.suffix.lower() in SUFFIXES)
    if not files:
        raise CorpusError(f"{str(path)!r} holds no {'/'.join(SUFFIXES)} files")
    docs: list[str] = []
    for f in files:
        try:
            docs += split_documents(f.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            raise CorpusError(f"cannot read {str(f)!r} ({err.strerror or err})") from None
        if max_documents is not None and len(docs) >= max_documents:
            return docs[:max_documents]
    if not docs:
        raise CorpusError(f"{str(path)!r} contains no text")
    return docs
