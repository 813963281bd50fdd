"""Corpora, tokenisation and task data for training (docs/architecture.md ``data/``).

* :mod:`.stories`: the built-in seeded generator of children's stories (offline default);
* :mod:`.text`: local text files / folders; :mod:`.hub`: TinyStories when a hub is reachable;
* :mod:`.tokenizer`: WordPiece training (``tokenizers``), cached on disk;
* :mod:`.corpus`: ``load_corpus(data)`` tying them together into token streams;
* :mod:`.collate`: MLM masking (15%, 80/10/10) and causal-LM batches;
* :mod:`.tasks`: noci22's reverse task and mindthegap's Heaviside task;
* :mod:`.tiny`: the small word-level generator used by the measurement code at init.
"""
