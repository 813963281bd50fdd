"""Diagnosis of trained weights (issue 36): real text through the model's tokenizer, one set of
numbers from the measured scores, and verdict, advice and JSON that agree.

The trained checkpoints are sigprop's own (:mod:`sigprop.models.tiny_trained`: a BERT MLM
encoder and a Llama CLM decoder with RoPE and GQA, trained here in under a minute each and
cached for the session).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from sigprop.analysis.diagnose import diagnose
from sigprop.analysis.diagnosis import to_json
from sigprop.spec import SpecError

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def diagnosed(encoder, decoder):
    return {k: diagnose(str(f), seq_len=64, sequences=2) for k, f in
            (("encoder", encoder), ("decoder", decoder))}


_NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)"


def assert_consistent(j: dict) -> None:
    """Verdict, failing heads, advice and JSON tell one story: every beta the advice quotes
    as the model's is ``derived.beta`` (to its printed 3 digits); on trained weights
    ``derived.beta`` is the RMS of the per-head measured betas, the advice never speaks of an
    init std, and the failing heads are heads of the failing layer."""
    der = j["derived"]
    for rec in j["recommendations"]:
        m = re.search(r"(?:measured beta|now) " + _NUMBER, rec["text"])
        if m and rec["what"] in ("score scale", "beta window"):
            assert float(m.group(1)) == pytest.approx(der["beta"], rel=5e-3), rec["text"]
        if rec.get("current") is not None and rec["what"] in ("score scale", "beta window"):
            assert rec["current"] == pytest.approx(der["beta"], rel=1e-12)
    if "beta_weights" in der:  # trained weights: the measured numbers
        betas = [h["beta_measured"] for h in j["per_head"] if h.get("beta_measured") is not None]
        assert der["beta"] == pytest.approx(math.sqrt(np.mean(np.square(betas))), rel=1e-6)
        assert der["beta"] == pytest.approx(der["beta_measured"], rel=1e-12)
        assert not any("init std" in r["text"] for r in j["recommendations"])
        over = {(r["layer"], h) for r in j["layers"] for h in r.get("heads_over_measured", [])}
        per = {(h["layer"], h["head"]) for h in j["per_head"]
               if (h.get("beta_over_beta_c_measured") or 0) > 1}
        assert over == per
    if j["failing_heads"]:
        layer = j["first_failing_layer"]
        assert set(j["failing_heads"]) <= {h["head"] for h in j["per_head"]
                                           if h["layer"] == layer}
    assert (j["first_failing_layer"] is None) == (j["verdict"] == "trainable")


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_trained_weights_read_real_text_and_one_set_of_numbers(diagnosed, kind):
    d = diagnosed[kind]
    j = json.loads(json.dumps(to_json(d, timing=False), allow_nan=False))
    assert j["inputs"].startswith("real text (builtin stories) through the model's tokenizer")
    assert j["trained_weights"] and j["weights"] == "folder"
    der = j["derived"]
    # the weights under the at-init law and the measured scores disagree on these models
    # (a 300-step model: several times), which is why the measured one must rule
    assert der["beta_measured_over_weights"] > 2
    assert all(r["theory"] in ("describes", "at-init reference") for r in j["layers"])
    assert all(r["theory_gap_cos"] is not None for r in j["layers"])
    assert_consistent(j)


def test_at_init_keeps_its_inputs_and_numbers():
    d = diagnose("gpt2", seq_len=32, seeds=1, sequences=1)
    j = to_json(d, timing=False)
    assert "at-init default" in j["inputs"]
    assert "beta_weights" not in j["derived"]
    assert not any("theory" in r for r in j["layers"])
    assert not any("measured" in r for r in j["recommendations"])  # trained weights only
    assert_consistent(j)


def test_a_loaded_module_finds_its_tokenizer(decoder):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(decoder))
    d = diagnose(m, seq_len=32, sequences=1)
    assert d.inputs.startswith("real text") and d.weights == "module"
    assert_consistent(to_json(d, timing=False))


def test_text_file_and_its_errors(encoder, tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("the cat sat on the mat and looked at the dog. " * 40)
    d = diagnose(str(encoder), seq_len=32, sequences=1, text=str(f))
    assert str(f) in d.inputs
    f.write_text("too short.")
    with pytest.raises(SpecError, match="^text: .* gives .* tokens; 2 sequences of 32 need"):
        diagnose(str(encoder), seq_len=32, sequences=2, text=str(f))
    with pytest.raises(SpecError, match="^text: .* does not exist"):
        diagnose(str(encoder), seq_len=32, sequences=1, text=str(tmp_path / "nope.txt"))
    with pytest.raises(SpecError, match="^text: needs the model's tokenizer"):
        diagnose("bert-base-uncased", seq_len=32, seeds=1, sequences=1, text=str(f))


def test_cli_text_errors_are_one_line(encoder, tmp_path, capsys):
    from sigprop.cli import run

    code = run(["diagnose", str(encoder), "--seq-len", "32", "--text",
                str(tmp_path / "missing.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "text:" in err[0], err


def test_longctx_trained_encoder_within_and_beyond_its_position_table(encoder):
    from sigprop.analysis.longctx_model import run

    with pytest.raises(SpecError, match=r"^lengths: 512 is beyond .*learned position table "
                                        r"\(embeddings.position_embeddings: 128 positions\)"):
        run(str(encoder), [64, 512], queries=16, out_queries=8, sequences=1)
    r = run(str(encoder), [32, 128], queries=16, out_queries=8, sequences=1, seq_len=64)
    assert r.info["lengths"] == [32, 128] and len(r.layers) == 2


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_trained_weights_are_told_from_init(diagnosed, kind):
    d = diagnosed[kind]
    assert d.weights_state == "trained"
    j = to_json(d, timing=False)
    assert j["weights_state"] == "trained" and j["weights_check"]["state"] == "trained"
    mats = [c for c in j["weights_check"]["checks"] if len(c["shape"]) == 2]
    assert mats and all(c["trained"] for c in mats)


def test_a_module_at_init_is_diagnosed_at_init(decoder):
    """An nn.Module whose weights are a fresh init: the weights check says init and the
    at-init theory, verdict and advice apply (no measured-scores path)."""
    from sigprop import models as hf

    m = hf.model_at_init(hf.load_config(str(decoder)), seed=3)
    d = diagnose(m, seq_len=32, sequences=1)
    assert d.weights == "module" and d.weights_state == "init"
    assert "beta_weights" not in d.derived
    assert any("matches a fresh init" in n for n in d.notes)


def test_mixed_weights_and_vs_init(encoder, tmp_path):
    """A checkpoint whose second layer is back at a fresh init reads mixed; --vs-init puts the
    fresh init beside the trained weights on the same inputs."""
    import shutil

    from safetensors.torch import load_file, save_file

    from sigprop import models as hf

    folder = tmp_path / "half"
    shutil.copytree(encoder, folder)
    w = load_file(str(folder / "model.safetensors"))
    fresh = hf.model_at_init(hf.load_config(str(encoder)), seed=11).state_dict()
    for k in list(w):
        if ".layer.1." in k:
            w[k] = fresh[k.removeprefix("bert.")].clone()
    save_file({k: v.contiguous() for k, v in w.items()}, str(folder / "model.safetensors"))
    d = diagnose(str(folder), seq_len=32, sequences=1, vs_init=True)
    assert d.weights_state == "mixed"
    back = {c.name for c in d.weights_check.matrices if not c.trained}
    assert back and all(".layer.1." in n for n in back)
    v = d.vs_init.layers
    assert list(v["layer"]) == [0, 1, 2]
    for col in ("cos", "entropy", "sigma_s"):
        assert {f"{col}_trained", f"{col}_init", f"{col}_change"} <= set(v.columns)
    np.testing.assert_allclose(v["cos_change"], v["cos_trained"] - v["cos_init"], atol=1e-12)
    # layer 1 is trained: its score scale left the init's (~0.02 x sqrt(d_head) scale) far
    assert float(v.loc[v.layer == 1, "sigma_s_trained"].iloc[0]) > \
        3 * float(v.loc[v.layer == 1, "sigma_s_init"].iloc[0])


def _roles(rows):
    import pandas as pd

    return pd.DataFrame(rows, columns=["layer", "head", "role"])


def test_sharp_by_design_is_not_collapse_and_collapsed_heads_are():
    """The verdict on trained weights reads the roles: a layer of sink and positional heads
    (low entropy by design) is not entropy-collapsed; a layer where most heads are collapsed
    is, with exactly those heads failing."""
    import pandas as pd

    from sigprop.analysis.trained import verdict_trained
    from sigprop.spec import ArchSpec

    spec = ArchSpec(depth=2, d_model=64, heads=4, seq_len=64)
    meas = pd.DataFrame({"layer": [0, 1, 2, 1, 2], "observable": ["cos"] * 3 + ["entropy"] * 2,
                         "source": "measured", "value": [0.3, 0.4, 0.5, 0.05, 0.05]})
    heads = pd.DataFrame(columns=["layer", "head", "observable", "source", "value"])
    by_design = _roles([(1, 0, "sink"), (1, 1, "positional"), (1, 2, "sink"),
                        (1, 3, "positional"), (2, 0, "sink"), (2, 1, "collapsed"),
                        (2, 2, "positional"), (2, 3, "content")])
    assert verdict_trained(spec, meas, heads, by_design) == ("trainable", None, [])
    sick = _roles([(1, 0, "sink"), (1, 1, "content"), (1, 2, "diffuse"), (1, 3, "content"),
                   (2, 0, "collapsed"), (2, 1, "collapsed"), (2, 2, "sink"),
                   (2, 3, "collapsed")])
    assert verdict_trained(spec, meas, heads, sick) == ("entropy_collapse", 2, [0, 1, 3])
    high = meas.assign(value=[0.3, 0.95, 0.99, 0.5, 0.5])
    assert verdict_trained(spec, high, heads, by_design) == ("rank_collapse", 1, [])


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_every_head_of_a_trained_model_has_a_role(diagnosed, kind):
    from sigprop.analysis.anatomy import ROLES

    j = to_json(diagnosed[kind], timing=False)
    heads = j["per_head"]
    assert len(heads) == 8 and all(h["role"] in ROLES and h["role_why"] for h in heads)
    assert all(h["max_logit"] is not None and h["max_logit"] > 0 for h in heads)
    collapsed = {h["head"] for h in heads
                 if h["layer"] == j["first_failing_layer"] and h["role"] == "collapsed"}
    if j["verdict"] == "entropy_collapse":
        assert set(j["failing_heads"]) == collapsed


def test_report_of_a_trained_model_shows_its_roles(diagnosed, tmp_path):
    from sigprop.report.html import write_report

    out = tmp_path / "r.html"
    write_report(diagnosed["decoder"], out)
    page = out.read_text()
    assert "Head roles on this text" in page and 'alt="head roles"' in page
    assert "inputs: real text" in page and "(trained)" in page


# --- the measured effect of the advice (analysis/advice_effect.py) ---------------------------
#: the rescale multiplies a head's scores by f^2, so its sigma_s and beta by f^2 exactly where
#: the layer's input is unchanged (no rescaled head below): only float32 rounding separates
#: the measured beta / beta_c after from the predicted 1 (seen: ~1e-7)
EXACT = 1e-5
#: above a rescaled head the layer's input moves; on the provoked decoder the layer-2 heads
#: landed within 0.4% of 1 (a bound, not a prediction: one of four layer-1 heads changed)
LOOSE = 0.05


def _score_advice(j: dict) -> dict:
    rec = j["recommendations"][0]
    assert rec["what"] == "score scale"
    return rec


def _check_measured(rec: dict) -> None:
    """Every head the advice names is measured, with its factor; heads whose layer input is
    unchanged land on the prediction to :data:`EXACT` and their entropy rises (the entropy
    of softmax(c z) falls with c); the others within :data:`LOOSE`; the console line is
    under the text."""
    named = re.findall(r"L(\d+)\.H(\d+) [0-9.]+[,;]", rec["text"])
    heads = rec["measured"]["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(int(a), int(b)) for a, b in named]
    low = min(h["layer"] for h in heads)
    for h in heads:
        assert h["predicted_after"] == pytest.approx(1.0, abs=1e-12)
        assert h["beta_over_beta_c_before"] > 1
        assert h["factor"] == pytest.approx(h["beta_over_beta_c_before"] ** -0.5, rel=1e-12)
        if h["layer"] == low:
            assert h["beta_over_beta_c_after"] == pytest.approx(1.0, rel=EXACT), h
            assert h["entropy_after"] > h["entropy_before"], h
        else:
            assert h["beta_over_beta_c_after"] == pytest.approx(1.0, abs=LOOSE), h
    h = heads[0]
    assert rec["measured"]["line"].startswith(
        f"measured: L{h['layer']}.H{h['head']} beta/beta_c "
        f"{h['beta_over_beta_c_before']:.2f} -> {h['beta_over_beta_c_after']:.2f} "
        f"(predicted 1.00)")
    assert "measured:" not in rec["text"]


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_score_advice_is_measured_on_the_fixtures(diagnosed, kind):
    """The fixtures' heads above beta_c (encoder: L1.H2, Q and K rows and biases; decoder:
    the four L2 heads, grouped K/V: the query takes f^2) rescaled on the folder's model and
    measured again on the same inputs: beta / beta_c lands on 1; the length scaling says it
    is predicted only."""
    j = json.loads(json.dumps(to_json(diagnosed[kind], timing=False), allow_nan=False))
    rec = _score_advice(j)
    _check_measured(rec)
    assert ("grouped K/V" in rec["measured"]["how"]) == (kind == "decoder")
    ls = j["recommendations"][1]
    assert ls["what"] == "length scaling" and ls["measured"]["predicted_only"] is True
    assert "longctx" in ls["measured"]["how"]


def test_a_provoked_head_is_named_rescaled_and_measured(decoder):
    """The decoder's L1.H0 with W_Q times 4 (its beta x 4, above beta_c): the advice names it
    with the factor that takes it back to beta_c, measured on a copy (the user's module keeps
    its weights): exact on layer 1, within :data:`LOOSE` on layer 2 whose input moved."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(decoder))
    with torch.no_grad():
        q = m.model.layers[0].self_attn.q_proj.weight
        q[: q.shape[0] // m.config.num_attention_heads] *= 4
    before = {k: v.clone() for k, v in m.state_dict().items()}
    d = diagnose(m, seq_len=64, sequences=2)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    j = json.loads(json.dumps(to_json(d, timing=False), allow_nan=False))
    rec = _score_advice(j)
    assert "L1.H0" in rec["text"]
    h = rec["measured"]["heads"][0]
    assert (h["layer"], h["head"]) == (1, 0) and h["beta_over_beta_c_before"] > 1.5
    _check_measured(rec)
    assert any(h["layer"] == 2 for h in rec["measured"]["heads"])  # the loose case is there
    assert_consistent(j)


def test_rescale_heads_layouts_and_refusals():
    """Fused [q | k | v] (GPT-2's Conv1D, columns): exactly the head's q and k columns and
    biases scale; shared layers and QK-norm are refused with the reason."""
    import torch
    from transformers import GPT2Config, Qwen3Config

    from sigprop import models as hf
    from sigprop.analysis.advice_effect import Unmeasured, rescale_heads

    m = hf.model_at_init(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64,
                                    n_positions=32, bos_token_id=0, eos_token_id=0), seed=0)
    att = m.h[1].attn.c_attn
    with torch.no_grad():
        att.bias.normal_()  # zero at init: give the biases something to scale
    w0, b0 = att.weight.detach().clone(), att.bias.detach().clone()
    how = rescale_heads(m, "h", {(2, 1): 0.5})
    assert "W_Q and W_K" in how
    ratio = att.weight.detach() / w0
    want = torch.ones(96)
    want[8:16] = want[32 + 8:32 + 16] = 0.5  # head 1 of q, then of k
    torch.testing.assert_close(ratio, want.expand_as(ratio))
    torch.testing.assert_close(att.bias.detach(), b0 * want)
    with pytest.raises(Unmeasured, match="shared layers"):
        rescale_heads(m, "h", {(1, 0): 0.5}, repeats=2)
    with pytest.raises(Unmeasured, match="no such head"):
        rescale_heads(m, "h", {(3, 0): 0.5})
    qw = hf.model_at_init(Qwen3Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, num_hidden_layers=1,
                                      intermediate_size=64, vocab_size=64), seed=0)
    with pytest.raises(Unmeasured, match="QK-norm"):
        rescale_heads(qw, "layers", {(1, 0): 0.5})


def test_advice_that_cannot_be_applied_says_why(decoder, monkeypatch):
    """Where the rescale cannot be applied (here: forced), the advice keeps its text and
    numbers and its record says why, with no heads; the diagnosis goes on."""
    from sigprop.analysis import advice_effect

    def refuse(*a, **k):
        raise advice_effect.Unmeasured("QK-norm: forced by the test")

    monkeypatch.setattr(advice_effect, "rescale_heads", refuse)
    j = json.loads(json.dumps(to_json(diagnose(str(decoder), seq_len=64, sequences=2),
                                      timing=False), allow_nan=False))
    rec = _score_advice(j)
    assert rec["measured"] == {"heads": [], "how": "not measured: QK-norm: forced by the test",
                               "line": "measured: not measured (QK-norm: forced by the test)"}
    assert_consistent(j)


def test_heads_sharp_by_design_are_not_at_risk():
    """A head above beta_c is advised only when its role is not sink, positional or selective
    (copy / induction-like: sharp on a different key per query)."""
    import pandas as pd

    from sigprop.analysis.trained import risky_heads

    scales = pd.DataFrame({"layer": [1, 1, 1, 1, 2], "head": [0, 1, 2, 3, 0],
                           "beta_over_beta_c": [2.0, 1.5, 1.2, 3.0, 0.9]})
    roles = pd.DataFrame({"layer": [1, 1, 1, 1, 2], "head": [0, 1, 2, 3, 0],
                          "role": ["sink", "positional", "selective", "collapsed", "content"]})
    assert risky_heads(scales, roles) == [(1, 3, 3.0)]
    assert [x[:2] for x in risky_heads(scales)] == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_real_text_anatomy_reaches_the_json(diagnosed):
    """On real text the probe reads the tokenizer's ids: each head's key concentration and
    its copy and induction mass are in per_head, as fractions of the mass."""
    j = to_json(diagnosed["decoder"], timing=False)
    for h in j["per_head"]:
        for k in ("top_key", "copy", "induction"):
            assert h[k] is not None and 0.0 <= h[k] <= 1.0, (k, h)
