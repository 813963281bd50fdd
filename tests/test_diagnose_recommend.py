"""The recommendations of `sigprop diagnose` (sigprop.analysis.recommend): each a frozen
Recommendation whose to_dict() is the JSON dict (its keys in a fixed order, absent numbers
left out, the attention residual's unsearched alpha_crit written as None)."""

import dataclasses

import pytest

from sigprop import ArchSpec
from sigprop.analysis.recommend import Recommendation, recommend

KEYS = {
    "beta window": ["what", "current", "limit", "qk_std_max", "text"],
    "lower beta": ["what", "beta", "predicted_cos_L", "predicted_verdict", "text"],
    "attention residual": ["what", "alpha_crit", "current", "predicted_cos_L_now", "alpha",
                           "predicted_cos_L", "predicted_verdict", "text"],
    "centred attention": ["what", "predicted_cos_L", "predicted_verdict", "text"],
    "length scaling": ["what", "seq_len", "beta_none", "beta_log-n", "beta_c", "text"],
}


def test_recommend_dicts_keep_their_keys_in_order():
    """Above beta_c: every kind of recommendation, alpha_crit undefined (NaN, no change
    offered); below beta_c with a weak residual: the change of alpha_attn. Each dict has its
    keys in the order of the JSON output."""
    above = ArchSpec(depth=6, d_model=64, heads=4, seq_len=64, beta=3.0)
    recs = recommend(above, 0.2)
    assert [r.what for r in recs] == list(KEYS)
    for r in recs:
        keys = KEYS[r.what]
        if r.what == "attention residual":
            keys = ["what", "alpha_crit", "current", "predicted_cos_L_now", "text"]
        assert list(r.to_dict()) == keys, r.what
    window = recs[0].to_dict()
    assert window["current"] == above.beta_eff and window["text"].startswith("keep beta below")
    weak = ArchSpec(depth=48, d_model=64, heads=4, seq_len=64, beta=0.5, alpha_attn=0.05)
    residual = recommend(weak, 0.2)[1].to_dict()
    assert list(residual) == KEYS["attention residual"]
    assert residual["alpha"] == pytest.approx(1.1 * residual["alpha_crit"])


def test_qk_norm_window_speaks_of_the_gains():
    """With QK-norm the window has no Q/K init std; the gains' product comes last."""
    spec = ArchSpec(depth=6, d_model=64, heads=4, seq_len=64)
    window = recommend(spec, 0.2, qk_norm=True)[0].to_dict()
    assert list(window) == ["what", "current", "limit", "text", "gain_product_max"]
    assert "QK-norm" in window["text"]


def test_absent_numbers_are_left_out_but_an_unsearched_alpha_crit_is_none():
    unsearched = Recommendation(what="attention residual", current=1.0,
                                predicted_cos_L_now=0.5, text="not searched")
    assert unsearched.to_dict() == {"what": "attention residual", "alpha_crit": None,
                                    "current": 1.0, "predicted_cos_L_now": 0.5,
                                    "text": "not searched"}
    assert Recommendation(what="centred attention", text="t").to_dict() == {
        "what": "centred attention", "text": "t"}


def test_recommendation_is_frozen_and_keyword_only():
    r = Recommendation(what="beta window", text="t")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.text = "u"
    with pytest.raises(TypeError):
        Recommendation("beta window", "t")
