"""`sigprop fix --compare / --method / --list` and the entropy floors from the weights:
the CLI contract (exit codes, JSON shape), the comparison's ranking rule, and the bounds
against brute force and against the measured entropy of every head."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sigprop.measurement.bounds import entropy_floor
from sigprop.models.presets import PRESETS, shrink
from sigprop.spec import SpecError

from ..clirun import sigprop


def run(*args, timeout=900):
    return sigprop(*args, timeout=timeout)


def _folder(tmp_path, name, family="bert-base-uncased", std=0.02, **sizes):
    cfg = shrink(PRESETS[family], **{**dict(layers=3, hidden=64, heads=4, intermediate=128,
                                            vocab=200), **sizes})
    cfg["initializer_range"] = std
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


# ---- the floor -------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 5, 64])
@pytest.mark.parametrize("s", [0.1, 1.0, 4.0])
def test_entropy_floor_is_the_minimum_over_logits_of_that_norm(n, s):
    """Random logit vectors of centred norm s never go below the floor, and the one-spike
    vector reaches it (to 1e-12): an independent check of the closed form."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((20000, n))
    z -= z.mean(1, keepdims=True)
    z *= s / np.linalg.norm(z, axis=1, keepdims=True)

    def ent(v):
        p = np.exp(v - v.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return -(p * np.log(np.where(p > 0, p, 1))).sum(-1)

    floor = float(entropy_floor(n, s))
    assert ent(z).min() >= floor - 1e-12
    spike = np.full(n, -s / math.sqrt(n * (n - 1)))
    spike[0] = s * math.sqrt((n - 1) / n)
    assert abs(float(ent(spike)) - floor) < 1e-12
    assert floor <= math.log(n) + 1e-15
    assert float(entropy_floor(n, 0.0)) == pytest.approx(math.log(n), rel=1e-15)
    assert float(entropy_floor(n, 1e9)) == 0.0


@pytest.mark.parametrize("shape", [(2, 96, 40), (2, 30, 80)])
@pytest.mark.parametrize("shared", [0.0, 3.0, 300.0])
def test_input_norms_for_the_floor_are_exact_upper_sides(shape, shared):
    """``_tops``' three inputs to the floors (top eigenvalue of [x, 1][x, 1]^T, of the centred
    X_c X_c^T, and the row norms) against float64 eigvalsh, over tokens and over channels and
    up to a shared direction 300x the rest (cos ~ 1 - 1e-5, where centring after a float32
    Gram would lose the centred part): never below the exact value, at most 2e-4 above (the
    row norms: 2e-6)."""
    import torch

    from sigprop.measurement.bounds import _tops

    g = torch.Generator().manual_seed(2)
    B, T, d = shape
    x = (torch.randn(B, T, d, generator=g, dtype=torch.float64)
         + shared * torch.randn(B, 1, d, generator=g, dtype=torch.float64)).float()
    x64 = x.double()
    xa = torch.cat([x64, torch.ones(B, T, 1, dtype=torch.float64)], -1)
    xc = x64 - x64.mean(1, keepdim=True)
    want = [torch.linalg.eigvalsh(xa @ xa.mT)[:, -1], torch.linalg.eigvalsh(xc @ xc.mT)[:, -1]]
    got = _tops(x)
    for w, gt in zip(want, got[:2], strict=True):
        r = gt / w.numpy()
        assert (r >= 1.0).all() and (r <= 1.0 + 2e-4).all(), r
    r = got[2] / xa.norm(dim=-1).numpy()
    assert (r >= 1.0).all() and (r <= 1.0 + 2e-6).all(), r


@pytest.mark.parametrize("family", ["bert-base-uncased", "roberta-base", "gpt2"])
@pytest.mark.parametrize("std", [pytest.param(0.02, marks=pytest.mark.slow), 0.002, 0.5])
def test_entropy_bounds_never_exceed_the_measured_entropy(family, std):
    """On every head of the families whose logits are X W X^T (absolute positions: BERT,
    RoBERTa, GPT-2; rotary families get no bound), both floors are at or below the measured
    normalised entropy. At init std 0.002 the floors are informative (some head above 0.3),
    so the check is not vacuous."""
    from sigprop.analysis.diagnose import diagnose

    cfg = shrink(PRESETS[family], layers=3, hidden=64, heads=4, intermediate=128, vocab=200)
    cfg["initializer_range"] = std
    d = diagnose(cfg, seq_len=32, seeds=2, sequences=2)
    h = d.heads
    ent = h[h.observable == "entropy"].groupby(["layer", "head"])["value"].mean()
    for name in ("entropy_bound", "entropy_bound_centred"):
        b = h[h.observable == name].set_index(["layer", "head"])["value"]
        assert len(b) == 3 * 4
        assert (b.to_numpy() <= ent.loc[b.index].to_numpy() + 1e-9).all(), name
    if std == 0.002:
        assert h[h.observable == "entropy_bound_centred"]["value"].max() > 0.3


def test_rotary_families_get_no_bound():
    from sigprop.analysis.diagnose import diagnose

    cfg = shrink(PRESETS["llama-3.2-1b"], layers=2, hidden=64, heads=4, kv_heads=2,
                 intermediate=128, vocab=200)
    d = diagnose(cfg, seq_len=16, seeds=1, sequences=1)
    assert "entropy_bound" not in set(d.heads.observable)


# ---- the command line ------------------------------------------------------------------------
def test_list_names_every_method_as_json():
    r = run("fix", "--list", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["methods"]
    names = [x["method"] for x in rows]
    assert len(names) >= 12 and "sigma-reparam" in names and "deepnorm" in names
    assert all(x["theory"] and x["cite"] for x in rows)


@pytest.mark.parametrize("args, needle", [
    (("--method", "nope", "--out", "OUT"), "method: unknown method 'nope'"),
    (("--method", "softcap", "--param", "softcap.cap=-1", "--out", "OUT"),
     "softcap.cap: must be a number in"),
    (("--method", "softcap"), "--out: required"),
    (("--compare", "all", "--out", "OUT"), "--compare: measures every fix"),
    (("--compare", "all", "--method", "softcap"), "--compare: measures every fix"),
    (("--method", "softcap", "--train-steps", "5", "--out", "OUT"),
     "--train-steps: only with --compare"),
    (("--compare", "all", "--train-steps", "-1"), "--train-steps: must be an integer"),
    (("--compare", "softcap,nope"), "method: unknown method 'nope'"),
    ((), "fix: give at least one of --method"),
])
def test_fix_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    """In-process (``cli.run``, no interpreter start per case); one case runs as a real
    subprocess below."""
    d = _folder(tmp_path, "m")
    args = tuple(str(tmp_path / "o") if a == "OUT" else a for a in args)
    r = sigprop("fix", str(d), *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_fix_bad_method_exits_2_from_the_shell(tmp_path):
    r = run("fix", str(_folder(tmp_path, "m")), "--method", "nope", "--out",
            str(tmp_path / "o"))
    assert r.returncode == 2 and "method: unknown method 'nope'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_fix_method_writes_a_folder_that_reloads(tmp_path):
    d = _folder(tmp_path, "m", family="gpt2")
    out = tmp_path / "fixed"
    r = run("fix", str(d), "--method", "qk-norm,depth-mup", "--param", "scope=proj",
            "--out", str(out), "--format", "json", "--seeds", "1", "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [m["name"] for m in res["fix"]["methods"]] == ["qk-norm", "depth-mup"]
    assert res["fix"]["methods"][0]["params"]["scope"] == "proj"
    saved = json.loads((out / "config.json").read_text())["sigprop_fix"]
    assert saved["applied"] == ["qk-norm", "depth-mup"]
    from sigprop import models

    back = models.from_pretrained(out)
    assert [n for n, _ in back.named_parameters() if n.endswith("sigprop_q_norm")]
    # the after-diagnosis's theory knows the q/k norm: unit score std in every layer
    sig = [float(np.sqrt(np.mean(np.square(x["sigma_s"]))))
           for x in res["after"]["spec"]["layers"]]
    assert np.allclose(sig, 1.0, atol=1e-6)


@pytest.mark.slow  # ~17 s; the ranking's other tests in this file run by default
def test_compare_json_shape_and_ranking(tmp_path):
    """A 12-layer post-LN BERT at d 64, init std 0.02: the baseline rank-collapses; every
    registered method has a row with predicted / measured numbers (or an error), trainable
    rows come first and the recommendation is the first row."""
    d = _folder(tmp_path, "deep", layers=12, std=0.02)
    r = run("fix", str(d), "--compare", "all", "--seq-len", "32", "--format", "json",
            "--no-timing")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res) >= {"baseline", "methods", "recommendation", "meta"}
    assert res["baseline"]["measured"]["cos_final"] > 0.0
    rows = res["methods"]
    from sigprop.models import methods as M

    assert {x["method"] for x in rows} == set(M.names())
    for x in rows:
        assert {"method", "params", "predicted", "measured", "verdict", "train_gain"} <= set(x)
        if x["error"] is None:
            assert {"cos_final", "entropy_min", "entropy_median", "ipr_max", "kept"} <= set(
                x["measured"])
            assert -1.0 <= x["measured"]["kept"] <= 1.0
            if M.get(x["method"]).theory != "measured only":
                assert x["predicted"]["cos_final"] is not None, x["method"]
    verdicts = [x["verdict"] for x in rows if x["error"] is None]
    first_bad = next((i for i, v in enumerate(verdicts) if v != "trainable"), len(verdicts))
    assert all(v != "trainable" for v in verdicts[first_bad:])
    assert res["recommendation"]["method"] == rows[0]["method"]
    assert "--method " + rows[0]["method"] in res["recommendation"]["command"]
    # stdout is the JSON alone; a pipe's stderr gets one progress line per stage
    progress = [x for x in r.stderr.splitlines() if x.startswith("comparing fixes: ")]
    assert progress[0] == "comparing fixes: baseline"
    assert {x.removeprefix("comparing fixes: ") for x in progress[1:]} == set(M.names())


@pytest.mark.slow
def test_compare_plot_and_table(tmp_path):
    d = _folder(tmp_path, "m")
    png = tmp_path / "c.png"
    r = run("fix", str(d), "--compare", "softcap,deepnorm,rezero", "--seq-len", "16",
            "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert png.stat().st_size > 1000
    assert "recommended" in r.stdout and "deepnorm" in r.stdout


def test_training_shape_keeps_depth_and_variances():
    """The scaled-down training model (--train-steps) has the model's depth and its sigma^2 d
    (beta, value and MLP variances) at width 64: the collapse it trains through is the full
    model's (a 2-block copy once trained every fix alike)."""
    from sigprop import models as hf
    from sigprop.analysis.compare_train import WIDTH, _small_config

    full = hf.load_config("bert-deep-48")
    small = _small_config(full, 500, 64)
    a, b = hf.spec_from_config(full, 64), hf.spec_from_config(small, 64)
    assert b.depth == a.depth == 48 and b.d_model == WIDTH
    assert b.beta_eff == pytest.approx(a.beta_eff, rel=1e-9)
    assert b.var_v == pytest.approx(a.var_v, rel=1e-9)
    assert b.var_w_in == pytest.approx(a.var_w_in, rel=1e-9)


def test_head_norms_are_the_spectral_norms_of_the_logit_maps():
    """Per head ||W_Q^h W_K^h^T||_2 with the biases folded in (and without the key bias)
    against ``torch.linalg.matrix_norm(ord=2)`` of the (d + 1) x (d + 1) logit map built
    explicitly, on a GPT-2 block (fused Conv1D q/k/v, biases) and a grouped-query Llama
    block (separate maps, no biases), to 1e-8 relative."""
    import torch

    from sigprop import models as hf
    from sigprop.measurement.bounds import _head_maps, _head_norms, _qk_targets
    from sigprop.measurement.probe import Probe

    for fam, sizes in (("gpt2", {}), ("llama-3.2-1b", {"kv_heads": 2})):
        cfg = hf.shrink(fam, layers=1, hidden=64, heads=4, intermediate=128, **sizes)
        model = hf.model_at_init(cfg, seed=0, vocab_size=cfg.vocab_size)
        site = Probe(model).sites[0]
        tq, tk = _qk_targets(site)
        H, dh = site.n_heads, site.head_dim
        q = _head_maps(*tq, H, dh)
        k = _head_maps(*tk, site.n_kv_heads, dh).repeat_interleave(H // site.n_kv_heads, 0)
        full = q.transpose(1, 2) @ k                      # (H, d + 1, d + 1) logit maps
        nob = full.clone()
        nob[:, :, -1] = 0                                 # the key bias's column
        got = _head_norms(site)
        for g, f in zip(got, (full, nob), strict=True):
            want = torch.linalg.matrix_norm(f, ord=2).numpy() * site.scale
            np.testing.assert_allclose(g, want, rtol=1e-8)
    # a singular key Gram (Cholesky fails: the eigendecomposition path): the last K/V head's
    # W_K zero, and rank 1 in the one before; the other heads unchanged
    with torch.no_grad():
        site.k.weight[-dh:] = 0
        row = site.k.weight[-2 * dh].clone()
        site.k.weight[-2 * dh:-dh] = row[None] * torch.linspace(1, 2, dh)[:, None]
    k = _head_maps(*tk, site.n_kv_heads, dh).repeat_interleave(H // site.n_kv_heads, 0)
    want = torch.linalg.matrix_norm(q.transpose(1, 2) @ k, ord=2).numpy() * site.scale
    assert (want[H // 2:] == 0).all() and (want[:H // 2] > 0).all()  # 2 K/V heads
    np.testing.assert_allclose(_head_norms(site)[0], want, rtol=1e-8, atol=1e-12)


def test_kept_is_one_for_an_identity_stack_and_zero_for_unrelated_or_collapsed_tokens():
    """``kept`` (observables.kept) against cases whose value is known exactly: the same
    states (1), any positive rescaling and any shift shared by a sequence's tokens (1: the
    centring removes it), the negated token parts (-1), a state whose tokens all equal their
    mean (0: complete rank collapse), and independent Gaussian states, whose cosines average
    0 with standard deviation 1 / sqrt(d * tokens) (5 sigma: 0.02 at d 64, 4 x 64 tokens);
    NaN for a single token."""
    import torch

    from sigprop.measurement.observables import kept

    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 64, 64, generator=g)
    assert torch.allclose(kept(x0, x0), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(kept(x0, 3.0 * x0 + torch.randn(4, 1, 64, generator=g)),
                          torch.ones(4, dtype=torch.float64))
    assert torch.allclose(kept(x0, -x0), -torch.ones(4, dtype=torch.float64))
    assert torch.equal(kept(x0, torch.randn(4, 1, 64, generator=g).expand(4, 64, 64)),
                       torch.zeros(4, dtype=torch.float64))
    assert kept(x0, torch.randn(4, 64, 64, generator=g)).mean().abs() < 5 / (8 * 16)
    assert torch.isnan(kept(x0[:, :1], x0[:, :1])).all()


def test_compare_reports_kept_and_it_separates_identity_from_scrambling_fixes():
    """On bert-tiny-collapse (24 post-LN blocks, init std 0.1) at T 16: ReZero (a = 0, norms
    removed) is the identity at init, so each token's centred output is its centred input
    (kept 1 to float32 roundoff); centred attention fixes the rank collapse (measured cos
    well below the baseline's) but leaves the post-LN MLP sublayers, which replace the
    tokens' own directions (kept measured -0.02 to 0.01 at T 16, 32 and 64; bound 0.1), as
    in the baseline. docs/fixes.md, "Training the fixes": the eight fixes that learn there
    keep 0.52-1.00, the four that do not 0.00-0.02."""
    from sigprop.analysis.ranking import rank_fixes

    c = rank_fixes("bert-tiny-collapse", "rezero,centred", seq_len=16)
    got = {r.method: r.measured for r in c.rows}
    assert got["rezero"]["kept"] == pytest.approx(1.0, abs=1e-5)
    assert abs(got["centred"]["kept"]) < 0.1
    assert abs(c.baseline["measured"]["kept"]) < 0.1
    assert got["centred"]["cos_final"] < c.baseline["measured"]["cos_final"] - 0.2
    # the verdict: centred is no longer rank-collapsed, but its input is lost; the baseline
    # keeps the worse failure (rank collapse); ReZero is trainable and ranks first
    verdict = {r.method: r.verdict for r in c.rows}
    assert verdict == {"rezero": "trainable", "centred": "input_lost"}
    assert c.baseline["verdict"] == "rank_collapse"
    assert [r.method for r in c.rows] == ["rezero", "centred"]


def test_input_lost_only_overrides_a_trainable_verdict_with_kept_within_noise_of_zero():
    import torch

    from sigprop.analysis.ranking import KEPT_Z, _with_kept, _worst, kept_floor
    from sigprop.measurement.observables import kept

    f = kept_floor(128, 128)
    assert f == pytest.approx(KEPT_Z / 128)
    assert _with_kept("trainable", 0.5 * f, f) == "input_lost"
    assert _with_kept("trainable", -0.5 * f, f) == "input_lost"
    assert _with_kept("trainable", f, f) == "trainable"
    assert _with_kept("trainable", -0.9, f) == "trainable"     # a sign flip keeps the input
    for v in ("rank_collapse", "entropy_collapse"):            # the collapse is the worse one
        assert _with_kept(v, 0.0, f) == v
    for k in (None, math.nan):                                 # not measured: diagnose's
        assert _with_kept("trainable", k, f) == "trainable"
    # the floor against the spread it is set from: kept of unrelated Gaussian states, 400
    # draws of 2 sequences x 64 tokens in d 128; their standard deviation is 1/sqrt(d n)
    # to ~4% (400 draws: 1/sqrt(2 * 400) relative), and none reaches the floor (5 sigma)
    g = torch.Generator().manual_seed(3)
    vals = torch.stack([kept(torch.randn(2, 64, 128, generator=g, dtype=torch.float64),
                             torch.randn(2, 64, 128, generator=g, dtype=torch.float64)).mean()
                        for _ in range(400)])
    sd = 1 / math.sqrt(128 * 128)
    assert float(vals.std()) == pytest.approx(sd, rel=0.15)
    assert float(vals.abs().max()) < kept_floor(128, 128)
    assert _worst(["trainable", "input_lost"]) == "input_lost"
    assert _worst(["input_lost", "rank_collapse"]) == "rank_collapse"


def test_old_names_of_the_fix_ranking_still_import():
    """``sigprop.analysis.compare.compare`` / ``FixComparison`` are the ranking's old names
    (a release of overlap); the ranking takes the one parameter form, the CLI's strings with
    a FutureWarning, before any work."""
    from sigprop.analysis import compare as old
    from sigprop.analysis import ranking

    assert old.compare is ranking.rank_fixes and old.FixComparison is ranking.FixRanking
    assert old.RANKING == ranking.RANKING
    with pytest.warns(FutureWarning, match="pass a dict"), \
            pytest.raises(SpecError, match="train_steps"):
        ranking.rank_fixes("bert-tiny-collapse", "softcap", ["softcap.cap=30"], train_steps=-1)


def test_compare_predicts_a_causal_decoder_position_resolved():
    """On a shrunk Qwen2 (causal, RoPE, token input) the comparison's predicted final cos is
    the position-resolved Gram theory from the unfixed model's measured input, as diagnose's
    theory row: the baseline's equals the diagnosis's own (same seed and sequences, 1e-9) and
    differs from the homogeneous theory's (by more than 1e-3, so the check can fail); QK-Clip,
    which changes nothing at init, predicts the baseline's number; Mix-LN (post-LN first
    blocks reading the raw stream) and value residuals (every block has W_O) are in the Gram
    theory, DyT is not (its row says homogeneous). Every row has a finite predicted and
    measured final cos, none an error."""
    from sigprop.analysis.diagnose import diagnose
    from sigprop.analysis.ranking import rank_fixes
    from sigprop.theory import depth

    cfg = shrink(PRESETS["qwen2-0.5b"], layers=4, hidden=64, heads=4, kv_heads=2,
                 intermediate=128, vocab=200)
    c = rank_fixes(cfg, "dyt,value-residual,mix-ln,qk-clip", seq_len=16)
    for r in c.rows:
        assert r.error is None, (r.method, r.error)
        assert np.isfinite(r.predicted["cos_final"]) and np.isfinite(r.measured["cos_final"])
    d = diagnose(cfg, seq_len=16, seeds=1, sequences=2, recommendations=False)
    th = d.trajectory[(d.trajectory.source == "theory") & (d.trajectory.observable == "cos")]
    base = c.baseline["predicted"]
    assert base["cos_theory"] == "position-resolved"
    assert base["cos_final"] == pytest.approx(float(th[th.layer == 4]["value"].iloc[0]),
                                              abs=1e-9)
    assert abs(base["cos_final"] - float(depth.final_cos(d.spec, rho0=d.rho0))) > 1e-3
    got = {r.method: r.predicted for r in c.rows}
    assert got["qk-clip"]["cos_final"] == pytest.approx(base["cos_final"], abs=1e-12)
    assert got["mix-ln"]["cos_theory"] == got["value-residual"]["cos_theory"] == \
        "position-resolved"
    assert got["dyt"]["cos_theory"] == "homogeneous"


def test_a_vanishing_stream_is_signal_lost_not_trainable():
    """DyT in place of bert-tiny-collapse's 49 post-LN norms (alpha 0.5: tanh(x / 2) ~ x / 2
    on small states) shrinks the stream's mean square: measured at T 16, the last block's output
    is 5e-23 of the first block's input (bound: below the 1e-8 floor), its cosine (0.9996
    here; 7e-32 on bert-deep-48) rounding, so the verdict is signal_lost, and it ranks below a
    fix that keeps the stream (ReZero, trainable, ratio within 1e-3 of 1: the identity at
    init)."""
    from sigprop.analysis.ranking import SIGNAL_FLOOR, rank_fixes

    c = rank_fixes("bert-tiny-collapse", "dyt,rezero", seq_len=16)
    got = {r.method: r for r in c.rows}
    assert got["dyt"].measured["q_ratio"] < SIGNAL_FLOOR
    assert got["dyt"].verdict == "signal_lost"
    assert got["rezero"].measured["q_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert got["rezero"].verdict == "trainable"
    assert [r.method for r in c.rows] == ["rezero", "dyt"]



def test_a_model_seed_past_the_methods_seed_range_still_draws_the_method():
    """Gated and differential attention draw from a ``seed`` parameter in [0, 2^31] that the
    comparison sets from the model's seed; a model seed may reach 2^63, so it is folded into
    that range: model seed 2^31 + 1 + 7 draws the method with seed 7 and gets a measured row
    (it was a one-line refusal of ``seed``), and model seed 8 draws with 8."""
    from sigprop.analysis.ranking import rank_fixes

    m = shrink(PRESETS["gpt2"], layers=2, hidden=32, heads=2, intermediate=64, vocab=100)

    def rows(seed):
        c = rank_fixes(m, ["gated-attn", "diff-attn"], seq_len=16, seed=seed).to_dict()
        return {r["method"]: r for r in c["methods"]}

    big, other = rows(2**31 + 1 + 7), rows(8)
    for name in ("gated-attn", "diff-attn"):
        assert big[name]["error"] is None, big[name]["error"]
        assert big[name]["params"]["seed"] == 7.0
        assert math.isfinite(big[name]["measured"]["cos_final"])
        assert other[name]["params"]["seed"] == 8.0
