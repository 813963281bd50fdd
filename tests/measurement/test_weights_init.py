"""Which weights these are (:mod:`sigprop.measurement.weights_init`): each parameter against a
fresh draw of the same architecture, summarised as init / trained / mixed.

Fresh models are built once per (family, seed) in this module; the two tiny trained folders
are :mod:`sigprop.models.tiny_trained`'s defaults, trained once per session and shared with
the other trained-model tests (at 60 steps their block matrices were already 11-84 noise sds
away from init)."""

from __future__ import annotations

import copy
import json
import math
from functools import cache

import pytest
import torch

from sigprop.measurement.weights_init import (
    SV_FLOOR,
    TRAINED_SLACK,
    Z_STD,
    check_against_init,
    edge_sd,
    top_singular_value,
)
from sigprop.models.config import shrink
from sigprop.models.loading import load_local_weights, model_at_init
from sigprop.models.tiny_trained import cached
from sigprop.spec import SpecError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=256)
#: presets shrunk to width 64, and three families built from their own config classes
PRESET_FAMILIES = ("bert-base-uncased", "roberta-base", "gpt2", "llama-3.2-1b", "qwen2-0.5b",
                   "mistral-like-1b")
OTHER_FAMILIES = ("t5", "gemma", "opt")
PAIRS = ((0, 1), (2, 3), (1, 2))


def _config(family: str):
    if family in PRESET_FAMILIES:
        return shrink(family, **SMALL)
    from transformers import GemmaConfig, OPTConfig, T5Config

    if family == "t5":  # relative position bias (32 x 4 table), no biases, RMS norms
        return T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=256, num_layers=2,
                        num_heads=4)
    if family == "gemma":  # RMSNorm gains initialised to zeros (they scale by 1 + w)
        return GemmaConfig(vocab_size=512, hidden_size=64, intermediate_size=256,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16)
    return OPTConfig(vocab_size=512, hidden_size=64, ffn_dim=256, num_hidden_layers=2,
                     num_attention_heads=4, word_embed_proj_dim=64)


@cache
def fresh(family: str, seed: int):
    return model_at_init(_config(family), seed=seed)


@cache
def trained(kind: str):
    """(the trained model with its folder's weights, the load report, a fresh draw)."""
    folder = cached(kind)
    model = model_at_init(folder, seed=0)
    rep = load_local_weights(model, folder)
    return model, rep, model_at_init(folder, seed=1)


def _by_name(check):
    return {c.name: c for c in check.checks}


# ---------------------------------------------------------------- calibration
@pytest.mark.parametrize("family", PRESET_FAMILIES + OTHER_FAMILIES)
def test_two_fresh_draws_read_as_init(family):
    """The false-positive check: two independent draws of the same law, three seed pairs per
    family, every parameter read as at init. Expected by hand: |z_std| ~ N(0, 1), so over
    the ~70 random parameters of a pair the largest is ~2.5 (6 is 2e-9 per parameter); the
    edge ratio's noise at 64 x 64 is 3.6 % (threshold 24 %), at 64 x 256 2.2 % (14 %).
    The deterministic laws (norm gains, zero biases) are equal entry for entry."""
    for a, b in PAIRS:
        check = check_against_init(fresh(family, a), fresh(family, b))
        assert check.state == "init", (family, a, b, check.notes)
        assert check.untrained_share == 1.0
        assert not [c.name for c in check.checks if c.trained]
        assert len(check.matrices) >= 8 and not check.skipped
        for c in check.checks:
            if c.law == "random":
                assert abs(c.z_std) < Z_STD
                if c.edge_ratio is not None:
                    assert 1 / c.sv_threshold < c.edge_ratio < c.sv_threshold
            else:
                assert c.max_diff == 0.0 and c.identical


def test_same_draw_is_identical_and_deterministic_laws_are_found():
    """A model against itself: every z is 0 and every edge ratio 1, and the note says the
    matrices are bit-identical; in bfloat16 it is still at init; Gemma's RMSNorm gains
    (zeros at init) and T5's (ones) are deterministic laws, its relative position table
    random."""
    m = fresh("llama-3.2-1b", 0)
    check = check_against_init(m, m)
    assert check.state == "init"
    assert all(c.identical for c in check.checks)
    assert all(c.z_std == 0.0 and c.edge_ratio == pytest.approx(1.0, abs=1e-6)
               for c in check.checks if c.law == "random")
    assert any("bit-identical" in n for n in check.notes)
    # the same draw stored in bfloat16 (what checkpoints hold): rounding each entry by up
    # to 2^-9 relative moves r by ~1e-6 relative, |z| < 0.1; the norm gains (1.0) are exact
    half = check_against_init(copy.deepcopy(m).to(torch.bfloat16), m)
    assert half.state == "init" and not any(c.identical for c in half.matrices)
    assert max(abs(c.z_std) for c in half.checks if c.law == "random") < 0.1
    gemma = _by_name(check_against_init(fresh("gemma", 0), fresh("gemma", 1)))
    assert gemma["layers.0.input_layernorm.weight"].law == "deterministic"
    assert gemma["layers.0.input_layernorm.weight"].rms_init == 0.0
    t5 = _by_name(check_against_init(fresh("t5", 0), fresh("t5", 1)))
    bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    assert t5[bias].law == "random" and t5[bias].shape == (32, 4)
    assert t5["encoder.block.0.layer.0.layer_norm.weight"].law == "deterministic"


# ---------------------------------------------------------------- trained checkpoints
def test_trained_decoder_reads_as_trained():
    """The tiny Llama (GQA, tied embeddings) after 60 AdamW steps: every matrix and every
    RMSNorm gain moved; the smallest |z_std| of a block matrix (a value map: 10.9) is
    above 6."""
    model, rep, init = trained("decoder")
    assert not rep.missing
    check = check_against_init(model, init)
    assert check.state == "trained" and check.untrained_share == 0.0
    blocks = [c for c in check.matrices if c.name.startswith("layers.")]
    assert len(blocks) == 14 and all(c.trained for c in blocks)
    assert min(abs(c.z_std) for c in blocks) > Z_STD
    assert all(c.trained for c in check.checks if not c.is_matrix)


def test_trained_encoder_reads_as_trained_but_its_pooler_does_not():
    """The tiny BERT MLM: its checkpoint holds no pooler, so the built model's pooler is its
    own init draw: read as untrained (4096 of ~0.24 M matrix entries, 1.7 % > the 0.5 %
    slack: "mixed"). Without the parameters the checkpoint did not hold, "trained": every
    block matrix trained; the token-type table (2 x 64, only row 0 ever used) may read as
    untrained, within the slack (128 entries, 0.05 %)."""
    model, rep, init = trained("encoder")
    assert rep.missing == ["pooler.dense.weight", "pooler.dense.bias"]
    full = check_against_init(model, init)
    assert full.state == "mixed"
    assert "pooler.dense.weight" in full.untrained
    assert set(full.untrained) <= {"pooler.dense.weight",
                                   "embeddings.token_type_embeddings.weight"}
    check = check_against_init(model, init, names=lambda n: n not in rep.missing)
    assert check.state == "trained"
    assert check.untrained_share <= TRAINED_SLACK
    blocks = [c for c in check.matrices if c.name.startswith("encoder.layer.")]
    assert len(blocks) == 12 and all(c.trained for c in blocks)
    assert min(abs(c.z_std) for c in blocks) > Z_STD
    words = _by_name(check)["embeddings.word_embeddings.weight"]
    assert words.trained and words.why == "std+spectrum"


def test_one_layer_back_at_init_reads_as_mixed():
    """The trained decoder with layer 1's parameters replaced by the fresh draw's: exactly
    those 7 matrices (and 2 norm gains) read as at init, 49 152 of ~0.23 M entries."""
    model, _, init = trained("decoder")
    mixed = copy.deepcopy(model)
    swap = {k: v for k, v in init.state_dict().items() if k.startswith("layers.1.")}
    mixed.load_state_dict(swap, strict=False)
    check = check_against_init(mixed, init)
    assert check.state == "mixed"
    back = {k for k in swap if k.endswith("weight") and init.get_parameter(k).dim() == 2}
    assert len(back) == 7 and set(check.untrained) == back
    assert {c.name for c in check.checks if not c.trained} == set(swap)
    assert any("read as at init" in n for n in check.notes)
    only = check_against_init(mixed, init, names="layers.1.")
    assert only.state == "init"
    assert check_against_init(mixed, init, names=["layers.0.", "embed"]).state == "trained"


# ---------------------------------------------------------------- subtle changes
def test_a_matrix_scaled_by_ten_percent_is_trained_by_its_std():
    """64 x 256 Gaussian entries: sd of log r between two draws = sqrt(2 / (2 * 16384)) =
    0.0078, so a 1.1 scale gives z = log 1.1 / 0.0078 = 12.2 +- 1 (> 6); the edge ratio
    does not move (the spectrum is rescaled as a whole)."""
    m = copy.deepcopy(fresh("llama-3.2-1b", 0))
    name = "layers.1.mlp.down_proj.weight"
    with torch.no_grad():
        m.get_parameter(name).mul_(1.1)
    check = check_against_init(m, fresh("llama-3.2-1b", 1))
    c = _by_name(check)[name]
    assert c.trained and c.why == "std"
    assert c.z_std == pytest.approx(math.log(1.1) / math.sqrt(2 / (2 * 16384)), abs=5)
    assert c.rms_ratio == pytest.approx(1.1, abs=0.05)
    assert check.untrained == [x.name for x in check.matrices if x.name != name]
    assert check.state == "mixed"


def test_a_rank_one_spike_is_trained_by_the_spectrum():
    """A rank-one spike of twice the top singular value, then the matrix rescaled to its
    former RMS: the scale test is blind by construction (|z| < 6 as between any two draws),
    the edge ratio is ~2 (threshold exp(6 sqrt(2) 1.52 %) = 1.14 at 64 x 256)."""
    m = copy.deepcopy(fresh("llama-3.2-1b", 0))
    name = "layers.0.mlp.up_proj.weight"
    w = m.get_parameter(name)
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(w.shape[0], 1, generator=gen)
    v = torch.randn(1, w.shape[1], generator=gen)
    with torch.no_grad():
        rms = w.pow(2).mean().sqrt()
        spiked = w + 2 * top_singular_value(w) * (u / u.norm()) @ (v / v.norm())
        w.copy_(spiked * rms / spiked.pow(2).mean().sqrt())
    c = _by_name(check_against_init(m, fresh("llama-3.2-1b", 1)))[name]
    assert c.trained and c.why == "spectrum"
    assert abs(c.z_std) < Z_STD
    assert c.edge_ratio > 1.6 and c.sv_threshold == pytest.approx(
        math.exp(6 * math.sqrt(2) * edge_sd(256, 64)), rel=1e-9)
    assert c.sv_threshold == pytest.approx(1.138, abs=1e-3)


def test_deterministic_laws_trained_by_any_change():
    """A norm gain (ones at init) moved by 1e-3 in one entry, and a matrix that is all zeros
    at init (made so in both draws) with one entry set: both trained by value, the
    tolerance 2 eps * max|init| (zero for the zero law)."""
    m = copy.deepcopy(fresh("llama-3.2-1b", 0))
    init = copy.deepcopy(fresh("llama-3.2-1b", 1))
    gain, zero = "layers.0.input_layernorm.weight", "layers.0.self_attn.o_proj.weight"
    with torch.no_grad():
        m.get_parameter(gain)[3] += 1e-3
        m.get_parameter(zero).zero_()
        init.get_parameter(zero).zero_()
    checks = _by_name(check_against_init(m, init))
    assert not checks[zero].trained and checks[zero].law == "deterministic"
    assert checks[gain].trained and checks[gain].why == "value"
    assert checks[gain].max_diff == pytest.approx(1e-3, rel=1e-3)
    assert checks[gain].tolerance == pytest.approx(2 * torch.finfo(torch.float32).eps)
    with torch.no_grad():
        m.get_parameter(zero)[0, 0] = 1e-6
    c = _by_name(check_against_init(m, init))[zero]
    assert c.trained and c.why == "value" and c.tolerance == 0.0


# ---------------------------------------------------------------- the pieces
def test_top_singular_value_krylov_and_batches():
    """Above EXACT_DIM (512) the block Krylov estimate is within 1e-3 of the exact value on a
    600 x 700 Gaussian matrix (a lower bound), and exact on a spiked one; a batch of
    matrices gives the largest of theirs."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(600, 700, generator=gen)
    exact = float(torch.linalg.matrix_norm(w, ord=2))
    est = top_singular_value(w)
    assert exact * (1 - 1e-3) < est <= exact * (1 + 1e-6)
    u, v = torch.randn(600, 1, generator=gen), torch.randn(1, 700, generator=gen)
    spiked = w + 3 * exact * (u / u.norm()) @ (v / v.norm())
    assert top_singular_value(spiked) == pytest.approx(
        float(torch.linalg.matrix_norm(spiked, ord=2)), rel=1e-5)
    batch = torch.randn(3, 40, 30, generator=gen)
    batch[1] *= 2
    assert top_singular_value(batch) == pytest.approx(
        float(torch.linalg.matrix_norm(batch[1], ord=2)), rel=1e-5)
    # the relative sd formula: 0.4 n^(-2/3) for a large square matrix, 0 for a vector
    assert edge_sd(4096, 4096) == pytest.approx(0.4 * 4096 ** (-2 / 3), rel=0.02)
    assert edge_sd(1, 64) == 0.0
    assert SV_FLOOR > 1 + 6 * math.sqrt(2) * edge_sd(4096, 4096)


def test_spectrum_skipped_where_the_scale_already_decided():
    """Two 600 x 700 Gaussian matrices (Krylov-sized: both sides above EXACT_DIM = 512). As
    two draws: both tests run, nothing fires (edge ratio within 1 +- 10 %). One scaled by
    1.5: z = log 1.5 / sqrt(2 / (2 * 420000)) = 263 +- 1; by default its spectral test is
    skipped (the verdict stands), ``spectrum=True`` runs it (a pure rescale: edge ratio ~1),
    ``spectrum=False`` runs it nowhere."""
    gen = torch.Generator().manual_seed(7)
    a, b = torch.nn.Linear(700, 600, bias=False), torch.nn.Linear(700, 600, bias=False)
    with torch.no_grad():
        a.weight.copy_(0.02 * torch.randn(600, 700, generator=gen))
        b.weight.copy_(0.02 * torch.randn(600, 700, generator=gen))
    (c,) = check_against_init(a, b).checks
    assert not c.trained and c.sv_ratio is not None
    assert abs(c.edge_ratio - 1) < 0.1 and c.sv_threshold == pytest.approx(SV_FLOOR)
    with torch.no_grad():
        a.weight.mul_(1.5)
    (c,) = check_against_init(a, b).checks
    assert c.trained and c.why == "std" and c.sv_ratio is None
    assert c.z_std == pytest.approx(math.log(1.5) / math.sqrt(1 / 420000), abs=5)
    (c,) = check_against_init(a, b, spectrum=True).checks
    assert c.why == "std" and c.sv_ratio == pytest.approx(1.5, rel=0.1)
    assert c.edge_ratio == pytest.approx(1.0, abs=0.1)
    (c,) = check_against_init(b, b, spectrum=False).checks
    assert c.sv_ratio is None and not c.trained


def test_names_rows_and_json():
    """A head model against a base one (names across ``base_model_prefix``), tables of
    different sizes (the common rows), a filter that keeps nothing (an error), and
    ``to_dict`` through ``json.dumps(allow_nan=False)`` (the deterministic rows' None)."""
    from transformers import AutoModelForCausalLM

    cfg = _config("llama-3.2-1b")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        head = AutoModelForCausalLM.from_config(cfg)
    base = model_at_init(cfg, seed=1, vocab_size=100)
    check = check_against_init(head, base)
    assert check.state == "init"
    emb = _by_name(check)["model.embed_tokens.weight"]
    assert emb.rows_cut and emb.numel == 100 * 64
    assert "lm_head.weight" not in _by_name(check)  # tied: one parameter, counted once
    assert any("common leading rows" in n for n in check.notes)
    with pytest.raises(SpecError):
        check_against_init(head, base, names="no such name")
    text = json.dumps(check.to_dict(), allow_nan=False)
    back = json.loads(text)
    assert back["state"] == "init" and back["thresholds"]["z_std"] == Z_STD
    assert len(back["checks"]) == len(check.checks)
    frame = check.to_frame()
    assert len(frame) == len(check.checks) and frame["shape"].iloc[0] == "512x64"
    vec_free = check_against_init(head, base, vectors=False)
    assert all(c.is_matrix for c in vec_free.checks)
