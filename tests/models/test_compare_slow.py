"""Issue acceptance of `sigprop fix --compare` at full size (slow: minutes each).

* bert-deep-48 at T 128: at least 12 methods, the baseline rank-collapses, at least 3
  methods measure trainable; the run takes at most 10 minutes on 2 cores.
* the x10 Q/K BERT-base folder (entropy collapse read from its weights): sigma-reparam,
  qk-norm and softcap each move the measured verdict off entropy_collapse.
* theory against measurement: every method the theory reaches within THEORY_GAP of the
  measured final cosine (mean of 2 seeds) on bert-deep-48 (T 128) and gpt2 (T 256).
"""

from __future__ import annotations

import time

import pytest
import torch

from sigprop import models as hf
from sigprop.analysis.ranking import rank_fixes

pytestmark = pytest.mark.slow

#: theory vs measured final cos, measured as the mean over 2 seeds x 2 sequences of built-in
#: text at d 768 (diagnose's default seeds): one seed's final cosine spreads by ~0.015 about
#: the mean (alpha on bert-deep-48: 0.770, 0.798, 0.797 on seeds 0-2 against the theory's
#: 0.800, so a single seed can use the whole budget), the finite-width theory error ~0.01-0.02
THEORY_GAP = 0.03


@pytest.fixture(scope="module")
def deep48():
    t0 = time.perf_counter()
    c = rank_fixes("bert-deep-48", "all", seq_len=128)
    return c, time.perf_counter() - t0


def test_bert_deep_48_compare_acceptance(deep48):
    c, seconds = deep48
    assert seconds <= 600
    assert len(c.rows) >= 12
    assert c.baseline["verdict"] == "rank_collapse"
    trainable = [r.method for r in c.rows if r.verdict == "trainable"]
    assert len(trainable) >= 3, [(r.method, r.verdict) for r in c.rows]
    assert c.rows[0].verdict == "trainable"


@pytest.mark.parametrize("model, T", [("bert-deep-48", 128), ("gpt2", 256)])
def test_theory_tracks_every_method_it_reaches(model, T):
    c = rank_fixes(model, "all", seq_len=T, seeds=2)
    assert c.seeds == 2
    gaps = {r.method: abs(r.predicted["cos_final"] - r.measured["cos_final"])
            for r in c.rows if r.error is None and r.predicted is not None}
    assert len(gaps) >= 10
    bad = {k: round(v, 3) for k, v in gaps.items() if v > THEORY_GAP}
    assert not bad, bad


def test_x10_qk_bert_leaves_entropy_collapse(tmp_path):
    cfg = hf.load_config("bert-base-uncased")
    m = hf.model_at_init(cfg, seed=0, vocab_size=4096, attn_implementation="sdpa")
    with torch.no_grad():
        for lay in m.encoder.layer:
            lay.attention.self.query.weight.mul_(10.0)
            lay.attention.self.key.weight.mul_(10.0)
    m.config.vocab_size = 4096
    m.save_pretrained(str(tmp_path / "x10"), safe_serialization=True)
    c = rank_fixes(str(tmp_path / "x10"), "sigma-reparam,qk-norm,softcap", seq_len=128)
    assert c.baseline["verdict"] == "entropy_collapse"
    for r in c.rows:
        assert r.verdict != "entropy_collapse", (r.method, r.measured)
