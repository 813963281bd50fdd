"""Corpora and tokenisation. For now: a small built-in generator of simple English text with a
word-level tokenizer (:mod:`.tiny`), enough to feed real token statistics through embeddings
at initialisation; the training issue brings the story generator and WordPiece."""
