"""sigprop.measurement.monitor: the training-time monitor on tiny models built to be healthy,
rank-collapsed and entropy-collapsed; its use by ``sigprop.training.loop.train`` and
``sigprop train --store``. Expected values are computed here from the models' own weights,
never by the monitor."""

import json
import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from sigprop.measurement.monitor import CollapseWarning, Monitor, monitor

D, H, T, B = 32, 2, 16, 4


pytestmark = pytest.mark.usefixtures("torch_one_thread")


# ---- a tiny transformer the probe can hook ----------------------------------------------
class Attention(nn.Module):
    """q_proj / k_proj / v_proj / o_proj and num_heads / head_dim, as the probe reads them;
    dropout 0.5 on the probabilities, so a measurement outside eval mode would be noisy."""

    def __init__(self, qk_std: float):
        super().__init__()
        self.num_heads, self.head_dim = H, D // H
        self.q_proj, self.k_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.v_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        for lin in (self.q_proj, self.k_proj):
            nn.init.normal_(lin.weight, std=qk_std)
        for lin in (self.v_proj, self.o_proj):
            nn.init.normal_(lin.weight, std=D ** -0.5)
        self.drop = nn.Dropout(0.5)

    def probs(self, x):
        Bx, Tx, _ = x.shape
        q, k = (p(x).view(Bx, Tx, H, D // H).transpose(1, 2) for p in (self.q_proj, self.k_proj))
        return torch.softmax(q @ k.transpose(-1, -2) * (D // H) ** -0.5, dim=-1)

    def forward(self, x):
        Bx, Tx, _ = x.shape
        v = self.v_proj(x).view(Bx, Tx, H, D // H).transpose(1, 2)
        return self.o_proj((self.drop(self.probs(x)) @ v).transpose(1, 2).reshape(Bx, Tx, D))


class Block(nn.Module):
    def __init__(self, qk_std, residual):
        super().__init__()
        self.attn, self.residual = Attention(qk_std), residual

    def forward(self, x):
        y = self.attn(x)
        return nn.functional.layer_norm(x + y, (D,)) if self.residual else y


class Tiny(nn.Module):
    """Healthy by default. ``qk_std=0, residual=False``: uniform attention averages the
    tokens, every token is the same after block 1 (rank collapse; entropy stays 1). Large
    ``qk_std``: one-hot attention (entropy collapse)."""

    def __init__(self, depth=2, qk_std=D ** -0.5, residual=True, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(Block(qk_std, residual) for _ in range(depth))

    def forward(self, x):
        for blk in self.layers:
            x = blk(x)
        return x


def tokens(seed=0):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def _quiet(fn):
    """Run ``fn`` with CollapseWarning turned into an error (a healthy run must not warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapseWarning)
        return fn()


def _run(mon, steps):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in steps:
            mon(s)
    return [w for w in caught if issubclass(w.category, CollapseWarning)]


# ---- tests --------------------------------------------------------------------------------
def test_every_k_steps_rows_and_scalars():
    model, x = Tiny(), tokens()
    seen = []
    mon = monitor(model, x, every=3, sinks=[lambda s, f, sc: seen.append((s, f, sc))])
    out = _quiet(lambda: [mon(s) for s in range(8)])
    assert [s for s, *_ in seen] == [0, 3, 6] == mon.steps
    assert [o is None for o in out] == [s % 3 != 0 for s in range(8)]
    assert mon(7, force=True) is not None and mon.steps[-1] == 7
    step, frame, scalars = seen[1]
    assert set(frame["step"]) == {3}
    heads = frame[(frame.observable == "entropy") & frame["head"].notna()]
    assert sorted(heads["head"].astype(int).unique()) == [0, 1]
    assert set(heads["layer"]) == {1, 2}
    assert {"grad_qk", "grad_v", "loss"} <= set(frame["observable"])
    for layer in (1, 2):
        for name in ("cos", "q", "stable_rank", "entropy", "ipr", "wmax", "grad_q", "grad_k",
                     "grad_v"):
            assert math.isfinite(scalars[f"sigprop/{name}/layer_{layer:02d}"]), name
        for h in range(H):
            assert 0 <= scalars[f"sigprop/entropy/layer_{layer:02d}/head_{h}"] <= 1
    assert "sigprop/cos/layer_00" in scalars and "sigprop/entropy/layer_00" not in scalars
    assert scalars["sigprop/cos/max"] == max(scalars["sigprop/cos/layer_01"],
                                             scalars["sigprop/cos/layer_02"])
    assert not mon.events and not mon.warned
    assert len(mon.trajectory()) == 4 * len(frame)


def test_values_match_a_direct_computation():
    """Layer 1's entropy / cos and W_Q's gradient, computed here from the model itself."""
    model, x = Tiny(), tokens()
    mon = Monitor(model, x, every=1, loss_fn=lambda out: out.pow(2).mean())
    _quiet(lambda: mon(0))
    sc = mon.scalars
    model.eval()  # the reference without dropout
    with torch.no_grad():
        A = model.layers[0].attn.probs(x).double()  # (B, H, T, T), float32 softmax
        ent = -(A * A.log()).sum(-1) / math.log(T)
        h1 = model.layers[0](x).double()
        u = h1 / h1.norm(dim=-1, keepdim=True)
        gram = u @ u.transpose(-1, -2)
        cos = ((gram.sum((-1, -2)) - T) / (T * (T - 1))).mean()
    assert sc["sigprop/entropy/layer_01"] == pytest.approx(float(ent.mean()), rel=1e-6)
    assert sc["sigprop/entropy/layer_01/head_1"] == pytest.approx(float(ent[:, 1].mean()),
                                                                  rel=1e-6)
    assert sc["sigprop/cos/layer_01"] == pytest.approx(float(cos), rel=1e-5)
    w = model.layers[0].attn.q_proj.weight
    (g,) = torch.autograd.grad(model(x).pow(2).mean(), [w])
    assert sc["sigprop/grad_q/layer_01"] == pytest.approx(float(g.double().pow(2).sum()),
                                                          rel=1e-5)


def test_eval_mode_during_measurement_and_training_state_untouched():
    model, x = Tiny(), tokens()
    model.train()
    grads = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    mon = Monitor(model, x, every=1)
    a = _quiet(lambda: mon(0))
    b = _quiet(lambda: mon(1))
    assert model.training  # restored
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n  # gradients via autograd.grad, .grad kept
    # dropout (p = 0.5 on the probabilities) is off while measuring: two measurements agree
    assert a["value"].tolist() == pytest.approx(b["value"].tolist(), rel=1e-12, nan_ok=True)


def test_rank_collapse_warns_once():
    mon = Monitor(Tiny(qk_std=0.0, residual=False), tokens(), every=2, grads=False)
    caught = _run(mon, range(6))
    assert len(caught) == 1
    ev = caught[0].message.event
    assert (ev.kind, ev.step, ev.layer, ev.threshold) == ("rank_collapse", 0, 1, 0.9)
    msg = str(caught[0].message)
    assert "rank collapse" in msg and "step 0" in msg and "layer 1" in msg and "0.9" in msg
    # every measured step and layer is an event; no entropy collapse (attention is uniform)
    assert sorted((e.step, e.layer) for e in mon.events) == [(s, ly) for s in (0, 2, 4)
                                                            for ly in (1, 2)]
    assert {e.kind for e in mon.events} == {"rank_collapse"}
    assert all(e.value >= 0.9 for e in mon.events)
    assert mon.first("entropy_collapse") is None


def test_entropy_collapse_warns_once():
    mon = Monitor(Tiny(qk_std=2.0), tokens(), every=1, grads=False, per_head=False)
    caught = _run(mon, range(3))
    assert len(caught) == 1 and caught[0].message.event.kind == "entropy_collapse"
    assert "entropy collapse" in str(caught[0].message)
    assert {e.kind for e in mon.events} == {"entropy_collapse"}
    assert all(e.value < 0.5 for e in mon.events)
    # the thresholds are the caller's: with entropy_min = 0 nothing is an entropy collapse
    strict = Monitor(Tiny(qk_std=2.0), tokens(), every=1, grads=False, entropy_min=0.0)
    assert not _run(strict, [0]) and not strict.events


def test_batches_and_the_models_own_loss():
    class Wrapped(nn.Module):
        """An HF-like model: keyword inputs, an output object with ``loss`` when given
        labels."""

        def __init__(self):
            super().__init__()
            self.model = Tiny()

        def forward(self, x, labels=None):
            h = self.model(x)
            loss = None if labels is None else (h - labels).pow(2).mean()
            return SimpleNamespace(last_hidden_state=h, loss=loss)

    net, x = Wrapped(), tokens()
    y = tokens(seed=1)
    mon = Monitor(net, {"x": x, "labels": y}, every=1)
    _quiet(lambda: mon(0))
    net.eval()
    w = net.model.layers[1].attn.k_proj.weight
    (g,) = torch.autograd.grad((net.model(x) - y).pow(2).mean(), [w])
    assert mon.scalars["sigprop/grad_k/layer_02"] == pytest.approx(
        float(g.double().pow(2).sum()), rel=1e-5)
    # a tuple batch and a bare tensor give the same probe rows
    t1 = Monitor(Tiny(), (x,), every=1, grads=False)
    t2 = Monitor(Tiny(), x, every=1, grads=False)
    assert _quiet(lambda: t1(0))["value"].tolist() == pytest.approx(
        _quiet(lambda: t2(0))["value"].tolist(), nan_ok=True)


def test_bad_arguments():
    with pytest.raises(ValueError, match="every"):
        Monitor(Tiny(), tokens(), every=-1)
    with pytest.raises(ValueError, match="rho_max"):
        Monitor(Tiny(), tokens(), rho_max=1.5)
    with pytest.raises(ValueError, match="block"):
        Monitor(nn.Linear(D, D), tokens())
    assert Monitor(Tiny(), tokens(), every=0)(0) is None  # 0: only when forced


def test_training_loop_uses_the_monitor():
    """sigprop's own loop (reverse task, no corpus) at a large beta: the monitor's sinks see
    every measuring step and its first entropy collapse warns once."""
    from sigprop.spec import ArchSpec
    from sigprop.training.loop import TrainConfig, train

    spec = ArchSpec(depth=1, d_model=16, heads=2, seq_len=8, beta=40.0)
    cfg = TrainConfig(task="reverse", steps=3, batch_size=4, eval_sequences=8,
                      measure_every=2, n_symbols=6)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = train(spec, cfg, sinks=[lambda s, f, sc: seen.append((s, sc))], warn=True)
    warned = [w for w in caught if issubclass(w.category, CollapseWarning)]
    assert [s for s, _ in seen] == [0, 2, 3]
    assert len(warned) == 1 and warned[0].message.event.kind == "entropy_collapse"
    ent = res.trajectory[(res.trajectory.observable == "entropy")]
    assert sorted(ent["step"]) == [0, 2, 3]
    assert {(e.step, e.layer) for e in res.events} == {
        (int(r.step), int(r.layer)) for r in ent.itertuples() if r.value < 0.5}
    assert seen[0][1]["sigprop/entropy/layer_01"] == pytest.approx(
        float(ent[ent.step == 0]["value"].iloc[0]))
    quiet = train(spec, cfg)  # the library default: events kept, no warning
    assert quiet.events and quiet.events == res.events


def test_cli_train_store_and_one_warning_per_kind(tmp_path):
    from typer.testing import CliRunner

    from sigprop.cli import app
    from sigprop.runs.store import Store

    store = tmp_path / "store"
    args = ["train", "--depth", "1", "--d-model", "16", "--heads", "2", "--seq-len", "8",
            "--beta", "40", "--task", "reverse", "--steps", "3", "--measure-every", "1",
            "--batch-size", "4", "--store", str(store), "--format", "json", "--no-timing"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("sigprop: warning:")]
    assert len(lines) == 1 and "entropy collapse at step 0" in lines[0]
    df = Store(store).read(command="monitor")
    assert sorted(df["step"].unique().tolist()) == [0, 1, 2, 3]
    assert set(df["run"]) == {"train"}
    rows = [r for r in out["rows"] if r["observable"] == "entropy" and r["step"] == 2]
    stored = df[(df.observable == "entropy") & (df.step == 2)]
    assert float(stored["value"].iloc[0]) == pytest.approx(rows[0]["value"])
    (tmp_path / "file").write_text("not a store")
    bad = CliRunner().invoke(app, [*args[:-5], "--store", str(tmp_path / "file")])
    assert bad.exit_code == 2 and "--store" in bad.stderr
