"""``StepMonitor``: the host's side of each learner update, in one place.

After the trainer launches update ``t`` it calls :meth:`StepMonitor.launched`. On the GPU that reads
update ``t - 1``'s loss and gradient norm (one step late: the train graph published them to a pinned
ring, :data:`cudarl.agent.PUBLISH_SLOTS` slots, and the event recorded after update ``t - 1`` says
they are there, so the host never waits on the update in flight); on the NumPy backend nothing is in
flight and it reads update ``t`` at once. Each value goes to the :class:`cudarl.guard.Guard`; on a
trip the monitor either stops (the trainer's ``on_stop`` saves, then :class:`GuardStop` propagates)
or rolls the agent back to its last in-memory snapshot and lowers the learning rate.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import replace

from .agent import PUBLISH_SLOTS
from .guard import Guard, GuardStop


class StepMonitor:
    """Readback, guard and rollback of one run.

    Args:
        agent: the :class:`cudarl.agent.Agent` (its readback ring, state and optimiser schedule).
        train_graph: the :class:`cudarl.graph.StepGraph` to recapture after a rollback (the schedule's
            constants are kernel arguments).
        guard: the run's :class:`cudarl.config.GuardConfig`.
        stream: the stream the graphs run on (None on NumPy).
        on_event: called with each event row (``{"event": "guard" | "rollback", ..., "message"}``).
        on_stop: called before a :class:`GuardStop` propagates (the trainer saves ``guard-stop``), or None.

    Attributes:
        losses: the loss of every update read, in order. last: ``(loss, grad_norm)`` of the latest;
        last_stats: its observables (:meth:`cudarl.stats.StepStats.decode`), ``{}`` before any.
        pending: the update launched but not read yet (GPU), or None. snapshot: ``(step, agent state)``.

    The agent is anything with the faces the monitor reads: ``readback``, ``stats``, ``state_dict()``,
    ``load_state_dict()`` and ``adam.schedule`` (a joined population's member ``i`` reads, snapshots and rolls
    back the stacked learner's member ``i`` in this form, so its guard acts as a single run's).
    """

    def __init__(self, agent, train_graph, guard, *, stream=None, on_event=print, on_stop=None):
        self.agent, self.train_graph, self.stream = agent, train_graph, stream
        self.lr_factor = guard.lr_factor
        self.guard = Guard(guard)
        self.on_event, self.on_stop = on_event, on_stop or (lambda: None)
        self.losses: list[float] = []
        self.last = (math.nan, math.nan)
        self.last_stats: dict = {}
        self.pending: int | None = None
        self.step = 0  # the latest update launched (events name it)
        self.snapshot: tuple | None = None

    def launched(self, step: int) -> bool:
        """Update ``step`` was just launched: mark its readback slot and read the update it is time to read
        (``step - 1`` on the GPU, ``step`` on the CPU). True if the guard rolled the agent back (the
        update in flight is then never read)."""
        self.step = step
        self.agent.readback.mark_written(self.stream, slot=step % PUBLISH_SLOTS)
        self.agent.stats.ring.mark_written(self.stream, slot=step % PUBLISH_SLOTS)
        if self.pending is not None and self._check(self.pending):
            self.pending = None
            return True
        self.pending = step
        if self.stream is None:  # no graph in flight: read now
            return self.settle()
        return False

    def settle(self) -> bool:
        """Read the pending update, if any (before an evaluation, a checkpoint, a snapshot or the end).
        True if the guard rolled back."""
        step, self.pending = self.pending, None
        return step is not None and self._check(step)

    def take_snapshot(self, step: int) -> None:
        """Settle, then keep the agent's state in memory as the rollback point of ``step``."""
        self.settle()
        with self._on_stream():  # after everything launched on it (a population's work between updates too)
            self.snapshot = (step, self.agent.state_dict())

    def _check(self, step: int) -> bool:
        """Read update ``step``'s loss and grad norm, record them, run the guard. True if rolled back."""
        v = self.agent.readback.read(step % PUBLISH_SLOTS)
        loss, gn = float(v[0]), float(v[1])
        self.losses.append(loss)
        self.last = (loss, gn)
        self.last_stats = self.agent.stats.read(step)
        try:
            ev = self.guard.check(step, loss, gn, self.last_stats.get("atom_utilisation"))
        except GuardStop as exc:
            self._stop(step, str(exc))
        if ev is None:
            return False
        self.on_event({**ev.as_dict(), "message": ev.message()})
        self._rollback(ev)
        return True

    def _rollback(self, ev) -> None:
        """Restore the last good snapshot and lower the learning rate by ``guard.lr_factor``."""
        if self.snapshot is None:
            self._stop(ev.step, f"{ev.message()} (no snapshot to roll back to yet)")
        step, state = self.snapshot
        sch, f = self.agent.adam.schedule, self.lr_factor
        if self.stream is not None:
            self.stream.synchronize()
        with self._on_stream():  # the next replay, on that stream, reads what is loaded (a joined member's
            self.agent.load_state_dict(state)  # schedule too: its entries of the learner's device table)
            self.agent.adam.schedule = replace(sch, lr=sch.lr * f, lr_min=sch.lr_min * f)
        self.train_graph.capture()  # the schedule's constants are kernel arguments
        self.on_event(
            {
                "event": "rollback",
                "step": self.step,
                "restored": step,
                "lr": sch.lr * f,
                "message": f"guard: rolled back to the snapshot of update {step}; learning rate now {sch.lr * f:.3g}",
            }
        )

    def _stop(self, step: int, message: str):
        """Stop: the event, ``on_stop`` (the trainer saves), then :class:`GuardStop` with ``message``."""
        self.on_event({"event": "guard", "step": step, "action": "stop", "message": message})
        self.on_stop()
        raise GuardStop(message)

    def _on_stream(self):
        """The graphs' stream as the current one (a no-op context on the NumPy backend)."""
        return self.stream if self.stream is not None else nullcontext()
