"""Issue 15 acceptance at realistic size (slow: minutes each, run with `make test-slow`):
per-layer |theory - measured| cos <= 0.03 at init for bert-base-uncased (T = 512), gpt2,
llama-3.2-1b, qwen2-0.5b and the Mistral-like preset (T = 256), theory from the weights
(docs/theory.md §2.8) and, for the causal ones, the position-resolved theory (§2.9).

Draws: 8 initialisations x 2 sequences of the built-in text. The measured layer cosine
scatters by ~0.03 from seed to seed on LLaMA-style decoders (stderr of the 8-seed mean
~0.008), which is why fewer seeds are not enough to test 0.03 (4 seeds gave 0.035 on one
llama layer). Measured when written: bert 0.019, gpt2 0.008, llama 0.018, qwen2 0.015,
mistral-like 0.013 (worst layers)."""

import warnings

import pytest

from sigprop.analysis.diagnose import diagnose

RUNS = [("bert-base-uncased", 512), ("gpt2", 256), ("llama-3.2-1b", 256),
        ("qwen2-0.5b", 256), ("mistral-like-1b", 256)]


@pytest.mark.slow
@pytest.mark.parametrize("preset,T", RUNS)
def test_preset_theory_within_003(preset, T):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = diagnose(preset, seq_len=T, seeds=8, sequences=2)
    tr = d.trajectory[d.trajectory.observable == "cos"]
    w = tr.pivot_table(index="layer", columns="source", values="value")
    gap = (w["theory"] - w["measured"]).abs()
    assert d.spec.layers is not None  # from the weights
    assert gap.max() <= 0.03, (preset, int(gap.idxmax()), w)
