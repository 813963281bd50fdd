"""SigpropCallback in a real ``transformers.Trainer``: a 2-layer BERT (d = 32) trained a few
steps on an in-memory dataset, TensorBoard as the logger; the sigprop scalars must be in the
Trainer's log history, in the TensorBoard event files and in the results store."""

import glob
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("tensorboard")

from sigprop.integrations import SigpropCallback  # noqa: E402
from sigprop.runs.store import Store  # noqa: E402

STEPS, EVERY, LAYERS, HEADS, VOCAB, T = 4, 2, 2, 2, 40, 12


def _model():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=64,
                                  max_position_embeddings=T, type_vocab_size=1)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg)


def _dataset(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, T), generator=g)
    labels = torch.where(torch.rand(n, T, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]  # every sequence has a scored position
    return [{"input_ids": i, "attention_mask": torch.ones(T, dtype=torch.long), "labels": y}
            for i, y in zip(ids, labels, strict=True)]


def _trainer(tmp_path, **cb):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, report_to=["tensorboard"], save_strategy="no",
        use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_dataset())
    return trainer, SigpropCallback(every=EVERY, **cb).attach(trainer)


def _scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(str(tb_dir / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, "no TensorBoard event file written"
    out = {}
    for f in files:
        acc = EventAccumulator(f, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def trained(torch_one_thread, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    trainer, cb = _trainer(tmp, store=tmp / "store", run="tiny-bert")
    trainer.train()
    return tmp, trainer, cb


def test_scalars_in_log_history(trained):
    _, trainer, cb = trained
    hist = [h for h in trainer.state.log_history if "sigprop/cos/layer_01" in h]
    assert [h["step"] for h in hist] == [0, 2, 4]  # step 0, then every 2 (4 is also the last)
    for h in hist:
        for layer in range(1, LAYERS + 1):
            for name in ("cos", "entropy", "ipr", "grad_q", "grad_k"):
                assert math.isfinite(h[f"sigprop/{name}/layer_{layer:02d}"]), name
            for head in range(HEADS):
                e = h[f"sigprop/entropy/layer_{layer:02d}/head_{head}"]
                assert 0.0 <= e <= 1.0
        assert -1.0 <= h["sigprop/cos/layer_01"] <= 1.0
    # the Trainer's own loss logging (logging_steps=1) is still there at every step
    assert sorted(h["step"] for h in trainer.state.log_history if "loss" in h) == [1, 2, 3, 4]
    # the model learns between measurements: the held batch's loss is not frozen
    losses = [h["sigprop/loss"] for h in hist]
    assert len(set(losses)) == len(losses)


def test_scalars_in_tensorboard(trained):
    tmp, trainer, _ = trained
    tb = _scalars(tmp / "out")
    steps = dict(tb["train/sigprop/entropy/layer_02/head_1"])
    assert sorted(steps) == [0, 2, 4]
    hist = {h["step"]: h for h in trainer.state.log_history if "sigprop/cos/layer_01" in h}
    for step, value in steps.items():
        assert value == pytest.approx(hist[step]["sigprop/entropy/layer_02/head_1"], rel=1e-6)
    assert "train/sigprop/grad_q/layer_01" in tb and "train/loss" in tb


def test_rows_in_store(trained):
    tmp, trainer, cb = trained
    df = Store(tmp / "store").read(command="monitor")
    assert sorted(df["step"].unique().tolist()) == [0, 2, 4]
    assert set(df["run"]) == {"tiny-bert"}
    assert {"cos", "entropy", "ipr", "grad_qk", "grad_v"} <= set(df["observable"])
    cos = df[(df.observable == "cos") & (df.layer == 1) & (df.step == 2)]["value"]
    hist = {h["step"]: h for h in trainer.state.log_history if "sigprop/cos/layer_01" in h}
    assert float(cos.iloc[0]) == pytest.approx(hist[2]["sigprop/cos/layer_01"])
    assert cb.monitor.steps == [0, 2, 4]


def test_taking_the_first_batch_keeps_the_run_reproducible(tmp_path):
    """The held batch drawn from the train dataloader must not shift the run's random
    state: the same training with and without the callback ends at the same weights. The
    callback here is passed to the Trainer without ``attach``: it still reaches the log
    history, and says once that the loggers do not see it."""
    plain_args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "plain"), max_steps=2, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    plain = transformers.Trainer(model=_model(), args=plain_args, train_dataset=_dataset())
    plain.train()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "cb"), max_steps=2, per_device_train_batch_size=4,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    cb = SigpropCallback(every=1, grads=False, per_head=False)
    watched = transformers.Trainer(model=_model(), args=args, train_dataset=_dataset(),
                                   callbacks=[cb])
    with pytest.warns(UserWarning, match="not attached"):
        watched.train()
    for (n, a), (_, b) in zip(plain.model.named_parameters(), watched.model.named_parameters(),
                              strict=True):
        assert torch.equal(a, b), n
    steps = [h["step"] for h in watched.state.log_history if "sigprop/cos/layer_01" in h]
    assert steps == [0, 1, 2] == cb.monitor.steps


def test_is_a_trainer_callback():
    cb = SigpropCallback(every=3)
    assert isinstance(cb, transformers.TrainerCallback) and isinstance(cb, SigpropCallback)
    with pytest.raises(ValueError, match="every"):
        SigpropCallback(every=0)


def test_in_step_telemetry_and_qk_clip_in_a_trainer(tmp_path):
    """telemetry on the Trainer's own batches, every step, with QK-Clip at a tau below the
    model's logits (~0.05 at init): the scalars reach the log history and TensorBoard at each
    step, the clipped heads are events, and after each clip the next step's largest logit is
    back near tau (one AdamW step of growth: at lr 1e-3 far less than the 2x allowed)."""
    trainer, cb = _trainer(tmp_path, telemetry=True, qk_clip=0.03, monitor=False)
    trainer.train()
    hist = [h for h in trainer.state.log_history if "attention/max_logit" in h]
    assert len(hist) == STEPS
    tags = _scalars(tmp_path / "out")
    assert "train/attention/max_logit" in tags and "train/attention/entropy/L0" in tags
    clips = [e for e in cb.health.events if e.kind == "qk_clip"]
    assert clips and all(e.value > 0.03 for e in clips)
    later = [h["attention/max_logit"] for h in hist[1:]]
    assert max(later) <= 2 * 0.03, later
    assert cb.monitor is None  # monitor=False: no held-batch measurement
