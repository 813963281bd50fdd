"""The weight reader fills ``LayerSpec.moe_*`` (docs/theory.md §2.5.2) on small HuggingFace
mixture-of-experts models built offline from shrunk configs (Mixtral: top-2 of 8,
renormalised; Qwen3-MoE: unnormalised softmax weights; Qwen2-MoE: a shared expert behind a
sigmoid gate); the expected values are read straight off the state_dict, and
``structure_spec`` takes the blocks into the theory."""

from __future__ import annotations

import pytest
import torch

from sigprop.measurement.weights import WeightReader
from sigprop.models.arch import structure_spec
from sigprop.models.zoo import small_config
from sigprop.spec import ArchSpec

transformers = pytest.importorskip("transformers")


def _build(model_type, seed=0, **over):
    d, _ = small_config(model_type)
    d = dict(d)
    mt = d.pop("model_type")
    d.update(over)
    cfg = transformers.AutoConfig.for_model(mt, **d)
    torch.manual_seed(seed)
    return transformers.AutoModel.from_config(cfg).eval(), cfg


def _read(model):
    with WeightReader(model) as w, torch.no_grad():
        model(torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0)))
    return w.read()


def _expert_vars(sd, pre, ln):
    """(var_w_in, var_w_out) of fused HF experts (E, 2 ff, d) / (E, d, ff), with the gains of
    the norm in front (``ln``) and the up branch folded into the output as for dense MLPs."""
    gu = sd[pre + "experts.gate_up_proj"].double()
    dn = sd[pre + "experts.down_proj"].double()
    ff = dn.shape[-1]
    g2 = sd[ln].double().square()
    vg = float((gu[:, :ff].square() * g2).sum(-1).mean())
    vu = float((gu[:, ff:].square() * g2).sum(-1).mean())
    return vg, float(dn.square().sum(-1).mean()) * vu / vg


@pytest.mark.parametrize(("mt", "k", "weighting"), [("mixtral", 2, "softmax_norm"),
                                                   ("qwen3_moe", 8, "softmax")])
def test_reader_recovers_routed_experts(mt, k, weighting):
    model, cfg = _build(mt)
    with torch.no_grad():  # a router of std 0.3 in layer 0 (a trained-like scale)
        model.layers[0].mlp.gate.weight.normal_(0.0, 0.3)
    table = _read(model)
    sd = model.state_dict()
    E = sd["layers.0.mlp.gate.weight"].shape[0]
    for i, lay in enumerate(table.layers):
        pre, ln = f"layers.{i}.mlp.", f"layers.{i}.post_attention_layernorm.weight"
        Wr = sd[pre + "gate.weight"].double() * sd[ln].double()
        assert lay.moe_experts == E and lay.moe_top_k == k == cfg.num_experts_per_tok
        assert lay.moe_weighting == weighting and lay.moe_scale == 1.0
        assert lay.moe_router_var == pytest.approx(float(Wr.square().sum() / E), rel=1e-4)
        vin, vout = _expert_vars(sd, pre, ln)
        assert lay.var_w_in == pytest.approx(vin, rel=1e-4)
        assert lay.var_w_out == pytest.approx(vout, rel=1e-4)
        assert lay.moe_shared_var_in is None
    d = cfg.hidden_size
    assert table.layers[0].moe_router_var == pytest.approx(0.09 * d, rel=0.1)
    spec, notes = structure_spec(ArchSpec(depth=2, d_model=d, heads=cfg.num_attention_heads,
                                          seq_len=12), cfg, table)
    assert spec is not None and spec.activation == "swiglu", notes
    assert any("mixture of experts" in n for n in notes)


def test_reader_recovers_shared_expert():
    model, cfg = _build("qwen2_moe", seed=1)
    table = _read(model)
    sd = model.state_dict()
    for i, lay in enumerate(table.layers):
        pre, ln = f"layers.{i}.mlp.", f"layers.{i}.post_attention_layernorm.weight"
        g2 = sd[ln].double().square()
        assert lay.moe_experts == cfg.num_experts and lay.moe_top_k == cfg.num_experts_per_tok
        assert lay.moe_weighting == "softmax"  # norm_topk_prob False: not renormalised
        vg = float((sd[pre + "shared_expert.gate_proj.weight"].double().square() * g2)
                   .sum(-1).mean())
        vu = float((sd[pre + "shared_expert.up_proj.weight"].double().square() * g2)
                   .sum(-1).mean())
        vd = float(sd[pre + "shared_expert.down_proj.weight"].double().square().sum(-1).mean())
        assert lay.moe_shared_var_in == pytest.approx(vg, rel=1e-4)
        assert lay.moe_shared_var_out == pytest.approx(vd * vu / vg, rel=1e-4)
        wg = sd[pre + "shared_expert_gate.weight"].double()
        assert lay.moe_shared_gate_var == pytest.approx(float((wg.square() * g2).sum()),
                                                        rel=1e-4)
        vin, vout = _expert_vars(sd, pre, ln)
        assert lay.var_w_in == pytest.approx(vin, rel=1e-4)
    spec, notes = structure_spec(ArchSpec(depth=2, d_model=cfg.hidden_size,
                                          heads=cfg.num_attention_heads, seq_len=12),
                                 cfg, table)
    assert spec is not None, notes
