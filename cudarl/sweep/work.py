"""The unit of work of a sweep: one population trained and evaluated, in this process or a Ray actor.

:func:`run_population` is all a worker does, wherever it runs, so a trial's numbers do not depend on
where it ran (a test holds a local sweep and a Ray sweep equal, bit for bit). It writes nothing but
its members' run directories, when the job names them (their resume checkpoints): the results, and
each member's policy file as bytes, go back to the sweep's driver, which records them.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from ..evaluate import json_safe

#: The numbers of one split's evaluation a trial keeps (the evaluation summary's).
POLICY_KEYS = ("sharpe", "total_return", "max_drawdown", "trades", "turnover", "bar_hit_rate")
STAT_KEYS = ("psr", "sharpe_interval", "skew", "kurtosis", "bars")


def split_numbers(summary: dict) -> dict:
    """The numbers a sweep keeps of one evaluation summary (NaN as None)."""
    pol, st = summary["policy"], summary["statistics"]
    out = {k: pol.get(k) for k in POLICY_KEYS}
    out.update({k: st.get(k) for k in STAT_KEYS})
    out["buy_and_hold_sharpe"] = summary["buy_and_hold"].get("sharpe")
    out["trading"] = bool(summary["deployment"]["trading"])
    return {k: json_safe(v) for k, v in out.items()}  # value by value: NaN as None, no reasons added


def weights_digest(state) -> str:
    """SHA-256 of a policy's weights (layer names sorted, float32 bytes): equal digests, equal weights."""
    h = hashlib.sha256()
    for k in sorted(state.weights):
        h.update(k.encode())
        h.update(np.ascontiguousarray(state.weights[k], np.float32).tobytes())
    return h.hexdigest()


#: When members write resume checkpoints, by ``run.resume_checkpoint`` (the spec's ``checkpoint``).
WRITTEN = {"eval": "at each validation evaluation and at the end", "end": "at the end"}


def mib(n: int) -> str:
    """``n`` bytes in MiB (GiB from 1 GiB on)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def checkpoint_cost(index: int, members: list, say):
    """A callable (a :meth:`cudarl.population.Population.run` ``progress``, which ignores its arguments)
    that says once, as soon as a member of population ``index`` has written a resume checkpoint, what one
    costs on disk and what the population's members write together each time."""
    said, when = [], members[0].cfg.run.resume_checkpoint

    def check(*_) -> None:
        if said or when not in WRITTEN:  # "never": the guard's guard-stop.npz is no resume checkpoint
            return
        got = next((m.checkpoint_bytes for m in members if m.checkpoint_bytes), None)
        if got is None:
            return
        said.append(got)
        say(
            f"population {index}: a member's resume checkpoint is {mib(got)}, {mib(got * len(members))} for its "
            f'{len(members)} member(s) {WRITTEN[when]} (the spec\'s checkpoint = "{when}")'
        )

    return check


def run_population(job: dict, bars, echo=None) -> dict:
    """Train and evaluate the population ``job`` describes; return its results.

    ``job``: ``{"index": int, "splits": Splits or None, "trials": [{"key", "config": {sec: {field}}}]}``,
    optionally ``"run_dirs"`` (per member, its run directory: resume checkpoints are written there) and
    ``"resume"`` (per member, its ``checkpoints/latest.npz``: the population continues from them,
    :meth:`cudarl.population.Population.resume`, in those run directories);
    ``bars``: the sweep's :class:`cudarl.data.Bars`; ``echo``: where to say, once, what a member's resume
    checkpoint costs on disk (:func:`checkpoint_cost`; default: the returned log). Returns ``{"index",
    "results": [per trial: {"key", "val", "test", "step", "weights_sha256", "guard_stop", "policy": bytes}],
    "log": [lines], "worker", "wall_s"}``.
    """
    from ..config import from_dict
    from ..policy import PolicyState
    from ..population import Population

    t0 = time.perf_counter()
    log: list[str] = []
    cfgs = [from_dict(t["config"]) for t in job["trials"]]
    if job.get("resume"):
        pop = Population.resume(job["resume"], bars=bars, splits=job["splits"], echo=log.append)
    else:
        dirs = [Path(d) for d in job["run_dirs"]] if job.get("run_dirs") else [False] * len(cfgs)
        pop = Population(cfgs, bars=bars, splits=job["splits"], run_dirs=dirs, echo=log.append)
    for m in pop.members:
        m.plot_evaluations = False  # equity.png: half a second of CPU an evaluation, for a folder soon removed
    cost = checkpoint_cost(job["index"], pop.members, echo or log.append)
    runs = pop.run(progress=cost)
    cost()  # a run too short for a metrics row
    val, test = pop.evaluate("val"), pop.evaluate("test")
    results = []
    with tempfile.TemporaryDirectory(prefix="cudarl-sweep-") as tmp:
        # no name outlives the loop holding a member: close() below releases the members' streams
        states = (PolicyState.of_trainer(m) for m in pop.members)
        for i, (t, state) in enumerate(zip(job["trials"], states, strict=True)):
            path = state.save(Path(tmp) / f"{i}.safetensors")
            results.append(
                {
                    "key": t["key"],
                    "val": split_numbers(val[i]),
                    "test": split_numbers(test[i]),
                    "step": state.step,
                    "periods_per_year": pop.members[i].data.periods_per_year,
                    "weights_sha256": weights_digest(state),
                    "policy": path.read_bytes(),
                    # a member its guard stopped keeps the weights it stopped with, and says so
                    "guard_stop": (runs[i] or {}).get("guard_stop"),
                }
            )
    be = pop.members[0].be
    pop.close()
    worker = {"host": socket.gethostname(), "pid": os.getpid(), "backend": be.name, "device": str(be.device)}
    return {"index": job["index"], "results": results, "log": log, "worker": worker, "wall_s": time.perf_counter() - t0}
