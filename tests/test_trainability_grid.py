"""The trainability grid as slices of one batched model (per-slice alpha_attn, issue 19 item 4)
gives the per-alpha path's outcomes; single-beta models get their beta; the quick benchmark
runs. Tiny models only (the whole file takes a few seconds)."""

import math

import numpy as np
import pytest
import torch

from sigprop.data.corpus import load_corpus
from sigprop.spec import ArchSpec
from sigprop.training.config import TrainConfig
from sigprop.training.task import TaskModel
from sigprop.training.trainability import trainability

SPEC = ArchSpec(depth=3, d_model=16, heads=2, seq_len=16, sigma_v2=0.2, sigma_w2=0.2)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("builtin", n_documents=200, vocab_size=300)


def test_batched_grid_equals_per_alpha_path(corpus):
    # 2 seeds x 2 betas x 3 alphas, 20 steps at lr 3e-3 with clipping at 0.05 (every step
    # clips, so a shared norm or optimiser state would show). Each slice is an independent
    # run in both paths; only float32 rounding may differ, where a batched matmul or
    # reduction groups the slices differently (none does on this machine: the frames are
    # equal bit for bit), hence rtol 1e-5 on the losses, ~100x one step's rounding.
    cfg = TrainConfig(steps=20, batch_size=8, eval_sequences=16, measure_every=0, seeds=2,
                      lr=3e-3, max_grad_norm=0.05, bias_init="unigram")
    betas, alphas = [0.3, 8.0], [0.2, 0.5, 2.0]
    t0, r0 = trainability(SPEC, betas, alphas, cfg, corpus=corpus, batched=False)
    for workers in (1, 4):  # one model; 4 shards that cut through the alphas
        t1, r1 = trainability(SPEC, betas, alphas, cfg, corpus=corpus, workers=workers)
        assert list(r1.columns) == list(r0.columns) and len(r1) == len(r0)
        assert r1.drop(columns=["value", "stderr"]).equals(r0.drop(columns=["value",
                                                                           "stderr"]))
        np.testing.assert_allclose(r1["value"], r0["value"], rtol=1e-5)
        np.testing.assert_allclose(t1["final_eval"], t0["final_eval"], rtol=1e-5)
        assert t1.drop(columns=["final_eval", "final_eval_stderr", "gain"]).equals(
            t0.drop(columns=["final_eval", "final_eval_stderr", "gain"]))
    assert set(r0["spec.alpha_attn"]) == set(alphas)
    assert (r0["spec.alpha_attn"] == r0["alpha"]).all()


def test_grid_progress_counts_the_whole_grid(corpus):
    cfg = TrainConfig(steps=3, batch_size=4, eval_sequences=8, measure_every=0)
    seen = []
    trainability(SPEC, [1.0], [0.5, 2.0], cfg, corpus=corpus, workers=2,
                 on_step=lambda d, t: seen.append((d, t)))
    assert seen == [(2, 6), (4, 6), (6, 6)]


def test_per_slice_alphas_share_draws():
    cfg = TrainConfig(seeds=2)
    m = TaskModel(SPEC, cfg, vocab=30, betas=[0.5, 8.0, 0.5], alphas=[0.2, 0.2, 2.0])
    ref = TaskModel(SPEC, cfg, vocab=30, betas=[0.5, 8.0])
    assert m.slice_alpha.tolist() == pytest.approx([0.2] * 4 + [2.0] * 2)
    for name, p in ref.named_parameters():  # the alpha-2 group repeats the first group
        q = dict(m.named_parameters())[name]
        assert torch.equal(q[:4], p) and torch.equal(q[4:], p[:2]), name
    assert "slice_alpha" not in m.state_dict()  # checkpoints keep their format
    with pytest.raises(ValueError, match="pair up"):
        TaskModel(SPEC, cfg, vocab=30, betas=[0.5, 8.0], alphas=[1.0])


def test_one_beta_scales_qk():
    # a one-beta list used to build the model at beta 1 (the rescaling ran only for two or
    # more betas): REM init, docs/theory.md §2.1: std = sqrt(beta sqrt(log T) / d)
    w = TaskModel(SPEC, TrainConfig(seeds=4), vocab=30, betas=[8.0]).body.blocks[0].attn.w_q
    want = math.sqrt(8.0 * math.sqrt(math.log(16)) / 16)
    assert float(w.detach().std()) == pytest.approx(want, rel=0.1)  # 1024 draws: ~2% error
    two = TaskModel(SPEC, TrainConfig(seeds=4), vocab=30, betas=[8.0, 1.0])
    assert torch.equal(two.body.blocks[0].attn.w_q[:4], w)


def test_quick_benchmark_runs():
    from sigprop.bench.training import training

    figs = training(size="quick")
    assert [f.name for f in figs] == ["training/grid-step", "training/grid-step-2-workers",
                                      "training/train-step"]
    assert all(f.sigprop_s > 0 and f.reference_s > 0 for f in figs)
