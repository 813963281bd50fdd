"""The weight reader fills ``LayerSpec.sink_logit`` and ``gate_var`` / ``gate_bias2``
(docs/theory.md §2.4.3-2.4.4) from small HuggingFace gpt-oss and Qwen3-Next models built
offline from shrunk configs; the expected values are read straight off the state_dict."""

from __future__ import annotations

import pytest
import torch

from sigprop.measurement.probe_sites import find_attention, find_blocks
from sigprop.measurement.weights import WeightReader

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=128,
             layer_types=["full_attention"] * 2)


def _read(model):
    with WeightReader(model) as w, torch.no_grad():
        model(torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0)))
    return w.read()


def test_reader_recovers_gpt_oss_sinks():
    cfg = transformers.GptOssConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    sd = model.state_dict()
    with torch.no_grad():  # trained-like sinks: spread over several nats, one per head
        for i in range(2):
            sd[f"model.layers.{i}.self_attn.sinks"].copy_(torch.linspace(-3.0, 4.0, 4) + i)
    table = _read(model)
    for i, lay in enumerate(table.layers):
        want = sd[f"model.layers.{i}.self_attn.sinks"].double().tolist()
        assert lay.sink_logit == pytest.approx(want, abs=1e-6)
        assert lay.gate_var is None
        assert len(lay.sigma_s) == 4


def test_reader_recovers_qwen3_next_gate():
    cfg = transformers.Qwen3NextConfig(**SMALL, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=32,
                                       shared_expert_intermediate_size=32,
                                       linear_num_value_heads=2, linear_num_key_heads=2)
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # a gate of std 0.5 in layer 0, the init's in layer 1
        model.model.layers[0].self_attn.q_proj.weight.unflatten(0, (4, 2, 16))[:, 1].normal_(
            0.0, 0.5 / 8.0)
    site = find_attention(find_blocks(model)[0][1])
    assert site.q_gate == "per_head" and site.n_heads == 4
    table = _read(model)
    sd = model.state_dict()
    for i, lay in enumerate(table.layers):
        Wq = sd[f"model.layers.{i}.self_attn.q_proj.weight"].double().unflatten(0, (4, 2, 16))
        Wg = Wq[:, 1].flatten(0, 1)
        # the norm in front is Qwen3-Next's (1 + w) RMSNorm at w = 0: gains 1
        want = float(Wg.pow(2).sum() / Wg.shape[0])
        assert lay.gate_var == pytest.approx(want, rel=1e-4)
        assert lay.gate_bias2 == 0.0
        assert lay.sink_logit is None
        assert len(lay.sigma_s) == 4  # the query heads, not the gate's rows
    assert table.layers[0].gate_var == pytest.approx(0.25, rel=0.1)  # 64 x 64 draws
