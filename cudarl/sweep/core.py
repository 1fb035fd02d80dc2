"""The sweep's driver: trials from a spec, packed into populations, run, recorded, resumed.

A trial is one configuration, one seed, one fold. Its key is a digest of its resolved config and its
splits, so a re-run of the sweep knows it. The driver packs trials into populations (members that
:func:`cudarl.population.can_share` and the same fold; at most as many as fit the device's free
memory by :func:`cudarl.population.memory_per_member`, or ``population`` of the spec; 4 on the CPU),
hands each to an executor (this process, or Ray actors: :mod:`cudarl.sweep.cluster`), and records
each finished trial at once: its policy file, then its ledger entry ``trials/<key>.json`` (the entry
is the commit; both written atomically). A sweep run again on its directory skips the trials in the
ledger.

Populations run in this process write a run directory per member, ``runs/<key>/``, with its resume
checkpoint ``checkpoints/latest.npz`` when the spec's ``checkpoint`` says (by default after each
validation evaluation, and when SIGTERM or SIGINT stops the sweep; ``end``; ``never``); it is removed
once the trial is in the ledger. A re-run packs all the spec's trials
as before (so a population keeps its members and its index) and continues a cut population from its
members' checkpoints (:func:`resume_plan`, :meth:`cudarl.population.Population.resume`, bit for bit)
when every member has one at the same update of its trial's config; otherwise it starts that
population over and says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import rundir
from ..atomic import atomic_open, remove_stale_temporaries
from ..config import Config, from_dict, resolve_for_backend
from .spec import SpecError, SweepSpec

MARKER = ".cudarl-sweep"
#: The members' run directories in a sweep directory: ``runs/<key>/``.
RUNS = "runs"
#: A member's resume checkpoint in its run directory.
LATEST = Path("checkpoints") / "latest.npz"
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
    ledger ``trials/``, the policies ``policies/`` and the run directories of unfinished trials ``runs/``.
    Created exclusively; taken again only by the same spec."""

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

    def run_dir(self, key: str) -> Path:
        """Where trial ``key``'s member writes its run directory: ``runs/<key>``."""
        return self.path / RUNS / key

    def remove_runs(self, keys) -> None:
        """Remove the run directories of trials ``keys`` (those cudarl made, or empty folders)."""
        for k in keys:
            d = self.run_dir(k)
            if d.is_dir() and (rundir.is_run_dir(d) or not any(d.iterdir())):
                shutil.rmtree(d)
        runs = self.path / RUNS
        if runs.is_dir() and not any(runs.iterdir()):
            runs.rmdir()

    def append_log(self, lines: list[str]) -> None:
        with open(self.path / "populations.log", "a") as f:
            f.writelines(x + "\n" for x in lines)


def resume_plan(sd: SweepDir, index: int, trials: list[Trial], checkpoints: bool = True):
    """``(paths, line)``: how population ``index`` of ``trials`` starts in sweep directory ``sd``.

    ``paths``: its members' resume checkpoints (``runs/<key>/checkpoints/latest.npz``, in member order)
    when every member has one, all at one update, each of its trial's config (``run.grid_barrier`` aside:
    a population of several members turns it off, the same bits); then ``line`` says it resumes.
    Otherwise ``paths`` is None and the population starts from update 0 in fresh run directories (the
    old ones are removed); ``line`` says why when a member had left a run directory (the population was
    cut), else it is None. ``checkpoints``: False where populations keep none (Ray actors); members of
    trials whose ``run.resume_checkpoint`` is ``never`` (the spec's ``checkpoint``) keep none either."""
    dirs = [sd.run_dir(t.key) for t in trials]
    if not any(d.exists() for d in dirs):
        return None, None
    paths = [d / LATEST for d in dirs]
    when = trials[0].config.run.resume_checkpoint  # the spec's checkpoint, every trial's
    if not checkpoints:
        step, why = None, "populations on Ray actors keep no checkpoints"
    elif when == "never":
        step, why = None, 'its members write no checkpoints (the spec\'s checkpoint = "never")'
    else:
        step, why = _common_update(paths, trials)
        if why is not None and when == "end" and not any(p.is_file() for p in paths):
            why += ' (the spec\'s checkpoint = "end": only a Ctrl-C or SIGTERM of the sweep writes one mid-run)'
    if why is None:
        return paths, f"resuming population {index} from update {step} (its members' checkpoints in {sd.path / RUNS})"
    sd.remove_runs(t.key for t in trials)
    return None, f"restarting population {index} from update 0: {why}"


def _common_update(paths: list[Path], trials: list[Trial]) -> tuple[int | None, str | None]:
    """``(update, None)``: every checkpoint of ``paths`` is of its trial's config and at ``update``; else
    ``(None, why not)``."""
    from ..checkpoint import CheckpointError
    from ..checkpoint import load as load_checkpoint

    missing = [str(i) for i, p in enumerate(paths) if not p.is_file()]
    if missing:
        return None, f"member(s) {', '.join(missing)} of {len(paths)} wrote no checkpoint before the sweep stopped"
    steps = []
    for i, (p, t) in enumerate(zip(paths, trials, strict=True)):
        try:
            info = load_checkpoint(p, only=("trainer/",))[1]  # the header: config and update
        except CheckpointError as e:
            return None, f"member {i}'s checkpoint cannot be read ({e})"
        diff = _config_differences(from_dict(info["config"]), t.config)
        if diff:
            return None, f"member {i}'s checkpoint {p} is of another config than its trial's ({', '.join(diff)})"
        steps.append(int(info["step"]))
    if len(set(steps)) > 1:
        return None, f"its members' checkpoints are at different updates {steps}"
    return steps[0], None


def _config_differences(a: Config, b: Config) -> list[str]:
    """The ``section.field`` names where ``a`` and ``b`` differ, ``run.grid_barrier`` aside."""
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d["run"].pop("grid_barrier", None)
    return [f"{s}.{k}" for s in sorted(set(da) | set(db)) for k in sorted(set(da.get(s, {})) | set(db.get(s, {})))
            if da.get(s, {}).get(k) != db.get(s, {}).get(k)]  # fmt: skip


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
    checkpoints = True  # members write run directories in the sweep's runs/; a cut population resumes

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
            done(run_population(job, bars, echo))

    def close(self) -> None:
        """Nothing to release."""
