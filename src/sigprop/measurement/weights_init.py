"""Which weights these are: each parameter of a model against its family's initialisation law.

    fresh = model_at_init(config, seed=1)        # the same architecture, freshly initialised
    check = check_against_init(model, fresh)     # InitCheck: state "init" | "trained" | "mixed"
    check.to_frame()                             # one row per parameter

The init law is never written down here: ``fresh`` carries it (the family's own
``_init_weights`` drew it from the same config), and every parameter of ``model`` is compared
with its namesake in ``fresh``. Two independent draws of the same law differ only by sampling
noise; a trained matrix differs by far more. Two statistics measure the difference, each in
units of its noise under the hypothesis "both are draws of the same law":

* scale: ``z_std = log(r / r0) / sd``, with ``r``, ``r0`` the root mean squares of the two
  tensors (the std of a centred law) over their ``n`` compared entries. For ``n`` i.i.d.
  entries the mean of squares has relative variance ``(kappa - 1) / n``, ``kappa = E x^4 /
  (E x^2)^2`` (3 for a Gaussian, 1.8 for a uniform law), so ``log r`` has variance
  ``(kappa - 1) / (4 n)`` and the difference of two independent draws twice that:
  ``sd = sqrt((kappa - 1) / (2 n))``, with ``kappa`` estimated on the fresh draw. ``z_std`` is
  then close to a standard normal (simulated for Gaussian, uniform and truncated laws, n
  from 128 to 1.3e5 entries: sd 0.99-1.05; the largest |z| in 4e4 pairs of 128 entries was
  5.5, in 2e4 pairs of 4096 entries 4.5). Threshold :data:`Z_STD` = 6: under a normal law
  ``P(|z| > 6) = 2e-9`` per parameter, so a model of a thousand matrices reads "init" with
  probability 1 - 2e-6, and a matrix of ``n`` Gaussian entries is caught once its scale moves
  by ``exp(6 / sqrt(n)) - 1``: 9.8 % at 64 x 64, 4.8 % at 64 x 256, 0.15 % at 4096 x 4096.
  Entries that are independent but not identically distributed (a fused map whose parts have
  different stds) inflate the pooled ``kappa``, hence ``sd``: the test stays conservative.
* spectrum: training grows singular values that stand out of the random-matrix bulk even when
  the scale barely moves. With ``s``, ``s0`` the largest singular values, the statistic is the
  *edge ratio* ``e = (s / r) / (s0 / r0)``: the top singular value relative to the bulk
  scale, so that a pure rescaling (the first test's business) leaves it at 1. For an ``m x n``
  i.i.d. matrix the largest eigenvalue of ``W W^T`` sits at ``mu = (sqrt(n - 1/2) +
  sqrt(m - 1/2))^2`` (unit entry variance) with Tracy-Widom fluctuations of scale ``(sqrt(n -
  1/2) + sqrt(m - 1/2)) (1 / sqrt(n - 1/2) + 1 / sqrt(m - 1/2))^(1/3)`` (Johnstone's
  centring and scaling), whose law has sd 1.27; halving for the square root gives the
  relative sd of ``s`` (0.4 ``n^(-2/3)`` for a square matrix: 2.5 % at n = 64, 0.16 % at
  4096), and ``log e`` of two draws has ``sqrt(2)`` times it (simulated: 0.90-1.03 of that
  for 64 x 64 and larger, half of it for 2 x 64: conservative). A matrix is flagged when
  ``|log e|`` exceeds ``max(log SV_FLOOR, SV_Z * sd)``: :data:`SV_Z` = 6 noise sds, whose
  Tracy-Widom tail (it decays like ``exp(-2/3 t^(3/2))``, slower than a normal one) is
  ~1e-8 per matrix, and never below :data:`SV_FLOOR` = 10 % relative. The floor covers what
  the i.i.d. formula does not: structured laws (zero padding rows, blocks of different
  stds) and the Krylov estimate's own error on big matrices (a few 1e-3, below); trained
  matrices carry outliers of tens of percent to several times the edge, far above it. The
  ``sv_threshold`` of each row is this bound as a ratio. Both directions count: an optimiser
  that flattens the spectrum (towards orthogonal) lowers ``e``.

Calibration on the families' own laws: two fresh draws of BERT, RoBERTa, GPT-2, Llama, Qwen2,
Mistral, T5, Gemma and OPT at width 64 (28 seed pairs each, 4228 random parameters) gave a
largest |z_std| of 3.3 and a largest |log e| of 0.65 of its threshold; the tiny trained
checkpoints of :mod:`sigprop.models.tiny_trained` (60 steps) put every block matrix 11 to 84
sds away (tests/measurement/test_weights_init.py).

The largest singular value is exact (the top eigenvalue of the ``k x k`` Gram matrix, ``k``
the smaller side) when ``k <=`` :data:`EXACT_DIM`, else a block Krylov estimate (a random
block of :data:`KRYLOV_BLOCK` vectors, :data:`KRYLOV_STEPS` products with the Gram matrix,
orthonormalised, then the exact top singular value of ``W`` on that subspace: a lower bound,
within 1e-4 of the truth on a 1024 x 1024 Gaussian matrix and 3e-3 at 8192 x 2048, far closer
on a trained matrix whose outlier stands apart). That reads the matrix 21 times against a thin
block: on one CPU thread, a 2048-wide Llama layer (seven matrices, both draws) took 4.8 s,
four forward passes of 512 tokens. So by default the spectral test is skipped where it cannot
change the verdict: on a Krylov-sized matrix that the scale test already found trained
(``sv`` fields None; ``spectrum=True`` forces it). A trained checkpoint then costs about two
reads of its weights, an initialised one the full price. Tensors of three or more dimensions
(stacked experts) are read as a batch of matrices over their leading dimensions, the
statistic on the largest of them.

Parameters whose init law is deterministic (the fresh draw takes at most two distinct values:
zeros, ones, a constant, an identity) have no sampling noise: they are trained when any entry
differs from the fresh value by more than the float tolerance (twice the coarser dtype's eps
times the largest init magnitude; zero for all-zero laws). A deterministic law with many values
(a log-spaced decay table) is read by the random tests, which see no difference when the
values are equal.

What is compared: every floating parameter present in both models (names matched as they are,
or across a head model's ``base_model_prefix``) with the same trailing shape; embedding tables
of different sizes are compared on their common leading rows (``rows_cut``). A parameter shared
between modules (tied embeddings) is one parameter of ``model.named_parameters()`` and counts
once. 1-D parameters (norm gains, biases) are reported when ``vectors=True`` (the default:
cheap, and a trained model moves its norm gains) but do not decide the state; the random
tests need :data:`MIN_NUMEL` entries or more.

``state`` (from the matrices: two or more dimensions): ``"init"`` when none is trained,
``"trained"`` when every one is, or when those read as untrained hold at most
:data:`TRAINED_SLACK` (0.5 %) of the compared matrix entries, ``"mixed"`` otherwise; the
untrained ones are named in ``notes`` either way. Why a slack: a trained model can hold side
tables the objective barely reached, which no test of their size can tell from their law --
the token-type table of a model trained on one segment type (one trained row of two: at width
64, 64 moved entries against 64 at init). Why 0.5 %: such tables are far below it in real
models (BERT-base's token types are 0.001 % of its matrices), while one whole block of a stack
of up to ~150 layers is above it, so a re-initialised or frozen-at-init layer still reads
"mixed" (one layer of an 80-layer 70B model: 1.2 % of its matrix entries). Shared matrices
count once. An embedding table with unused rows is one matrix, trained when its used rows
moved it. Parameters the checkpoint did not hold (a pooler the training never had: BERT-base's
is 0.54 %) sit at the built model's own init and read as untrained, truthfully; to leave them
out, pass ``names=lambda n: n not in load_report.missing``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..spec import SpecError
from ..trajectory import clean

__all__ = ["EXACT_DIM", "InitCheck", "MIN_NUMEL", "MatrixCheck", "SV_FLOOR", "SV_Z",
           "TRAINED_SLACK", "Z_STD", "check_against_init", "edge_sd", "top_singular_value"]

#: threshold on |z_std| (module docstring): 2e-9 two-sided per parameter under a normal law
Z_STD = 6.0
#: threshold on |log edge ratio| in noise sds of the top singular value (module docstring)
SV_Z = 6.0
#: the edge ratio's threshold is never below this relative change (module docstring)
SV_FLOOR = 1.1
#: "trained" allows untrained matrices up to this share of the compared entries (docstring)
TRAINED_SLACK = 0.005
#: fewest compared entries for the random tests (fewer: the parameter is skipped)
MIN_NUMEL = 32
#: largest smaller side for an exact top singular value; above it, block Krylov
EXACT_DIM = 512
KRYLOV_BLOCK, KRYLOV_STEPS = 8, 10


@dataclass(frozen=True, kw_only=True)
class MatrixCheck:
    """One parameter of the model against its namesake in the fresh draw (module docstring).

    ``numel``: entries compared (``rows_cut``: only the common leading rows of two tables of
    different sizes); ``law``: ``"random"`` or ``"deterministic"`` (the fresh draw takes at
    most two values); ``rms`` / ``rms_init``: root mean squares (the std of a centred law),
    ``rms_ratio`` their ratio; ``kurtosis_init``: ``E x^4 / (E x^2)^2`` of the fresh draw,
    which sets ``z_std``'s noise; ``sv`` / ``sv_init``: largest singular values (the largest
    over the slices of a 3-D or higher tensor), ``sv_ratio`` theirs, ``edge_ratio`` =
    ``sv_ratio / rms_ratio``, ``sv_threshold``: the edge ratio's bound (trained outside
    ``[1/t, t]``); ``max_diff`` / ``tolerance``: a deterministic law's largest deviation and
    its float tolerance; ``identical``: bit-equal to the fresh draw (a parameter the
    checkpoint did not hold, or the same seed); ``why``: the tests that fired (``"std"``,
    ``"spectrum"``, ``"value"``, joined by ``+``). None: not computed."""

    name: str
    shape: tuple[int, ...]
    numel: int
    rows_cut: bool = False
    law: str
    rms: float
    rms_init: float
    rms_ratio: float | None = None
    kurtosis_init: float | None = None
    z_std: float | None = None
    sv: float | None = None
    sv_init: float | None = None
    sv_ratio: float | None = None
    edge_ratio: float | None = None
    sv_threshold: float | None = None
    max_diff: float | None = None
    tolerance: float | None = None
    identical: bool = False
    trained: bool
    why: str = ""

    @property
    def is_matrix(self) -> bool:
        """Two or more dimensions: decides the state."""
        return len(self.shape) >= 2

    def to_dict(self) -> dict:
        """JSON-ready: every float finite or None."""
        out = {k: clean(v) for k, v in asdict(self).items()}
        out["shape"] = list(self.shape)
        return out


@dataclass(frozen=True, kw_only=True)
class InitCheck:
    """What :func:`check_against_init` returns: ``checks`` (one :class:`MatrixCheck` per
    compared parameter, in the model's order), ``state`` (``"init"``, ``"trained"`` or
    ``"mixed"``, from the matrices alone), the thresholds used (``z_std``, ``sv_z``,
    ``sv_floor``; ``slack``: the share of untrained entries "trained" allows),
    ``untrained_share`` (the share of the compared matrix entries read as at init),
    ``skipped`` (``"name: why"`` for each parameter not compared) and ``notes``."""

    checks: list[MatrixCheck]
    state: str
    z_std: float = Z_STD
    sv_z: float = SV_Z
    sv_floor: float = SV_FLOOR
    slack: float = TRAINED_SLACK
    untrained_share: float = 0.0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def matrices(self) -> list[MatrixCheck]:
        """The checks of two or more dimensions (those that decide ``state``)."""
        return [c for c in self.checks if c.is_matrix]

    @property
    def untrained(self) -> list[str]:
        """Names of the matrices read as at init."""
        return [c.name for c in self.matrices if not c.trained]

    def to_frame(self):
        """pandas DataFrame, one row per compared parameter (``shape`` as ``"64x256"``)."""
        import pandas as pd

        rows = []
        for c in self.checks:
            d = asdict(c)
            d["shape"] = "x".join(str(s) for s in c.shape)
            rows.append(d)
        return pd.DataFrame(rows, columns=[f for f in MatrixCheck.__dataclass_fields__])

    def to_dict(self) -> dict:
        """JSON-ready (``json.dumps(..., allow_nan=False)`` works): floats finite or None."""
        mats = self.matrices
        return {"state": self.state,
                "thresholds": {"z_std": self.z_std, "sv_z": self.sv_z,
                               "sv_floor": self.sv_floor, "slack": self.slack},
                "untrained_share": clean(self.untrained_share),
                "matrices": len(mats), "trained": sum(c.trained for c in mats),
                "checks": [c.to_dict() for c in self.checks],
                "skipped": list(self.skipped), "notes": list(self.notes)}


# ---------------------------------------------------------------- the statistics
def edge_sd(m: int, n: int) -> float:
    """Relative sd of the largest singular value of an ``m x n`` matrix of i.i.d. entries
    (module docstring: Tracy-Widom fluctuations of the top eigenvalue of ``W W^T``, halved
    for the square root); 0 when a side is 1 (the singular value is then the norm)."""
    if min(m, n) < 2:
        return 0.0
    a, b = math.sqrt(max(m, n) - 0.5), math.sqrt(min(m, n) - 0.5)
    mu = (a + b) ** 2
    scale = (a + b) * (1.0 / a + 1.0 / b) ** (1.0 / 3.0)
    return 1.27 * scale / (2.0 * mu)


def top_singular_value(w: torch.Tensor, seed: int = 0) -> float:
    """Largest singular value of a matrix, or the largest over the matrices of a batch
    ``(..., m, n)``, in ``w``'s dtype and device: exact when ``min(m, n) <=``
    :data:`EXACT_DIM` (the top eigenvalue of the small Gram matrix), else block Krylov
    (module docstring; the start block drawn from ``seed`` with a local generator, the
    global RNG untouched). Every product keeps ``W`` in its stored layout, a thin block on
    either side: a transposed view of ``W`` times a thin block ran ten times slower on CPU."""
    w = w.reshape(-1, *w.shape[-2:])
    wide = w.shape[-2] <= w.shape[-1]  # Krylov vectors live on the smaller side, k

    def gram(v):  # W W^T v (wide) or W^T W v, both (batch, k, block)
        return w @ (v.mT @ w).mT if wide else ((w @ v).mT @ w).mT

    k = w.shape[-2] if wide else w.shape[-1]
    if k <= EXACT_DIM:
        g = w @ w.mT if wide else w.mT @ w
        return math.sqrt(max(float(torch.linalg.eigvalsh(g)[..., -1].max()), 0.0))
    gen = torch.Generator(device=w.device).manual_seed(seed)
    start = torch.randn(KRYLOV_BLOCK, k, generator=gen, device=w.device, dtype=w.dtype)
    v = torch.linalg.qr(start.mT.expand(w.shape[0], k, KRYLOV_BLOCK)).Q
    basis = [v]
    for _ in range(KRYLOV_STEPS):
        v = gram(v)
        for _ in range(2):  # Gram-Schmidt twice against the basis so far
            for u in basis:
                v = v - u @ (u.mT @ v)
        v = torch.linalg.qr(v).Q
        basis.append(v)
    q = torch.cat(basis, dim=-1)
    return float(torch.linalg.matrix_norm(q.mT @ w if wide else w @ q, ord=2).max())


def _moments(x: torch.Tensor) -> tuple[float, float]:
    """(root mean square, E x^4 / (E x^2)^2) of a float32 tensor, with one temporary of its
    size. Plain sums (cascade summation on CPU, a tree on CUDA: relative error ~1e-6);
    ``torch.linalg.vector_norm`` in float32 was off by 1e-3 (2nd moment) and 3e-2 (4th) on
    1.7e7 Gaussian entries, ten times the sampling noise the scale test resolves."""
    n = x.numel()
    sq = x.square()
    m2 = float(sq.sum()) / n
    m4 = float(sq.square_().sum()) / n
    return math.sqrt(m2), (m4 / (m2 * m2) if m2 > 0 else math.nan)


def _two_valued(x: torch.Tensor) -> bool:
    """Whether ``x`` takes at most two distinct values (a deterministic init law); a random
    law shows three among its first entries, which ends the check."""
    flat = x.reshape(-1)
    if torch.unique(flat[:64]).numel() > 2:
        return False
    first = flat[0]
    same = flat == first
    if bool(same.all()):
        return True
    other = flat[int(torch.argmin(same.to(torch.uint8)))]
    return bool((same | (flat == other)).all())


def _deterministic(c: dict, w, w0, eps: float) -> MatrixCheck:
    """The check of a parameter with a deterministic init law: a difference beyond float
    tolerance is training."""
    tol = 2.0 * eps * float(w0.abs().max())
    diff = float((w - w0).abs().max())
    ratio = c["rms"] / c["rms_init"] if c["rms_init"] > 0 else None
    trained = diff > tol
    return MatrixCheck(**c, law="deterministic", rms_ratio=ratio, max_diff=diff, tolerance=tol,
                       identical=diff == 0.0, trained=trained, why="value" if trained else "")


def _random(c: dict, w, w0, kurt: float, spectrum: bool | None) -> MatrixCheck:
    """The check of a parameter drawn at random at init: the scale and spectrum tests (the
    latter skipped on a Krylov-sized matrix the scale test already found trained, unless
    ``spectrum`` is True; never run when it is False)."""
    n = c["numel"]
    ratio = c["rms"] / c["rms_init"]  # rms_init > 0: an all-zero law is deterministic
    noise = max(math.sqrt(max(kurt - 1.0, 0.0) / (2.0 * n)), 1e-6)  # 1e-6: float32 sums
    z = math.log(ratio) / noise if ratio > 0 else -math.inf
    why = ["std"] if abs(z) > Z_STD else []
    spec = {}
    m_, n_ = w.shape[-2:] if w.dim() >= 2 else (1, 1)
    wanted = spectrum if spectrum is not None else not why or min(m_, n_) <= EXACT_DIM
    if wanted and w.dim() >= 2 and min(m_, n_) >= 2 and c["rms"] > 0:
        s, s0 = top_singular_value(w), top_singular_value(w0)
        edge = (s / s0) / ratio if s0 > 0 else math.inf
        bound = math.exp(max(math.log(SV_FLOOR), SV_Z * math.sqrt(2.0) * edge_sd(m_, n_)))
        spec = dict(sv=s, sv_init=s0, sv_ratio=s / s0 if s0 > 0 else math.inf,
                    edge_ratio=edge, sv_threshold=bound)
        if not 1.0 / bound <= edge <= bound:
            why.append("spectrum")
    return MatrixCheck(**c, law="random", rms_ratio=ratio, kurtosis_init=kurt, z_std=z,
                       identical=c["rms"] == c["rms_init"] and bool(torch.equal(w, w0)),
                       trained=bool(why), why="+".join(why), **spec)


def _check(name: str, p: torch.Tensor, p0: torch.Tensor,
           spectrum: bool | None) -> MatrixCheck | str:
    """One parameter against its fresh namesake: a MatrixCheck, or why it is skipped."""
    rows = min(p.shape[0], p0.shape[0])
    eps = max(torch.finfo(p.dtype).eps, torch.finfo(p0.dtype).eps)
    w = p.detach()[:rows].to(torch.float32)
    w0 = p0.detach()[:rows].to(device=w.device, dtype=torch.float32)
    c = dict(name=name, shape=tuple(p.shape), numel=w.numel(),
             rows_cut=rows != p.shape[0] or rows != p0.shape[0])
    if w.numel() == 0:
        return "no entries"
    c["rms"], _ = _moments(w)
    c["rms_init"], kurt0 = _moments(w0)
    if not (math.isfinite(c["rms"]) and math.isfinite(c["rms_init"])):
        return "non-finite entries"
    if _two_valued(w0):
        return _deterministic(c, w, w0, eps)
    if w.numel() < MIN_NUMEL:
        return f"{w.numel()} entries, fewer than {MIN_NUMEL} for a statistic"
    return _random(c, w, w0, kurt0, spectrum)


# ---------------------------------------------------------------- the model
def _keep(names) -> Callable[[str], bool]:
    """The ``names`` filter as a predicate: None keeps all; a callable as is; a string or an
    iterable of strings keeps the names holding any of them."""
    if names is None:
        return lambda _n: True
    if callable(names):
        return names
    parts = [names] if isinstance(names, str) else [str(x) for x in names]
    return lambda n: any(x in n for x in parts)


def _namesake(name: str, fresh: dict, prefixes: list[str]) -> str | None:
    """``name`` in the fresh model, as is or across a head model's base prefix."""
    if name in fresh:
        return name
    for pre in prefixes:
        if name.startswith(pre + ".") and name[len(pre) + 1:] in fresh:
            return name[len(pre) + 1:]
        if pre + "." + name in fresh:
            return pre + "." + name
    return None


def _counterpart(name: str, p, fresh: dict, prefixes: list[str]):
    """(fresh parameter, None) or (None, why it is not compared)."""
    if not (p.is_floating_point() and p.dim() >= 1):
        return None, "not a floating tensor"
    if p.device.type == "meta":
        return None, "on the meta device (no values)"
    key = _namesake(name, fresh, prefixes)
    if key is None:
        return None, "no namesake in the fresh model"
    p0 = fresh[key]
    if p0.dim() != p.dim() or p0.shape[1:] != p.shape[1:]:
        return None, (f"shape {tuple(p.shape)}, {tuple(p0.shape)} in the fresh model")
    if p0.device.type == "meta" or not p0.is_floating_point():
        return None, "no values in the fresh model"
    return p0, None


def check_against_init(model: nn.Module, fresh: nn.Module, *,
                       names: Iterable[str] | str | Callable[[str], bool] | None = None,
                       vectors: bool = True, spectrum: bool | None = None) -> InitCheck:
    """Compare every parameter of ``model`` (the weights under test) with its namesake in
    ``fresh`` (the same architecture from the same config at init, e.g.
    :func:`sigprop.models.loading.model_at_init`; any seed, any device) and summarise: the
    module docstring gives the statistics, their noise and the thresholds.

    ``names``: compare only these parameters -- a substring or an iterable of substrings (a
    name holding any of them is kept) or a predicate on the name (e.g. the measured blocks,
    or ``lambda n: n not in load_report.missing``). ``vectors``: also report 1-D parameters
    (norm gains, biases; they never decide ``state``). ``spectrum``: None (default) runs the
    spectral test on every matrix except those above :data:`EXACT_DIM` on both sides that
    the scale test already found trained (their verdict stands; a trained checkpoint then
    costs little more than reading its weights), True on every matrix, False on none (the
    scale and value tests only). One parameter at a time, in float32
    on ``model``'s device (the fresh one copied there): memory a few times the largest
    parameter. Raises :class:`~sigprop.spec.SpecError` when no matrix is compared."""
    keep = _keep(names)
    fresh_params = dict(fresh.named_parameters(remove_duplicate=False))
    prefixes = [x for x in {getattr(model, "base_model_prefix", ""),
                            getattr(fresh, "base_model_prefix", "")} if x]
    checks, skipped = [], []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not keep(name) or (p.dim() < 2 and not vectors):
                continue
            p0, why = _counterpart(name, p, fresh_params, prefixes)
            got = why if p0 is None else _check(name, p, p0, spectrum)
            if isinstance(got, str):
                skipped.append(f"{name}: {got}")
            else:
                checks.append(got)
    mats = [c for c in checks if c.is_matrix]
    if not mats:
        raise SpecError("model", "no parameter of two or more dimensions has a namesake of "
                                 "the same trailing shape in the fresh model"
                                 + (" among the selected names" if names is not None else ""))
    idle = sum(c.numel for c in mats if not c.trained) / sum(c.numel for c in mats)
    state = ("init" if not any(c.trained for c in mats)
             else "trained" if idle <= TRAINED_SLACK else "mixed")
    return InitCheck(checks=checks, state=state, untrained_share=idle, skipped=skipped,
                     notes=_notes(checks, mats, idle, skipped))


def _notes(checks: list[MatrixCheck], mats: list[MatrixCheck], idle: float,
           skipped: list[str]) -> list[str]:
    """What a reader of the summary needs beside the verdict."""
    done = sum(c.trained for c in mats)
    notes = [f"{done} of {len(mats)} matrices trained"]
    vecs = [c for c in checks if not c.is_matrix]
    if vecs:
        notes.append(f"{sum(c.trained for c in vecs)} of {len(vecs)} vectors (1-D, not in "
                     "the state) differ from their init law")
    if 0 < done < len(mats):
        at = [c.name for c in mats if not c.trained]
        notes.append(f"read as at init ({100 * idle:.3g} % of the compared matrix entries; "
                     f"'trained' allows {100 * TRAINED_SLACK:g} %): " + ", ".join(at[:8])
                     + (f" (+{len(at) - 8} more)" if len(at) > 8 else ""))
    same = [c.name for c in mats if c.identical and c.law == "random"]
    if same:
        notes.append(f"{len(same)} matrices bit-identical to the fresh draw (not in the "
                     "checkpoint, or the same seed): " + ", ".join(same[:4])
                     + (" ..." if len(same) > 4 else ""))
    cut = [c.name for c in checks if c.rows_cut]
    if cut:
        notes.append("compared on their common leading rows (tables of different sizes): "
                     + ", ".join(cut))
    if skipped:
        notes.append(f"{len(skipped)} parameters not compared (see skipped)")
    return notes
