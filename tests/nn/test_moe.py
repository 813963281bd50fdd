"""Mixture-of-experts MLP: theory (docs/theory.md §2.5.2) against sigprop's torch MoE layer
built from the same LayerSpec, on Gaussian inputs at q = 1 and cosine rho.

Each check is the mean of 2 seeds: one seed holds only E = 8 experts and one router, whose
draws move the branch variance and cosine by ~0.01-0.02 at d = 256 (the router's logits of a
sequence share its common direction); two seeds keep that well inside the 0.03 tolerance."""

import numpy as np
import pytest
import torch

from sigprop.nn.model import SigpropTransformer, moe_gates
from sigprop.spec import ArchSpec, LayerSpec
from sigprop.theory import moe
from sigprop.theory.blocks import BlockParams, mlp_map

D, FF, E, B, T = 256, 512, 8, 32, 16
TOL = 0.03


def _spec(k, rstd, weighting="softmax_norm", **kw):
    lay = LayerSpec(sigma_s=(1.0,) * 4, var_v=1.0, var_o=None, var_w_in=2.0, var_w_out=1.0,
                    moe_experts=E, moe_top_k=k, moe_router_var=rstd**2 * D,
                    moe_weighting=weighting, **kw)
    return ArchSpec(depth=1, d_model=D, heads=4, d_ff=FF, norm="pre", activation="relu",
                    layers=[lay], seq_len=T)


def _measure(spec, rho, seeds=(0, 1)):
    """(branch variance, cosine as the ratio of the mean off-diagonal to the mean diagonal
    Gram entry) of the MoE branch, averaged over the seeds."""
    out = []
    for seed in seeds:
        m = SigpropTransformer(spec, n_seeds=1, seed=seed, dtype=torch.float64)
        g = torch.Generator().manual_seed(1000 + seed)
        c = torch.randn(1, B, 1, D, generator=g, dtype=torch.float64)
        z = torch.randn(1, B, T, D, generator=g, dtype=torch.float64)
        with torch.no_grad():
            y = m.blocks[0].mlp(rho**0.5 * c + (1 - rho) ** 0.5 * z)
        G = torch.einsum("sbtd,sbud->sbtu", y, y) / D
        diag = G.diagonal(dim1=-2, dim2=-1)
        off = (G.sum((-1, -2)) - diag.sum(-1)).mean() / (T * (T - 1))
        out.append((float(diag.mean()), float(off / diag.mean())))
    return np.mean(out, axis=0)


def _theory(spec, rho, dense=False):
    bp = BlockParams.from_spec(spec, 1)
    q, p = mlp_map(1.0, rho, activation="relu", var_w_in=2.0, var_w_out=1.0, var_b=0.0,
                   moe=None if dense else bp.moe)
    return float(q), float(p / q)


@pytest.mark.parametrize("rho", [0.2, 0.8])
@pytest.mark.parametrize("rstd", [0.02, 1.0])
@pytest.mark.parametrize("k", [1, 2])
def test_moe_branch_matches_theory(k, rstd, rho):
    spec = _spec(k, rstd)
    qm, cm = _measure(spec, rho)
    qt, ct = _theory(spec, rho)
    assert abs(qm - qt) < TOL, (qm, qt)
    assert abs(cm - ct) < TOL, (cm, ct)


def test_dense_theory_misses_moe():
    """Control: the dense-MLP theory (no routing factors) is off by far more than the
    tolerance on the same measurement, so the test above can fail."""
    spec = _spec(2, 0.02)
    qm, cm = _measure(spec, 0.2)
    qd, cd = _theory(spec, 0.2, dense=True)
    assert abs(qm - qd) > 5 * TOL and abs(cm - cd) > 5 * TOL


def test_shared_expert_and_unnormalised_weights():
    """Qwen2-MoE's layout: softmax weights not renormalised, a shared expert behind a
    sigmoid gate."""
    spec = _spec(2, 1.0, "softmax", moe_shared_var_in=2.0, moe_shared_var_out=1.0,
                 moe_shared_gate_var=1.0)
    qm, cm = _measure(spec, 0.5)
    qt, ct = _theory(spec, 0.5)
    assert abs(qm - qt) < TOL and abs(cm - ct) < TOL, (qm, qt, cm, ct)


def test_gates_match_theory_rule():
    """The torch routing weights are the theory's :func:`moe.gates`, for every rule."""
    logits = np.random.default_rng(3).standard_normal((50, 8)) * 2
    for w in moe.WEIGHTINGS:
        got = moe_gates(torch.as_tensor(logits), 3, w).numpy()
        np.testing.assert_allclose(got, moe.gates(logits, 3, w), rtol=1e-12, atol=1e-15)
