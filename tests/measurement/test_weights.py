"""Weights first (docs/theory.md §2.8): theory parameters read from a model's weights, per layer
and head, and the per-layer spec they make."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sigprop import models as hf
from sigprop.measurement.probe import Probe, to_trajectory
from sigprop.measurement.weight_maps import norm_gains
from sigprop.measurement.weight_table import WeightTable
from sigprop.measurement.weights import WeightReader
from sigprop.spec import ArchSpec, LayerSpec, SpecError
from sigprop.theory import depth

SMALL = dict(layers=3, hidden=128, heads=4, kv_heads=2, intermediate=256)


def _read(model, ids):
    p = Probe(model, keep_hidden=False)
    w = WeightReader(model, blocks=p.blocks, sites=p.sites)
    with p, w, torch.no_grad():
        model(input_ids=ids)
    return w.read(), to_trajectory([p], per_head=True)


@pytest.mark.parametrize("name", ["bert-base-uncased", "gpt2", "llama-3.2-1b", "qwen2-0.5b"])
def test_weights_match_the_init_law_and_the_measured_scores(name):
    """At HF init every weight is N(0, std^2): sigma_s = std^2 d per head, var = std^2 fan_in
    (GPT-2's c_proj / 2L). Finite d: each head's sigma_s^2 is a sum of d*d_H products, relative
    spread ~ 1/sqrt(d_H) ~ 0.18 at d_H = 32, so the head RMS of 4 heads x 3 layers is within
    10%; the variances (sums of ~1e4-6e4 squares) within 3%. The measured score RMS per head
    (64 tokens, 2 sequences) has expectation sigma_s: within 12% on the RMS over heads."""
    cfg = hf.shrink(name, **SMALL)
    model = hf.model_at_init(cfg, seed=0, attn_implementation="sdpa", vocab_size=512)
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    table, tr = _read(model, ids)
    std, d = 0.02, 128
    assert len(table.layers) == 3 and len(table.heads) == 12
    sig = np.array([h["sigma_s"] for h in table.heads])
    assert abs(np.sqrt(np.mean(sig**2)) / (std**2 * d) - 1) < 0.10
    div = 6.0 if name == "gpt2" else 1.0  # GPT-2: both c_proj scaled by 1/sqrt(2L)
    for lay in table.layers:
        assert abs(lay.var_v / (std**2 * d) - 1) < 0.03
        assert abs(lay.var_o / (std**2 * d / div) - 1) < 0.03
        assert abs(lay.var_w_in / (std**2 * d) - 1) < 0.03
        assert abs(lay.var_w_out / (std**2 * 256 / div) - 1) < 0.06
        assert lay.var_b == 0.0
    meas = tr[(tr.observable == "sigma_s") & tr["head"].notna()]["value"].to_numpy()
    assert meas.size == 12
    assert abs(np.sqrt(np.mean(meas**2)) / np.sqrt(np.mean(sig**2)) - 1) < 0.12


def test_per_head_scaling_and_gains_are_read_exactly():
    """Deterministic reads of the same weights: Q of head 2 x 3 gives exactly 3x its sigma_s;
    the norm in front of the attention with gains 2 gives 4x every head (G enters W_Q and
    W_K); a value-bias of 0.1 gives var_b > 0."""
    cfg = hf.shrink("llama-3.2-1b", **SMALL)
    model = hf.model_at_init(cfg, seed=1, attn_implementation="sdpa", vocab_size=512)
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(0))
    base, _ = _read(model, ids)
    dh = 32
    with torch.no_grad():
        model.layers[0].self_attn.q_proj.weight[2 * dh:3 * dh].mul_(3.0)
        model.layers[1].input_layernorm.weight.fill_(2.0)
    new, _ = _read(model, ids)
    s0, s1 = np.array(base.layers[0].sigma_s), np.array(new.layers[0].sigma_s)
    np.testing.assert_allclose(s1 / s0, [1, 1, 3, 1], rtol=1e-6)
    np.testing.assert_allclose(np.array(new.layers[1].sigma_s) / base.layers[1].sigma_s, 4.0,
                               rtol=1e-6)
    assert new.layers[1].var_v == pytest.approx(4 * base.layers[1].var_v, rel=1e-6)
    assert new.layers[2].sigma_s == pytest.approx(base.layers[2].sigma_s, rel=1e-9)


def test_norm_gains_of_any_norm_class():
    """Gains read functionally: LayerNorm (mean-subtracting, with bias), RMSNorm, a Gemma-style
    ``(1 + w)`` norm whose weight is 0 at init, and a norm module that is not affine."""
    ln = torch.nn.LayerNorm(16)
    with torch.no_grad():
        ln.weight.copy_(torch.linspace(0.5, 2.0, 16))
        ln.bias.fill_(0.3)
    np.testing.assert_allclose(norm_gains(ln), np.linspace(0.5, 2.0, 16), rtol=1e-4)

    class OnePlus(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) * (1 + self.weight)

    np.testing.assert_allclose(norm_gains(OnePlus()), np.ones(8), rtol=1e-5)

    class NotANorm(torch.nn.Module):
        weight = torch.nn.Parameter(torch.ones(8))

        def forward(self, x):
            return torch.tanh(3 * x)

    assert norm_gains(NotANorm()) is None


def test_qk_norm_sets_sigma_by_the_gains():
    """Qwen3 (QK-norm): sigma_s = sqrt(sum g_q^2 g_k^2 / d_H) = 1 at unit gains, whatever the
    weight std; q_norm gains x2 -> 2."""
    cfg = hf.shrink("qwen2-0.5b", **SMALL).to_dict()
    cfg.update(model_type="qwen3", head_dim=32)
    model = hf.model_at_init(cfg, seed=0, attn_implementation="sdpa", vocab_size=512)
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(0))
    table, _ = _read(model, ids)
    np.testing.assert_allclose(table.layers[0].sigma_s, 1.0, rtol=1e-4)
    with torch.no_grad():
        model.layers[0].self_attn.q_norm.weight.fill_(2.0)
    table, _ = _read(model, ids)
    np.testing.assert_allclose(table.layers[0].sigma_s, 2.0, rtol=1e-4)


def test_average_over_draws():
    a = WeightTable((LayerSpec((1.0, 3.0), 1.0, 2.0, 1.0, 1.0),), [
        {"layer": 1, "head": 0, "sigma_s": 1.0}, {"layer": 1, "head": 1, "sigma_s": 3.0}], [1.0])
    b = WeightTable((LayerSpec((3.0, 1.0), 3.0, 4.0, 1.0, 3.0),), [
        {"layer": 1, "head": 0, "sigma_s": 3.0}, {"layer": 1, "head": 1, "sigma_s": 1.0}], [1.0])
    m = WeightTable.average([a, b])
    np.testing.assert_allclose(m.layers[0].sigma_s, [math.sqrt(5)] * 2)
    assert m.layers[0].var_v == 2.0 and m.layers[0].var_o == 3.0
    assert [h["sigma_s"] for h in m.heads] == pytest.approx([math.sqrt(5)] * 2)


# ------------------------------------------------------------------------------ the spec side
def _uniform_layers(spec: ArchSpec, n_heads: int) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(sigma_s=(spec.sigma_s,) * n_heads, var_v=spec.var_v,
                           var_o=spec.var_o, var_w_in=spec.var_w_in, var_w_out=spec.var_w_out)
                 for _ in range(spec.depth))


@pytest.mark.parametrize("norm,causal", [("post", False), ("pre", True), ("none", False)])
def test_layers_equal_to_the_spec_give_the_same_theory(norm, causal):
    """A spec whose per-layer entries repeat its own values is the same model: identical
    trajectory and final cosines on a beta / alpha grid (the grid's beta scales every layer)."""
    s = ArchSpec(depth=5, d_model=64, heads=4, seq_len=64, norm=norm, causal=causal,
                 rho0=0.2, qk_std=0.08)
    lay = s.replace(qk_std=None, layers=_uniform_layers(s, 4))
    a, b = depth.propagate(s), depth.propagate(lay)
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-12, atol=1e-14)
    grid = dict(beta=np.array([0.1, 0.8, 2.5])[:, None], alpha_attn=np.array([0.5, 1.0, 2.0]))
    np.testing.assert_allclose(depth.final_cos(s, **grid), depth.final_cos(lay, **grid),
                               rtol=1e-12)
    assert depth.verdict(s) == depth.verdict(lay)


def test_layer_spec_validation_and_round_trip():
    lay = LayerSpec(sigma_s=(0.5, 2.0), var_v=1.0, var_o=None, var_w_in=2.0, var_w_out=2.0,
                    head_weights=(1.0, 3.0))
    s = ArchSpec(depth=1, d_model=8, heads=2, seq_len=16, layers=(lay,))
    assert ArchSpec.from_dict(s.to_dict()) == s
    assert s.sigma_s == pytest.approx(math.sqrt((0.25 + 4) / 2))
    with pytest.raises(SpecError, match="layers: needs depth=2"):
        ArchSpec(depth=2, d_model=8, heads=2, layers=(lay,))
    with pytest.raises(SpecError, match="layers: give layers"):
        ArchSpec(depth=1, d_model=8, heads=2, beta=1.0, layers=(lay,))
    with pytest.raises(SpecError, match=r"layers.var_v: must be a finite number"):
        LayerSpec(sigma_s=(1.0,), var_v=float("nan"), var_o=1.0, var_w_in=1.0, var_w_out=1.0)
    with pytest.raises(SpecError, match=r"layers.sigma_s"):
        LayerSpec(sigma_s=(-1.0,), var_v=1.0, var_o=1.0, var_w_in=1.0, var_w_out=1.0)
    with pytest.raises(SpecError, match=r"layers.head_weights: needs 2"):
        LayerSpec(sigma_s=(1.0, 1.0), var_v=1.0, var_o=1.0, var_w_in=1.0, var_w_out=1.0,
                  head_weights=(1.0,))
    with pytest.raises(SpecError, match=r"layers.bogus: unknown field"):
        ArchSpec.from_dict({"depth": 1, "d_model": 8, "heads": 2,
                            "layers": [{"sigma_s": [1.0], "var_v": 1, "var_o": 1,
                                        "var_w_in": 1, "var_w_out": 1, "bogus": 1}]})
    # with_beta keeps the per-head structure and sets every layer's RMS beta
    b = s.with_beta(0.7)
    assert b.beta_eff == pytest.approx(0.7)
    np.testing.assert_allclose(np.array(b.layers[0].sigma_s) / lay.sigma_s, b.sigma_s / s.sigma_s)


def test_head_spread_theory_matches_simulation():
    """Heads of one block with different score stds (two far below, two far above beta_c):
    the theory averages the row statistics over heads (docs/theory.md §2.8). Simulation: an
    HF BERT-like encoder (d = 128, 4 heads, T = 64, 3 layers) whose Q/K heads are rescaled,
    diagnosed as an nn.Module, 1 draw x 4 sequences. Tolerance 0.05 on cos and ipr per layer:
    the agreement tests give ~0.03 at this width (finite d_H = 32 chi2 spread, 1 draw), and the
    mean over heads of ipr is a mean of four quantities each within that."""
    import sigprop

    cfg = hf.shrink("bert-base-uncased", layers=3, hidden=128, heads=4, intermediate=512)
    model = hf.model_at_init(cfg, seed=3, attn_implementation="sdpa", vocab_size=cfg.vocab_size)
    f = [0.5, 1.0, 12.0, 20.0]
    with torch.no_grad():
        for lay in model.bert.encoder.layer if hasattr(model, "bert") else model.encoder.layer:
            for h, x in enumerate(f):
                lay.attention.self.query.weight[32 * h:32 * (h + 1)].mul_(x)
    d = sigprop.diagnose(model, seq_len=64, sequences=4)
    sig = d.spec.layers[0].sigma_s
    assert sig[3] / sig[0] == pytest.approx(40, rel=0.3)  # the rescaling, read back
    tr = d.trajectory
    for obs in ("cos", "ipr"):
        w = tr[tr.observable == obs].pivot_table(index="layer", columns="source", values="value")
        gap = (w["theory"] - w["measured"]).abs().max()
        assert gap < 0.05, (obs, w)


@pytest.mark.parametrize("shape", [(3072, 768), (64, 20000)])
def test_column_sums_of_squares_in_float32_are_within_1e_6_of_float64(shape):
    """``col_sq`` accumulates in float32 (no squared copy): against the float64 sum, within
    1e-6 relative on a bert-base MLP map and on a 20,000-wide column count (the claimed
    tolerance: far below a one-draw variance's sampling noise, sqrt(2 / rows) >= 1e-2 here)."""
    from sigprop.measurement.weight_maps import col_sq

    W = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 0.02
    want = W.double().square().sum(0)
    got = col_sq(W)
    assert got.dtype == torch.float64
    assert float(((got - want).abs() / want).max()) < 1e-6
