"""Run directories for the learning check's jobs: one per job under a run root, named from the job, so a
later call finds the checkpoint an earlier call left and continues from it instead of starting over.

Shared by every tool that runs jobs through ``learning_check.run_jobs`` (``--run-root``; the learning
check, ``tools/sweep.py``, ``tools/mechanism_screen.py``, ``tools/risk_screen.py``):

- :func:`name` is the job's directory name: task, head, seed, variant and a hash of everything that
  makes its config (the overrides, the budget, the device), stable across calls and processes;
- the trainer writes the run there as a normal run (:class:`cudarl.trainer.Trainer`): ``latest.npz``
  after every validation evaluation, ``best.safetensors``, and ``latest.npz`` again when SIGTERM or
  SIGINT stops it (:mod:`cudarl.interrupt`);
- :func:`plan` says, before anything runs, which jobs continue from which update (``resume``), and
  refuses to start over a run directory that exists when ``resume`` is not asked for (its work would
  be lost); :func:`open_trainer` builds the job's trainer, resumed (``Trainer.resume``: exact) or new.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

#: The job fields that make its config; the directory name hashes them.
CONFIG_KEYS = ("task", "head", "seed", "variant", "sets", "quick", "device")
#: A resume checkpoint's path inside a run directory.
LATEST = Path("checkpoints") / "latest.npz"


def name(job: dict) -> str:
    """``<task>-<head>-seed<seed>[-<variant>]-<hash>``: the run directory of ``job`` under a run root.

    The hash (12 hex digits of SHA-256) covers :data:`CONFIG_KEYS`, so two jobs that differ in any
    override get two directories, and the same job gets the same one in every call."""
    key = json.dumps({k: job.get(k) for k in CONFIG_KEYS}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    parts = [job["task"], job["head"], f"seed{job['seed']}"]
    if job.get("variant"):
        parts.append(job["variant"])
    return "-".join(re.sub(r"[^A-Za-z0-9._+=-]+", "_", str(p)).strip("_")[:40] for p in parts) + f"-{digest}"


def checkpoint_step(path) -> int:
    """The update a resume checkpoint was written at (its header only: :func:`cudarl.checkpoint.trainer_step`)."""
    from cudarl.checkpoint import trainer_step

    return trainer_step(path)


def plan(jobs: list[dict], root, resume: bool) -> list[str]:
    """Give every job its ``run_dir`` (and ``resume``) under ``root``; the lines that say what each
    existing directory means: which jobs continue from which update, which start over.

    Without ``resume``, a job whose directory exists is refused (``SystemExit`` naming them), as
    ``cudarl-train`` never reuses a run directory: pass ``--resume`` to continue them, or another
    root."""
    root = Path(root)
    lines, taken = [], []
    for job in jobs:
        d = root / name(job)
        job["run_dir"], job["resume"] = str(d), resume
        if not d.exists():
            continue
        if not resume:
            taken.append(d)
            continue
        latest = d / LATEST
        if latest.is_file():
            lines.append(f"resume: {d.name} from update {checkpoint_step(latest)} ({latest})")
        else:
            lines.append(f"resume: {d.name} has no checkpoint; starting it over")
    if taken:
        shown = ", ".join(str(d) for d in taken[:3]) + (f" and {len(taken) - 3} more" if len(taken) > 3 else "")
        raise SystemExit(
            f"{len(taken)} run director{'y' if len(taken) == 1 else 'ies'} of these jobs exist already ({shown}); "
            "pass --resume to continue them from their checkpoints, or pick another --run-root"
        )
    return lines


def open_trainer(cfg, run_dir, resume: bool, echo):
    """``(trainer, resumed_from)``: the job's trainer in ``run_dir``, continued from its
    ``checkpoints/latest.npz`` when ``resume`` and it has one (``resumed_from``: that update), else new
    (``resumed_from`` None; with ``resume``, a directory cudarl made that holds no checkpoint yet is
    started over: nothing in it can be continued).

    A checkpoint whose config is not ``cfg`` (the code's defaults changed between calls) is refused
    with the fields that differ, not continued under another config."""
    from cudarl import rundir
    from cudarl.trainer import Trainer

    d = Path(run_dir)
    latest = d / LATEST
    if resume and latest.is_file():
        # how this call runs it, not what it computes: run.grid_barrier is off when processes share a GPU
        # (learning_check.run_jobs), the same bits either way, and the calls may differ in workers
        t = Trainer.resume(latest, overrides={"run": {"grid_barrier": cfg.run.grid_barrier}}, echo=echo)
        if t.cfg != cfg:
            mine, theirs = cfg.to_dict(), t.cfg.to_dict()
            diff = [f"{s}.{k}" for s in mine for k in mine[s] if theirs.get(s, {}).get(k) != mine[s][k]]
            raise ValueError(
                f"{latest}: its config differs from this job's in {diff or 'its layout'}; remove {d} to run it anew"
            )
        return t, t.step
    if resume and d.exists() and rundir.is_run_dir(d):
        shutil.rmtree(d)
    return Trainer(cfg, run_dir=d, echo=echo), None
