"""The training guard: reads loss and gradient norm every step and acts on NaN, inf or spikes.

The values reach the host through :class:`cudarl.pinned.PinnedReadback`, one step late (the
trainer reads step ``t - 1`` after launching step ``t``), so the guard never stalls the GPU.

Rule (documented in ``docs/guide.md``): a step *trips* the guard when its loss or gradient norm
is NaN or inf, or when the window of the last ``window`` healthy losses is full and the loss
exceeds ``spike_factor`` times their median (a median, so one earlier outlier does not hide the
next), or (``min_atom_utilisation`` > 0, a head with atoms) when the atom utilisation of each of the
last ``window`` updates was below ``min_atom_utilisation``: the return distribution has collapsed
onto a few atoms (the seed system trained for days that way). On a trip the action is ``"stop"``
(raise :class:`GuardStop` with the step, value and rule) or ``"rollback"`` (the trainer restores
its last good in-memory snapshot and multiplies the learning rate by ``lr_factor``); after
``max_rollbacks`` rollbacks it stops. Every trip is an event returned to the caller, who logs it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .config import GuardConfig


class GuardStop(RuntimeError):
    """Training stopped by the guard; the message says at which step and why."""


@dataclass(frozen=True)
class GuardEvent:
    step: int
    reason: str  # "nan", "inf", "spike", "collapse"
    what: str  # "loss", "grad_norm" or "atom_utilisation"
    value: float
    threshold: float | None
    action: str  # "stop" or "rollback"

    def message(self) -> str:
        if self.reason == "collapse":
            return (
                f"guard: step {self.step}: atom_utilisation = {self.value:.3g} < {self.threshold:.3g} for the last "
                "guard.window updates (the return distribution sits on a few atoms: fit net.v_min/v_max to the "
                f"returns or turn on agent.popart); action: {self.action}"
            )
        thr = f" > {self.threshold:.4g} (spike rule)" if self.threshold is not None else ""
        return f"guard: step {self.step}: {self.what} = {self.value!r}{thr}; action: {self.action}"

    def as_dict(self) -> dict:
        return {
            "event": "guard",
            "step": self.step,
            "reason": self.reason,
            "what": self.what,
            "value": None if not math.isfinite(self.value) else self.value,
            "raw": repr(self.value),
            "threshold": self.threshold,
            "action": self.action,
        }


class Guard:
    """Checks each step's (loss, grad_norm) by the rule of a :class:`cudarl.config.GuardConfig` (validated
    there, the one source of its defaults): ``action`` (``"stop"`` or ``"rollback"``), ``window`` (recent
    healthy losses the spike rule looks at), ``spike_factor`` (a loss above ``spike_factor * median`` is a
    spike), ``max_rollbacks`` (after this many the next trip stops training) and ``min_atom_utilisation``
    (the collapse rule; 0 turns it off)."""

    def __init__(self, cfg: GuardConfig | None = None):
        cfg = cfg or GuardConfig()
        self.action, self.window = cfg.action, int(cfg.window)
        self.spike_factor, self.max_rollbacks = float(cfg.spike_factor), int(cfg.max_rollbacks)
        self.min_utilisation = float(cfg.min_atom_utilisation)
        self.history: deque = deque(maxlen=self.window)
        self.low_utilisation = 0  # consecutive updates below min_atom_utilisation
        self.rollbacks = 0

    def check(self, step: int, loss: float, grad_norm: float, utilisation: float | None = None) -> GuardEvent | None:
        """Return ``None`` for a healthy step (recorded in the window), else the event. ``utilisation``:
        the update's atom utilisation (None for a head without atoms).

        Raises :class:`GuardStop` when the action is ``"stop"`` or rollbacks are exhausted.
        """
        event = None
        for what, v in (("loss", loss), ("grad_norm", grad_norm)):
            if not math.isfinite(v):
                event = GuardEvent(step, "nan" if math.isnan(v) else "inf", what, float(v), None, self.action)
                break
        if event is None and len(self.history) == self.window:
            thr = self.spike_factor * sorted(self.history)[self.window // 2]
            if loss > thr:
                event = GuardEvent(step, "spike", "loss", float(loss), thr, self.action)
        if event is None and utilisation is not None and self.min_utilisation > 0:
            low = utilisation < self.min_utilisation
            self.low_utilisation = self.low_utilisation + 1 if low else 0
            if self.low_utilisation >= self.window:
                event = GuardEvent(
                    step, "collapse", "atom_utilisation", float(utilisation), self.min_utilisation, self.action
                )
        if event is None:
            self.history.append(float(loss))
            return None
        self.low_utilisation = 0
        if self.action == "stop" or self.rollbacks >= self.max_rollbacks:
            stopped = GuardEvent(event.step, event.reason, event.what, event.value, event.threshold, "stop")
            raise GuardStop(
                stopped.message() + (f" (after {self.rollbacks} rollbacks)" if self.action == "rollback" else "")
            )
        self.rollbacks += 1
        return event

    def state_dict(self) -> dict:
        """The window of healthy losses, the run of low-utilisation updates and the rollbacks so far (a
        checkpoint's ``guard``)."""
        return {"history": list(self.history), "rollbacks": self.rollbacks, "low_utilisation": self.low_utilisation}

    def load_state_dict(self, s: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.history = deque((float(x) for x in s["history"]), maxlen=self.window)
        self.rollbacks = int(s["rollbacks"])
        self.low_utilisation = int(s.get("low_utilisation", 0))  # absent in checkpoints written before the rule
