"""Attention sinks and output gates in the theory (docs/theory.md §2.4.3-2.4.4): the
quadratures against plain NumPy Monte Carlo of their definitions, and the LayerSpec fields'
validation. The comparison with sigprop's torch stack is in tests/nn/test_sink_gate.py."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.spec import ArchSpec, LayerSpec, SpecError
from sigprop.theory import blocks, depth, kernels
from sigprop.theory.sink import sink_moments


def _mc_row(v, vc, s, n, draws, rng):
    """(E W, E W^2, E sum_b w_b^2) of a row with scores c + e_b and a sink logit s, by
    sampling the definition: w_b = exp(z_b) / (exp(s) + sum exp(z))."""
    z = rng.standard_normal((draws, n)) * np.sqrt(v) + rng.standard_normal((draws, 1)) * np.sqrt(vc)
    top = np.maximum(z.max(axis=1, keepdims=True), s)
    ez = np.exp(z - top)
    w = ez / (ez.sum(axis=1, keepdims=True) + np.exp(s - top))
    W = w.sum(axis=1)
    return np.array([W.mean(), (W**2).mean(), (w**2).sum(axis=1).mean()])


@pytest.mark.parametrize("v, vc, s, n", [
    (1.0, 0.0, 0.0, 64),     # below condensation, no common part
    (4.0, 1.0, 5.0, 64),     # strong sink, common part
    (12.0, 0.0, 5.0, 64),    # above condensation (beta ~ 1.7 at rho = 0)
    (0.0, 1.0, 3.0, 16),     # uniform rows: only the common part fluctuates
    (2.0, 0.3, -2.0, 1),     # one key (the first causal row)
])
def test_sink_moments_match_sampling(v, vc, s, n):
    # 2e5 rows: standard errors <= 1e-3 on every moment; tolerance 4e-3 (4 sigma)
    mc = _mc_row(v, vc, s, n, 200_000, np.random.default_rng(1))
    th = np.array(sink_moments(v, vc, s, n))
    assert np.max(np.abs(th - mc)) < 4e-3, (th, mc)


def test_sink_limits():
    # a very negative sink is no sink: E W = E W^2 = 1 and Y2s = the REM's Y2
    from sigprop.theory import rem
    w1, w2, y2s = sink_moments(3.0, 0.5, -45.0, 64)
    assert w1 == pytest.approx(1.0, abs=1e-9) and w2 == pytest.approx(1.0, abs=1e-9)
    assert y2s == pytest.approx(float(rem.y2_finite(3.0, 64)), abs=1e-6)
    # v = vc = 0: every row is uniform with mass n / (n + e^s)
    w1, w2, y2s = sink_moments(0.0, 0.0, 2.0, 16)
    assert w1 == pytest.approx(16 / (16 + np.exp(2.0)), rel=1e-6)
    assert w2 == pytest.approx(w1**2, rel=1e-6)
    assert y2s == pytest.approx(w1**2 / 16, rel=1e-6)


@pytest.mark.parametrize("q1, p1", [(0.25, 0.0), (1.0, 0.3), (9.0, 4.5), (2.0, -1.0)])
def test_gate_kernel_matches_sampling(q1, p1):
    rng = np.random.default_rng(2)
    x, z = rng.standard_normal((2, 1_000_000))
    c = p1 / q1
    g, g2 = np.sqrt(q1) * x, np.sqrt(q1) * (c * x + np.sqrt(1 - c * c) * z)
    sig = 1 / (1 + np.exp(-g))
    kd, ko = kernels.gate_kernel(q1, p1)
    # standard errors ~2e-4; tolerance 1e-3
    assert float(kd) == pytest.approx(np.mean(sig**2), abs=1e-3)
    assert float(ko) == pytest.approx(np.mean(sig / (1 + np.exp(-g2))), abs=1e-3)


def test_gate_kernel_zero_variance_is_a_quarter():
    kd, ko = kernels.gate_kernel(0.0, 0.0)
    assert float(kd) == 0.25 and float(ko) == 0.25


def _lay(**kw):
    return LayerSpec(sigma_s=(2.0,) * 4, var_v=1.0, var_o=1.0, var_w_in=2.0, var_w_out=1.0, **kw)


@pytest.mark.parametrize("kw, field", [
    (dict(sink_logit=(0.0, 1.0)), "layers.sink_logit"),          # not one per head
    (dict(sink_logit=(0.0, 1.0, 2.0, 99.0)), "layers.sink_logit"),  # out of range
    (dict(sink_logit=(0.0, 1.0, 2.0, float("nan"))), "layers.sink_logit"),
    (dict(gate_var=-1.0), "layers.gate_var"),
    (dict(gate_bias2=1.0), "layers.gate_bias2"),                   # a bias without a gate
    (dict(gate_var=1.0, gate_bias2=-0.5), "layers.gate_bias2"),
])
def test_layer_fields_validated(kw, field):
    with pytest.raises(SpecError) as err:
        _lay(**kw)
    assert err.value.field == field


def test_sinks_need_softmax():
    lay = _lay(sink_logit=(0.0,) * 4)
    with pytest.raises(SpecError) as err:
        ArchSpec(depth=1, d_model=64, heads=4, seq_len=64, attention="centred", layers=(lay,))
    assert err.value.field == "layers.sink_logit"
    spec = ArchSpec.from_dict(ArchSpec(depth=1, d_model=64, heads=4, seq_len=64,
                                       layers=(lay,)).to_dict())  # round trip
    assert spec.layers[0].sink_logit == (0.0,) * 4


def test_sink_and_gate_change_the_map():
    """A strong sink scales the branch variance down by about E W^2; a gate by E sigmoid^2
    (1/4 at zero gate variance); both enter the layer's theory through BlockParams."""
    base = ArchSpec(depth=1, d_model=64, heads=4, seq_len=64, norm="pre", layers=(_lay(),))
    for kw in (dict(sink_logit=(5.0,) * 4), dict(gate_var=1e-12)):
        sp = base.replace(layers=(_lay(**kw),))
        bp0, bp = blocks.BlockParams.from_spec(base, 1), blocks.BlockParams.from_spec(sp, 1)
        st0 = blocks._head_stats(bp0, 1.0, 0.0, asymptotic=False, full=False)[0]
        st = blocks._head_stats(bp, 1.0, 0.0, asymptotic=False, full=False)[0]
        q0, _ = blocks.attention_map(1.0, 0.0, st0, variant="softmax", var_v=1.0, var_b=0.0)
        q1, _ = blocks.attention_map(1.0, 0.0, st, variant="softmax", var_v=1.0, var_b=0.0,
                                     gate=blocks.gate_factors(bp, 1.0, 0.0))
        if "gate_var" in kw:
            assert float(q1) == pytest.approx(0.25 * float(q0), rel=1e-6)
        else:
            assert 0.3 < float(q1 / q0) < 0.9
        tr = depth.propagate(sp)
        assert np.isfinite(tr.value.to_numpy(dtype=float)).all()
