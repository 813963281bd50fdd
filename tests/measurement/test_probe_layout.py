"""Time-major models (FSMT, XLNet and other fairseq ports pass ``(tokens, batch, width)``
states between blocks): the probe reads them as the same model laid out batch-first."""

import pytest
import torch
from torch import nn

from sigprop.measurement.probe import Probe


class _Attention(nn.Module):
    def __init__(self, d, heads, time_major):
        super().__init__()
        self.num_heads, self.head_dim, self.time_major = heads, d // heads, time_major
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.o_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        if self.time_major == "inside":  # batch-first inside the module
            x = x.transpose(0, 1)
        q, k, v = (p(x) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.time_major == "projected":  # projections on time-major states (FSMT)
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
                   for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim**0.5, dim=-1)
        out = self.o_proj((a @ v).transpose(1, 2).flatten(-2))
        return out.transpose(0, 1) if self.time_major else out


class _Block(nn.Module):
    def __init__(self, d, heads, time_major):
        super().__init__()
        self.self_attn = _Attention(d, heads, time_major)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.self_attn(x))


class _Stack(nn.Module):
    def __init__(self, time_major, d=32, heads=4):
        super().__init__()
        self.layers = nn.ModuleList(_Block(d, heads, time_major) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _probe(model, x):
    p = Probe(model, layers=list(model.layers), batch=2, keep_hidden=False)
    with p, torch.no_grad():
        model(x)
    return p


@pytest.mark.parametrize("where", ["inside", "projected"])
def test_time_major_states_read_as_batch_first(where):
    torch.manual_seed(0)
    bf, tm = _Stack(False).eval(), _Stack(where).eval()
    tm.load_state_dict(bf.state_dict())
    for lin in bf.modules():  # scores large enough that the entropy is far from uniform
        if isinstance(lin, nn.Linear):
            nn.init.normal_(lin.weight, std=0.5)
    tm.load_state_dict(bf.state_dict())
    x = torch.randn(2, 16, 32)  # batch 2, 16 tokens: the two layouts differ in shape
    a, b = _probe(bf, x), _probe(tm, x.transpose(0, 1))
    assert b.time_major and not a.time_major
    for ha, hb in zip(a.hidden_stats, b.hidden_stats, strict=True):
        torch.testing.assert_close(ha["cos"], hb["cos"])
    assert a.attention_stats[0], "the attention layer was read"
    for sa, sb in zip(a.attention_stats, b.attention_stats, strict=True):
        assert set(sa) == set(sb)
        for key in sa:
            torch.testing.assert_close(sa[key], sb[key])
    ent = a.attention_stats[0]["entropy"]
    assert float(ent.mean()) < 0.9  # not uniform: a batch/token mix-up would show


def test_batch_first_model_with_batch_equal_to_width_is_not_transposed():
    torch.manual_seed(1)
    m = _Stack(False).eval()
    p = _probe(m, torch.randn(2, 2, 32))  # tokens == batch: ambiguous, read as batch-first
    assert not p.time_major


class _HeadsFirst(nn.Module):
    """A projection module wrapping one Linear that returns its heads first, (B, n, T, dh)
    (Inkling 2's query / key projections)."""

    def __init__(self, d, heads):
        super().__init__()
        self.linear, self.heads = nn.Linear(d, d), heads

    def forward(self, x):
        return self.linear(x).unflatten(-1, (self.heads, -1)).transpose(1, 2)


class _WrappedAttention(_Attention):
    def __init__(self, d, heads):
        super().__init__(d, heads, False)
        self.q_proj, self.k_proj = _HeadsFirst(d, heads), _HeadsFirst(d, heads)

    def forward(self, x):
        q, k = self.q_proj(x), self.k_proj(x)
        v = self.v_proj(x).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim**0.5, dim=-1)
        return self.o_proj((a @ v).transpose(1, 2).flatten(-2))


@pytest.mark.parametrize("T", [16, 3])
def test_wrapped_heads_first_projections_read_as_plain_ones(T):
    """q / k projections that wrap a Linear and return ``(B, heads, T, dh)`` give the same
    statistics as the plain Linear layout with the same weights (T 3 != heads 4; T 16)."""
    torch.manual_seed(2)
    plain = _Stack(False).eval()
    for lin in plain.modules():
        if isinstance(lin, nn.Linear):
            nn.init.normal_(lin.weight, std=0.5)
    wrapped = _Stack(False).eval()
    for blk in wrapped.layers:
        blk.self_attn = _WrappedAttention(32, 4)
    sd = {k.replace("q_proj.", "q_proj.linear.").replace("k_proj.", "k_proj.linear."): v
          for k, v in plain.state_dict().items()}
    wrapped.load_state_dict(sd)
    x = torch.randn(2, T, 32)
    a, b = _probe(plain, x), _probe(wrapped, x)
    assert a.attention_stats[0] and b.attention_stats[0], "both attention layers were read"
    for sa, sb in zip(a.attention_stats, b.attention_stats, strict=True):
        assert set(sa) == set(sb)
        for key in sa:
            torch.testing.assert_close(sa[key], sb[key])


def test_windowed_maps_fold_windows_into_the_batch():
    """Returned maps with a windows axis, (B, H, windows, T, Tk) (Hiera), are read as
    (B windows, H, T, Tk): each head's maps are its windows' maps; no heads axis raises."""
    from sigprop.measurement.probe import _heads_third_last

    A = torch.softmax(torch.randn(2, 3, 5, 4, 4), -1)
    out = _heads_third_last(A, 3)
    assert tuple(out.shape) == (10, 3, 4, 4)
    torch.testing.assert_close(out[7, 2], A[1, 2, 2])  # sequence 1, window 2, head 2
    assert _heads_third_last(A[:, :, 0], 3) is not None  # 4-D maps pass through
    with pytest.raises(RuntimeError, match="no axis of 7 heads"):
        _heads_third_last(A, 7)
