"""sigprop.training.optim.SliceAdam against torch's Adam / AdamW, the shared loop of
sigprop.training.steps (float64 throughout: the comparisons are to rounding), and
MuonAdamW's split of a model's parameters, its step and its saved state."""

import copy

import pytest
import torch

from sigprop.training.optim import SliceAdam
from sigprop.training.steps import run, step

pytestmark = pytest.mark.usefixtures("torch_one_thread")

R, STEPS = 3, 25


def _problem(seed: int = 0):
    """A quadratic-plus-quartic loss per slice of a (R, 4, 5) parameter and a (5, R) one
    (slices along dims 0 and 1): nonzero gradients that change every step."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(R, 4, 5, generator=g, dtype=torch.float64)
    v = torch.randn(5, R, generator=g, dtype=torch.float64)
    target = torch.randn(R, 4, generator=g, dtype=torch.float64)

    def losses(w, v):  # (R,): slice r reads w[r] and v[:, r] only
        out = torch.einsum("rij,jr->ri", w, v)
        return (out - target).square().mean(1) + 0.1 * w.pow(4).mean((1, 2))

    return w, v, losses


def _slice_adam(lr, weight_decay=0.0):
    w, v, losses = _problem()
    w, v = w.clone().requires_grad_(True), v.clone().requires_grad_(True)
    opt = SliceAdam([{"params": [w]}, {"params": [v], "dim": 1}], lr=lr,
                    weight_decay=weight_decay)
    seen = []
    run(lambda _k: losses(w, v), opt, STEPS, after=lambda _k, x: seen.append(x))
    return w.detach(), v.detach(), torch.stack(seen)


def _torch_runs(lrs, weight_decay=0.0):
    """Each slice trained alone by torch's Adam (AdamW with weight decay) at its rate."""
    w0, v0, losses = _problem()
    ws, vs = [], []
    for r, lr in enumerate(lrs):
        w = w0[r].clone().requires_grad_(True)
        v = v0[:, r].clone().requires_grad_(True)
        cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
        opt = cls([w, v], lr=lr, weight_decay=weight_decay, foreach=False)
        for _ in range(STEPS):
            full_w = w0.clone()
            full_w[r] = w
            full_v = v0.clone()
            full_v[:, r] = v
            step(losses(full_w, full_v)[r], opt)
        ws.append(w.detach())
        vs.append(v.detach())
    return torch.stack(ws), torch.stack(vs, dim=1)


def test_one_rate_equals_torch_adam():
    w, v, _ = _slice_adam(0.05)
    tw, tv = _torch_runs([0.05] * R)
    torch.testing.assert_close(w, tw, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(v, tv, rtol=1e-12, atol=1e-13)


def test_per_slice_rates_equal_separate_torch_runs():
    lrs = [0.3, 0.02, 1e-3]
    w, v, seen = _slice_adam(torch.tensor(lrs, dtype=torch.float64))
    tw, tv = _torch_runs(lrs)
    torch.testing.assert_close(w, tw, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(v, tv, rtol=1e-12, atol=1e-13)
    assert seen.shape == (STEPS, R) and not torch.equal(w[0], w[1])


def test_decoupled_weight_decay_equals_torch_adamw():
    lrs = [0.1, 0.01, 0.05]
    w, v, _ = _slice_adam(torch.tensor(lrs, dtype=torch.float64), weight_decay=0.3)
    tw, tv = _torch_runs(lrs, weight_decay=0.3)
    torch.testing.assert_close(w, tw, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(v, tv, rtol=1e-12, atol=1e-13)


def test_rates_must_match_the_slices():
    p = torch.zeros(2, 3, requires_grad=True)
    p.grad = torch.ones(2, 3)
    with pytest.raises(ValueError, match="3 learning rates"):
        SliceAdam([p], lr=torch.tensor([0.1, 0.2, 0.3])).step()
    with pytest.raises(ValueError, match="lr"):
        SliceAdam([p], lr=-1.0)


def test_run_stops_before_a_nonfinite_loss():
    p = torch.ones(2, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    done = run(lambda k: p.sum() * (float("nan") if k == 3 else 1.0), opt, 5, finite=True)
    assert done == 2
    torch.testing.assert_close(p.detach(), torch.full((2,), 0.8))


def test_muon_adamw_split_and_step():
    """MuonAdamW: the hidden 2-D projections go to Muon; embeddings (tied head included),
    norms and biases to AdamW; both halves move on a step; a rate set through
    ``param_groups`` reaches both; ``zero_grad`` clears every gradient."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from sigprop.training.optim import MuonAdamW

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2,
                                       n_positions=8))
    opt = MuonAdamW(model, lr=0.01)
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in muon}
    assert names == {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight",
                     "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight"}
    rest = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    assert id(model.transformer.wte.weight) in rest and id(model.lm_head.weight) in rest
    assert len(muon) + len(rest) == len(list(model.parameters()))
    for g in opt.param_groups:
        g["lr"] = 0.02
    assert opt.muon.param_groups[0]["lr"] == opt.adamw.param_groups[0]["lr"] == 0.02
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 50, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "transformer.h.0.attn.c_attn.weight" in moved and "transformer.wte.weight" in moved
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    # the state round-trips: a fresh optimiser loaded with it takes the same next step
    model.eval()  # (dropout off: the two steps see the same gradients)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    again = MuonAdamW(model, lr=0.02)  # (a copy, as saved to disk: torch's state_dict
    again.load_state_dict(copy.deepcopy(opt.state_dict()))  # holds the live tensors)
    steps = []
    for o in (opt, again):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
        model(input_ids=ids, labels=ids).loss.backward()
        o.step()
        o.zero_grad()
        steps.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert all(torch.equal(steps[0][n], steps[1][n]) for n in saved)
