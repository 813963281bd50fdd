"""Routing factors of a mixture-of-experts MLP (docs/theory.md §2.5.2) and their spec fields."""

import numpy as np
import pytest

from sigprop.spec import ArchSpec, LayerSpec, SpecError
from sigprop.theory import moe
from sigprop.theory.blocks import BlockParams, mlp_map

LAY = dict(sigma_s=(1.0,), var_v=1.0, var_o=None, var_w_in=2.0, var_w_out=1.0)


def test_two_experts_top1_exact():
    """E = 2, k = 1: the same expert iff the logit differences have the same sign, which
    have correlation rho: B = 1/2 + arcsin(rho) / pi exactly (any logit scale)."""
    rho = np.array([-0.5, 0.0, 0.2, 0.5, 0.8, 0.95])
    A, B = moe.factors(2, 1, 4.0, "softmax_norm", 1.0, rho)
    np.testing.assert_allclose(A, 1.0)
    np.testing.assert_allclose(B, 0.5 + np.arcsin(rho) / np.pi, atol=8e-3)  # 4 s.e.


def test_limits():
    """rho = 1 gives A; rho = 0 with renormalised weights gives 1/E (independent routes);
    a vanishing router (s = 0) gives uniform softmax weights 1/E on a random top-k."""
    A, B = moe.factors(8, 2, 0.3, "softmax_norm", 1.0, np.array([0.0, 1.0]))
    assert B[1] == pytest.approx(A[1])
    assert B[0] == pytest.approx(1 / 8, abs=6e-3)
    A0, _ = moe.factors(8, 2, 0.0, "softmax", 1.0, 0.5)
    assert float(A0) == pytest.approx(2 / 64, rel=1e-9)  # two weights 1/8
    A1, _ = moe.factors(8, 2, 0.0, "softmax_norm", 1.0, 0.5)
    assert float(A1) == pytest.approx(0.5, rel=1e-9)


def test_mlp_map_factorises():
    """The routed map is the dense map times (A, B); the shared expert adds its dense map
    times its gate kernel."""
    lay = LayerSpec(**LAY, moe_experts=4, moe_top_k=2, moe_router_var=1.0, moe_scale=2.0)
    spec = ArchSpec(depth=1, d_model=64, heads=1, norm="pre", layers=[lay])
    bp = BlockParams.from_spec(spec, 1)
    q, p = mlp_map(1.0, 0.4, activation="relu", var_w_in=2.0, var_w_out=1.0, var_b=0.0,
                   moe=bp.moe)
    qd, pd = mlp_map(1.0, 0.4, activation="relu", var_w_in=2.0, var_w_out=1.0, var_b=0.0)
    A, B = moe.factors(4, 2, 1.0, "softmax_norm", 1.0, 0.4)
    np.testing.assert_allclose([q, p], [4 * A * qd, 4 * B * pd], rtol=1e-12)


@pytest.mark.parametrize(("kw", "field"), [
    (dict(moe_top_k=2), "layers.moe_top_k"),
    (dict(moe_experts=4, moe_top_k=5), "layers.moe_top_k"),
    (dict(moe_experts=0), "layers.moe_experts"),
    (dict(moe_experts=4, moe_weighting="topk"), "layers.moe_weighting"),
    (dict(moe_experts=4, moe_router_var=-1.0), "layers.moe_router_var"),
    (dict(moe_experts=4, moe_shared_var_in=1.0), "layers.moe_shared_var_out"),
    (dict(moe_experts=4, moe_shared_gate_var=1.0), "layers.moe_shared_gate_var"),
])
def test_spec_errors(kw, field):
    with pytest.raises(SpecError) as err:
        LayerSpec(**LAY, **kw)
    assert err.value.field == field
