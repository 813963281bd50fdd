"""The public API (``import sigprop``) as a notebook uses it: typed results with the tidy
Trajectory, a Figure and notebook HTML, without touching matplotlib's backend."""

import matplotlib
import pytest
import torch

import sigprop


@pytest.fixture(scope="module")
def small_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                     intermediate_size=64, vocab_size=200, max_position_embeddings=64)
    torch.manual_seed(0)
    return BertModel(cfg)


def _check_result(r, observables=("cos",)):
    before = matplotlib.get_backend()
    df = r.to_frame()
    assert {"layer", "observable", "source", "value", "stderr"} <= set(df.columns)
    assert set(observables) <= set(df["observable"])
    fig = r.plot()
    assert fig.axes
    page = r._repr_html_()
    assert page.startswith("<div>") and "data:image/svg+xml;base64," in page and "<table" in page
    assert matplotlib.get_backend() == before
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []


def test_diagnose_an_nn_module_as_a_notebook_would(small_bert):
    was_training = small_bert.training
    d = sigprop.diagnose(small_bert, seq_len=32, sequences=2)
    assert isinstance(d, sigprop.Diagnosis)
    assert d.model == "BertModel" and d.trained and d.seeds == 1
    assert d.verdict in ("trainable", "rank_collapse", "entropy_collapse")
    assert small_bert.training == was_training  # mode restored
    _check_result(d, ("cos", "entropy", "ipr"))


def test_diagnose_uses_the_modules_own_weights(small_bert):
    """Q/K weights x 30 in the module: the measured attention entropy falls (the weights are
    the ones measured, not a fresh init from the config)."""
    import copy

    hot = copy.deepcopy(small_bert)
    with torch.no_grad():
        for layer in hot.encoder.layer:
            layer.attention.self.query.weight.mul_(30.0)
            layer.attention.self.key.weight.mul_(30.0)
    cold = sigprop.diagnose(small_bert, seq_len=32, sequences=2)
    warm = sigprop.diagnose(hot, seq_len=32, sequences=2)

    def ent(d):
        t = d.trajectory
        return t[(t.source == "measured") & (t.observable == "entropy")]["value"].mean()

    assert ent(warm) < ent(cold) - 0.2


def test_diagnose_rejects_a_module_without_config():
    with pytest.raises(sigprop.SpecError, match="no transformers config"):
        sigprop.diagnose(torch.nn.Linear(4, 4))


def test_predict_measure_longctx_results():
    p = sigprop.predict(depth=6, beta=0.5, seq_len=64)
    assert isinstance(p, sigprop.Prediction) and p.spec.depth == 6
    _check_result(p, ("cos", "ipr"))
    assert sigprop.predict(beta=3.0).alpha_crit is None  # entropy collapse: no alpha_crit
    c = sigprop.measure(depth=2, d_model=32, heads=2, seq_len=16, seeds=2, sequences=1)
    assert isinstance(c, sigprop.Comparison)
    assert {"theory", "measured"} <= set(c.to_frame()["source"])
    _check_result(c)
    lc = sigprop.longctx(d_model=16, heads=2, seq_len=16, lengths=[16, 64], queries=8)
    assert isinstance(lc, sigprop.LongContext) and lc.trends
    _check_result(lc, ("ipr", "entropy"))


def test_version():
    assert isinstance(sigprop.__version__, str) and sigprop.__version__[0].isdigit()
