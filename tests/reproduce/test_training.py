"""Training at CPU scale (issue 7), all `slow`: the two acceptance checks of `sigprop train` /
`sigprop trainability`, gg25.fig1f's acceptance at its default size and gg25.fig4 against the
`sigprop train` command. Thresholds are the issue's (0.3 nats; at most one disagreement). The
reproduced items that train are tested at tiny and quick sizes in test_training_items.py."""

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def _train_json(*args):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sigprop", "train", *args, "--format", "json"],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), time.perf_counter() - t0


def test_acceptance_train_low_beta_beats_entropy_collapse():
    # issue 7 acceptance: beta 0.5 ends >= 0.3 nats below beta 8 (same command otherwise).
    # Measured with the default unigram readout bias: 2.21 vs 4.20 nats, 89-101 s each (with
    # --bias-init zero: 3.52 vs 4.44)
    base = ["--depth", "1", "--heads", "1", "--d-model", "64", "--seq-len", "64",
            "--steps", "2000", "--seed", "0"]
    low, t_low = _train_json(*base, "--beta", "0.5")
    high, t_high = _train_json(*base, "--beta", "8")
    print(f"beta 0.5: eval {low['eval_loss']:.3f} ({t_low:.0f} s); "
          f"beta 8: eval {high['eval_loss']:.3f} ({t_high:.0f} s)")
    assert high["eval_loss"] - low["eval_loss"] >= 0.3


def test_acceptance_trainability_three_regimes():
    # issue 7 acceptance: the default grid (DEEP_SMALL, betas 0.3/1/8 x alphas 0.2/0.5/2: 2
    # trainable, 5 rank_collapse, 2 entropy_collapse points) with the default training
    # (sigprop.training.trainability.TRAINABILITY_CONFIG: 500 steps, batch 64, lr 2e-3, unigram
    # readout
    # bias);
    # criterion: learned = final eval loss >= 0.5 nats below the unigram baseline.
    # Measured (seed 0, deterministic tokenizer): the trainable points gain 0.72 / 0.70 nats,
    # all others <= 0.07, in 13-14 min on one thread. Over 5 earlier runs of alpha 2 (seeds 0,
    # 1; three vocabularies of the library's non-deterministic trainer,
    # see
    # sigprop.training.trainability.TRAINABILITY_CONFIG) the gains of beta 0.3 / 1 / 8 spanned
    # 0.62-0.77 /
    # 0.52-0.76 / 0.01-0.13; the rank-collapse points stay within 0.03 of the baseline.
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sigprop", "trainability", "--format", "json"],
                       capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    print(f"\n{out['criterion']} ({time.perf_counter() - t0:.0f} s)")
    for q in out["points"]:
        print(f"beta {q['beta']:g}, alpha {q['alpha']:g}: {q['theory']:16s} {q['outcome']:8s} "
              f"eval {q['final_eval']:.3f}, baseline {q['baseline']:.3f}, gain {q['gain']:.3f}"
              f"{'' if q['agree'] else '  DISAGREES'}")
    assert "0.5 nats below" in out["criterion"]
    regimes = {q["theory"] for q in out["points"]}
    assert regimes == {"trainable", "rank_collapse", "entropy_collapse"}
    assert out["disagreements"] == sum(not q["agree"] for q in out["points"])
    assert len(out["points"]) == 9 and out["disagreements"] <= 1


def test_fig1f_acceptance_at_default_size():
    # the acceptance for gg25.fig1f at its default size (the quick size is held to
    # the same in tests/reproduce/test_training_items.py): the trainable run gains >= 0.3
    # nats, the rank- and entropy-collapse runs <= 0.05. Measured (seed 0, 400 steps, depths
    # 24 and 12): see docs/reproduce/training.md
    from sigprop.reproduce import core

    exp = core.run("gg25.fig1f")
    g = exp.table.set_index("theory")["gain"]
    print(exp.table[["run", "theory", "final_eval", "gain", "seconds"]].to_string())
    assert g["trainable"] >= 0.3
    assert g["rank_collapse"] <= 0.05 and g["entropy_collapse"] <= 0.05
    assert exp.status == "pass"


def test_fig4_item_agrees_with_the_train_command():
    # gg25.fig4 trains its betas side by side; `sigprop train --beta B` trains one spec: the
    # same model, data, batches and optimiser, so the same loss (float32 summation order
    # aside). Small size: 200 steps, d = T = 32.
    from sigprop.reproduce import core

    exp = core.run("gg25.fig4", steps=200, d_model=32, seq_len=32, betas=(0.5, 8.0))
    base = ["--depth", "1", "--heads", "1", "--d-model", "32", "--seq-len", "32",
            "--steps", "200", "--seed", "0"]
    for beta in (0.5, 8.0):
        out, _ = _train_json(*base, "--beta", str(beta))
        row = exp.table[exp.table["beta"] == beta].iloc[0]
        assert abs(row.final_eval - out["eval_loss"]) < 0.01, (beta, row.final_eval,
                                                              out["eval_loss"])
        assert abs(row.baseline - out["baseline"]) < 1e-6
