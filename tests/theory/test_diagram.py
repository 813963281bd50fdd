"""Trainability diagram and alpha_crit (docs/theory.md §2.7)."""

import time

import numpy as np
import pytest

from sigprop.spec import ArchSpec
from sigprop.theory import depth, diagram

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
        above = depth.final_cos(spec, beta=beta, alpha_attn=a * 1.01)
        below = depth.final_cos(spec, beta=beta, alpha_attn=a * 0.99)
        assert above < spec.rho_max <= below


def test_grid_matches_scalar_loop():
    """The vectorised grid equals a per-point scalar loop of the same map."""
    spec = ArchSpec(beta=0.5, **{**GG, "depth": 8})
    d = diagram.compute(spec, n_beta=5, n_alpha=4, with_rho=True)
    for i, b in enumerate(d.betas):
        for j, a in enumerate(d.alphas):
            one = spec.replace(beta=float(b), alpha_attn=float(a))
            ref = depth.propagate(one)
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


# Threshold certificates (issue 13: alpha_crit at depth 10000). alpha_crit only needs the side
# of rho_max the final cosine lies on; where the block is a nondecreasing map of the cosine alone
# the side is certain before the last layer (sigprop.theory.depth, module docstring). Checked
# against the full iteration over norms, attention variants, masks and activations.
_CERT_SPECS = [
    dict(norm=n, attention=a, causal=c, activation=f, sigma_b2=b, rho0=r)
    for n in ("post", "pre") for a in ("softmax", "centred", "uniform") for c in (False, True)
    for f, b, r in (("relu", 0.0, 0.0), ("tanh", 4e-4, 0.5), ("gelu", 0.0, 0.95))
] + [
    dict(norm="none", attention="uniform", activation=f, causal=c, sigma_v2=0.2, sigma_w2=0.2)
    for f in ("relu", "linear") for c in (False, True)  # homogeneous: scale factored out
]


@pytest.mark.parametrize("kw", _CERT_SPECS,
                         ids=lambda kw: "-".join(str(v) for v in kw.values()))
@pytest.mark.parametrize("rho_max", [0.5, 0.9])
def test_threshold_certificates_match_full_iteration(kw, rho_max, monkeypatch):
    from sigprop.theory import depth as theory_depth

    monkeypatch.setattr(theory_depth, "CERT_MIN_DEPTH", 1)  # certificates at any depth

    spec = ArchSpec(depth=120, seq_len=64, rho_max=rho_max, **kw)
    b = np.linspace(0.0, 1.2, 5)[:, None]
    a = np.geomspace(0.05, 1e3, 11)[None, :]
    with np.errstate(all="ignore"):
        full = theory_depth.final_cos(spec, beta=b, alpha_attn=a)
        fast = theory_depth.final_cos(spec, beta=b, alpha_attn=a, threshold=rho_max)
    assert np.array_equal(np.isnan(full), np.isnan(fast))
    ok = ~np.isnan(full)
    assert np.array_equal(full[ok] < rho_max, fast[ok] < rho_max)
    if kw["norm"] == "pre":
        assert np.array_equal(full[ok], fast[ok])  # not a 1-D map: no certificate used


@pytest.mark.parametrize("kw", [
    dict(), dict(depth=60), dict(depth=200, beta=0.5, rho0=0.0, sigma_v2=0.2, sigma_w2=0.2,
                                 sigma_b2=4e-4),
    dict(depth=100, causal=True, alpha_mlp=0.5), dict(depth=100, attention="centred"),
    dict(depth=100, attention="uniform", activation="tanh"),
    dict(depth=200, activation="gelu", alpha_mlp=0.5), dict(depth=60, norm="pre"),
    dict(depth=300, beta=0.5, rho0=0.0, sigma_v2=0.2, sigma_w2=0.2, sigma_b2=4e-4, causal=True),
])
def test_alpha_crit_with_certificates_equals_full_iteration(kw, monkeypatch):
    """alpha_crit with early-stopping probes agrees with the search iterating every layer of
    every probe to relative 1e-6 (observed: bit for bit; only a final cosine within roundoff
    of rho_max could flip a probe)."""
    from sigprop.theory import depth as theory_depth

    spec = ArchSpec(**kw)
    betas = np.linspace(0.0, 1.5, 7)
    monkeypatch.setattr(theory_depth, "CERT_MIN_DEPTH", 1)  # certificates at any depth
    fast = diagram.alpha_crit(spec, betas)
    monkeypatch.setattr(theory_depth, "CERT_MIN_DEPTH", 10**9)  # certificates off
    full = diagram.alpha_crit(spec, betas)
    assert np.array_equal(np.isnan(fast), np.isnan(full))
    assert np.array_equal(np.isinf(fast), np.isinf(full))
    fin = np.isfinite(full)
    np.testing.assert_allclose(fast[fin], full[fin], rtol=1e-6, atol=0)
