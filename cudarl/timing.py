"""Start-up timing: wall seconds per stage, with the kernel compiles and loads counted apart.

``Trainer.timings`` is filled by a :class:`Stopwatch` (``tools/bench_startup.py`` reads it): the
stages of construction and :meth:`Trainer.prime`, plus ``"compile"``, the seconds any of them
spent waiting for a kernel binary (an NVRTC compile or a cache read) or loading a module.
"""

from __future__ import annotations

import time

from . import kernels


def _kernel_seconds() -> float:
    return kernels.load_seconds["wait"] + kernels.load_seconds["load"]


class Stopwatch:
    """Adds each lap's wall seconds to ``timings[name]``; the part of it spent on kernel binaries
    (``cudarl.kernels.load_seconds``) goes to ``timings["compile"]`` instead."""

    def __init__(self, timings: dict[str, float]):
        self.timings = timings
        self._t, self._k = time.perf_counter(), _kernel_seconds()

    def lap(self, name: str) -> None:
        t, k = time.perf_counter(), _kernel_seconds()
        self.timings[name] = self.timings.get(name, 0.0) + (t - self._t) - (k - self._k)
        if k > self._k:
            self.timings["compile"] = self.timings.get("compile", 0.0) + (k - self._k)
        self._t, self._k = t, k
