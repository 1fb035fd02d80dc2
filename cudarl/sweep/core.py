"""The sweep's driver: trials from a spec, packed into populations, run, recorded, resumed.

A trial is one configuration, one seed, one fold. Its key is a digest of its resolved config and its
splits, so a re-run of the sweep knows it. The driver packs trials into populations (members that
:func:`cudarl.population.can_share` and the same fold; at most as many as fit the device's free
memory by :func:`cudarl.population.memory_per_member`, or ``population`` of the spec; 4 on the CPU),
hands each to an executor (this process, or Ray actors: :mod:`cudarl.sweep.cluster`), and records
each finished trial at once: its policy file, then its ledger entry ``trials/<key>.json`` (the entry
is the commit; both written atomically). A sweep run again on its directory skips the trials in the
ledger.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_open, remove_stale_temporaries
from ..config import Config, resolve_for_backend
from .spec import SpecError, SweepSpec

MARKER = ".cudarl-sweep"
#: Members of a population on the CPU when the spec does not say.
CPU_POPULATION = 4
#: Share of the device's free memory a population may take.
MEMORY_SHARE = 0.8


class SweepError(RuntimeError):
    """A sweep cannot start or go on (its directory, its executor)."""


@dataclass
class Trial:
    key: str
    config_id: int
    params: dict
    seed: int
    fold: int | None
    config: Config
    splits: object  # cudarl.splits.Splits, or None for the config's chronological split

    def job_entry(self) -> dict:
        return {"key": self.key, "config": self.config.to_dict()}


def trial_key(cfg: Config, splits) -> str:
    blob = json.dumps({"config": cfg.to_dict(), "splits": None if splits is None else splits.as_dict()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_trials(spec: SweepSpec, configurations: list[dict], gpu: bool, bars, first_id: int = 0) -> list[Trial]:
    """Every (configuration, fold, seed) of ``configurations`` as a :class:`Trial`, resolved for the
    backend the trials run on (``gpu``); ``bars`` gives the walk-forward folds their length."""
    from ..splits import walk_forward
    from ..walkforward import fold_config

    out = []
    for ci, params in enumerate(configurations, start=first_id):
        for seed in spec.seeds:
            cfg, explicit = spec.trial_config(params, seed)
            explicit.setdefault("run", {})["device"] = "gpu" if gpu else "cpu"
            cfg = resolve_for_backend(cfg.with_overrides({"run": {"device": "gpu" if gpu else "cpu"}}), gpu, explicit)
            if not spec.folds:
                out.append(Trial(trial_key(cfg, None), ci, params, seed, None, cfg, None))
                continue
            try:
                parts = walk_forward(len(bars), folds=spec.folds, warmup=cfg.features.warmup)
            except ValueError as e:
                raise SpecError(f"{spec.path}: folds = {spec.folds}: {e}") from None
            for fi, sp in enumerate(parts):
                fcfg, _ = fold_config(cfg, sp)
                out.append(Trial(trial_key(fcfg, sp), ci, params, seed, fi, fcfg, sp))
    return out


def population_capacity(cfg: Config, gpu: bool, spec_cap: int, free_bytes: int | None, bars=None, splits=None) -> int:
    """Most members of a population of ``cfg``: the spec's ``population`` when set, else on the GPU as
    many as :data:`MEMORY_SHARE` of ``free_bytes`` holds, on the CPU :data:`CPU_POPULATION`."""
    from ..population import memory_per_member

    if not gpu:
        return spec_cap or CPU_POPULATION
    fit = max(1, int(MEMORY_SHARE * (free_bytes or 0)) // memory_per_member(cfg, bars=bars, splits=splits))
    return min(fit, spec_cap) if spec_cap else fit


def pack(trials: list[Trial], capacity, slots: int = 1) -> list[list[Trial]]:
    """Trials in populations: same fold, members that can share, at most ``capacity(trial)`` each;
    in the trials' order. With ``slots`` workers (Ray actors), a group's populations are made a
    multiple of ``slots`` in number, of even size, so no worker is left alone with the last one."""
    from ..population import can_share

    groups: list[list[Trial]] = []
    for t in trials:
        for g in groups:
            if g[0].fold == t.fold and can_share(g[0].config, t.config):
                g.append(t)
                break
        else:
            groups.append([t])
    out = []
    for g in groups:
        cap = capacity(g[0])
        n = -(-len(g) // cap)  # populations at full size
        n = min(len(g), -(-n // slots) * slots)  # rounded up to a multiple of the workers
        q, r = divmod(len(g), n)  # n populations of q or q + 1 members
        starts = [i * q + min(i, r) for i in range(n + 1)]
        out += [g[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    return out


class SweepDir:
    """A sweep directory: the marker, the spec it runs, a lock held while a sweep runs in it, the
    ledger ``trials/`` and the policies ``policies/``. Created exclusively; taken again only by the same spec."""

    def __init__(self, path: Path, spec: SweepSpec, echo=print):
        self.path = Path(path)
        self.echo = echo
        fresh = self._claim(spec)
        self._lock = open(self.path / ".lock", "a")  # noqa: SIM115 (held for the sweep's life)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"{self.path}: another sweep is running in this directory") from None
        (self.path / "trials").mkdir(exist_ok=True)
        (self.path / "policies").mkdir(exist_ok=True)
        removed = sum(len(remove_stale_temporaries(self.path / d)) for d in ("", "trials", "policies"))
        if removed:
            echo(f"removed {removed} temporary file(s) left by an interrupted write in {self.path}")
        if fresh:
            with atomic_open(self.path / "spec.toml") as f:
                f.write(spec.text)

    def _claim(self, spec: SweepSpec) -> bool:
        d = self.path
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            d.mkdir()
        except FileExistsError:
            if (d / MARKER).is_file():
                mine = json.loads((d / MARKER).read_text()).get("spec_sha256")
                if mine != spec.digest:
                    raise SweepError(
                        f"{d} holds a sweep of another spec (spec.toml there differs from {spec.path}); "
                        "pass --out for a new sweep directory"
                    ) from None
                return False
            if not d.is_dir() or any(d.iterdir()):
                raise SweepError(f"{d} exists and is not a cudarl sweep directory; pass --out for a new one") from None
        fd = os.open(d / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as f:
            json.dump({"spec_sha256": spec.digest, "created": time.time(), "pid": os.getpid()}, f)
        return True

    def close(self) -> None:
        self._lock.close()

    def ledger(self) -> dict[str, dict]:
        """Finished trials, by key."""
        out = {}
        for p in sorted((self.path / "trials").glob("*.json")):
            rec = json.loads(p.read_text())
            out[rec["key"]] = rec
        return out

    def record(self, trial: Trial, result: dict, population: dict) -> dict:
        """Write one finished trial: its policy file, then its ledger entry (the commit)."""
        with atomic_open(self.path / "policies" / f"{trial.key}.safetensors", "wb") as f:
            f.write(result["policy"])
        rec = {
            "key": trial.key,
            "config_id": trial.config_id,
            "params": trial.params,
            "seed": trial.seed,
            "fold": trial.fold,
            "splits": None if trial.splits is None else trial.splits.as_dict(),
            **{k: result[k] for k in ("val", "test", "step", "periods_per_year", "weights_sha256", "guard_stop")},
            "policy": f"policies/{trial.key}.safetensors",
            "population": population["index"],
            "worker": population["worker"],
            "finished": time.time(),
        }
        with atomic_open(self.path / "trials" / f"{trial.key}.json") as f:
            json.dump(rec, f, indent=1, allow_nan=False)
        return rec

    def append_log(self, lines: list[str]) -> None:
        with open(self.path / "populations.log", "a") as f:
            f.writelines(x + "\n" for x in lines)


def free_device_memory() -> int | None:
    """Free bytes of this process's GPU (None without CuPy or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:
        return None


def check_stop(stop) -> None:
    """Raise :class:`cudarl.interrupt.Interrupted` once ``stop`` is set (finished trials are in the ledger)."""
    if stop:
        from ..interrupt import Interrupted

        raise Interrupted(stop.signum, f"sweep stopped by {stop.name}; finished trials are kept")


class LocalExecutor:
    """Populations one after another in this process."""

    gpu_free: int | None = None
    slots = 1  # populations at a time

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.gpu_free = free_device_memory() if gpu else None
        self.retried: list[dict] = []

    def describe(self) -> str:
        """Where populations run, in words."""
        return "this process (GPU)" if self.gpu else "this process (NumPy backend)"

    def run(self, jobs: list[dict], bars, done, echo, stop=()) -> None:
        """Run each job, calling ``done(result)`` as each ends; stop before the next one once ``stop``
        (:class:`cudarl.interrupt.StopFlag`) is set (a signal during training stops that trainer itself)."""
        from .work import run_population

        for job in jobs:
            check_stop(stop)
            echo(f"population {job['index']}: {len(job['trials'])} member(s) ...")
            done(run_population(job, bars))

    def close(self) -> None:
        """Nothing to release."""
