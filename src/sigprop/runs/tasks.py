"""The commands a sweep task can run, each a library call that returns one tidy table.

A task is ``(command, config)``. The config's keys are the command's options in Python
spelling (``alpha_attn``, ``seq_len``; the command line's ``--alpha-attn`` with ``_``) and, for
commands that take an architecture, the :class:`~sigprop.spec.ArchSpec` fields. What each
command stores, one row per Trajectory row with its result's headline numbers as extra
columns (docs/sweeps.md):

=============  ===========================================================================
predict        theory trajectory; ``verdict``, ``alpha_crit``
measure        theory + measured trajectory; ``verdict``, ``alpha_crit``, ``rho0``
diagnose       ``model`` (preset, config path, HF name): trajectory and per-head rows;
               ``verdict``, ``first_failing_layer``
longctx        spec fields (one layer, streamed) or ``model`` (every layer); rows per length
train          spec + training options (:class:`~sigprop.training.config.TrainConfig`);
               ``final_loss``, ``eval_loss``, ``baseline``
trainability   one (beta, alpha_attn) point of the grid on the deep small model (spec fields
               override it); ``theory``, ``outcome``, ``agree``, ``gain``
reproduce      ``item`` (a registered name) at ``size``; ``status``, ``checks_passed``
=============  ===========================================================================

:func:`check` validates a task in the driver before anything runs (unknown key, bad spec
value: one line naming the key); :func:`execute` runs it in a worker.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..spec import ArchSpec, SpecError

__all__ = ["COMMANDS", "Command", "check", "execute", "resources"]

#: ArchSpec fields a config may set (per-layer parameters come only from model weights)
SPEC_KEYS = frozenset(f.name for f in dataclasses.fields(ArchSpec) if f.name != "layers")


@dataclass(frozen=True)
class Command:
    """``run(spec_fields, options) -> DataFrame``; ``options``: the keys besides the spec's;
    ``spec``: whether the ArchSpec fields are accepted; ``torch``: whether it runs torch (a
    worker then fixes torch's thread count); ``required``: keys every task must give."""

    name: str
    run: Callable[[dict, dict], pd.DataFrame]
    options: frozenset[str]
    spec: bool = True
    torch: bool = True
    required: tuple[str, ...] = ()

    def keys(self) -> frozenset[str]:
        return self.options | (SPEC_KEYS if self.spec else frozenset())


def _params(fn: Callable, drop: tuple[str, ...] = ()) -> frozenset[str]:
    skip = {"spec", "fields", "on_step", "on_seed", "on_progress", "corpus", *drop}
    return frozenset(k for k, p in inspect.signature(fn).parameters.items()
                     if k not in skip and p.kind is not p.VAR_KEYWORD)


def _with(frame: pd.DataFrame, **cols: Any) -> pd.DataFrame:
    """``frame`` with scalar result columns added to every row."""
    frame = frame.copy()
    for k, v in cols.items():
        frame[k] = v
    return frame


# ---- the commands ------------------------------------------------------------------------
def _predict(spec: dict, opt: dict) -> pd.DataFrame:
    from ..analysis.predict import predict

    p = predict(ArchSpec(**spec), **opt)
    return _with(p.trajectory, verdict=p.verdict, alpha_crit=p.alpha_crit)


def _measure(spec: dict, opt: dict) -> pd.DataFrame:
    from ..analysis.measure import measure

    c = measure(ArchSpec(**spec), **opt)
    return _with(c.trajectory, verdict=c.verdict, alpha_crit=c.alpha_crit, rho0=c.rho0)


def _diagnose(spec: dict, opt: dict) -> pd.DataFrame:
    from ..analysis.diagnose import diagnose

    d = diagnose(**opt)
    heads = d.heads.assign(source=d.heads.get("source", "measured"))
    frame = pd.concat([d.trajectory, heads], ignore_index=True)
    return _with(frame, verdict=d.verdict, first_failing_layer=d.first_failing_layer)


def _longctx(spec: dict, opt: dict) -> pd.DataFrame:
    from ..analysis.longctx import longctx, longctx_model

    if "model" in opt:
        model = opt.pop("model")
        return longctx_model(model, **opt).trajectory
    return longctx(ArchSpec(**spec), **opt).trajectory


_DATA_KEYS = ("data", "documents", "vocab_size")


def _train_config(opt: dict, base=None):
    from ..training.config import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    kw = {k: opt.pop(k) for k in list(opt) if k in names}
    return dataclasses.replace(base, **kw) if base is not None else TrainConfig(**kw)


def _corpus(opt: dict, task: str):
    data = opt.pop("data", "builtin")
    docs, vocab = opt.pop("documents", None), opt.pop("vocab_size", 2000)
    if task not in ("mlm", "clm"):
        return data, None
    from ..data.corpus import load_corpus

    return data, load_corpus(data, n_documents=docs, vocab_size=vocab)


def _train(spec: dict, opt: dict) -> pd.DataFrame:
    from ..training.loop import train

    cfg = _train_config(opt)
    data, corpus = _corpus(opt, cfg.task)
    res = train(ArchSpec(**spec), cfg, data=data, corpus=corpus)
    return _with(res.trajectory, final_loss=float(res.final_train.mean()),
                 eval_loss=float(res.final_eval.mean()), baseline=res.baseline)


def _trainability(spec: dict, opt: dict) -> pd.DataFrame:
    from ..training.trainability import DEEP_SMALL, TRAINABILITY_CONFIG, trainability

    s = ArchSpec(**{**DEEP_SMALL, **spec})
    cfg = _train_config(opt, TRAINABILITY_CONFIG)
    data, corpus = _corpus(opt, "mlm")
    table, traj = trainability(s, [s.beta_eff], [s.alpha_attn], cfg, data=data,
                               corpus=corpus, **opt)
    row = table.iloc[0].to_dict()
    return _with(traj, **{k: v for k, v in row.items() if k not in traj.columns})


def _reproduce(spec: dict, opt: dict) -> pd.DataFrame:
    from ..reproduce.core import items, run

    name = opt.pop("item")
    known = items()
    if name not in known:
        raise SpecError("item", f"unknown item {name!r}; `sigprop reproduce --list` lists "
                                f"the {len(known)} items")
    exp = run(known[name], opt.pop("size", "default"), **opt)
    passed = sum(c.status != "fail" for c in exp.checks)
    return _with(exp.trajectory, status=exp.status, checks_passed=passed,
                 checks=len(exp.checks))


def _train_keys() -> frozenset[str]:
    from ..training.config import TrainConfig

    return frozenset(f.name for f in dataclasses.fields(TrainConfig)) | frozenset(_DATA_KEYS)


def _commands() -> dict[str, Command]:
    from ..analysis.diagnose import diagnose
    from ..analysis.longctx import longctx
    from ..analysis.longctx_model.engine import run as run_model
    from ..analysis.measure import measure
    from ..analysis.predict import predict

    train_keys = _train_keys()
    return {c.name: c for c in (
        Command("predict", _predict, _params(predict), torch=False),
        Command("measure", _measure, _params(measure)),
        Command("diagnose", _diagnose, _params(diagnose), spec=False, required=("model",)),
        Command("longctx", _longctx, _params(longctx) | _params(run_model, ("model",))
                | {"model"}),
        Command("train", _train, train_keys),
        Command("trainability", _trainability, train_keys | {"margin"}),
        Command("reproduce", _reproduce, frozenset({"item", "size", "seed", "device"}),
                spec=False, required=("item",)),
    )}


COMMANDS: dict[str, Command] = {}


def command(name: str) -> Command:
    if not COMMANDS:
        COMMANDS.update(_commands())
    if name not in COMMANDS:
        raise SpecError("command", f"must be one of {', '.join(COMMANDS)} (got {name!r})")
    return COMMANDS[name]


def _split(cmd: Command, config: Mapping[str, Any]) -> tuple[dict, dict]:
    """(ArchSpec fields, other options); a model's longctx keeps ``seq_len`` etc. as its own
    options (the model brings its architecture)."""
    by_model = cmd.name == "longctx" and "model" in config
    spec = {k: v for k, v in config.items()
            if cmd.spec and k in SPEC_KEYS and not (by_model and k in cmd.options)}
    opt = {k: v for k, v in config.items() if k not in spec}
    return spec, opt


def check(name: str, config: Mapping[str, Any]) -> None:
    """Validate one task before it runs: the command exists, every key is one of its
    options, required keys are there, and the architecture is a valid ArchSpec. Raises
    :class:`SpecError` naming the key."""
    cmd = command(name)
    unknown = sorted(set(config) - cmd.keys())
    if unknown:
        extra = " or an ArchSpec field" if cmd.spec else ""
        raise SpecError(unknown[0], f"not an option of {name} (its options: "
                                    f"{', '.join(sorted(cmd.options))}{extra})")
    for k in cmd.required:
        if k not in config:
            raise SpecError(k, f"{name} needs {k} in every task")
    spec, _ = _split(cmd, config)
    if name == "trainability":
        from ..training.trainability import DEEP_SMALL

        ArchSpec(**{**DEEP_SMALL, **spec})
    elif name == "longctx" and "model" in config:
        if spec:
            raise SpecError(sorted(spec)[0], "longctx of a model reads the model's own "
                                             "architecture; drop the ArchSpec fields")
    elif cmd.spec:
        ArchSpec(**spec)
    if name == "reproduce":
        from ..reproduce.core import SIZES, items

        known = items()
        if config["item"] not in known:
            raise SpecError("item", f"unknown item {config['item']!r}; `sigprop reproduce "
                                    f"--list` lists the {len(known)} items")
        if config.get("size", "default") not in SIZES:
            raise SpecError("size", f"must be one of {', '.join(SIZES)} "
                                    f"(got {config['size']!r})")


def resources(name: str, config: Mapping[str, Any], cpus: float = 1.0,
              gpus: float | None = None) -> dict[str, float]:
    """What one task asks of a Ray node: ``cpus`` CPUs, and ``gpus`` GPUs (default: 1 when
    the task's ``device`` is CUDA, else 0), so Ray places GPU work on GPU nodes."""
    if gpus is None:
        gpus = 1.0 if str(config.get("device", "cpu")).startswith("cuda") else 0.0
    return {"num_cpus": float(cpus), "num_gpus": float(gpus)}


def execute(name: str, config: Mapping[str, Any], threads: int = 1) -> tuple[pd.DataFrame, float]:
    """Run one task in this process with torch at ``threads`` intra-op threads; returns its
    table and the seconds it took. Exceptions propagate (the executor records them)."""
    cmd = command(name)
    t0 = time.perf_counter()
    if cmd.torch:
        import torch

        torch.set_num_threads(max(1, int(threads)))
    spec, opt = _split(cmd, dict(config))
    frame = cmd.run(spec, opt)
    return frame.reset_index(drop=True), time.perf_counter() - t0


def worker_setup(threads: int) -> None:
    """Thread limits for a fresh worker process, before NumPy or torch is imported."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(max(1, int(threads)))
