"""Training reproductions at CPU scale (issue 7), all `slow`: the two acceptance checks of
`sigprop train` / `sigprop trainability` and the registered experiments of
sigprop.reproduce.training. Thresholds are the issue's (0.3 nats; at most one disagreement)
or, for the reproductions, the effect the seed reports with a margin well above the seed-to-
seed spread we measured (stated per test)."""

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


def test_noci22_reverse_uniform_attention_stalls():
    # measured (1,500 steps, 2 seeds): beta = 0 stays at 2.10 nats (chance log 10 = 2.30),
    # beta = 1 reaches 4e-4; the seeds differed by < 0.01. beta = 0 is exactly uniform
    # attention with W_Q = W_K = 0, a saddle: the Q/K gradients vanish identically (noci22
    # Thm 3.2 in its extreme form), so the thresholds below have a wide margin.
    from sigprop.reproduce import get

    table = get("noci22.reverse")()["table"].set_index("beta")
    assert table.loc[1.0, "final_eval"] < 0.3
    assert table.loc[0.0, "final_eval"] > 1.5


def test_mindthegap_heaviside_runs_both_variants():
    # measured at T = d = 32, 2 layers, 400 steps, best of lr {1e-3, 3e-3, 1e-2}: softmax
    # train MSE 0.239, centred (A_perp) 0.312 against the constant-1/2 baseline 0.25, i.e.
    # removing the gap did NOT help at this scale (mindthegap trains T = d = 500); this test
    # only checks that both variants train (loss below the value at initialisation).
    from sigprop.reproduce import get

    out = get("mindthegap.heaviside")()
    traj, table = out["trajectory"], out["table"].set_index("run")
    for run in ("softmax", "centred"):
        ev = traj[(traj["run"] == run) & (traj["observable"] == "loss")
                  & (traj["split"] == "train")]
        assert table.loc[run, "final_train"] < ev["value"].iloc[0]
