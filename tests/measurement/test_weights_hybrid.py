"""The weight reader on hybrid stacks (docs/theory.md §2.8.1): blocks without an attention
site are measured mixers (``LayerSpec.mixer``), the attention blocks are read as before; a
small HuggingFace Jamba (Mamba block, then attention + MoE) built offline."""

from __future__ import annotations

import pytest
import torch

from sigprop.measurement.weight_table import WeightTable
from sigprop.measurement.weights import MEASURED_MIXER, WeightReader
from sigprop.models.arch import structure_spec
from sigprop.spec import ArchSpec

transformers = pytest.importorskip("transformers")


def _jamba():
    from sigprop.models.zoo import small_config

    d, _ = small_config("jamba")
    d = dict(d)
    d.pop("model_type", None)
    cfg = transformers.AutoConfig.for_model("jamba", **d)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval(), cfg


def _read(model, vocab):
    w = WeightReader(model)
    with w, torch.no_grad():
        model(torch.randint(0, vocab, (1, 12), generator=torch.Generator().manual_seed(0)))
    return w, w.read()


def test_reader_marks_non_attention_blocks_measured():
    model, cfg = _jamba()
    w, table = _read(model, cfg.vocab_size)
    assert len(table.layers) == cfg.num_hidden_layers == 2
    assert table.layers[0] is MEASURED_MIXER and table.layers[0].mixer_map is None
    att = table.layers[1]
    assert not att.measured and att.moe_experts is not None
    # the attention block's value variance off its state_dict
    Wv = model.model.layers[1].self_attn.v_proj.weight.detach().double()
    g = model.model.layers[1].input_layernorm.weight.detach().double()
    assert att.var_v == pytest.approx(float((Wv * g).pow(2).sum() / Wv.shape[0]), rel=1e-4)
    assert {h["layer"] for h in table.heads} == {2}
    assert table.structure[0]["mixer"] == "measured"
    assert "mamba" in table.structure[0]["mixer_modules"]
    assert any("layer 1: no attention" in n for n in table.notes)
    assert all(x == table.scale[1] for x in table.scale)
    # averaging draws keeps the measured mixer and the heads of the attention layer
    avg = WeightTable.average([table, table])
    assert avg.layers[0].measured and [h["layer"] for h in avg.heads] == \
        [h["layer"] for h in table.heads]
    spec, notes = structure_spec(ArchSpec(depth=2, d_model=64, heads=4, seq_len=12), cfg,
                                 table)
    assert spec is not None and spec.norm == "pre"
    assert any("hybrid stack: layer(s) 1 have no attention" in n for n in notes)


def test_reader_refuses_a_stack_without_attention():
    model, cfg = _jamba()
    w = WeightReader(model)
    w.sites = [None] * len(w.sites)
    with w, torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, 12)))
    with pytest.raises(ValueError, match="no block has an attention"):
        w.read()
