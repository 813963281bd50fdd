"""Hybrid stacks: blocks whose token mixer is not attention enter the per-layer theory as
measured residual maps (docs/theory.md §2.8.1)."""

import math
from dataclasses import replace

import numpy as np
import pytest

from sigprop.spec import ArchSpec, LayerSpec, SpecError
from sigprop.theory import depth
from sigprop.theory.blocks import BlockParams, block_step

ATT = LayerSpec(sigma_s=(1.0, 1.5), var_v=1.0, var_o=1.0, var_w_in=1.0, var_w_out=1.0)


def _mixer(q_in=1.0, c_in=0.1, q_out=3.0, c_out=0.05):
    return LayerSpec(sigma_s=(0.0,), var_v=0.0, var_o=None, var_w_in=0.0, var_w_out=0.0,
                     mixer="measured", mixer_map=(q_in, c_in, q_out, c_out))


def _spec(layers, norm="pre", **kw):
    return ArchSpec(depth=len(layers), d_model=64, heads=2, seq_len=64, norm=norm,
                    activation="swiglu", causal=True, layers=tuple(layers), **kw)


def test_layerspec_mixer_validation():
    assert _mixer().measured and not ATT.measured
    with pytest.raises(SpecError, match="layers.mixer"):
        replace(_mixer(), mixer="mamba")
    with pytest.raises(SpecError, match="layers.mixer_map"):
        replace(_mixer(), mixer_map=(1.0, 0.1, 2.0))
    with pytest.raises(SpecError, match="cos_out"):
        replace(_mixer(), mixer_map=(1.0, 0.1, 2.0, 1.5))
    with pytest.raises(SpecError, match="q_in"):
        replace(_mixer(), mixer_map=(0.0, 0.1, 2.0, 0.5))
    with pytest.raises(SpecError, match="needs mixer"):
        replace(ATT, mixer_map=(1.0, 0.1, 2.0, 0.5))
    assert LayerSpec.from_dict({**_mixer().__dict__}).mixer_map == (1.0, 0.1, 3.0, 0.05)


@pytest.mark.parametrize("norm", ["pre", "none", "post"])
def test_measured_map_exact_at_the_measured_input(norm):
    """The map returns the measured output when the theory's input is the measured one
    (post-LN: q = 1 in and out, the cosine's increment)."""
    q_in = 1.0 if norm == "post" else 2.0
    q_out = 1.0 if norm == "post" else 5.0
    lay = _mixer(q_in, 0.2, q_out, 0.35)
    bp = BlockParams.from_spec(_spec([lay, ATT], norm=norm), 1)
    q, p, st = block_step(np.float64(q_in), np.float64(0.2 * q_in), bp)
    assert st is None
    assert q == pytest.approx(q_out, rel=1e-12)
    assert p / q == pytest.approx(0.35, abs=1e-12)
    # a different input: additive (pre / none) -- the increments are the measured ones
    if norm != "post":
        q, p, _ = block_step(np.float64(1.0), np.float64(0.5), bp)
        assert q == pytest.approx(1.0 + q_out - q_in)
        assert p == pytest.approx(0.5 + 0.35 * q_out - 0.2 * q_in)
    # pre-LN scale factor: the increments are divided by the state's scale S
    if norm == "pre":
        q, p, _ = block_step(np.float64(1.0), np.float64(0.5), bp, branch_scale=0.5)
        assert q == pytest.approx(1.0 + 0.5 * (q_out - q_in))


def test_propagate_hybrid_rows_and_verdict():
    spec = _spec([_mixer(), ATT, _mixer(4.0, 0.3, 6.0, 0.2), ATT], rho0=0.1)
    tr = depth.propagate(spec)
    cos = tr[tr.observable == "cos"].set_index("layer")["value"]
    assert list(cos.index) == [0, 1, 2, 3, 4]
    assert cos[1] == pytest.approx(0.05, abs=1e-12)  # the measured map at its input
    att_layers = set(tr[tr.observable == "entropy"]["layer"])
    assert att_layers == {2, 4}  # no attention rows for the measured mixers
    rows = depth.layer_table(spec, tr)
    assert [r.get("mixer") for r in rows] == ["measured", None, "measured", None]
    assert rows[0]["beta"] == 0.0
    assert depth.verdict(spec, tr) in ("trainable", "rank_collapse", "entropy_collapse")
    # the spec's beta: the attention layers' only
    assert spec.sigma_s == pytest.approx(math.sqrt(np.mean([1.0, 2.25])))
    # final_cos (the per-layer vectorised path, position tables) agrees with propagate
    assert float(depth.final_cos(spec)) == pytest.approx(cos[4], rel=1e-7)


def test_unfilled_mixer_is_refused():
    lay = replace(_mixer(), mixer_map=None)
    with pytest.raises(SpecError, match="mixer_map"):
        depth.propagate(_spec([ATT, lay]))


def test_final_cos_per_layer_base_is_the_spec_rms():
    """final_cos of a per-layer spec without a beta grid scales each layer's own score std
    (it took layer 1's RMS as the base, wrong where layers differ)."""
    b = replace(ATT, sigma_s=(3.0, 4.0))
    spec = _spec([ATT, b, ATT, b], rho0=0.1)
    tr = depth.propagate(spec)
    last = float(tr[(tr.observable == "cos") & (tr.layer == 4)]["value"].iloc[0])
    assert float(depth.final_cos(spec)) == pytest.approx(last, rel=1e-7)


def test_glu_shift_kernel_against_sampling():
    """gpt-oss's up branch u + 1 (docs/theory.md §2.5.3): E[phi(g)^2 (u + 1)^2] and the
    cross moment with independent gate and up pre-activations of moments (q1, p1), against
    2e5 samples (s.e. ~ 0.3 %)."""
    from sigprop.theory.blocks import mlp_map

    rng = np.random.default_rng(0)
    q1, c = 0.3, 0.4
    n = 200_000
    z = rng.standard_normal((4, n))
    s = math.sqrt(q1)
    g_a, g_c = s * z[0], s * (c * z[0] + math.sqrt(1 - c * c) * z[1])
    u_a, u_c = s * z[2], s * (c * z[2] + math.sqrt(1 - c * c) * z[3])
    gelu = lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))  # noqa: E731
    fa, fc = gelu(g_a), gelu(g_c)
    want_q = np.mean((fa * (u_a + 1)) ** 2)
    want_p = np.mean(fa * (u_a + 1) * fc * (u_c + 1))
    q, p = mlp_map(1.0, c, activation="geglu", var_w_in=q1, var_w_out=1.0, var_b=0.0,
                   glu_shift=1.0)
    assert float(q) == pytest.approx(want_q, rel=0.02)
    assert float(p) == pytest.approx(want_p, rel=0.03)
    q0, _ = mlp_map(1.0, c, activation="geglu", var_w_in=q1, var_w_out=1.0, var_b=0.0)
    assert float(q) > 3 * float(q0)  # the shift dominates at small q1
    with pytest.raises(SpecError, match="glu_shift"):
        replace(ATT, glu_shift=-1.0)
