"""sigprop.models.loading and sigprop.models.presets: HF config -> ArchSpec, models at init, local
weights.

No network: an autouse fixture makes every socket connection fail, so a hidden hub call would
raise. Models are shrunk configs of the real families (built in ~0.1 s each)."""

from __future__ import annotations

import json
import math
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from sigprop import models as hf
from sigprop.measurement.probe import Probe
from sigprop.models.presets import PRESETS, shrink
from sigprop.spec import SpecError
from sigprop.theory import blocks

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512)
FAMILY_PRESETS = ["bert-base-uncased", "roberta-base", "gpt2", "llama-3.2-1b", "qwen2-0.5b"]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _get(d: dict, *keys):
    return next(d[k] for k in keys if k in d)


def _small(name: str, **over):
    return hf.load_config(shrink(PRESETS[name], **{**SMALL, **over}))


# --------------------------------------------------------------------------------------------
# presets and spec mapping
# --------------------------------------------------------------------------------------------
#: what each family is, from its architecture (not from sigprop's code)
EXPECTED = {  # norm, ln_kind, activation, causal
    "bert-base-uncased": ("post", "layernorm", "gelu", False),
    "roberta-base": ("post", "layernorm", "gelu", False),
    "gpt2": ("pre", "layernorm", "gelu", True),
    "llama-3.2-1b": ("pre", "rms", "swiglu", True),
    "qwen2-0.5b": ("pre", "rms", "swiglu", True),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_its_config(name):
    p = PRESETS[name]
    cfg = hf.load_config(name)
    assert cfg.model_type == p["model_type"]
    assert cfg.hidden_size == _get(p, "hidden_size", "n_embd")
    assert cfg.num_hidden_layers == _get(p, "num_hidden_layers", "n_layer")
    assert cfg.vocab_size == p["vocab_size"]


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_spec_from_config_matches_the_preset(name):
    p = PRESETS[name]
    spec, info = hf.spec_and_info(name)
    d = _get(p, "hidden_size", "n_embd")
    heads = _get(p, "num_attention_heads", "n_head")
    assert spec.depth == _get(p, "num_hidden_layers", "n_layer")
    assert spec.d_model == d
    assert spec.heads == heads
    assert info.n_heads == heads
    assert info.n_kv_heads == p.get("num_key_value_heads", heads)
    assert spec.ff == (p.get("intermediate_size") or p.get("n_inner") or 4 * d)
    assert (spec.norm, spec.ln_kind, spec.activation, spec.causal) == EXPECTED[name]
    assert spec.init_std == p["initializer_range"]
    assert spec.sigma_b2 == 0.0
    assert spec.seq_len == 512  # min(max positions, 512); RoBERTa: 514 - (pad + 1) = 512
    assert info.vocab_size == p["vocab_size"]
    assert info.tied_embeddings == p.get("tie_word_embeddings", True)
    assert info.positions == ("rope" if "rope_theta" in p else "learned")
    if "rope_theta" in p:
        assert info.rope_theta == p["rope_theta"]
        assert any(n.startswith("RoPE") for n in info.notes)
    if p.get("num_key_value_heads", heads) != heads:
        assert any(n.startswith("GQA") for n in info.notes)
    if EXPECTED[name][2] == "swiglu":
        assert any(n.startswith("SwiGLU") for n in info.notes)


def test_bert_base_beta_eff_gg25_b1():
    # gg25 B.1: 0.02^2 * 768 / sqrt(log 512) ~= 0.123
    expected = 0.02**2 * 768 / math.sqrt(math.log(512))
    spec = hf.spec_from_config("bert-base-uncased")
    assert spec.beta_eff == pytest.approx(expected, rel=1e-12)
    assert abs(spec.beta_eff - 0.123) < 5e-4
    tr = hf.translations("bert-base-uncased")
    assert tr["beta"] == pytest.approx(expected, rel=1e-12)
    assert tr["sigma_s"] == pytest.approx(0.02**2 * 768, rel=1e-12)
    assert tr["beta_c"] == pytest.approx(math.sqrt(2 / (1 - 1 / 3)))  # rho0 = 1/3 (token type)
    assert hf.translations("bert-base-uncased", rho=0.0)["beta_c"] == pytest.approx(math.sqrt(2))


def test_seq_len_argument_and_limits():
    assert hf.spec_from_config("gpt2", seq_len=1024).seq_len == 1024
    with pytest.raises(SpecError, match="seq_len"):
        hf.spec_from_config("bert-base-uncased", seq_len=513)  # learned positions stop at 512
    info = hf.describe(hf.load_config("qwen2-0.5b"), seq_len=200_000)  # RoPE: allowed, noted
    assert any("exceeds max_position_embeddings" in n for n in info.notes)


def test_gpt2_residual_scaling_and_embedding_absorption():
    std, d, L = 0.02, 768, 12
    raw = hf.spec_from_config("gpt2", absorb_embedding=False)
    assert raw.sigma_o2 == pytest.approx(std**2 * d / (2 * L))
    assert raw.sigma_w2_out == pytest.approx(std**2 * 4 * d / (2 * L))
    assert not raw.mean_field_mode and raw.var_v == pytest.approx(std**2 * d)
    q0 = 2 * std**2  # wte + wpe
    assert hf.describe("gpt2").embed_q == pytest.approx(q0)
    assert hf.spec_from_config("gpt2").sigma_o2 == pytest.approx(std**2 * d / (2 * L) / q0)


def test_score_multipliers_yarn_unscaled_gpt2_and_qk_norm():
    yarn = dict(PRESETS["llama-3.2-1b"],
                rope_scaling={"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 8192})
    s = hf.spec_from_config(yarn)
    assert (s.scaling, s.scaling_param) == ("yarn", 4.0)
    assert s.multiplier == pytest.approx((0.1 * math.log(4.0) + 1) ** 2)
    assert hf.spec_from_config("llama-3.2-1b").scaling == "none"  # llama3 type: factor 1
    g = hf.spec_from_config(dict(PRESETS["gpt2"], scale_attn_weights=False))
    assert g.scaling == "tau" and g.multiplier == pytest.approx(math.sqrt(64))
    q3 = hf.spec_and_info(shrink(_default_dict("qwen3"), **SMALL))
    assert q3[1].qk_norm and q3[0].sigma_s == pytest.approx(1.0)


def test_unknown_model_lists_presets_on_one_line(tmp_path):
    for bad in ("no-such-model", str(tmp_path / "missing")):
        with pytest.raises(SpecError) as err:
            hf.load_config(bad)
        msg = str(err.value)
        assert err.value.field == "model" and "\n" not in msg and repr(bad) in msg
        assert all(name in msg for name in PRESETS)
    with pytest.raises(SpecError, match="not supported"):
        hf.spec_from_config({"model_type": "t5"})


def test_local_config_file_and_folder(tmp_path):
    d = shrink(PRESETS["gpt2"], **SMALL)
    (tmp_path / "config.json").write_text(json.dumps(d))
    for src in (tmp_path, tmp_path / "config.json", str(tmp_path)):
        cfg = hf.load_config(src)
        assert (cfg.model_type, cfg.n_embd, cfg.n_layer) == ("gpt2", 64, 2)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SpecError, match="not a readable JSON"):
        hf.load_config(tmp_path / "bad.json")
    (tmp_path / "nomt.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(SpecError, match="no model_type"):
        hf.load_config(tmp_path / "nomt.json")


# --------------------------------------------------------------------------------------------
# models at init
# --------------------------------------------------------------------------------------------
def _default_dict(model_type: str) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type).to_dict()


def _family_configs():
    out = {n: shrink(PRESETS[n], **SMALL) for n in FAMILY_PRESETS}
    out.update({t: shrink(_default_dict(t), **SMALL) for t in ("mistral", "qwen3")})
    return out


@pytest.mark.parametrize("family", list(_family_configs()))
def test_model_at_init_builds_deterministically(family):
    cfg = hf.load_config(_family_configs()[family])
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = hf.model_at_init(cfg, seed=0)
    assert torch.equal(torch.rand(3), before)  # the caller's RNG is left alone
    b = hf.model_at_init(cfg, seed=0, attn_implementation="sdpa")
    c = hf.model_at_init(cfg, seed=1)
    assert not a.training and not hasattr(a, "lm_head")
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    w = next(k for k in sa if k.endswith("weight") and sa[k].dim() == 2 and "emb" not in k)
    assert not torch.equal(sa[w], sc[w])
    spec = hf.spec_from_config(cfg, seq_len=16)
    assert len(hf.qkv_names(a)) == spec.depth
    ids = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        assert torch.isfinite(a(input_ids=ids).last_hidden_state).all()


def test_model_uses_hf_init_and_small_vocab():
    cfg = _small("bert-base-uncased", hidden=256, intermediate=1024)
    m = hf.model_at_init(cfg, vocab_size=100)
    assert m.get_input_embeddings().weight.shape == (100, 256)
    assert cfg.vocab_size == 512  # the config itself is untouched
    q = torch.cat([b.attention.self.query.weight.detach().flatten() for b in m.encoder.layer])
    # n = 131072 draws: the sample std's relative error is 1/sqrt(2n) = 0.002; torch's default
    # (kaiming uniform) would give 1/sqrt(3 * 256) = 0.036, so 2% separates the two
    assert float(q.std()) == pytest.approx(0.02, rel=0.02)
    assert all(not b.attention.self.query.bias.detach().any() for b in m.encoder.layer)
    assert torch.equal(m.encoder.layer[0].output.LayerNorm.weight, torch.ones(256))
    g = hf.model_at_init(_small("gpt2", hidden=256, intermediate=1024))
    cp = torch.cat([b.attn.c_proj.weight.detach().flatten() for b in g.h])  # 1/sqrt(2L) rule
    assert float(cp.std()) == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.02)
    with pytest.raises(SpecError, match="vocab_size"):
        hf.model_at_init(_small("roberta-base"), vocab_size=1)  # pad_token_id = 1


@pytest.mark.parametrize("name", ["bert-base-uncased", "gpt2", "llama-3.2-1b"])
def test_block1_matches_the_mapped_spec(name):
    """Agreement: the first block's output q (in units of the input's q0) and the input cosine
    against the theory's block map on the mapped spec. q after block 1 depends only on the
    diagonal statistics (Y2, E phi^2), not on the cross terms. Width 256, two initialisations:
    the weights' finite-width fluctuations (relative ~ sqrt(2/d) = 9% per token, much less
    after averaging over 256 tokens) leave a few % error; 12% tolerance."""
    cfg = _small(name, layers=2, hidden=256, heads=4, intermediate=512, vocab=4096)
    T = 64
    spec = hf.spec_from_config(cfg, seq_len=T)
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(4096, generator=g)[:T] for _ in range(4)])
    qs, rhos = [], []
    for seed in range(2):
        m = hf.model_at_init(cfg, seed=seed)
        with torch.no_grad(), Probe(m, attention=None, keep_hidden=False) as p:
            m(input_ids=ids)
        qs.append(float(p.hidden_stats[1]["q"].mean() / p.hidden_stats[0]["q"].mean()))
        rhos.append(float(p.hidden_stats[0]["cos"].mean()))
    # distinct tokens: cosine from the tables shared by all positions (1/3 for BERT, else 0);
    # spread of one |s|^2 over d = 256 features: sqrt(2/256) * 2/9 ~ 0.02
    assert np.mean(rhos) == pytest.approx(spec.rho0, abs=0.06)
    q1 = float(blocks.block_step(1.0, spec.rho0, blocks.BlockParams.from_spec(spec))[0])
    assert np.mean(qs) == pytest.approx(q1, rel=0.12)
    if spec.norm == "pre":  # without absorbing q0 the prediction is off by a large factor
        raw = hf.spec_from_config(cfg, seq_len=T, absorb_embedding=False)
        q_raw = float(blocks.block_step(1.0, 0.0, blocks.BlockParams.from_spec(raw))[0])
        assert q1 / q_raw > 2


# --------------------------------------------------------------------------------------------
# local weights
# --------------------------------------------------------------------------------------------
class NotATensor:
    pass


def _equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_safetensors_weights_load_and_flag_trained(tmp_path):
    from safetensors.torch import save_file

    cfg = _small("bert-base-uncased")
    src = hf.model_at_init(cfg, seed=0)
    sd = {f"bert.{k}": v.contiguous().clone() for k, v in src.state_dict().items()}
    sd["cls.predictions.bias"] = torch.zeros(512)  # a head tensor the base model lacks
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "training_args.bin").write_bytes(b"pickle, never read")
    dst = hf.model_at_init(cfg, seed=1)
    assert not _equal(src, dst)
    rep = hf.load_local_weights(dst, tmp_path)
    assert rep.trained and rep.files == ["model.safetensors"]
    assert rep.unexpected == ["cls.predictions.bias"] and _equal(src, dst)
    small = hf.model_at_init(cfg, seed=2, vocab_size=100)  # embedding table cut to 100 rows
    rep = hf.load_local_weights(small, tmp_path)
    assert rep.truncated == ["embeddings.word_embeddings.weight"]
    assert torch.equal(small.embeddings.word_embeddings.weight,
                       src.embeddings.word_embeddings.weight[:100])


def test_pickle_checkpoints_only_with_weights_only(tmp_path):
    cfg = _small("gpt2")
    src, dst = hf.model_at_init(cfg, seed=0), hf.model_at_init(cfg, seed=1)
    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save(src.state_dict(), plain / "pytorch_model.bin")  # tensors only: accepted
    torch.save({"args": NotATensor()}, plain / "training_args.bin")  # not a weight file
    rep = hf.load_local_weights(dst, plain)
    assert rep.trained and rep.files == ["pytorch_model.bin"] and _equal(src, dst)

    evil = tmp_path / "evil"
    evil.mkdir()
    torch.save({"w": torch.zeros(2), "obj": NotATensor()}, evil / "pytorch_model.bin")
    with pytest.raises(SpecError) as err:
        hf.load_local_weights(dst, evil)
    assert "refusing to unpickle" in str(err.value) and "\n" not in str(err.value)
    torch.save({"w": torch.zeros(2), "obj": NotATensor()}, evil / "pytorch_model.pt")
    (evil / "pytorch_model.bin").unlink()
    with pytest.raises(SpecError, match="convert to safetensors"):
        hf.load_local_weights(dst, evil)


def test_folder_without_weights_is_not_trained(tmp_path):
    m = hf.model_at_init(_small("gpt2"))
    (tmp_path / "config.json").write_text("{}")
    assert hf.load_local_weights(m, tmp_path).trained is False
    with pytest.raises(SpecError):
        hf.load_local_weights(m, tmp_path / "nope")


# --------------------------------------------------------------------------------------------
# module names, and the source never trusts remote code
# --------------------------------------------------------------------------------------------
def test_qkv_names_per_family():
    bert = hf.model_at_init(_small("bert-base-uncased"))
    e = hf.qkv_names(bert)[1]
    assert e["q"] == "encoder.layer.1.attention.self.query"
    assert (e["k"], e["v"]) == ("encoder.layer.1.attention.self.key",
                                "encoder.layer.1.attention.self.value")
    assert e["o"] == "encoder.layer.1.attention.output.dense"
    assert (e["mlp_in"], e["mlp_out"]) == (["encoder.layer.1.intermediate.dense"],
                                           "encoder.layer.1.output.dense")
    gpt = hf.model_at_init(_small("gpt2"))
    e = hf.qkv_names(gpt)[0]
    assert e["q"] is None and e["qkv"] == "h.0.attn.c_attn" and e["fused"] == "concat"
    assert e["qkv_slices"] == {"q": (0, 64), "k": (64, 128), "v": (128, 192)}
    assert e["out_axis"] == 1 and gpt.h[0].attn.c_attn.weight.shape == (64, 192)
    assert (e["o"], e["mlp_in"], e["mlp_out"]) == ("h.0.attn.c_proj", ["h.0.mlp.c_fc"],
                                                   "h.0.mlp.c_proj")
    llama = hf.model_at_init(_small("llama-3.2-1b"))
    e = hf.qkv_names(llama)[0]
    assert e["q"] == "layers.0.self_attn.q_proj" and e["o"] == "layers.0.self_attn.o_proj"
    assert e["mlp_in"] == ["layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"]
    assert e["mlp_out"] == "layers.0.mlp.down_proj"
    names = dict(llama.named_modules())
    for m, entries in ((bert, hf.qkv_names(bert)), (llama, hf.qkv_names(llama))):
        for ent in entries:
            assert ent["other"] == []
            assert all(n in dict(m.named_modules()) for n in (ent["q"], ent["k"], ent["v"]))
    assert "layers.0.self_attn.k_proj" in names


def test_source_never_trusts_remote_code():
    pkg = Path(hf.__file__).parent  # sigprop/models: configs, presets, models at init, weights
    src = "".join((pkg / f).read_text() for f in ("loading.py", "config.py", "presets.py"))
    assert not re.search(r"trust_remote_code\s*=\s*True", src)
    assert not re.search(r"weights_only\s*=\s*False", src)
    assert "trust_remote_code=False" in src and "weights_only=True" in src
    assert "from_pretrained(" not in src  # configs are read as JSON, never from a hub
