"""Training / evaluation batches for every task of :mod:`sigprop.training.loop`.

``Batches(spec, config)`` reads the task, sequence length, batch size, masking probability ...
from a spec and a train config (duck-typed: this module does not import the trainer). Training
batches are drawn from a ``torch.Generator`` owned by the caller; the evaluation set is fixed
(its own generator, seeded independently of the run's seed, so runs with different seeds and
betas are evaluated on the same masked sequences).
"""

from __future__ import annotations

import torch

from . import collate, tasks

EVAL_SEED = 20_250_101  #: seed of the fixed evaluation set (shared by all runs)


class Batches:
    """Batches for ``config.task`` in ``mlm | clm | reverse | heaviside`` (see train.py)."""

    def __init__(self, spec, config, *, data: str = "builtin", corpus=None):
        self.task, self.T, self.B = config.task, spec.seq_len, config.batch_size
        self.config = config
        self.corpus = None
        self.unigram_logp = None  #: (V,) log token frequencies of the training stream (LM tasks)
        g = torch.Generator().manual_seed(EVAL_SEED)
        if self.task in ("mlm", "clm"):
            if corpus is None:
                from .corpus import load_corpus

                corpus = load_corpus(data)
            self.corpus, self.vocab, self.source = corpus, corpus.vocab_size, corpus.source
            extra = 1 if self.task == "clm" else 0
            cls = corpus.cls_id if self.task == "mlm" else None
            w = collate.lm_windows(corpus.eval, config.eval_sequences, self.T, cls_id=cls,
                                   gen=None, extra=extra)
            self._eval = [self._lm_pair(w[i:i + self.B], g) for i in range(0, len(w), self.B)]
            labels = torch.cat([y.reshape(-1) for _, y in self._eval])
            self.unigram_logp = collate.unigram_logp(corpus.train, self.vocab)
            self.baseline = collate.label_nll(self.unigram_logp, labels)
            self._probe = w[: min(len(w), 8), : self.T]
        elif self.task == "reverse":
            self.vocab, self.source = config.n_symbols, "reverse"
            x, y = tasks.reverse_batch(config.eval_sequences, self.T, config.n_symbols, g)
            self._eval = [(x[i:i + self.B], y[i:i + self.B]) for i in range(0, len(x), self.B)]
            self.baseline = float(torch.log(torch.tensor(float(config.n_symbols))))
            self._probe = x[:8]
        else:  # heaviside: a fixed training set of n_points; evaluation on fresh points
            self.vocab, self.source = None, "heaviside"
            gt = torch.Generator().manual_seed(config.seed)
            self._x, self._y = tasks.heaviside_data(config.n_points, self.T, spec.d_model, gt)
            x, y = tasks.heaviside_data(config.eval_sequences, self.T, spec.d_model, g)
            self._eval = [(x[i:i + self.B], y[i:i + self.B]) for i in range(0, len(x), self.B)]
            self.baseline = 0.25  # MSE of the constant 1/2 against balanced 0/1 targets
            self._probe = x[:8]
        self.n_eval_batches = len(self._eval)

    def _lm_pair(self, w: torch.Tensor, gen: torch.Generator):
        if self.task == "clm":
            return collate.clm_pair(w)
        return collate.mlm_mask(w, self.vocab, gen, prob=self.config.mask_prob,
                                mask_id=self.corpus.mask_id)

    def train_batch(self, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.task in ("mlm", "clm"):
            extra = 1 if self.task == "clm" else 0
            cls = self.corpus.cls_id if self.task == "mlm" else None
            w = collate.lm_windows(self.corpus.train, self.B, self.T, cls_id=cls, gen=gen,
                                   extra=extra)
            x, y = self._lm_pair(w, gen)
        elif self.task == "reverse":
            x, y = tasks.reverse_batch(self.B, self.T, self.config.n_symbols, gen)
        else:
            idx = torch.randint(0, len(self._x), (min(self.B, len(self._x)),), generator=gen)
            x, y = self._x[idx], self._y[idx]
        return x.to(device), y.to(device)

    def eval_batches(self, device):
        for x, y in self._eval:
            yield x.to(device), y.to(device)

    def probe(self, device) -> torch.Tensor:
        """A few unmasked evaluation inputs for measuring observables during training."""
        return self._probe.to(device)
