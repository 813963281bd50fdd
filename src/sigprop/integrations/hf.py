"""The training-time monitor inside a HuggingFace ``transformers.Trainer`` (docs/monitor.md).

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    cb = SigpropCallback(every=50, store="runs/monitor").attach(trainer)
    trainer.train()
    cb.monitor.events                       # every layer found in collapse

Every ``every`` optimiser steps (default: the Trainer's ``logging_steps``), and at step 0 and
the last step, :class:`sigprop.measurement.monitor.Monitor` measures the model on a held batch
(given, or the first batch of the train dataloader) and the scalars go through
``trainer.log``: that puts them in ``trainer.state.log_history`` and hands them to every
logger that ``report_to`` configured (TensorBoard, W&B, MLflow ...; TensorBoard shows them
under ``train/sigprop/...``, since the Trainer prefixes training logs). The loggers get the
values at the Trainer's ``global_step``. Each measurement's rows also go to the results store
when ``store`` is given (command ``monitor``, one record per (run, step)).

Attention health on the training batch (``telemetry=True``, or ``qk_clip=tau`` which implies
it): every optimiser step (``telemetry_every``) the in-step telemetry of
:class:`sigprop.training.health.AttentionHealth` reads the q and k of the Trainer's own
forward pass -- per head the largest logit, entropy, sink share, beta --, logs them through the
same path, warns ahead of a projected crossing and, with ``qk_clip``, rescales the heads whose
largest logit passed tau right after the optimiser step (Kimi K2's QK-Clip). It runs on every
rank (statistics reduced across data-parallel ranks; rank 0 logs). ``monitor=False`` leaves
out the held-batch monitor.

Why ``attach``: a Trainer hands its callbacks the model, optimiser and dataloaders but not
itself, and only ``trainer.log`` reaches both the log history and every logger. A callback
passed as ``Trainer(callbacks=[cb])`` and never attached still measures, stores, warns and
appends to ``state.log_history``, but the loggers do not see it (one ``UserWarning`` says so).

transformers is imported only when a callback is built: the class becomes a subclass of
``transformers.TrainerCallback`` then (``isinstance(cb, TrainerCallback)`` holds), so
``import sigprop`` stays light.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from ..measurement.monitor import ENTROPY_MIN, RHO_MAX, Monitor

__all__ = ["SigpropCallback", "store_sink"]


def store_sink(store, run: str, **config: Any) -> Callable:
    """A monitor sink that writes every measurement to the results store ``store`` (a
    :class:`sigprop.runs.store.Store` or its folder): command ``monitor``, config
    ``{"run": run, "step": step, **config}``, so each measurement is its own atomic record
    (a rerun of the same run replaces its records step by step). Read them back with
    ``Store(dir).read(command="monitor")``."""
    from ..runs.store import Store

    st = store if isinstance(store, Store) else Store(store)

    def sink(step: int, frame, scalars) -> None:
        st.write("monitor", {"run": run, "step": int(step), **config}, frame)

    sink.store = st  # type: ignore[attr-defined]
    return sink


@cache
def _with_trainer_base(cls: type) -> type:
    """``cls`` with ``transformers.TrainerCallback`` as a second base (built once per class):
    its no-op handlers cover every event, including ones added after this was written."""
    from transformers import TrainerCallback

    if issubclass(cls, TrainerCallback):
        return cls
    return type(cls.__name__, (cls, TrainerCallback),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                 "__doc__": cls.__doc__})


def _first_batch(dataloader, device_index: int | None):
    """The first batch of ``dataloader`` without moving any random state of the run: a fresh
    iterator draws a sampler permutation (and a masking collator its masks) from the global
    generators, so torch's (CPU and the model's GPU), NumPy's and Python's states are
    restored after."""
    import random

    import numpy as np
    import torch

    py, npy = random.getstate(), np.random.get_state()
    devices = [] if device_index is None else [device_index]
    try:
        with torch.random.fork_rng(devices=devices):
            return next(iter(dataloader))
    finally:
        random.setstate(py)
        np.random.set_state(npy)


class SigpropCallback:
    """A ``transformers.TrainerCallback`` that runs the sigprop monitor (module docstring).

    ``batch``: the held batch (a dict of tensors, as the model takes it; with ``labels`` the
    model's own loss is differentiated for the Q/K gradients); None takes the first batch of
    the train dataloader (without changing the run's random state). ``every``: measuring
    interval in optimiser steps (None: ``args.logging_steps``). ``store``: a results store
    folder (or ``Store``) for the rows; ``run``: the record name there (default:
    ``args.run_name``, else the output folder's name). ``grads``, ``per_head``, ``rho_max``,
    ``entropy_min``, ``loss_fn``, ``warn``, ``probe_kwargs``: as
    :class:`~sigprop.measurement.monitor.Monitor`; ``sinks``: more ``sink(step, frame,
    scalars)`` callables. Only the world process zero measures.

    After training: ``monitor`` (the :class:`Monitor`: ``events``, ``trajectory()``,
    ``scalars``).
    """

    def __new__(cls, *args, **kwargs):
        return object.__new__(_with_trainer_base(cls))

    def __init__(self, batch: Mapping | None = None, *, every: int | None = None,
                 store=None, run: str | None = None, grads: bool = True,
                 per_head: bool = True, rho_max: float = RHO_MAX,
                 entropy_min: float = ENTROPY_MIN, loss_fn: Callable | None = None,
                 warn: bool = True, sinks: Sequence[Callable] = (),
                 probe_kwargs: Mapping | None = None, trainer=None, telemetry: bool = False,
                 qk_clip: float | None = None, telemetry_every: int = 1,
                 health_kwargs: Mapping | None = None, monitor: bool = True):
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 1):
            raise ValueError(f"every must be a positive integer or None (got {every!r})")
        self.health_options = None
        if telemetry or qk_clip is not None:
            self.health_options = dict(health_kwargs or {}, every=telemetry_every,
                                       qk_clip=qk_clip, warn=warn)
        self.use_monitor = bool(monitor)
        self.health = None
        self.batch, self.every, self.store, self.run = batch, every, store, run
        self.options = dict(grads=grads, per_head=per_head, rho_max=rho_max,
                            entropy_min=entropy_min, loss_fn=loss_fn, warn=warn,
                            probe_kwargs=probe_kwargs)
        self.sinks = list(sinks)
        self.trainer = None
        self.monitor: Monitor | None = None
        self._state = None
        if trainer is not None:
            self.attach(trainer)

    def attach(self, trainer) -> SigpropCallback:
        """Log through ``trainer.log`` and add this callback to ``trainer`` if it is not
        there yet; returns the callback."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    # ---- Trainer events ---------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, train_dataloader=None,
                       **kwargs):
        self._state = state
        if self.health_options is not None and self.health is None:  # every rank
            self._start_health(args, model, state)
        if not state.is_world_process_zero or not self.use_monitor:
            return
        if self.trainer is None:
            warnings.warn("SigpropCallback is not attached to its Trainer: its scalars reach "
                          "state.log_history and the store but not the report_to loggers; "
                          "use SigpropCallback(...).attach(trainer)", UserWarning,
                          stacklevel=2)
        batch = self.batch
        if batch is None:
            if train_dataloader is None:
                raise ValueError("SigpropCallback needs batch= when the Trainer has no train "
                                 "dataloader")
            param = next(model.parameters(), None)
            cuda = param is not None and param.device.type == "cuda"
            batch = _first_batch(train_dataloader, (param.device.index or 0) if cuda else None)
        every = self.every or _logging_every(args, state)
        sinks = [self._log]
        if self.store is not None:
            run = self.run or getattr(args, "run_name", None) or _folder_name(args)
            sinks.append(store_sink(self.store, run))
        self.monitor = Monitor(model, batch, every=every, sinks=sinks + self.sinks,
                               **self.options)
        self.monitor(state.global_step)

    def _start_health(self, args, model, state) -> None:
        from ..training.health import AttentionHealth

        sinks = [self._log] if state.is_world_process_zero else []
        if self.store is not None and state.is_world_process_zero:
            run = self.run or getattr(args, "run_name", None) or _folder_name(args)
            sinks.append(store_sink(self.store, run, kind="telemetry"))
        self.health = AttentionHealth(model, sinks=sinks, start=state.global_step + 1,
                                      **self.health_options)

    def on_step_end(self, args, state, control, **kwargs):
        if self.health is not None:  # after the optimiser step: QK-Clip acts on it
            self.health.after_step(state.global_step)
        if self.monitor is not None:
            last = state.max_steps > 0 and state.global_step >= state.max_steps
            self.monitor(state.global_step, force=last)

    def on_train_end(self, args, state, control, **kwargs):
        if self.health is not None:
            self.health.close()

    # ---- logging -----------------------------------------------------------------------
    def _log(self, step: int, frame, scalars: dict) -> None:
        """Scalars to ``trainer.log`` (log history and every logger), keeping the Trainer's
        own decision to log this step (its ``on_log`` resets ``control.should_log``)."""
        if self.trainer is None:
            entry = dict(scalars, step=step)
            if self._state is not None:
                if self._state.epoch is not None:
                    entry["epoch"] = self._state.epoch
                self._state.log_history.append(entry)
            return
        control = getattr(self.trainer, "control", None)
        should_log = getattr(control, "should_log", None)
        self.trainer.log(dict(scalars))
        if control is not None and should_log is not None:
            self.trainer.control.should_log = should_log


def _logging_every(args, state) -> int:
    """The Trainer's logging interval in steps (``logging_steps`` below 1 is a fraction of
    the run, as the Trainer reads it)."""
    ls = getattr(args, "logging_steps", 50) or 50
    if ls < 1:
        return max(1, math.ceil(ls * max(state.max_steps, 1)))
    return int(ls)


def _folder_name(args) -> str:
    import os

    out = getattr(args, "output_dir", None)
    return os.path.basename(os.path.normpath(out)) if out else "trainer"
