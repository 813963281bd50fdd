"""A certified bound on every attention logit, read from the weights: QK-Clip's
``clip_on="bound"`` rule (:class:`sigprop.training.health.AttentionHealth`, docs/instability.md).

Why a bound. QK-Clip on a batch's largest logits (Kimi K2's rule, or sigprop's ``"updated"``)
bounds that batch only: the next batch is other inputs through the same weights, and its
largest logit can pass tau. To hold every later batch at tau, the clip must act on a quantity
that covers every input the head can receive. Here that quantity is a bound on ``|logit|``
over all inputs, computed per head from the weights alone.

The input of a head is a norm's output. In a pre-LN block the Q and K projections read the
block's LayerNorm / RMSNorm (in a post-LN block, the previous block's final norm, or for the
first block the embedding norm). Whatever the family, such a norm is
``N(x) = g * z(x) + b`` (elementwise gain ``g``, bias ``b``, zero for an RMSNorm) with
``z`` the input divided by its RMS (after removing the mean, for a LayerNorm): ``|z| <=
sqrt(d)`` for every ``x``. So ``|N(x)| <= max|g| sqrt(d) + |b|``, whatever the stream holds.
This module uses the sharper form with the gain folded into the maps: a head's query is
``q = A z + a`` with ``A = W_Q diag(g)`` and ``a = W_Q b + b_Q`` (the key likewise: ``k = C
z' + c``), ``|z|, |z'| <= r = sqrt(d)``, and its logit is ``s q.k`` (``s``: the logit scale).
Two bounds hold:

* without rotary positions, ``q.k = z^T A^T C z' + a.C z' + z^T A^T c + a.c``, so
  ``|logit| <= s (||A^T C||_2 r^2 + |C^T a| r + |A^T c| r + |a.c|)``;
* with rotary positions the query and key are rotated by position-dependent orthogonal maps
  before the product, so only their lengths count:
  ``|logit| <= s rho^2 (||A||_2 r + |a|) (||C||_2 r + |c|)``, with ``rho`` the rotary map's
  gain (1 for plain RoPE; read from the ``(cos, sin)`` the attention receives, so a scaled
  rotary, YaRN's ``mscale``, is covered).

Each head takes the tighter of the bounds that apply (the second one always applies; the first
only without rotary positions). Both are bilinear in (W_Q rows, b_Q) and in (W_K rows, b_K),
so QK-Clip's rescale by ``gamma`` (:func:`~.qk_clip.qk_clip_`: ``gamma^alpha`` on the head's
query rows and bias, ``gamma^(1 - alpha)`` on its key's; with grouped K/V heads the query
takes the whole ``gamma``) scales the bound by exactly ``gamma``: ``gamma = tau / B`` leaves
the bound at ``tau``.

What is found, and how (nothing is looked up by family):

* which norm feeds which attention: once, by a forward pass on a few token ids with hooks on
  every norm module (:func:`~.parts.is_norm`) and on the Q / K projections: the tensor a
  norm returns must be the very tensor each projection receives (same storage, shape and
  version counter: no dropout, addition or in-place change between). The pass runs in
  training mode (dropout on the attention input is then seen and refused), under
  ``no_grad`` and with the random state forked (the run's RNG is not drawn from);
* each norm's effective gain and bias, at every call: the norm is applied to ``c u``, ``-c
  u`` and ``2 c u`` with ``u`` alternating +-1 (mean 0, RMS 1; a second, shifted one for an
  odd width) and ``c = 64`` (so ``eps`` is negligible): ``g = (N(cu) - N(-cu)) / (2u)``,
  ``b = (N(cu) + N(-cu)) / 2``. The norm is trusted only if ``N(2cu) = N(cu)`` (scale
  invariance) and a seeded random vector comes out as ``g z + b`` for the LayerNorm or the
  RMSNorm ``z`` (so HF's RMSNorms with ``weight``, Gemma's ``1 + weight``, ``nn.LayerNorm``
  and the like pass, and anything else is refused).

Refused, with one line (``SpecError``, field ``clip_on``): a model without a norm feeding its
Q / K projections directly (a raw stream, dropout or another operation in between, MLA's
latent up-projections, QK-norm, a wrapped projection), a projection fed by more than one norm,
additive position biases (ALiBi), or a forward that does not run on token ids. The spectral
norms are computed in float64 (``torch.linalg.matrix_norm(ord=2)`` on the ``d_H x d_H``
factors of thin QR decompositions), so the cost per layer is a few small decompositions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...measurement.probe import first_tensor
from ...spec import SpecError
from .head_rows import head_rows, linear_of

#: the field a refusal names: the health check's QK-Clip rule
FIELD = "clip_on"
#: the probe's amplitude: the norm's eps is negligible against c^2
PROBE_SCALE = 64.0
#: ``kind`` of a head's bound
KINDS = ("bilinear", "product")


@dataclass(frozen=True, kw_only=True)
class LayerWiring:
    """What feeds one attention layer (``layer``: its index in
    :func:`~.qk_clip.attention_layers`): the norm modules whose output the Q and K
    projections receive (``q_norm`` / ``k_norm``, named ``q_source`` / ``k_source``),
    whether the logits carry rotary positions (``rope``) and the rotary map's gain
    (``rope_gain``, 1 for plain RoPE)."""

    layer: int
    block: str
    site: object
    q_norm: nn.Module
    k_norm: nn.Module
    q_source: str
    k_source: str
    rope: bool
    rope_gain: float


@dataclass(frozen=True, kw_only=True)
class LayerBound:
    """One layer's bounds per query head, float64: ``bound`` (the one used, the smaller of
    those that apply), ``product`` (the rotary-safe product of the query and key lengths),
    ``bilinear`` (the bilinear-form bound; None with rotary positions) and ``kind`` per head
    (:data:`KINDS`)."""

    bound: torch.Tensor
    product: torch.Tensor
    bilinear: torch.Tensor | None
    kind: tuple[str, ...]


def _refuse(what: str) -> SpecError:
    return SpecError(FIELD, f"'bound' cannot bound this model's logits: {what}")


# ---- a norm's effective gain and bias ---------------------------------------------------
def _probe_vectors(d: int) -> list[torch.Tensor]:
    """Alternating +-1 vectors of mean 0 covering every coordinate (two for odd ``d``)."""
    u = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(d)], dtype=torch.float64)
    if d % 2 == 0:
        return [u]
    u[-1] = 0.0
    return [u, torch.roll(u, 1)]


def norm_affine(norm: nn.Module, width: int, seed: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gain, bias)`` (float64, ``(width,)``) of a norm module read as ``N(x) = gain *
    z(x) + bias`` (module docstring). Raises ``ValueError`` with the reason when the module
    is not scale invariant or does not act as a LayerNorm / RMSNorm with an elementwise
    affine map."""
    p = next(iter(norm.parameters()), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    device = p.device if p is not None else torch.device("cpu")
    if width < 2:
        raise ValueError(f"a norm over {width} feature(s)")
    us = _probe_vectors(width)
    v = torch.randn(width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c = PROBE_SCALE
    rows = [x for u in us for x in (c * u, -c * u, 2 * c * u)] + [c * v]
    x = torch.stack(rows)[None].to(device=device, dtype=dtype)
    with torch.no_grad():
        try:
            y = norm(x)
        except Exception as err:  # noqa: BLE001 - any module's forward on a probe
            raise ValueError(f"it fails on a probe ({type(err).__name__})") from None
    if not torch.is_tensor(y) or y.shape != x.shape:
        raise ValueError("its output is not a tensor of its input's shape")
    y = y[0].to("cpu", torch.float64)
    tol = 1e-4 if torch.finfo(dtype).bits >= 32 else 2e-2
    gain = torch.zeros(width, dtype=torch.float64)
    bias = torch.zeros(width, dtype=torch.float64)
    for j, u in enumerate(us):
        plus, minus, twice = y[3 * j], y[3 * j + 1], y[3 * j + 2]
        top = float(plus.abs().max()) + 1e-12
        if float((twice - plus).abs().max()) > tol * top:
            raise ValueError("it is not scale invariant (N(2x) != N(x))")
        nz = u != 0
        rms = float(u.square().mean().sqrt())
        gain[nz] = ((plus - minus) * rms / (2 * u))[nz]
        bias[nz] = ((plus + minus) / 2)[nz]
    if not bool(torch.isfinite(gain).all() and torch.isfinite(bias).all()):
        raise ValueError("its gain or bias is not finite")
    got = y[-1]
    top = float(got.abs().max()) + 1e-12
    zs = (v / v.square().mean().sqrt(), (v - v.mean()) / (v - v.mean()).square().mean().sqrt())
    if min(float((gain * z + bias - got).abs().max()) for z in zs) > tol * top:
        raise ValueError("it does not act as a LayerNorm or RMSNorm (gain * z + bias)")
    return gain, bias


# ---- which norm feeds which attention ---------------------------------------------------
def _runner(model: nn.Module, layers) -> tuple[nn.Module, int]:
    """The module to run on token ids: ``model`` or the first submodule (a LightningModule's
    ``.model``) whose forward takes ``input_ids``, whose config names a vocabulary and which
    holds every attention layer."""
    import inspect

    sites = [site.module for _, site in layers]
    for m in [model, *model.modules()]:
        cfg = getattr(m, "config", None)
        vocab = getattr(cfg, "vocab_size", None)
        if vocab is None and hasattr(cfg, "get_text_config"):
            vocab = getattr(cfg.get_text_config(), "vocab_size", None)
        if not (isinstance(vocab, int) and vocab > 0):
            continue
        try:
            takes = "input_ids" in inspect.signature(m.forward).parameters
        except (TypeError, ValueError):
            takes = False
        inside = {id(x) for x in m.modules()}
        if takes and all(id(s) in inside for s in sites):
            return m, vocab
    raise _refuse(f"{type(model).__name__} has no config naming a vocabulary on a forward "
                  "taking input_ids, so sigprop cannot run it to find the norm feeding each "
                  "attention")


class _Tracer:
    """The hooks of the wiring pass: every norm's output, and what each Q / K projection and
    attention module received."""

    def __init__(self, model: nn.Module, layers):
        from .parts import is_norm

        self.made: dict[int, tuple[str, torch.Tensor, int]] = {}
        self.fed: dict[tuple[int, str], set] = {}
        self.kwargs: dict[int, list[dict]] = {}
        self.handles = []
        for name, m in model.named_modules():
            if is_norm(m):
                self.handles.append(m.register_forward_hook(self._norm_hook(name)))
        for i, (_, site) in enumerate(layers):
            roles = ("qk",) if site.q is site.k else ("q", "k")
            for role in roles:
                mod = site.q if role != "k" else site.k
                self.handles.append(mod.register_forward_pre_hook(self._proj_hook(i, role),
                                                                  with_kwargs=True))
            self.handles.append(site.module.register_forward_pre_hook(self._att_hook(i),
                                                                      with_kwargs=True))

    def _norm_hook(self, name):
        def hook(m, args, out):
            if torch.is_tensor(out) and out.data_ptr() not in self.made:
                self.made[out.data_ptr()] = (name, out, out._version)
        return hook

    def _proj_hook(self, i, role):
        def hook(m, args, kwargs):
            x = first_tensor([*args, *kwargs.values()])
            got = self.made.get(x.data_ptr()) if x is not None else None
            ok = (got is not None and got[1].shape[-1] == x.shape[-1]
                  and got[1].numel() == x.numel() and x._version == got[2])
            for r in (("q", "k") if role == "qk" else (role,)):
                self.fed.setdefault((i, r), set()).add(got[0] if ok else None)
        return hook

    def _att_hook(self, i):
        def hook(m, args, kwargs):
            self.kwargs.setdefault(i, []).append(kwargs)
        return hook

    def close(self):
        for h in self.handles:
            h.remove()
        self.made.clear()


def _run_traced(model: nn.Module, layers) -> _Tracer:
    """One forward pass on a few token ids in training mode (no gradients, the random state
    forked, every module's mode restored) with the tracer's hooks on."""
    runner, vocab = _runner(model, layers)
    p = next(iter(runner.parameters()), None)
    device = p.device if p is not None else torch.device("cpu")
    ids = ((torch.arange(6) * 7 + 3) % vocab)[None].to(device)
    modes = [(m, m.training) for m in runner.modules()]
    cuda = sorted({q.device.index or 0 for q in runner.parameters() if q.is_cuda})
    tracer = _Tracer(model, layers)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            runner.train()
            runner(input_ids=ids)
    except SpecError:
        raise
    except Exception as err:  # noqa: BLE001 - the model's own forward on our token ids
        first = (str(err).splitlines() or [""])[0][:120]
        raise _refuse(f"{type(runner).__name__} does not run on token ids to find the norm "
                      f"feeding each attention ({type(err).__name__}: {first})") from None
    finally:
        for m, was in modes:
            m.training = was
        tracer.close()
    return tracer


def _rope_of(model: nn.Module, calls: list[dict], block: str) -> tuple[bool, float]:
    """Whether a layer's logits carry rotary positions, and the rotary map's gain: the
    largest ``sqrt(cos^2 + sin^2)`` of the ``(cos, sin)`` its attention received (1 when none
    was passed). Additive position biases are refused."""
    gain, seen = 1.0, False
    for kw in calls:
        for key in ("alibi", "position_bias", "relative_position_bias"):
            if torch.is_tensor(kw.get(key)):
                raise _refuse(f"{block}: its logits take an additive position bias ({key})")
        pe = kw.get("position_embeddings")
        if isinstance(pe, tuple | list) and len(pe) == 2 and all(torch.is_tensor(t) for t in pe):
            cos, sin = (t.detach().to(torch.float64) for t in pe)
            if cos.shape == sin.shape:
                seen = True
                gain = max(gain, float((cos.square() + sin.square()).sqrt().max()))
    cfg = getattr(model, "config", None)
    named = any("rotary" in type(m).__name__.lower() for m in model.modules())
    named = named or any(("rope" in k or "rotary" in k) and v not in (None, False, 0)
                         for k, v in (vars(cfg).items() if cfg is not None else ()))
    return seen or named, gain


def wire(model: nn.Module) -> list[LayerWiring]:
    """Which norm feeds each attention layer of ``model`` (:func:`~.qk_clip.attention_layers`),
    found by one traced forward pass (module docstring). Refuses in one line (SpecError,
    field ``clip_on``) whatever it cannot bound."""
    from ...measurement.weights_mla import MLASite
    from .qk_clip import attention_layers, has_qk_norm

    try:
        layers = attention_layers(model)
    except ValueError as err:
        raise _refuse(str(err)) from None
    if not layers:
        raise _refuse(f"{type(model).__name__}: no attention layer with Q/K projections")
    for block, site in layers:
        if isinstance(site, MLASite):
            raise _refuse(f"{block}: multi-head latent attention (its keys come from a "
                          "latent through norms and up-projections)")
        if has_qk_norm(site):
            raise _refuse(f"{block}: q / k are normalised after their projections (QK-norm: "
                          "the weights do not set the logits)")
        for role, m in (("query", site.q), ("key", site.k)):
            got = linear_of(m)
            if got is None or got[0] is not m:
                raise _refuse(f"{block}: the {role} projection {type(m).__name__} is not a "
                              "plain linear map")
    tracer = _run_traced(model, layers)
    mods = dict(model.named_modules())
    out = []
    for i, (block, site) in enumerate(layers):
        src = {}
        for r in ("q", "k"):
            fed = tracer.fed.get((i, r), set())
            if not fed:
                raise _refuse(f"{block}: its {r} projection did not run in a forward pass")
            if None in fed or len(fed) > 1:
                what = ("not a norm's output (the raw stream, dropout or another operation "
                        "in between)" if None in fed else f"fed by several norms ({len(fed)})")
                raise _refuse(f"{block}: the {r} projection's input is {what}")
            src[r] = next(iter(fed))
        rope, gain = _rope_of(model, tracer.kwargs.get(i, []), block)
        out.append(LayerWiring(layer=i, block=block, site=site, q_norm=mods[src["q"]],
                               k_norm=mods[src["k"]], q_source=src["q"], k_source=src["k"],
                               rope=rope, rope_gain=gain))
    return out


# ---- the bound ----------------------------------------------------------------------------
def _rows(site, part: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, b)`` float64 of ``part``'s ``n`` heads: ``(n, d_H, d)`` and ``(n, d_H)`` (zeros
    without a bias)."""
    mod, axis = linear_of(site.q if part == "q" else site.k)
    w = mod.weight.detach().to("cpu", torch.float64)
    w = w if axis == 0 else w.T
    b = getattr(mod, "bias", None)
    b = b.detach().to("cpu", torch.float64) if b is not None else torch.zeros(w.shape[0],
                                                                             dtype=w.dtype)
    spans = [head_rows(site, h, part) for h in range(n)]
    return (torch.stack([w[lo:hi] for lo, hi in spans]),
            torch.stack([b[lo:hi] for lo, hi in spans]))


def layer_bound(w: LayerWiring) -> LayerBound:
    """The bound on ``|logit|`` over every input, per query head of one layer (module
    docstring), from the weights as they are now."""
    site = w.site
    H, G = site.n_heads, site.n_kv_heads
    wq, bq = _rows(site, "q", H)
    wk, bk = _rows(site, "k", G)
    d = wq.shape[-1]
    if wk.shape[-1] != d:
        raise _refuse(f"{w.block}: query and key projections read inputs of different widths")
    try:
        gq, nq = norm_affine(w.q_norm, d)
        gk, nk = (gq, nq) if w.k_norm is w.q_norm else norm_affine(w.k_norm, d)
    except ValueError as err:
        raise _refuse(f"{w.block}: the norm feeding its attention ({w.q_source}"
                      f"{'' if w.k_norm is w.q_norm else ', ' + w.k_source}) cannot be read: "
                      f"{err}") from None
    kv = torch.arange(H) // max(1, H // G)  # the K head each query head reads
    A, a = wq * gq, wq @ nq + bq  # q = A z + a, |z| <= sqrt(d)
    C, c = wk * gk, (wk @ nk + bk)[kv]  # per K head; its bias per query head
    r, s = math.sqrt(d), float(site.scale)
    # thin QR of the transposes, A^T = Q_A R_A: ||A||_2 = ||R_A||_2 and ||A^T C||_2 =
    # ||R_A R_C^T||_2, so every spectral norm is of a small d_H x d_H factor
    ra = torch.linalg.qr(A.transpose(-1, -2), mode="r").R
    rc = torch.linalg.qr(C.transpose(-1, -2), mode="r").R[kv]
    mats = [ra, rc] + ([] if w.rope else [ra @ rc.transpose(-1, -2)])
    if len({m.shape for m in mats}) == 1:  # one batched call (d >= d_H: every factor square)
        norms = torch.linalg.matrix_norm(torch.cat(mats), ord=2).split(H)
    else:
        norms = [torch.linalg.matrix_norm(m, ord=2) for m in mats]
    sa, sc = norms[0], norms[1]
    product = s * w.rope_gain ** 2 * (sa * r + a.norm(dim=-1)) * (sc * r + c.norm(dim=-1))
    bilinear = None
    if not w.rope:
        C, cross = C[kv], norms[2]
        lin = (C.transpose(-1, -2) @ a[..., None]).norm(dim=(-2, -1)) + \
            (A.transpose(-1, -2) @ c[..., None]).norm(dim=(-2, -1))
        bilinear = s * (cross * r * r + lin * r + (a * c).sum(-1).abs())
    bound = product if bilinear is None else torch.minimum(product, bilinear)
    kind = tuple("product" if bilinear is None or float(p) <= float(q) else "bilinear"
                 for p, q in zip(product.tolist(), (bilinear if bilinear is not None
                                                    else product).tolist(), strict=True))
    return LayerBound(bound=bound, product=product, bilinear=bilinear, kind=kind)


class LogitBound:
    """The certified logit bound of a model: its wiring found once (:func:`wire`, refusing
    in one line what it cannot bound), the bounds computed from the current weights at each
    :meth:`bounds` call.

        lb = LogitBound(model)
        lb.bounds()      # {attention layer: (H,) float64 bound per query head}
        qk_clip_(model, lb.bounds(), tau=30.0)    # every logit of every input <= 30
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.wiring = wire(model)
        self.layers()  # every feeding norm read once: refused here, not at a later step

    def layers(self) -> dict[int, LayerBound]:
        """``{attention layer: LayerBound}`` of the weights as they are now."""
        with torch.no_grad():
            return {w.layer: layer_bound(w) for w in self.wiring}

    def bounds(self) -> dict[int, torch.Tensor]:
        """``{attention layer (qk_clip_'s index): per query head bound}``, float64."""
        return {i: lb.bound for i, lb in self.layers().items()}
