"""Every command a sweep task can run, at a tiny size, through the same call a worker makes:
the rows are the command's own result with its headline numbers as columns."""

from __future__ import annotations

import pytest

from sigprop.runs.tasks import check, execute, resources
from sigprop.spec import SpecError

TINY = dict(d_model=16, heads=2, seq_len=8, depth=2)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A 2-layer GPT-2 config.json: a model as a sweep names one, by path."""
    from transformers import GPT2Config

    path = tmp_path_factory.mktemp("tiny") / "gpt2"
    GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=256, vocab_size=128
               ).save_pretrained(path)
    return str(path / "config.json")


def _run(command, **config):
    check(command, config)
    frame, seconds = execute(command, config)
    assert seconds > 0 and len(frame) > 0
    return frame


def test_predict_and_measure_carry_the_verdict():
    p = _run("predict", beta=3.0, **TINY)
    assert set(p["verdict"]) == {"entropy_collapse"}  # beta 3 > beta_c(0) = sqrt(2)
    m = _run("measure", beta=0.5, seeds=2, **TINY)
    assert {"theory", "measured"} <= set(m["source"]) and set(m["verdict"]) == {"trainable"}


def test_diagnose_rows_include_heads(tiny_gpt2):
    d = _run("diagnose", model=tiny_gpt2, seq_len=8, seeds=1, sequences=1)
    assert d["head"].notna().any() and d["head"].isna().any()
    assert d["verdict"].nunique() == 1


@pytest.mark.slow  # >10 s; in `make test-slow`
def test_longctx_spec_and_model(tiny_gpt2):
    s = _run("longctx", lengths=[64, 256], queries=8, beta=1.0, **TINY)
    assert sorted(s["seq_len"].unique()) == [64, 256]
    m = _run("longctx", model=tiny_gpt2, lengths=[64, 128], queries=4, train_len=64)
    assert sorted(m["seq_len"].unique()) == [64, 128]
    assert m["layer"].nunique() == 2  # both attention layers
    with pytest.raises(SpecError, match="own"):
        check("longctx", {"model": "gpt2", "beta": 1.0})


def test_train_and_trainability_point():
    t = _run("train", task="reverse", steps=4, batch_size=4, **{**TINY, "seq_len": 10})
    assert "loss" in set(t["observable"]) and t["final_loss"].notna().all()
    p = _run("trainability", beta=0.3, alpha_attn=2.0, steps=3, batch_size=4, depth=2)
    assert {"theory", "outcome", "agree", "gain"} <= set(p.columns)


def test_reproduce_item():
    r = _run("reproduce", item="gg25.fig1d", size="tiny")
    assert r["status"].iloc[0] in ("pass", "differs", "fail")
    assert r["checks"].iloc[0] >= 1


def test_resources_place_cuda_tasks_on_gpus():
    assert resources("measure", {"device": "cuda"}) == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert resources("measure", {}) == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert resources("train", {}, cpus=4, gpus=0.5) == {"num_cpus": 4.0, "num_gpus": 0.5}
