"""ArchSpec validation and derived quantities (docs/theory.md §2.1, §6)."""

import math

import pytest

from sigprop.spec import ArchSpec, SpecError, score_multiplier


def test_bert_base_beta_eff():
    # gg25 B.1: sigma = 0.02, d = 768, T = 512 -> beta_eff = sigma^2 d / sqrt(log T) ~= 0.123
    s = ArchSpec()
    assert s.beta_eff == pytest.approx(0.02**2 * 768 / math.sqrt(math.log(512)), rel=1e-12)
    assert abs(s.beta_eff - 0.123) < 5e-4


def test_derived_translations_bert():
    d = ArchSpec().derived()
    assert d["beta_c"] == pytest.approx(math.sqrt(2))
    # docs/theory.md §6: sigma_A = sqrt(exp(sigma_s^2) - 1) at rho = 0
    assert d["sigma_A"] == pytest.approx(math.sqrt(math.exp(0.3072**2) - 1), rel=1e-12)
    assert abs(d["sigma_A"] - 0.315) < 1e-3
    # deshpande26's ratio equals beta / beta_c (same transition, docs/theory.md §3.3)
    assert d["deshpande_ratio"] == pytest.approx(d["beta_over_beta_c"], rel=1e-12)
    assert d["gamma"] == pytest.approx(0.3072 / math.log(512))


def test_beta_mode_rem_init_any_heads():
    # docs/theory.md §2.1: REM init sigma_q = sigma_k = sqrt(beta sqrt(log T)/d) reproduces beta for
    # any number of heads (sigma_s independent of H).
    for heads in (1, 4, 12):
        s = ArchSpec(beta=0.7, heads=heads)
        sq = s.rem_qk_std()
        sigma_s = sq * sq * s.d_model
        assert sigma_s / math.sqrt(math.log(s.seq_len)) == pytest.approx(0.7, rel=1e-12)


def test_init_std_modes():
    hf = ArchSpec(init_std=0.02, d_model=64, heads=4, d_ff=256)
    assert hf.var_v == pytest.approx(0.02**2 * 64)
    assert hf.var_w_out == pytest.approx(0.02**2 * 256)
    assert hf.var_o == pytest.approx(0.02**2 * 64)
    mf = ArchSpec(sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4)
    assert (mf.var_v, mf.var_w_in, mf.var_w_out, mf.var_o) == (0.2, 0.2, 0.2, None)
    # qk_std follows init_std unless given
    assert ArchSpec(init_std=0.05).sigma_s == pytest.approx(0.05**2 * 768)


@pytest.mark.parametrize("field,value,needle", [
    ("beta", -1.0, "beta"), ("depth", 0, "depth"), ("heads", 7, "heads"),
    ("seq_len", 1, "seq_len"), ("norm", "middle", "norm"), ("rho0", 1.5, "rho0"),
    ("alpha_attn", float("nan"), "alpha_attn"), ("activation", "swish", "activation"),
    ("sigma_b2", -1e-3, "sigma_b2"), ("scaling_param", 0.0, "scaling_param"),
])
def test_bad_values_name_field(field, value, needle):
    with pytest.raises(SpecError) as err:
        ArchSpec(**{field: value})
    msg = str(err.value)
    assert msg.startswith(needle) and "\n" not in msg
    assert err.value.field == field


def test_beta_and_qk_std_exclusive():
    with pytest.raises(SpecError, match="beta"):
        ArchSpec(beta=1.0, qk_std=0.02)


def test_roundtrip_dict():
    s = ArchSpec(depth=3, beta=1.2, causal=True, activation="tanh")
    assert ArchSpec.from_dict(s.to_dict()) == s
    with pytest.raises(SpecError, match="unknown"):
        ArchSpec.from_dict({"depht": 3})


def test_score_multipliers():
    # docs/theory.md §3.2, each at its reference point and one more length
    assert score_multiplier("none", 4096) == 1.0
    assert score_multiplier("log-n", 512) == pytest.approx(1.0)
    assert score_multiplier("log-n", 512**2) == pytest.approx(2.0)
    assert score_multiplier("qwen", 100, 512) == 1.0
    assert score_multiplier("qwen", 512**3, 512) == pytest.approx(3.0)
    assert score_multiplier("ssmax", 512) == pytest.approx(1.0)
    assert score_multiplier("ssmax", 1000, 0.5) == pytest.approx(0.5 * math.log(1000))
    assert score_multiplier("yarn", 10, 16.0) == pytest.approx((0.1 * math.log(16) + 1) ** 2)
    assert score_multiplier("tau", 10, 8.5) == pytest.approx(8.5)  # noci22 Eq. 45: multiplies
    s = ArchSpec(beta=1.0, scaling="tau", scaling_param=2.0)
    assert s.beta_eff == pytest.approx(2.0)
