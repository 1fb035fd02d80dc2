"""Ctrl-C and SIGTERM during training: finish the update in flight, write a checkpoint, exit 130 / 143.

Inside :func:`deferred`, SIGINT and SIGTERM only set a flag; the training loop looks at it between
updates (a point where the host's counters and the device agree), saves, and raises
:class:`Interrupted`. A second Ctrl-C while that happens raises ``KeyboardInterrupt`` at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal after its final checkpoint; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = int(signum)
        self.exit_code = 128 + self.signum


class StopFlag:
    """Set by a signal handler; read by the loop. ``signum`` is the first signal received, or None."""

    def __init__(self):
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


@contextmanager
def deferred(signals=(signal.SIGINT, signal.SIGTERM)):
    """Yield a :class:`StopFlag` that SIGINT / SIGTERM set instead of stopping the process (main
    thread only: elsewhere signals cannot be caught and the flag never sets)."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if not flag:
            flag.signum = signum

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
