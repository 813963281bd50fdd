"""CLI contract of `sigprop train` and `sigprop trainability` (docs/cli.md): JSON rows, exit codes,
one-line errors, files written. Tiny models; every call is a subprocess (~5 s each)."""

import json
import os
import subprocess
import sys

import pytest

from .clirun import sigprop

TINY = ["--depth", "1", "--heads", "1", "--d-model", "16", "--seq-len", "16", "--beta", "0.5",
        "--documents", "200", "--vocab-size", "300"]


def run(*args, env=None, timeout=300):
    if env:  # variables read when a library is imported (HF_HUB_OFFLINE): a fresh process
        return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **env})
    return sigprop(*args, timeout=timeout)


def test_train_json_rows_plot_and_checkpoint(tmp_path):
    png, ck = tmp_path / "loss.png", tmp_path / "ck"
    p = run("train", *TINY, "--steps", "6", "--eval-every", "3", "--measure-every", "3",
            "--plot", str(png), "--checkpoint", str(ck), "--format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"spec", "config", "rows", "final_loss", "eval_loss", "baseline", "seconds"} <= set(out)
    assert out["config"]["bias_init"] == "unigram"  # the CLI's default readout bias
    loss = [r for r in out["rows"] if r["observable"] == "loss"]
    assert all(r["source"] == "measured" and r["layer"] == 1 for r in loss)
    assert [r["step"] for r in loss if r["split"] == "eval"] == [0, 3, 6]
    assert {r["split"] for r in loss} == {"train", "eval"}
    cos = [r for r in out["rows"] if r["observable"] == "cos"]
    assert {r["step"] for r in cos} == {0, 3, 6} and {r["layer"] for r in cos} == {0, 1}
    assert any(r["observable"] == "entropy" for r in out["rows"])
    assert png.stat().st_size > 5000
    assert (ck / "model.safetensors").exists() and (ck / "spec.json").exists()


def test_train_table_mode():
    p = run("train", *TINY, "--steps", "2")
    assert p.returncode == 0, p.stderr
    assert "eval loss" in p.stdout and "baseline" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--steps", "0"], "--steps"),
    (["--task", "translate"], "--task"),
    (["--lr", "-1"], "--lr"),
    (["--batch-size", "0"], "--batch-size"),
    (["--data", "/no/such/folder"], "--data"),
    (["--task", "clm"], "--task"),  # a bidirectional spec cannot do next-token prediction
    (["--device", "tpu"], "--device"),
    (["--bias-init", "ones"], "--bias-init"),
])
def test_train_bad_values_exit_2(args, needle):
    p = run("train", *TINY, "--steps", "1", *args)
    assert p.returncode == 2
    line = p.stderr.strip()
    assert "\n" not in line and needle in line and "Traceback" not in p.stderr


def test_tinystories_without_hub_is_one_clear_line():
    p = run("train", *TINY, "--steps", "1", "--data", "tinystories",
            env={"HF_HUB_OFFLINE": "1"})
    assert p.returncode == 2
    line = p.stderr.strip()
    assert "\n" not in line and line.startswith("sigprop: error: --data: tinystories")


def test_trainability_json_and_table(tmp_path):
    args = ["--depth", "2", "--d-model", "16", "--heads", "2", "--seq-len", "16",
            "--sigma-v2", "0.2", "--sigma-w2", "0.2", "--betas", "0.3,8", "--alphas", "2",
            "--steps", "3", "--seeds", "1", "--batch-size", "4"]
    p = run("trainability", *args, "--format", "json", "--plot", str(tmp_path / "t.png"))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "criterion" in out and "nats below" in out["criterion"]
    assert out["config"]["bias_init"] == "unigram" and out["config"]["lr"] == 2e-3
    pts = {(q["beta"], q["alpha"]): q for q in out["points"]}
    assert set(pts) == {(0.3, 2.0), (8.0, 2.0)}
    assert pts[(8.0, 2.0)]["theory"] == "entropy_collapse"
    assert {q["outcome"] for q in pts.values()} <= {"learned", "stuck"}
    assert out["disagreements"] == sum(not q["agree"] for q in pts.values())
    assert (tmp_path / "t.png").stat().st_size > 5000
    bad = run("trainability", *args[:-6], "--betas", "a,b")
    assert bad.returncode == 2 and "--betas" in bad.stderr


def test_data_path_too_long_for_the_file_system_is_one_line(capsys):
    """Slow-fuzz finding: a 300-character --data name raised OSError (ENAMETOOLONG)."""
    from sigprop.cli import run

    rc = run(["train", "--depth", "1", "--d-model", "8", "--heads", "1", "--seq-len", "8",
              "--steps", "1", "--data", "a" * 300])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("sigprop: error: --data:")


class _Stop(Exception):
    pass


def _train_config_of(args, monkeypatch, capsys, have):
    """Run ``sigprop train ARGS`` in this process on a machine with ``have`` bytes available,
    up to the training call (neither the corpus nor the model is built): (config, stderr)."""
    from sigprop.cli import cmd_train, run
    from sigprop.measurement import memory
    from sigprop.training import loop

    seen = {}

    def fake_train(spec, cfg, **kw):
        seen["spec"], seen["cfg"] = spec, cfg
        raise _Stop

    monkeypatch.setattr(memory, "available", lambda: have)
    monkeypatch.setattr(cmd_train, "_corpus_or_fail", lambda *a: None)
    monkeypatch.setattr(loop, "train", fake_train)
    try:
        rc = run(["train", *args])
    except _Stop:
        rc = None
    return rc, seen, capsys.readouterr().err


def test_train_defaults_fit_a_24_gb_machine(monkeypatch, capsys):
    """Issue 34: ``sigprop train``'s default batch (64: ~35 GB for the default 12-layer
    d=768, T=512 model) shrinks to what fits ~20 GB available, with one note on stderr."""
    from sigprop.spec import ArchSpec
    from sigprop.training.loop import check_memory

    rc, seen, err = _train_config_of([], monkeypatch, capsys, have=20e9)
    assert rc is None and seen["spec"] == ArchSpec(), err
    cfg = seen["cfg"]
    assert cfg.batch_size == 16, cfg  # 32 needs ~18.5 GB above the baseline, 16 ~10.4 GB
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sigprop: note: --batch-size 16 "), err
    assert "default 64" in lines[0] and "set --batch-size" in lines[0]
    check_memory(ArchSpec(), cfg)  # (memory.available is still the 20 GB machine)


def test_train_batch_size_given_or_fitting_is_kept(monkeypatch, capsys):
    rc, seen, err = _train_config_of(["--batch-size", "64"], monkeypatch, capsys, have=20e9)
    lines = err.strip().splitlines()
    assert rc == 2 and not seen and len(lines) == 1, err  # an explicit value is refused
    assert lines[0].startswith("sigprop: error: --") and "fits" in lines[0]
    rc, seen, err = _train_config_of([], monkeypatch, capsys, have=64e9)
    assert rc is None and seen["cfg"].batch_size == 64 and err == ""


def test_train_attention_health_and_qk_clip():
    """``--telemetry-every`` adds the training batch's largest logit and entropy (split
    train) at the read steps and a ``health`` list to the JSON; ``--qk-clip`` reads every
    step; bad values exit 2 naming the option before any work."""
    p = run("train", *TINY, "--causal", "--task", "clm", "--steps", "4",
            "--telemetry-every", "2", "--qk-clip", "0.01", "--format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    ml = [r for r in out["rows"] if r["observable"] == "max_logit"]
    assert {r["step"] for r in ml} == {1, 2, 3, 4} and {r["split"] for r in ml} == {"train"}
    assert any(e["kind"] == "qk_clip" and e["slice"] == 0 for e in out["health"])
    assert "QK-Clip rescaled" in p.stderr
    for opt, bad in (("--qk-clip", "-1"), ("--telemetry-every", "-3"),
                     ("--qk-clip-alpha", "2")):
        p = run("train", *TINY, "--steps", "2", opt, bad)
        assert p.returncode == 2 and opt in p.stderr and "Traceback" not in p.stderr, p.stderr
