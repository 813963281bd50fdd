"""Inputs of the right kind (sigprop.models.inputs), configs validated by transformers, per-layer
theory and the QK-norm advice (issue 34)."""

import math

import pytest
import torch

from sigprop.analysis.diagnose import diagnose
from sigprop.models import load_config, model_at_init, zoo
from sigprop.models.inputs import make_input, settle
from sigprop.spec import SpecError


def _small(mt):
    d, why = zoo.small_config(mt)
    if d is None:
        pytest.skip(f"{mt}: {why}")
    return d


def test_audio_values_give_T_frames():
    """Raw audio for a wav2vec2-style model is long enough that the model's own convolutional
    feature extractor yields at least T frames (and not many more: < T + 2)."""
    cfg = load_config(_small("wav2vec2"))
    m = model_at_init(cfg)
    for T in (8, 50):
        x = make_input("input_values", cfg, m, 1, T, 2, 0)
        with torch.no_grad():
            frames = m.feature_extractor(x).shape[-1]
        assert T <= frames < T + 2


def test_feature_layout_variant_is_the_transpose():
    cfg = load_config(_small("whisper"))
    a = make_input("input_features", cfg, None, 2, 8, 2, 0)
    b = make_input("input_features@t", cfg, None, 2, 8, 2, 0)
    assert torch.equal(a.transpose(-1, -2), b)


def test_text_avoids_placeholder_ids():
    """Text for a composite model never holds its image placeholder id (which would ask for
    image features that were not given)."""
    cfg = load_config(_small("llava"))
    ids = make_input("input_ids", cfg, None, 4, 256, 64, 0)
    special = cfg.image_token_id
    if special < 64:
        assert not (ids == special).any()
    assert int(ids.max()) < 64


def test_settle_names_what_it_cannot_make():
    class Needs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

        def forward(self, input_ids, frobnicator):
            return self.layers[0](input_ids.float())

    m = Needs()
    with pytest.raises(SpecError, match="needs frobnicator"):
        settle(m, None, ["input_ids"], ["layers"], lambda inp: m(**inp))


def test_settle_adds_what_the_forward_asks_for():
    """A forward that raises "You have to specify pixel_values" gets them on the next try."""
    class Dual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, input_ids=None, pixel_values=None):
            if pixel_values is None:
                raise ValueError("You have to specify pixel_values")
            return self.layers[0](pixel_values)

    m = Dual()
    cfg = load_config(_small("vit"))
    st = settle(m, cfg, ["input_ids"], ["layers"], lambda inp: m(**inp), vocab=16)
    assert "pixel_values" in st.names and st.ran == ["layers"]


def test_settle_takes_one_of_alternatives():
    """"You have to specify either pixel_values or image_embeds": the next try adds the one
    input sigprop makes first (not the embeddings), since giving both is refused too."""
    class Either(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Identity()])

        def forward(self, input_ids=None, pixel_values=None, image_embeds=None):
            if (pixel_values is None) == (image_embeds is None):
                raise ValueError("You have to specify either pixel_values or image_embeds"
                                 if pixel_values is None else "You cannot specify both")
            return self.layers[0](pixel_values)

    m = Either()
    cfg = load_config(_small("vit"))
    st = settle(m, cfg, ["input_ids"], ["layers"], lambda inp: m(**inp), vocab=16)
    assert "pixel_values" in st.names and "image_embeds" not in st.names
    assert st.ran == ["layers"]


def test_image_pair_variant():
    """``pixel_values@2``: two different images per sequence, (B, 2, C, H, W)."""
    cfg = load_config(_small("vit"))
    x = make_input("pixel_values@2", cfg, None, 3, 8, 2, 0)
    h, w = cfg.image_size, cfg.image_size
    assert tuple(x.shape) == (3, 2, cfg.num_channels, h, w)
    assert not torch.equal(x[:, 0], x[:, 1])


def test_spectrogram_values_for_a_mel_model_without_conv_extractor():
    """AST takes ``input_values`` as a (frames, mel bins) spectrogram of its config's
    max_length; wav2vec2 (a convolutional extractor) keeps raw samples."""
    cfg = load_config({"model_type": "audio-spectrogram-transformer", "hidden_size": 32,
                       "num_hidden_layers": 1, "num_attention_heads": 2,
                       "intermediate_size": 64, "max_length": 64, "num_mel_bins": 16})
    x = make_input("input_values", cfg, None, 2, 8, 2, 0)
    assert tuple(x.shape) == (2, 64, 16)
    assert make_input("input_values", load_config(_small("wav2vec2")), None, 2, 8, 2, 0).ndim == 2


def test_cross_attention_memory_has_the_encoder_width():
    cfg = load_config(_small("blip_2_qformer"))
    x = make_input("encoder_hidden_states", cfg, None, 2, 8, 2, 0)
    assert tuple(x.shape) == (2, 8, cfg.encoder_hidden_size)


def test_whisper_heads_without_kv_field_accepted():
    """4 encoder heads and no KV field: transformers takes the KV heads from the encoder
    heads; sigprop accepts what transformers builds (the old check read a class default of 6)."""
    d = {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
         "decoder_ffn_dim": 128, "num_mel_bins": 16, "max_source_positions": 32,
         "max_target_positions": 32}
    assert load_config(d).num_key_value_heads == 4
    dg = diagnose(d, seeds=1, sequences=1)
    assert dg.verdict in ("trainable", "rank_collapse", "entropy_collapse")


def test_per_stage_heads_accepted():
    cfg = load_config({"model_type": "swin", "embed_dim": 16, "depths": [1, 1],
                       "num_heads": [2, 4], "image_size": 32, "patch_size": 4,
                       "window_size": 4})
    assert list(cfg.num_heads) == [2, 4]


def test_gemma4_per_layer_beta_and_qk_norm_advice():
    """Gemma 4 text (QK-norm, attention scale 1, value norm; sliding layers of head dim 16
    and a full layer of 32 in the shrunk config): unit norm gains make sigma_s = sqrt(d_head),
    so the full layer's beta is sqrt(2) times the sliding one's (to 1e-6: the gains are read by
    running the float32 norm modules, ~1e-7 relative); the advice speaks of the norm gains,
    not a Q/K init std, and its limit maps back to beta_c through
    beta = multiplier x g / sqrt(log T)."""
    d = _small("gemma4_text")
    dg = diagnose(d, seq_len=32, seeds=1, sequences=1)
    assert dg.spec.layers is not None
    b = [r["beta"] for r in dg.layers]
    assert b[1] / b[0] == pytest.approx(math.sqrt(2), rel=1e-6)
    rec = dg.recommendations[0]
    assert "QK-norm" in rec["text"] and "qk_std_max" not in rec
    assert rec["gain_product_max"] * dg.spec.multiplier / math.sqrt(math.log(32)) == \
        pytest.approx(rec["limit"], rel=1e-12)


def test_composite_language_stack_by_default_and_vision_tower_on_request():
    """LLaVA: text reaches the language model's blocks (the default stack, named in the
    result); --stack vision_tower diagnoses the CLIP vision tower as a model of its own, on
    images: its blocks see (image_size / patch_size)^2 patches + CLS, read from the vision
    config here."""
    d = _small("llava")
    base = diagnose(d, seq_len=16, seeds=1, sequences=1)
    assert base.stack_path.startswith("language_model")
    vt = diagnose(d, seq_len=16, seeds=1, sequences=1, stack="vision_tower")
    assert vt.stack_path.startswith("vision_tower")
    vc = load_config(d).vision_config
    assert vt.spec.seq_len == (vc.image_size // vc.patch_size) ** 2 + 1
    with pytest.raises(SpecError, match="no block list named"):
        diagnose(d, seq_len=16, seeds=1, sequences=1, stack="no_such_tower")


def test_layers_shrink_keeps_stage_widths_and_heads():
    """``small_config(mode="layers")`` shrinks depth only: per-stage widths and head counts
    stay as the default config has them (D-FINE's backbone widths feed its encoder's input
    projections, which the width shrink left inconsistent); the width shrink caps them."""
    from transformers import CONFIG_MAPPING

    base = CONFIG_MAPPING["swin"]().to_dict()
    base["model_type"] = "swin"
    lo = zoo.shrink_dict(base, width=10**9, heads=10**9, kv_heads=10**9, ff=10**9)
    assert lo["num_heads"] == base["num_heads"] and lo["depths"] == [1] * len(base["depths"])
    small = zoo.shrink_dict(base)
    assert max(small["num_heads"]) <= 2
    d = CONFIG_MAPPING["d_fine"]().to_dict()
    d["model_type"] = "d_fine"
    lo = zoo.shrink_dict(d, width=10**9, heads=10**9, kv_heads=10**9, ff=10**9)
    assert lo["backbone_config"]["hidden_sizes"] == d["backbone_config"]["hidden_sizes"]


def test_patch_grid_sizes_and_unset_placeholder_ids():
    """MiniCPM-V's ``target_sizes`` are its images' patches per side; a BLIP-2 default config
    leaves the image placeholder id unset (its checkpoints set one), which the shrink fills
    with a top id of the text vocabulary that built text then avoids."""
    cfg = load_config(_small("minicpm_ocr_vision"))
    side = cfg.image_size // cfg.patch_size
    assert make_input("target_sizes", cfg, None, 2, 8, 2, 0).tolist() == [[side, side]] * 2
    d = _small("blip-2")
    vocab = d["text_config"]["vocab_size"]
    assert d["image_token_index"] == vocab - 1
    ids = make_input("input_ids", load_config(d), None, 4, 256, vocab, 0)
    assert not (ids == vocab - 1).any()
