"""Every model type the installed transformers builds at small size: ``sigprop diagnose`` gives
a verdict, or one line on stderr and exit code 2, never a traceback (issue 34).

The default suite runs a stratified sample (every 48th type of the sorted list, plus one type
of each input kind and stack design: audio values and features, video, composite
vision-language, dual encoder, hybrid Mamba/attention, per-layer config, no attention); the full
pass is ``slow`` (``make test-slow``, ~15 min on 2 cores) and is what
``benchmarks/breadth.py`` runs and counts.

Each type goes through :func:`benchmarks.breadth.one`: the type's default config shrunk by
:func:`sigprop.models.zoo.small_config`, written to ``config.json`` and diagnosed through the
command line in this process, so an escaping exception is caught and named here."""

import importlib.util
from pathlib import Path

import pytest

from sigprop.models import zoo

_spec = importlib.util.spec_from_file_location(
    "breadth", Path(__file__).parents[1] / "benchmarks" / "breadth.py")
breadth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(breadth)

#: one type per input kind / design the sample must hold whatever the sorted list looks like
STRATA = ("wav2vec2", "whisper", "videomae", "llava", "clip", "jamba", "gemma4_text",
          "convnext", "swin", "layoutlmv3", "gpt_oss", "qwen3_next")
ALL = zoo.model_types()
SAMPLE = sorted(set(ALL[::48]) | {t for t in STRATA if t in ALL})


def _check(mt: str, tmp_path) -> dict:
    rec = breadth.one(mt, tmp_path, timeout=300)
    if rec["outcome"] == "no_build":
        pytest.skip(f"transformers builds no small {mt}: {rec['reason'][:100]}")
    assert rec["outcome"] != "traceback", (
        f"{mt}: {rec.get('error')}: {rec.get('message')} at {rec.get('where')}")
    assert rec["outcome"] in ("verdict", "refusal"), rec
    if rec["outcome"] == "refusal":
        assert rec["lines"] == 1 and rec["code"] == 2
        assert "Traceback" not in rec["message"]
    return rec


#: sample types whose one diagnose takes ~15 s here (the default suite's budget): make test-slow
HEAVY = {"blt", "pe_audio_encoder"}


@pytest.mark.parametrize("mt", [pytest.param(t, marks=pytest.mark.slow) if t in HEAVY else t
                                for t in SAMPLE])
def test_sample_no_traceback(mt, tmp_path):
    _check(mt, tmp_path)


@pytest.mark.parametrize("mt", ["wav2vec2", "videomae", "llava", "jamba", "gemma4_text",
                                "whisper", "fsmt", "qwen2_vl_text", "lxmert", "xmod",
                                "muse_spark_vision", "nemotron3_5_transcribe_word_timestamp",
                                "vilt", "owlvit", "audio-spectrogram-transformer", "lightglue",
                                "inkling2_text", "blip_2_qformer", "deepseek_v2", "mgp-str",
                                "hunyuan_vl_vision", "minicpm_ocr_vision", "grounding-dino",
                                "instructblip"])
def test_kinds_get_a_verdict(mt, tmp_path):
    """Audio values, video frames, a composite vision-language model (its language stack
    reached by text), a hybrid Mamba/attention stack, a per-layer config, Whisper's encoder,
    a time-major stack (FSMT), multimodal RoPE sections left to the model's default (Qwen2-VL),
    region features and boxes (LXMERT), language ids (X-MOD), patches of two frames
    (``patch_temporal``), a forward that takes only embeddings (``inputs_embeds``), one that
    takes images or their embeddings but not both (ViLT), text capped at a CLIP-like text
    tower's 16 positions beside the image (OWL-ViT), a spectrogram as ``input_values`` (AST),
    image pairs (LightGlue), projections wrapped with their own norms that return heads
    first in a stack of two block classes (Inkling 2), a Q-Former run on its own with a
    memory to attend to, a router whose default top-k is unset (DeepSeek-V2), an
    ``nn.Sequential`` of blocks with fused ``qkv`` (MGP-STR), one image packed as (patches,
    features) whose block input is (1, patches, width) (HunYuan-VL's tower: not time-major),
    patch grid sizes (MiniCPM-V), more object queries than a small image has proposals
    (Grounding DINO) and an unset image placeholder id (InstructBLIP) all get a verdict, not a
    refusal."""
    if mt not in ALL:
        pytest.skip(f"{mt} not in this transformers")
    rec = _check(mt, tmp_path)
    assert rec["outcome"] == "verdict", rec


def test_no_attention_is_one_line(tmp_path):
    """A model without attention is refused in one line saying so (docs/cli.md), not given
    an attention verdict."""
    rec = _check("convnext", tmp_path)
    assert rec["outcome"] == "refusal" and "no attention" in rec["message"]


@pytest.mark.slow
@pytest.mark.parametrize("mt", [t for t in ALL if t not in SAMPLE])
def test_every_type_no_traceback(mt, tmp_path):
    _check(mt, tmp_path)
