"""Trainability diagram and alpha_crit (THEORY §2.7)."""

import time

import numpy as np
import pytest

from sigprop.spec import ArchSpec
from sigprop.theory import blocks, diagram

GG = dict(depth=60, rho0=0.0, sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4)


def test_regions_and_alpha_crit_definition():
    spec = ArchSpec(beta=0.5, **GG)
    d = diagram.compute(spec, n_beta=64, n_alpha=64)
    assert set(np.unique(d.regime)) == {0, 1, 2}  # all three regimes appear
    assert np.all(d.regime[d.betas > d.beta_c] == diagram.ENTROPY_COLLAPSE)
    # alpha_crit is where rho_L crosses rho_max: check on both sides for a few betas
    for beta in (0.2, 0.8, 1.3):
        a = float(diagram.alpha_crit(spec, [beta])[0])
        assert np.isfinite(a) and a > 0
        above = blocks.final_cos(spec, beta=beta, alpha_attn=a * 1.01)
        below = blocks.final_cos(spec, beta=beta, alpha_attn=a * 0.99)
        assert above < spec.rho_max <= below


def test_grid_matches_scalar_loop():
    """The vectorised grid equals a per-point scalar loop of the same map."""
    spec = ArchSpec(beta=0.5, **{**GG, "depth": 8})
    d = diagram.compute(spec, n_beta=5, n_alpha=4, with_rho=True)
    for i, b in enumerate(d.betas):
        for j, a in enumerate(d.alphas):
            one = spec.replace(beta=float(b), alpha_attn=float(a))
            ref = blocks.propagate(one)
            cos_l = ref[(ref.observable == "cos") & (ref.layer == 8)]["value"].item()
            assert d.rho_l[i, j] == pytest.approx(cos_l, abs=1e-9)


def test_regime_from_alpha_crit_equals_full_grid():
    # the regime grid is read off alpha_crit (monotone in alpha); iterate every point to check
    spec = ArchSpec(beta=0.5, **{**GG, "depth": 30})
    d = diagram.compute(spec, n_beta=48, n_alpha=48, with_rho=True)
    below = d.betas <= d.beta_c
    from_grid = np.where(d.rho_l >= spec.rho_max, diagram.RANK_COLLAPSE, diagram.TRAINABLE)
    assert np.array_equal(d.regime[below], from_grid[below])
    assert (d.regime == diagram.RANK_COLLAPSE).any() and (d.regime == diagram.TRAINABLE).any()


def test_alpha_crit_grows_with_depth():
    # gg25 Fig. 1(c): deeper models need stronger residuals (ReLU: no chaotic phase)
    crit = [float(diagram.alpha_crit(ArchSpec(beta=0.5, **{**GG, "depth": L}))[0])
            for L in (6, 24, 96)]
    assert crit[0] < crit[1] < crit[2]


def test_uniform_attention_never_entropy_collapses():
    spec = ArchSpec(attention="uniform", **{**GG, "depth": 6})
    d = diagram.compute(spec, n_beta=8, n_alpha=8)
    assert not np.any(d.regime == diagram.ENTROPY_COLLAPSE)


def test_full_diagram_is_fast():
    spec = ArchSpec(**GG)
    diagram.compute(spec, n_beta=16, n_alpha=16)  # warm the tables
    t0 = time.perf_counter()
    diagram.compute(spec, n_beta=256, n_alpha=256)
    assert time.perf_counter() - t0 < 1.5  # 60 layers x 65536 points, vectorised
