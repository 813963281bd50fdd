"""SigpropLightningCallback in a real Lightning ``Trainer``: a 2-layer Llama (d = 32) built from
its config, wrapped in a LightningModule and trained a few steps on random token ids, CSV as
the logger; the attention scalars must be in the callback's health at every optimizer step,
in the logger's metrics file at the same steps as the loss, and in the results store, and
QK-Clip must act after the optimizer step."""

import csv
import glob
import math
import sys
import types

import pytest
import torch

pytest.importorskip("lightning", reason="lightning is not installed (pip install "
                                        "sigprop[lightning])")
transformers = pytest.importorskip("transformers")

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from sigprop.integrations import lightning as sl  # noqa: E402
from sigprop.integrations.lightning import SigpropLightningCallback  # noqa: E402
from sigprop.models import loading  # noqa: E402
from sigprop.runs.store import Store  # noqa: E402
from sigprop.spec import SpecError  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

STEPS, LAYERS, HEADS, VOCAB, T, B = 6, 2, 2, 200, 16, 4
CFG = dict(model_type="llama", hidden_size=32, num_hidden_layers=LAYERS,
           num_attention_heads=HEADS, intermediate_size=64, vocab_size=VOCAB,
           max_position_embeddings=128)


class TinyLM(pl.LightningModule):
    """A LightningModule wrapping a HuggingFace causal LM (the usual ``self.model``)."""

    def __init__(self, lr=1e-3):
        super().__init__()
        torch.manual_seed(0)
        self.model = transformers.AutoModelForCausalLM.from_config(loading.load_config(CFG))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _loader(n=STEPS * B, seed=0):
    ids = torch.randint(3, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(ids, batch_size=B, shuffle=False)


def _fit(tmp_path, cb, steps=STEPS, **kw):
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1,
                         logger=CSVLogger(str(tmp_path), name="tiny"), log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[cb],
                         **kw)
    module = TinyLM()
    trainer.fit(module, _loader())
    return trainer, module


def _hooks(module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def _csv_rows(tmp_path):
    files = glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)
    assert len(files) == 1, files
    with open(files[0], newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def fitted(torch_one_thread, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lightning")
    cb = SigpropLightningCallback(rows=4, per_head=True, store=tmp / "store", run="tiny",
                                  warn=False)
    trainer, module = _fit(tmp, cb)
    return tmp, trainer, module, cb


def test_scalars_at_every_optimizer_step(fitted):
    _, trainer, _, cb = fitted
    assert trainer.global_step == STEPS
    assert isinstance(cb, pl.Callback)
    assert [s["step"] for s in cb.health.scalars] == list(range(STEPS))
    for s in cb.health.scalars:
        for key in ("attention/max_logit", "attention/min_entropy", "attention/max_logit/L0",
                    "attention/entropy/L1", "attention/beta/L0", "attention/max_logit/L1.H1"):
            assert math.isfinite(s[key]), key
    assert set(cb.health.trajectory().step) == set(range(STEPS))
    assert not cb.health.events  # a healthy tiny model: no crossing, no forecast


def test_logger_gets_the_scalars_at_the_loss_steps(fitted):
    tmp, _, _, _ = fitted
    rows = _csv_rows(tmp)
    att = {int(r["step"]) for r in rows if r.get("attention/max_logit")}
    loss = {int(r["step"]) for r in rows if r.get("train_loss")}
    assert att == set(range(STEPS))
    assert loss == att  # Lightning logs the batch's loss at the same step
    assert "attention/entropy/L1" in rows[0] and "attention/max_logit/L1.H1" in rows[0]


def test_rows_in_the_results_store(fitted):
    tmp, _, _, cb = fitted
    df = Store(tmp / "store").read(command="monitor")
    assert set(df.step) == set(range(STEPS))
    assert set(df.run) == {"tiny"} and set(df.kind) == {"telemetry"}
    assert len(df) == len(cb.health.rows)


def test_hooks_removed_after_fit(fitted):
    _, _, module, cb = fitted
    assert _hooks(module) == 0
    ids = next(iter(_loader()))
    module.model(input_ids=ids, labels=ids).loss.backward()  # a training-like forward
    assert cb.health.telemetry.end_step() == {}  # nothing read any more


def test_qk_clip_after_the_optimizer_step(tmp_path):
    """QK-Clip at half the largest logit at init (~0.05; Llama's initializer_range 0.02): the
    heads above tau are clipped at the steps they passed it, and after each clip the next
    step's largest logit stays within 1.5 tau (one AdamW step at lr 1e-3 and a new batch;
    measured <= 1.32 tau), where the same run without the clip stays above 1.5 tau (measured
    >= 1.86 tau) at every step."""
    ref = SigpropLightningCallback(rows=4, warn=False, log=False)
    _fit(tmp_path / "ref", ref)
    tau = ref.health.scalars[0]["attention/max_logit"] / 2
    cb = SigpropLightningCallback(rows=4, qk_clip=tau, warn=False)
    _fit(tmp_path / "clip", cb)
    clips = [e for e in cb.health.events if e.kind == "qk_clip"]
    assert clips and all(e.value > tau and e.threshold == tau for e in clips)
    assert {(e.layer, e.head) for e in clips if e.step == 0} == {
        (i, h) for i in range(LAYERS) for h in range(HEADS)}  # all above tau at init
    # step 0 reads the forward before any clip: the same weights, the same batch
    assert cb.health.scalars[0]["attention/max_logit"] == ref.health.scalars[0][
        "attention/max_logit"]
    clipped = [s["attention/max_logit"] for s in cb.health.scalars[1:]]
    free = [s["attention/max_logit"] for s in ref.health.scalars[1:]]
    assert max(clipped) <= 1.5 * tau < min(free), (tau, clipped, free)


def test_gradient_accumulation_is_one_step(tmp_path):
    """accumulate_grad_batches=2: six batches, three optimizer steps; the health reads each
    step once, its two forwards merged."""
    cb = SigpropLightningCallback(rows=4, warn=False)
    trainer, _ = _fit(tmp_path, cb, steps=3, accumulate_grad_batches=2)
    assert trainer.global_step == 3
    assert [s["step"] for s in cb.health.scalars] == [0, 1, 2]
    rows = _csv_rows(tmp_path)
    assert {int(r["step"]) for r in rows if r.get("attention/max_logit")} == {0, 1, 2}


class _Plain(pl.LightningModule):
    def __init__(self, inner):
        super().__init__()
        self.net = inner


def test_which_module_is_read():
    """module= names the submodule; a LightningModule without attention is refused in one
    line (field ``model``); unknown options fail when the callback is built."""
    fake = types.SimpleNamespace(global_step=0, is_global_zero=True, loggers=[])
    lm = TinyLM()
    cb = SigpropLightningCallback(rows=2, module="model.model")
    cb.on_train_start(fake, lm)
    assert cb.health.model is lm.model.model and _hooks(lm) > 0
    cb.on_train_end(fake, lm)
    assert _hooks(lm) == 0
    with pytest.raises(SpecError, match="^model: "):
        SigpropLightningCallback().on_train_start(fake, _Plain(torch.nn.Linear(4, 4)))
    with pytest.raises(TypeError):
        SigpropLightningCallback(nonsense=1)


def test_missing_lightning_is_one_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    sl._with_lightning_base.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install sigprop\[lightning\]"):
            SigpropLightningCallback()
    finally:
        sl._with_lightning_base.cache_clear()


def test_pickles_for_spawned_processes():
    """strategy="ddp_spawn" pickles the trainer with its callbacks; deepcopy likewise."""
    import copy
    import pickle

    cb = SigpropLightningCallback(rows=3, qk_clip=50.0, seed=2)
    for back in (pickle.loads(pickle.dumps(cb)), copy.deepcopy(cb)):
        assert isinstance(back, pl.Callback) and type(back) is type(cb)
        assert back.options == cb.options and back.health is None
