"""One memory estimator for every command that allocates, and the refusal built on it.

:func:`estimate` returns the predicted peak resident memory (bytes) of a run: a fixed
interpreter baseline (:data:`BASELINE`, the measured RSS of a tiny run of the workload through
the library: python, torch, numpy, sigprop and, for ``diagnose``, transformers; the CLI adds
~0.1 GB of reporting imports) plus a small model of the workload's big tensors, whose constants
were calibrated against peak RSS. :func:`check` runs before anything big is allocated and
refuses when the part above the baseline (already resident when it runs) exceeds ``SAFETY``
(80%) of :func:`available` memory: it raises :class:`sigprop.spec.SpecError` naming the option
to shrink, one line with the estimate, the available memory and what bounds it, and a smaller
setting that fits (found by bisection on the estimate, shrinking first the option furthest above
its minimum). :func:`available` is the tightest of every bound that applies (:func:`limits`):
``MemAvailable``; the process's ``RLIMIT_AS`` (``ulimit -v``) less its virtual size ``VmSize``
and ``RLIMIT_DATA`` (``ulimit -d``) less ``VmData`` (the kernel refuses a mapping past either,
however little is resident: python, torch and numpy already map ~0.9 GB of virtual size for
~0.3 GB resident); the cgroup v2 ``memory.max`` less ``memory.current`` and the cgroup v1
``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` of the process's cgroup and its parents
(less reclaimable page cache). A command's last line of defence, an allocation that fails all
the same, is :func:`allocation_failure`'s one line.
``b``: bytes of the simulation dtype; S seeds (x betas when training), B sequences / batch,
T tokens, d width, H heads, L blocks, F MLP width, V vocabulary, P parameters of one seed.

* ``measure`` (:func:`sigprop.measurement.engine.measure`): weights ``S P b``; continuous inputs
  ``B T d (8 + b)`` (float64 draw plus the cast) or embeddings ``S (V + T) d b``; the L + 1
  hidden states kept for the statistics plus one block's transients (expanded-input copy, Q,
  K, V, scaled Q, attention output, residual, normalised copy) ``~(L + 9) S B T d b``; the MLP
  ``2 S B T F b``; one layer's logits and probabilities ``2 S B H T^2 b``; stable-rank Grams
  ``2 S B min(T, d)^2 b``; with ``grads``, the training activations below.
* ``diagnose`` / ``fix`` (:func:`sigprop.analysis.diagnose.diagnose`): one HF model at a time,
float32
  weights ``4 P`` (vocabulary capped at 4096); the probe's float64 hidden states
  ``(L + 1) B T d 8``; the float64 recomputation of the attention maps, formed for
  ``h = min(H, max(1, 2^24 / (B T^2)))`` heads at a time, ``7 x 8 B h T^2`` (scores, scaled,
  masked, log-softmax, probabilities and the statistics' temporaries).
* ``longctx`` (:func:`sigprop.measurement.longctx.stream_lengths`, streaming, c = min(chunk, T), R =
  min(queries, T), n scalings): per worker the token chunk and its K/V projection ``9 c d``,
  the score tiles ``12 R 512``, the chunk's per-tile statistics (float32, their float64 copies
  and the merge's temporaries) ``20 n H (ceil(c / 512) + 1) R (d_H + 4)``, REM draws
  ``12 H R c``; shared float64 row states ``8 n H R (d_H + 5) + 24 R d``, the weights and the
  sampled rows' int64 permutation of all T keys ``8 T`` (8.6 GB at T = 2^30; measured 8.03 T).
  Independent of T otherwise; the work is bounded separately (:data:`MAX_PAIRS`).
* ``train`` / ``trainability`` (:func:`sigprop.training.loop.train`): parameters, gradients, AdamW's
  two moments and foreach temporaries ``6 S P 4``; activations kept for the backward pass,
  per block ``S B T (10 d + 2 F) 4``, and ``L + 1`` probability maps ``S B H T^2 4``; readout
  logits, log-probabilities and their gradient ``3 S N V 4`` (N = B T for clm / reverse, the
  masked 15% for mlm); heaviside's held eval data ``eval_sequences T d 4``.
* ``spectra`` (:mod:`sigprop.measurement.spectra`, n queries, n_k keys, block width w, q
  iterations): q and k and their augmented copies ``2 (n + n_k)(d_H + 1) b``; Krylov basis and
  images ``2 n w (q + 2) 8``; per worker a row block ``3 block n_k b`` and accumulators
  ``(n + n_k) w b``; ``to_dense`` the matrix ``n n_k b`` (2x when centred).

Accuracy (``benchmarks/bench_memory.py``: each run in a fresh subprocess through the library
entry point, peak = the child's ``ru_maxrss``; 2-core CPU, float32 unless noted)::

    workload  setting                             estimate  peak RSS  ratio
    measure   d256 L4 H4 S4 B2 T1024               0.84 GB   0.76 GB   1.10
    measure   d256 L4 H4 S4 B2 T2048               1.83 GB   1.73 GB   1.06
    measure   d512 L2 H8 S64 B2 T128               2.87 GB   2.39 GB   1.20
    measure   d256 L4 S4 B2 T1024 --grads          2.11 GB   1.87 GB   1.13
    diagnose  bert-base T512 B4                    1.73 GB   1.83 GB   0.95
    diagnose  bert-base T128 B2                    0.90 GB   0.88 GB   1.03
    diagnose  gpt2 T1024 B2                        1.97 GB   2.06 GB   0.96
    longctx   d768 H12 T2^18 chunk 2^17 R256       4.32 GB   4.12 GB   1.05
    longctx   d768 T2^16 chunk 2^13 R256           0.61 GB   0.73 GB   0.84
    longctx   d768 T2^17 chunk 2^16 R1024 compare 14.24 GB  14.02 GB   1.02
    train     d128 L2 H2 B64 T512                  1.57 GB   1.86 GB   0.84
    train     d128 L2 H2 B16 T256                  0.56 GB   0.59 GB   0.95
    train     d256 L4 H4 B16 T256 S2               1.44 GB   1.53 GB   0.94
    spectra   Krylov T16384 d_H 64 (float64)       0.45 GB   0.50 GB   0.91
    spectra   to_dense T8192 (float64)             0.87 GB   0.90 GB   0.97
    spectra   to_dense T4096 centred               0.60 GB   0.60 GB   0.99

(train and the centred dense rows: estimates recomputed with the final constants against the
peaks measured in the same benchmark run; peaks of one setting vary by ~0.1 GB between runs.)

The goal, within 25%, holds where the workload is at least about the baseline; below that
the baseline's own spread (~0.05-0.1 GB between commands) dominates.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from ..spec import ArchSpec, SpecError

#: refuse when the estimate exceeds this fraction of the available memory
SAFETY = 0.8
#: measured RSS (bytes) of a tiny run: python + torch + numpy/pandas + sigprop (+ transformers
#: for the HF commands), the part of every estimate that does not scale with the run
BASELINE = {"measure": 330e6, "longctx": 330e6, "train": 420e6, "spectra": 320e6,
            "diagnose": 480e6}
#: work bound of a long-context sweep: sum over lengths of T x min(queries, T) x scalings
#: (the default 2^9..2^20 sweep with 256 queries is 2^29; 2^34 is ~10 min on 2 cores)
MAX_PAIRS = 2**34
#: vocabulary assumed for a corpus not loaded yet: the built-in stories' 2000, else BERT's
BUILTIN_VOCAB, OTHER_VOCAB = 2000, 30522

KINDS = ("measure", "diagnose", "longctx", "train", "spectra")


#: a limit at or above this many bytes means "no limit" (cgroup v1 writes 2^63 rounded down to
#: a page; ``max`` in cgroup v2; RLIM_INFINITY)
NO_LIMIT = 2.0**60
#: cgroup files, relative to the cgroup folder: (limit, usage, reclaimable page cache in
#: memory.stat) of cgroup v2 and of cgroup v1's memory controller
CGROUP_V2 = ("memory.max", "memory.current", "inactive_file")
CGROUP_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _read(path) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def meminfo_available(path="/proc/meminfo") -> float:
    """``MemAvailable`` of ``path`` in bytes, else free physical pages (``os.sysconf``), else
    infinity."""
    text = _read(path) or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return float(line.split()[1]) * 1024
            except (IndexError, ValueError):
                break
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def _status_kb(text: str, key: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            try:
                return float(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def _soft_limit(which: str) -> float:
    try:
        import resource

        soft = resource.getrlimit(getattr(resource, which))[0]
    except (ImportError, AttributeError, OSError, ValueError):
        return math.inf
    return math.inf if soft < 0 or soft >= NO_LIMIT else float(soft)


def rlimit_headroom(status="/proc/self/status", limits: dict[str, float] | None = None
                    ) -> dict[str, tuple[float, float]]:
    """The process limits that apply, ``name -> (limit, headroom)`` in bytes: ``RLIMIT_AS``
    (``ulimit -v``) less the current virtual size ``VmSize``, ``RLIMIT_DATA`` (``ulimit -d``;
    private writable mappings, which is where tensors live) less ``VmData``, both read from
    ``status``. The kernel refuses a mapping that would cross either limit, whatever the
    resident memory, so the headroom is of virtual size: python, torch and numpy already
    reserve ~0.9 GB of it (shared libraries, thread stacks, malloc arenas) for ~0.3 GB
    resident. ``limits``: ``{"AS": bytes, "DATA": bytes}`` instead of ``getrlimit`` (a value
    at or above :data:`NO_LIMIT` or infinite: no limit); a missing field of ``status`` counts
    as zero used."""
    if limits is None:
        limits = {"AS": _soft_limit("RLIMIT_AS"), "DATA": _soft_limit("RLIMIT_DATA")}
    text = None
    out = {}
    for name, field in (("AS", "VmSize"), ("DATA", "VmData")):
        lim = float(limits.get(name, math.inf))
        if not lim < NO_LIMIT:
            continue
        if text is None:
            text = _read(status) or ""
        used = _status_kb(text, field) or 0.0
        out[name] = (lim, max(0.0, lim - used))
    return out


def _cgroup_paths(text: str) -> tuple[str | None, str | None]:
    """(cgroup v2 path, cgroup v1 memory-controller path) of a ``/proc/<pid>/cgroup`` text."""
    v2 = v1 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _stat_value(text: str | None, key: str) -> float:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 0.0


def cgroup_level(folder, files=CGROUP_V2) -> tuple[float, float] | None:
    """(limit, headroom) in bytes of one cgroup folder: limit less usage, the usage less its
    reclaimable page cache (``inactive_file`` of ``memory.stat``, as the kernel reclaims it
    before it refuses); None when the folder sets no limit (``max``, a value at or above
    :data:`NO_LIMIT`, or no limit file). ``files``: :data:`CGROUP_V2` or :data:`CGROUP_V1`."""
    from pathlib import Path

    folder = Path(folder)
    raw = _read(folder / files[0])
    if raw is None or raw.strip() in ("", "max"):
        return None
    try:
        limit = float(raw.split()[0])
    except ValueError:
        return None
    if limit >= NO_LIMIT:
        return None
    try:
        usage = float((_read(folder / files[1]) or "0").split()[0])
    except (ValueError, IndexError):
        usage = 0.0
    usage = max(0.0, usage - _stat_value(_read(folder / "memory.stat"), files[2]))
    return limit, max(0.0, limit - usage)


def cgroup_headroom(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"
                    ) -> dict[str, tuple[float, float]]:
    """The cgroup memory limits that apply, ``file -> (limit, headroom)`` in bytes, the
    tightest level of each hierarchy: cgroup v2 (``memory.max`` less ``memory.current``, under
    ``root`` or ``root/unified``) and cgroup v1 (``memory.limit_in_bytes`` less
    ``memory.usage_in_bytes`` under ``root/memory``), both less reclaimable page cache
    (:func:`cgroup_level`). The process's own cgroup (``proc_cgroup``) and every parent up to
    the mount are read, since a parent's limit binds its children; where the process's path
    is not under the mount (a container that sees its own cgroup as the root), the mount's
    root folder is the process's cgroup."""
    from pathlib import Path

    v2, v1 = _cgroup_paths(_read(proc_cgroup) or "")
    out = {}
    for path, mounts, files in ((v2, ("", "unified"), CGROUP_V2),
                                (v1, ("memory",), CGROUP_V1)):
        if path is None:
            continue
        for mount in mounts:
            base = Path(root) / mount if mount else Path(root)
            folder = base / path.lstrip("/")
            if not folder.is_dir():
                folder = base
            best = None
            while True:
                level = cgroup_level(folder, files)
                if level is not None and (best is None or level[1] < best[1]):
                    best = level
                if folder == base or base not in folder.parents:
                    break
                folder = folder.parent
            if best is not None and (files[0] not in out or best[1] < out[files[0]][1]):
                out[files[0]] = best
    return out


def limits(*, meminfo="/proc/meminfo", status="/proc/self/status",
           proc_cgroup="/proc/self/cgroup", cgroup_root="/sys/fs/cgroup",
           rlimits: dict[str, float] | None = None) -> list[tuple[float, str]]:
    """Every bound on a new allocation that applies, as (bytes available, what bounds it),
    tightest first: ``MemAvailable`` (:func:`meminfo_available`), the process limits
    (:func:`rlimit_headroom`) and the cgroup limits (:func:`cgroup_headroom`). The paths and
    ``rlimits`` are parameters so that tests can fake them."""
    out = [(meminfo_available(meminfo), "MemAvailable")]
    flags = {"AS": "ulimit -v", "DATA": "ulimit -d"}
    for name, (lim, room) in rlimit_headroom(status, rlimits).items():
        out.append((room, f"RLIMIT_{name} {gb(lim)}, {flags[name]}"))
    for name, (lim, room) in cgroup_headroom(proc_cgroup, cgroup_root).items():
        out.append((room, f"cgroup {name} {gb(lim)}"))
    return sorted(out, key=lambda x: x[0])


#: the bound that :func:`available` found tightest last time: (bytes, what), for the message
_LAST: tuple[float, str] = (math.nan, "")


def available(**paths) -> float:
    """Bytes available to a new allocation: the tightest of :func:`limits` (``MemAvailable``,
    the address-space and data limits less what the process maps already, the cgroup v2 / v1
    memory limits less the cgroup's usage); infinity when none can be read (no refusal).
    ``paths``: :func:`limits`'s keyword arguments."""
    global _LAST
    have, what = limits(**paths)[0]
    _LAST = (have, what)
    return have


def _block_params(spec: ArchSpec, kv_heads: int | None = None) -> int:
    d, F = spec.d_model, spec.ff
    kv = spec.heads if kv_heads is None else kv_heads
    attn = 2 * d * d + 2 * d * spec.d_head * kv + (d * d if spec.var_o is not None else 0)
    mlp = (3 if spec.activation in ("swiglu", "geglu") else 2) * d * F
    return attn + mlp + 4 * d + 2 * F


def _measure(spec: ArchSpec, seeds: int, sequences: int, input: str = "rho", dtype_bytes=4,
             grads: bool = False, vocab: int | None = None, **_) -> float:
    S, B, T, d, H, L, b = seeds, sequences, spec.seq_len, spec.d_model, spec.heads, \
        spec.depth, dtype_bytes
    sbt = S * B * T
    total = S * L * _block_params(spec) * b
    if input == "text":
        total += S * ((vocab or BUILTIN_VOCAB) + T) * d * b
    else:
        total += B * T * d * (8 + b)
    total += sbt * d * b * (L + 1 + 8) + 2 * sbt * spec.ff * b
    if spec.attention != "uniform":
        total += 2 * sbt * H * T * b
    total += 2 * S * B * min(T, d) ** 2 * b
    if grads:
        total += _activations(spec, S, B, b)
    return BASELINE["measure"] + total


def _activations(spec: ArchSpec, S: int, B: int, b: int) -> float:
    """Autograd activations of a forward over every block plus the backward's transients."""
    T, d, H, L = spec.seq_len, spec.d_model, spec.heads, spec.depth
    per_block = S * B * T * (10 * d + 2 * spec.ff) * b
    maps = S * B * H * T * T * b * ((L + 1) if spec.attention != "uniform" else 0)
    return L * per_block + maps


def _diagnose(spec: ArchSpec, sequences: int, vocab: int, kv_heads: int | None = None,
              **_) -> float:
    d, L, T, H, B = spec.d_model, spec.depth, spec.seq_len, spec.heads, sequences
    params = L * _block_params(spec, kv_heads) + (vocab + T) * d
    heads_at_once = min(H, max(1, 2**24 // (B * T * T)))  # the probe's recomputation chunks
    return BASELINE["diagnose"] + 4.0 * params + (L + 1) * B * T * d * 8 \
        + 7 * 8 * B * T * T * heads_at_once


def _longctx(spec: ArchSpec, queries: int, chunk: int, lengths, n_scalings: int = 1,
             workers: int = 1, rem: bool = False, **_) -> float:
    d, H = spec.d_model, spec.heads
    T = max(lengths)
    R, c = min(queries, T), min(chunk, T)
    per_worker = 9 * c * d + 4 * 3 * R * 512 \
        + 20 * n_scalings * H * (-(-c // 512) + 1) * R * (spec.d_head + 4)
    if rem:
        per_worker += 3 * 4 * H * R * c
    shared = 8 * (n_scalings * H * R * (spec.d_head + 5) + 3 * R * d) + 4 * 8 * d * d
    shared += 8 * T  # the rows sampled as a prefix of a permutation of all T (int64)
    return BASELINE["longctx"] + workers * per_worker + shared


def _train(spec: ArchSpec, batch_size: int, slices: int, task: str = "mlm",
           vocab: int | None = None, eval_sequences: int = 256, tie: bool = False,
           **_) -> float:
    S, B, T, d = slices, batch_size, spec.seq_len, spec.d_model
    P = spec.depth * _block_params(spec)
    if vocab is not None:
        P += (vocab + T) * d + (0 if tie else d * vocab) + vocab
    total = 6.0 * S * P * 4 + _activations(spec, S, B, 4)
    if vocab is not None:
        n = B * T if task in ("clm", "reverse") else math.ceil(0.15 * B * T) + B
        total += 3 * S * n * vocab * 4
    if task == "heaviside":
        total += eval_sequences * T * d * 4
    return BASELINE["train"] + total


def _spectra(seq_len: int, n_keys: int | None = None, width: int = 15, n_iter: int = 8,
             block: int = 64, workers: int = 1, d_head: int = 0, dense: bool = False,
             centred: bool = False, dtype_bytes: int = 8, **_) -> float:
    n, b = seq_len, dtype_bytes
    nk = n if n_keys is None else n_keys
    held = 2 * (n + nk) * (d_head + 1) * b  # q, k and their log-sum-exp-augmented copies
    if dense:
        return BASELINE["spectra"] + held + n * nk * b * (2 if centred else 1)
    krylov = 2 * n * width * (n_iter + 2) * 8
    per_worker = 3 * block * nk * b + (n + nk) * width * b
    return BASELINE["spectra"] + held + krylov + workers * per_worker


_MODELS: dict[str, Callable[..., float]] = {
    "measure": _measure, "diagnose": _diagnose, "longctx": _longctx, "train": _train,
    "spectra": _spectra}


def estimate(kind: str, **kw) -> float:
    """Predicted peak RSS in bytes of workload ``kind`` (module docstring for the models)."""
    if kind not in _MODELS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
    return float(_MODELS[kind](**kw))


def gb(x: float) -> str:
    """Bytes as the messages write them (``12.8 GB``)."""
    if math.isinf(x):
        return "unlimited"
    for unit, scale in (("GB", 1e9), ("TB", 1e12), ("PB", 1e15)):
        if x < 1000 * scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e18:.3g} EB"


def _apply(kw: dict, name: str, value: int) -> dict | None:
    """``kw`` with option ``name`` set to ``value`` (a spec field goes into the spec)."""
    out = dict(kw)
    if name in ("seq_len", "d_model", "depth") and "spec" in kw:
        try:
            out["spec"] = kw["spec"].replace(**{name: value})
        except SpecError:
            return None
    elif name == "lengths":
        out["lengths"] = [min(t, value) for t in kw["lengths"]]
    else:
        out[name] = value
    return out


def _current(kw: dict, name: str) -> int:
    if name in ("seq_len", "d_model", "depth") and "spec" in kw:
        return int(getattr(kw["spec"], name))
    if name == "lengths":
        return int(max(kw["lengths"]))
    return int(kw[name])


def _largest(fits: Callable[[int], bool], lo: int, hi: int, step: int) -> int | None:
    """Largest multiple of ``step`` in [lo, hi) with ``fits`` (monotone), or None."""
    lo = max(step, -(-lo // step) * step)
    if lo >= hi or not fits(lo):
        return None
    a, b = lo // step, (hi - 1) // step  # fits(a * step); search the last fitting multiple
    while a < b:
        m = (a + b + 1) // 2
        if fits(m * step):
            a = m
        else:
            b = m - 1
    return a * step


def _nice(name: str, v: int, kw: dict) -> int:
    if name in ("seq_len", "chunk", "lengths") and v >= 16:
        return 2 ** int(math.log2(v))
    return v


def suggest(kind: str, budget: float, shrink: dict[str, int], **kw) -> dict[str, int] | None:
    """Smaller settings that fit ``budget``: the options of ``shrink`` (name -> minimum) are
    lowered in turn, the one furthest above its current-to-minimum ratio first, each to the
    largest value that fits or else to its minimum. None if even all minima do not fit."""
    order = sorted(shrink, key=lambda n: -_current(kw, n) / max(shrink[n], 1))
    cur, out = dict(kw), {}
    for name in order:
        lo, now = shrink[name], _current(cur, name)
        if now <= lo:
            continue
        step = cur["spec"].heads if name == "d_model" and "spec" in cur else 1

        def fits(v, name=name, cur=cur):
            trial = _apply(cur, name, v)
            return trial is not None and estimate(kind, **trial) <= budget

        v = _largest(fits, lo, now, step)
        if v is not None:
            nv = _nice(name, v, cur)
            v = nv if fits(nv) else v
            out[name] = v
            return out
        trial = _apply(cur, name, max(lo, step))
        if trial is None:
            continue
        cur, out[name] = trial, max(lo, step)
    return None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check(kind: str, *, shrink: dict[str, int], have: float | None = None, **kw) -> float:
    """Refuse (``SpecError``) when ``estimate(kind, **kw)`` less the baseline (resident
    already) exceeds ``SAFETY`` x ``have`` (default :func:`available`); ``shrink``: the options
    that may be lowered, name -> minimum (module docstring). The message names the bound that
    :func:`available` found tightest (``MemAvailable``, ``RLIMIT_AS ..., ulimit -v``, ``cgroup
    memory.max ...``) when ``have`` is its reading. Returns the estimate."""
    need = estimate(kind, **kw)
    have = available() if have is None else have
    base = BASELINE[kind]  # already resident when the check runs
    budget = SAFETY * have + base
    if need <= budget:
        return need
    sug = suggest(kind, budget, shrink, **kw)
    field = next(iter(sug)) if sug else max(shrink, key=lambda n: _current(kw, n) / shrink[n])
    tail = ("e.g. " + " ".join(f"{_flag(k)} {v}" for k, v in sug.items()) + " fits"
            if sug else "no smaller setting of " + ", ".join(map(_flag, shrink)) + " fits")
    raise SpecError(field, f"this run needs ~{gb(need - base)} more but {gb(have)} are "
                           f"available ({bound_text(have)}{SAFETY:.0%} may be used); {tail}")


def bound_text(have: float) -> str:
    """``"<what bounds it>; "`` when ``have`` is :func:`available`'s last reading, else
    nothing."""
    value, what = _LAST
    return f"{what}; " if what and have == value else ""


def allocation_failure(err: BaseException) -> str | None:
    """One line for an allocation that failed in spite of :func:`check` (the last line of
    defence of a command: torch's ``DefaultCPUAllocator`` / "not enough memory"
    ``RuntimeError``, CUDA's ``OutOfMemoryError`` or a ``MemoryError``), else None."""
    import re

    if isinstance(err, MemoryError):
        text = str(err)
    elif isinstance(err, RuntimeError) and re.search(
            r"alloc|not enough memory|out of memory", str(err), re.IGNORECASE):
        text = str(err)
    else:
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    size = re.search(r"allocate (\d+(?:\.\d+)? [KMGT]i?B)", text)
    what = (f" of {gb(float(asked.group(1)))}" if asked
            else f" of {size.group(1)}" if size else "")
    have = available()
    return (f"out of memory: an allocation{what} failed with {gb(have)} available "
            f"({bound_text(have)}the memory estimate did not cover it); use a smaller setting")


def check_work(lengths, queries: int, n_scalings: int = 1) -> None:
    """Refuse a long-context sweep of more than :data:`MAX_PAIRS` key-query pairs."""
    pairs = sum(int(t) * min(queries, int(t)) for t in lengths) * n_scalings
    if pairs <= MAX_PAIRS:
        return
    k = 1
    while 2 ** (k + 1) * min(queries, 2 ** (k + 1)) * n_scalings <= MAX_PAIRS // 2:
        k += 1
    raise SpecError("lengths", f"this sweep streams ~{pairs:.3g} key-query pairs, above the "
                               f"work bound 2^{int(math.log2(MAX_PAIRS))} (~10 min on 2 "
                               f"cores); lengths up to 2^{k} fit")
