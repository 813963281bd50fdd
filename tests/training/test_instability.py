"""The provoked instability experiment (sigprop.training.instability, ``sigprop instability``;
docs/instability.md): structure of the result, QK-Clip's bound, the spike rule, the CLI's
one-line errors. Fast: a tiny model, one seed, a few steps."""

from __future__ import annotations

import json
import math

import pytest

from sigprop.spec import SpecError
from sigprop.training.instability import (
    FIXES,
    InstabilityConfig,
    build_model,
    run_instability,
    spike_step,
)

TINY = InstabilityConfig(arch="llama", steps=16, lr=1e-2, warmup=0, d_model=32, layers=1, heads=2,
                         seq_len=16, batch=4, documents=300, vocab=500, tau=1.0,
                         spike_after=2, window=5, rows=4)


@pytest.fixture(scope="module")
def tiny():
    return run_instability(1, config=TINY)


def test_structure(tiny):
    assert tiny.fixes == FIXES and tiny.seeds == (0,)
    assert len(tiny.steps) == len(FIXES) * TINY.steps
    assert {"fix", "seed", "step", "lr", "loss", "max_logit", "min_entropy"} <= \
        set(tiny.steps.columns)
    assert list(tiny.runs["fix"]) == list(FIXES)
    assert list(tiny.summary["fix"]) == list(FIXES)
    for col in ("spiked", "spike_step", "warning_step", "lead", "max_logit", "qk_clips",
                "clip_median_ratio", "clip_within"):
        assert col in tiny.runs.columns
    clip = tiny.runs.set_index("fix").loc["qk-clip"]
    assert 0 < clip["clip_within"] <= 1 and clip["clip_median_ratio"] > 0
    assert all(math.isfinite(v) for v in tiny.steps["loss"])
    d = tiny.to_dict(steps=True)
    json.dumps(d, allow_nan=False)  # JSON-clean
    assert d["rule"].startswith("spike:") and len(d["steps"]) == len(tiny.steps)
    # what the registry applied is recorded; sigma-reparam's training-time part is said
    applied = dict(zip(tiny.runs["fix"], tiny.runs["applied"], strict=True))
    assert "normalised" in applied["qk-norm"] and "gamma W / sigma(W)" in applied[
        "sigma-reparam"] and applied["none"] == ""


def test_qk_clip_bound(tiny):
    """QK-Clip keeps every step's largest logit within one step's growth of tau (the
    module's stated bound, tau x 1.5), where the unclipped run (same seed, same batches)
    goes past it."""
    clip = tiny.steps[tiny.steps["fix"] == "qk-clip"]["max_logit"]
    none = tiny.steps[tiny.steps["fix"] == "none"]["max_logit"]
    run = tiny.runs.set_index("fix").loc["qk-clip"]
    assert run["qk_clips"] > 0
    assert clip.max() <= TINY.tau * (1 + TINY.clip_slack)
    assert bool(run["clip_held"])
    assert none.max() > TINY.tau * (1 + TINY.clip_slack)
    # before the first clip the two arms are the same run
    first = int(tiny.events.query("fix == 'qk-clip' and kind == 'qk_clip'")["step"].min())
    assert list(clip[:first + 1]) == list(none[:first + 1])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sigma_reparam_training_time(arch):
    """sigma-reparam: W_Q and W_K (GPT-2: their blocks of the fused c_attn) have spectral
    norm 1 through the reparametrisation, W_V is untouched, and the gain is trained."""
    import torch

    cfg = InstabilityConfig(arch=arch, d_model=32, heads=2, layers=1)
    m, lines = build_model(cfg, 100, "sigma-reparam")
    ref, _ = build_model(cfg, 100, "none")
    assert "gamma W / sigma(W)" in lines[-1]
    gains = [n for n, _ in m.named_parameters() if n.endswith(".gain")]
    assert len(gains) == 2  # W_Q and W_K of the one block
    d = cfg.d_model
    with torch.no_grad():
        if arch == "gpt2":
            w, w0 = m.transformer.h[0].attn.c_attn.weight, ref.transformer.h[0].attn.c_attn.weight
            qk = [w[:, :d], w[:, d:2 * d]]
            assert torch.equal(w[:, 2 * d:], w0[:, 2 * d:])
        else:
            a = m.model.layers[0].self_attn
            qk = [a.q_proj.weight, a.k_proj.weight]
        for b in qk:
            assert abs(float(torch.linalg.matrix_norm(b, 2)) - 1) < 0.02


def test_spike_rule():
    assert spike_step([5, 4, 3, 3.1, 3.2, 4.0, 3], factor=1.3, after=2, window=1) == 5
    assert spike_step([5, 4, 3, 3.1, 3.2, 3.8, 3], factor=1.3, after=2, window=1) is None
    assert spike_step([5, 9, 3], factor=1.3, after=2, window=1) is None  # before ``after``
    assert spike_step([5, 4, math.nan], factor=1.3, after=0, window=1) == 2
    # windowed: 3-step means 4, 3.33, 3, 3, 3.33, 3.67, ... (ending at steps 2, 3, ...); the
    # first above 1.1 x 3 ends at step 6; one noisy step alone is averaged away
    assert spike_step([5, 4, 3, 3, 3, 3, 4, 4, 4, 4], factor=1.1, after=2, window=3) == 6
    assert spike_step([5, 4, 3, 3, 3, 3, 3.5, 3, 3, 3], factor=1.1, after=2, window=3) is None
    assert spike_step([5, 4, 3, 3, 3, 3, 3.5, 3, 3, 3], factor=1.1, after=2, window=1) == 6
    assert spike_step([5, 4, math.inf, 3], factor=1.1, after=0, window=3) == 2


@pytest.mark.slow  # ~12 s: two spawned processes import torch and transformers; make test-slow
def test_workers_give_the_same_runs():
    """Two worker processes (spawned, one thread each) train exactly the runs one process
    does: each run's init, batches and row sampling depend on its seed only."""
    cfg = InstabilityConfig(arch="gpt2", steps=4, lr=1e-2, warmup=0, d_model=32, layers=1,
                            heads=2, seq_len=16, batch=4, documents=300, vocab=500, tau=1.0,
                            spike_after=2, window=5, rows=4)
    one = run_instability(1, fixes=("none", "qk-clip"), config=cfg)
    two = run_instability(1, fixes=("none", "qk-clip"), config=cfg, workers=2)
    assert one.steps["loss"].tolist() == two.steps["loss"].tolist()
    assert one.steps["max_logit"].tolist() == two.steps["max_logit"].tolist()
    with pytest.raises(SpecError, match="workers"):
        run_instability(1, config=cfg, workers=0)


def test_warmup_ramps_then_holds_the_peak():
    """``warmup=2`` over 4 steps: lr/2, lr, lr, lr (the ramp, then constant); the default
    (None) ramps over the whole run: lr/4, lr/2, 3lr/4, lr."""
    from dataclasses import replace

    cfg = replace(TINY, steps=4, warmup=2, lr=0.01)
    got = run_instability(1, fixes=("none",), config=cfg).steps["lr"].tolist()
    assert got == pytest.approx([0.005, 0.01, 0.01, 0.01], rel=1e-12)
    got = run_instability(1, fixes=("none",), config=replace(cfg, warmup=None)).steps["lr"]
    assert got.tolist() == pytest.approx([0.0025, 0.005, 0.0075, 0.01], rel=1e-12)


def test_muon_arm_trains_and_refuses_an_unknown_optimizer():
    """``optimizer="muon"``: the runs train (finite losses that fall from the first step's
    log(vocab)-sized value on this easy corpus) with every arm; an unknown name is refused."""
    from dataclasses import replace

    cfg = replace(TINY, optimizer="muon", lr=0.02, steps=8)
    res = run_instability(1, fixes=("none", "qk-clip", "sigma-reparam"), config=cfg)
    for fix, g in res.steps.groupby("fix"):
        loss = g["loss"].to_numpy()
        assert all(math.isfinite(x) for x in loss), fix
        assert loss[-1] < loss[0], (fix, loss)
    with pytest.raises(SpecError, match="optimizer"):
        replace(TINY, optimizer="sgd").check()


def test_bad_config():
    with pytest.raises(SpecError):
        run_instability(1, fixes=("none", "bogus"), config=TINY)
    with pytest.raises(SpecError):
        run_instability(0, config=TINY)
    with pytest.raises(SpecError):
        run_instability(1, lr=-1.0, config=TINY)


def test_cli_json(capsys):
    from sigprop.cli import run

    assert run(["instability", "--seeds", "1", "--steps", "3", "--fixes", "none,qk-clip",
                "--workers", "1", "--warmup", "1", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["fix"] for r in d["summary"]] == ["none", "qk-clip"]
    assert len(d["runs"]) == 2 and d["config"]["steps"] == 3
    assert d["config"]["warmup"] == 1


@pytest.mark.parametrize("args", [
    ["--seeds", "0"], ["--steps", "0"], ["--lr", "-1"], ["--lr", "nan"],
    ["--fixes", "none,bogus"], ["--fixes", "none,none"], ["--fixes", ""],
    ["--qk-clip", "0"], ["--plot", "/nonexistent-dir/f.png"], ["--format", "csv"],
    ["--workers", "0"], ["--logit-limit", "-1"], ["--warmup", "-1"],
    ["--seed", "-1"], ["--clip-on", "later"], ["--optimizer", "sgd"],
])
def test_cli_bad_options(args, capsys):
    from sigprop.cli import run

    assert run(["instability", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sigprop: error:") and "\n" not in err


def test_figure_names_the_optimizer_and_the_clip_rule(tmp_path):
    """The figure (``--plot``): three panels, written to the path, its title naming the
    optimizer and, with a qk-clip arm, the clip rule."""
    from dataclasses import replace

    from sigprop.plotting.instability import plot_instability

    cfg = replace(TINY, optimizer="muon", steps=4, clip_on="bound")
    res = run_instability(1, fixes=("none", "qk-clip"), config=cfg)
    fig = plot_instability(res, str(tmp_path / "f.png"))
    title = fig._suptitle.get_text()
    assert "Muon to lr 0.01" in title and "QK-Clip on bound" in title, title
    assert (tmp_path / "f.png").stat().st_size > 0 and len(fig.axes) == 3
    res = run_instability(1, fixes=("none",), config=replace(TINY, steps=4))
    title = plot_instability(res)._suptitle.get_text()
    assert "AdamW to lr" in title and "QK-Clip" not in title, title
