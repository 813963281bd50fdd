"""Hybrid stacks in `sigprop diagnose`: attention layers from the theory, the other mixers
(Mamba, Gated-DeltaNet linear attention) as measured residual maps (docs/theory.md §2.8.1).
Shrunk HF models built offline from the zoo's small configs (2 layers, d = 64, T = 64)."""

import warnings
from dataclasses import replace

import numpy as np
import pytest

import sigprop
from sigprop.models.zoo import small_config
from sigprop.theory import depth

from .clirun import sigprop as cli

#: theory vs measured cos per layer. Two layers at d = 64, one draw, 2 x 64 tokens: the
#: measured mean cosine of one draw scatters by ~1/sqrt(d) ~ 0.1 times the branch's share,
#: and the attention layer's MoE (16 or 8 experts at d = 64) is far from mean field
TOL = 0.05


def _config(model_type: str, **over):
    from transformers import AutoConfig

    d, _ = small_config(model_type)
    d = dict(d)
    d.pop("model_type", None)
    d.update(over)
    return AutoConfig.for_model(model_type, **d)


def _diagnose(cfg, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sigprop.diagnose(cfg, seq_len=64, seeds=1, sequences=2, seed=0, **kw)


def _cos(traj, source):
    t = traj[(traj.observable == "cos") & (traj.source == source)]
    return t.set_index("layer")["value"].sort_index()


# (config overrides, which layers are measured mixers). initializer_range 0.1: the mixer
# block multiplies the stream's q by ~20-90 and lowers its cosine, so an identity map in its
# place is visibly wrong (at the configs' 0.02 Jamba's Mamba and Qwen3-Next's DeltaNet barely
# move the state); num_experts 8 keeps Qwen3-Next's routing factors quick (its 512 experts
# take a minute). Nemotron-H ("ME*-": Mamba, MoE, attention without an MLP, MLP) at its own
# init: its MoE block raises the cosine from ~0.03 to ~0.17
CASES = {
    "jamba": (dict(initializer_range=0.1), [True, False]),
    "qwen3_next": (dict(initializer_range=0.1, num_experts=8, num_experts_per_tok=2),
                   [True, False]),
    "nemotron_h": ({}, [True, True, False, True]),
}


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_hybrid_theory_rows_for_every_layer(model_type):
    over, pattern = CASES[model_type]
    dg = _diagnose(_config(model_type, **over))
    meas, theory = _cos(dg.trajectory, "measured"), _cos(dg.trajectory, "theory")
    assert list(theory.index) == list(meas.index) == list(range(len(pattern) + 1))
    assert [x.measured for x in dg.spec.layers] == pattern
    assert all(x.mixer_map is not None for x in dg.spec.layers if x.measured)
    assert any("hybrid stack: layer(s) 1" in n for n in dg.notes)
    assert not any("not readable" in n for n in dg.notes)
    err = np.abs(theory - meas)
    first_att = pattern.index(False) + 1
    assert err[:first_att].max() < 1e-9  # the measured maps at the measured input
    assert err.max() < TOL, err.to_dict()
    # control: identity maps in place of the measured mixers miss the first attention layer
    # (jamba: 0.24-0.32 off, qwen3_next: 0.052-0.061, nemotron_h 0.054-0.095; the theory
    # with the maps: < 0.004, < 0.004, < 0.021; seeds 0-2)
    ident = tuple(replace(x, mixer_map=(x.mixer_map[0], x.mixer_map[1]) * 2)
                  if x.measured else x for x in dg.spec.layers)
    ctl = _cos(depth.propagate(dg.spec.replace(layers=ident)), "theory")
    gap = abs(ctl[first_att] - meas[first_att])
    assert gap > max(TOL, 2 * err[first_att]), (ctl[first_att], meas[first_att])
    assert [r.get("mixer") == "measured" for r in dg.layers] == pattern


def test_hybrid_cli_json(tmp_path):
    import json

    cfg = _config("jamba", initializer_range=0.1)
    cfg.save_pretrained(tmp_path)
    p = cli("diagnose", str(tmp_path / "config.json"), "--seq-len", "64", "--seeds", "1",
            "--sequences", "2", "--format", "json", timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    theory = [r for r in out["rows"] if r["source"] == "theory" and r["observable"] == "cos"]
    assert len(theory) == 3
    assert any("measured residual maps" in n for n in out["notes"])


def test_gpt_oss_clamped_swiglu_in_the_theory():
    """gpt-oss's experts (clamped SwiGLU g sigmoid(1.702 g) (u + 1), docs/theory.md §2.5.3)
    are in the theory: q grows as measured only with the up branch's + 1 (shift 1 over the
    up / gate variance ratio, ~1 at init). 8 experts (the config's 128 take ~50 s in the
    routing factors). Measured (seeds 0, 1): q / q0 within 4 %, without the shift 27-41 %
    low; cos within 0.02 / 0.053 (sinks, 64 tokens, d = 64)."""
    dg = _diagnose(_config("gpt_oss", num_local_experts=8, num_experts_per_tok=2),
                   recommendations=False)  # (the alpha_crit search with sinks: ~20 s)
    assert any("clamped SwiGLU" in n for n in dg.notes)
    assert dg.spec.activation == "geglu"
    assert all(x.glu_shift == pytest.approx(1.0, abs=0.05) for x in dg.spec.layers)
    tr = dg.trajectory
    q = tr[tr.observable == "q"].pivot_table(index="layer", columns="source", values="value")
    ratio = (q["measured"] / q["measured"][0]).to_numpy()
    assert np.allclose(q["theory"].to_numpy(), ratio, rtol=0.06), (q["theory"], ratio)
    meas, theory = _cos(tr, "measured"), _cos(tr, "theory")
    assert np.abs(theory - meas).max() < 0.06
    # control, first layer only (a sinked layer's theory costs ~3 s)
    no_shift = dg.spec.replace(depth=1, layers=(replace(dg.spec.layers[0], glu_shift=0.0),))
    t0 = depth.propagate(no_shift)
    q0 = t0[(t0.observable == "q") & (t0.layer == 1)]["value"].iloc[0]
    assert q0 < 0.85 * ratio[1], (q0, ratio)
