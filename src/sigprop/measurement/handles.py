"""Hook handles held by a context manager: :class:`HookHandles` is the one home of "leaving the
context removes every hook it registered", shared by the probe, the weight reader, the
long-context capture and its float32 blocks."""

from __future__ import annotations


class HookHandles:
    """Mixin of a context manager that registers forward hooks in ``__enter__``: their handles
    go in ``self._handles`` (a list the subclass starts empty), and ``__exit__`` removes them
    all and starts a new list, letting any exception through."""

    _handles: list

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False
