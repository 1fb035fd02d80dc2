"""A sweep's specification (``SPEC.toml``): the base config, the fields to vary, seeds and folds.

::

    name = "lr-gamma"                  # the sweep directory <out>/<name> (default: the file's stem)
    config = "base.toml"               # optional config file, relative to this file
    data = "builtin:regime?n=3000"     # optional data.source
    seeds = [0, 1, 2]                  # or a count: 3 means 0, 1, 2 (default [0])
    folds = 0                          # walk-forward folds (0: the config's chronological split)
    population = 0                     # most members a population (0: as many as fit; 4 on the CPU)
    checkpoint = "eval"                # when members write resume checkpoints: eval, end or never
    out = "sweeps"                     # parent folder of the sweep directory

    [set]                              # fields every trial gets
    "run.steps" = 2000

    [grid]                             # every combination ...
    "optim.lr" = [1e-4, 3e-4]
    "agent.gamma" = [0.9, 0.99]

    [random]                           # ... or n draws (seeded); the search space of --optuna
    n = 8
    seed = 0
    "optim.lr" = { log_uniform = [1e-5, 1e-3] }
    "agent.gamma" = { uniform = [0.9, 0.999] }
    "replay.n_step" = { int = [1, 5] }
    "net.hidden" = { choice = [[64, 64], [128, 128]] }

Keys are ``SECTION.FIELD`` of :mod:`cudarl.config` (quoted, or as TOML dotted keys). Every error
names the file and the key.

``checkpoint`` is every trial's ``run.resume_checkpoint``: when a member writes its resume checkpoint
``runs/<key>/checkpoints/latest.npz`` (the whole replay buffer: tens of MiB a member at the default
capacity). ``eval``: after each validation evaluation, at the end and when the sweep is stopped (a
``kill -9`` loses only the updates since the last evaluation); ``end``: at the end and when the sweep is
stopped (Ctrl-C, SIGTERM: a ``kill -9`` restarts the population); ``never``: a cut population restarts
from update 0.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import RESUME_CHECKPOINTS, SECTIONS, Config, ConfigError, from_dict, load_toml

TOP = ("name", "config", "data", "seeds", "folds", "population", "checkpoint", "out", "set", "grid", "random")
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
#: Fields a sweep sets itself (seeds come from ``seeds``, resume checkpoints from ``checkpoint``; trials'
#: run directories are the sweep's ``runs/<key>``).
RESERVED = ("run.seed", "run.name", "run.out_dir", "run.record", "run.offline", "run.resume_checkpoint")
#: The top-level key that sets a reserved field, where one does.
SET_BY = {"run.seed": "seeds", "run.resume_checkpoint": "checkpoint"}
#: ... and fields that must be the same for every trial (the backend they run on).
NOT_VARIED = (*RESERVED, "run.device")


class SpecError(ValueError):
    """A sweep specification is malformed; the message names the file and key."""


@dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep specification."""

    path: Path
    name: str
    text: str  # the file as read (stored in the sweep directory; a re-run must match it)
    explicit: dict  # {section: {field: value}} the user set (config file, data, [set])
    base: Config  # defaults, then the config file, then data and [set]; not yet resolved for a backend
    seeds: tuple
    folds: int
    population: int
    out: Path
    checkpoint: str = "eval"  # every trial's run.resume_checkpoint
    grid: dict = field(default_factory=dict)  # {"sec.field": [values]}
    random: dict = field(default_factory=dict)  # {"sec.field": (kind, args)}
    random_n: int = 0
    random_seed: int = 0

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def configurations(self) -> list[dict]:
        """The configurations to try, in order: each a ``{"sec.field": value}`` of the varied fields
        (``[{}]``: the base alone)."""
        if self.grid:
            keys = list(self.grid)
            return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*self.grid.values())]
        if self.random:
            rng = np.random.default_rng([self.random_seed, 0x5EE9])
            return [{k: draw(rng, *d) for k, d in self.random.items()} for _ in range(self.random_n)]
        return [{}]

    def trial_config(self, params: dict, seed: int) -> tuple[Config, dict]:
        """``(config, explicit)`` of one trial (not yet resolved for a backend)."""
        explicit = {s: dict(v) for s, v in self.explicit.items()}
        sets = {"run.seed": seed, "run.name": self.name, "run.resume_checkpoint": self.checkpoint}
        for key, v in {**params, **sets}.items():
            sec, f = key.split(".")
            explicit.setdefault(sec, {})[f] = v
        try:
            return from_dict(explicit), explicit
        except ConfigError as e:
            raise SpecError(
                f"{self.path}: the trial {json.dumps(params)} (seed {seed}) is not a valid config: {e}"
            ) from None


def draw(rng, kind: str, args):
    """One value of a ``[random]`` distribution."""
    if kind == "uniform":
        return float(rng.uniform(args[0], args[1]))
    if kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
    if kind == "int":
        return int(rng.integers(args[0], args[1] + 1))
    return args[int(rng.integers(len(args)))]


def _flat(table: dict, where: str, path: Path, leaf_dicts: bool = False, reserved=NOT_VARIED) -> dict:
    """``{"sec.field": value}`` from a table of quoted ``"sec.field"`` keys or dotted (nested) ones."""
    out = {}
    for k, v in table.items():
        if "." in k:
            out[k] = v
        elif isinstance(v, dict) and not (leaf_dicts and set(v) <= set(DISTRIBUTIONS)):
            for f, vv in v.items():
                out[f"{k}.{f}"] = vv
        else:
            raise SpecError(f'{path}: {where}.{k}: expected SECTION.FIELD (e.g. "optim.lr"), got {k!r}')
    for k in out:
        sec, _, f = k.partition(".")
        if sec not in SECTIONS:
            raise SpecError(f'{path}: {where}."{k}": no section [{sec}]; sections are {sorted(SECTIONS)}')
        names = [x.name for x in SECTIONS[sec].__dataclass_fields__.values()]
        if f not in names:
            raise SpecError(f'{path}: {where}."{k}": [{sec}] has no field {f!r}; fields are {sorted(names)}')
        if k in reserved:
            why = "the sweep sets it itself" + (f" (the top-level `{SET_BY[k]}`)" if k in SET_BY else "")
            if k not in RESERVED:
                why = "every trial runs on one backend (set it in [set])"
            raise SpecError(f'{path}: {where}."{k}": {why}')
    return out


def _check_value(base: Config, key: str, value, where: str, path: Path) -> None:
    sec, f = key.split(".")
    try:
        from_dict({sec: {f: value}}, base=base)
    except ConfigError as e:
        raise SpecError(f'{path}: {where}."{key}" = {json.dumps(value)}: {e}') from None


def _int(d: dict, key: str, default: int, lo: int, path: Path, where: str = "") -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise SpecError(f"{path}: {where}{key}: expected an integer >= {lo}, got {v!r}")
    return v


def load_spec(path) -> SweepSpec:
    """Read and validate ``SPEC.toml``; raises :class:`SpecError` naming the file and key."""
    path = Path(path)
    try:
        raw = load_toml(path)
    except ConfigError as e:
        raise SpecError(str(e)) from None
    text = path.read_text()
    unknown = sorted(set(raw) - set(TOP))
    if unknown:
        raise SpecError(f"{path}: unknown key(s) {unknown}; a sweep spec has {list(TOP)}")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name or "/" in name:
        raise SpecError(f"{path}: name: expected a non-empty string without '/', got {name!r}")
    explicit: dict = {}
    if "config" in raw:
        if not isinstance(raw["config"], str):
            raise SpecError(f"{path}: config: expected a file name, got {raw['config']!r}")
        cfile = (path.parent / raw["config"]).resolve()
        try:
            tables = load_toml(cfile)
        except ConfigError as e:
            raise SpecError(f"{path}: config: {e}") from None
        for sec, vals in tables.items():
            if not isinstance(vals, dict):
                raise SpecError(f"{path}: config: {cfile}: [{sec}] must be a table of fields")
            explicit.setdefault(sec, {}).update(vals)
    if "data" in raw:
        if not isinstance(raw["data"], str):
            raise SpecError(f"{path}: data: expected a path or builtin:<name>, got {raw['data']!r}")
        explicit.setdefault("data", {})["source"] = raw["data"]
    sets = raw.get("set", {})
    if not isinstance(sets, dict):
        raise SpecError(f"{path}: set: expected a table of SECTION.FIELD = value")
    for key, v in _flat(sets, "set", path, reserved=RESERVED).items():
        sec, f = key.split(".")
        explicit.setdefault(sec, {})[f] = v
    try:
        base = from_dict(explicit)
    except ConfigError as e:
        raise SpecError(f"{path}: the base config (config, data, [set]): {e}") from None
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
        seeds = list(range(seeds))
    if (
        not isinstance(seeds, list)
        or not seeds
        or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise SpecError(f"{path}: seeds: expected a count >= 1 or a list of distinct integers >= 0, got {seeds!r}")
    folds = _int(raw, "folds", 0, 0, path)
    population = _int(raw, "population", 0, 0, path)
    checkpoint = raw.get("checkpoint", "eval")
    if checkpoint not in RESUME_CHECKPOINTS:
        choices = ", ".join(json.dumps(c) for c in RESUME_CHECKPOINTS)
        raise SpecError(f"{path}: checkpoint: expected one of {choices}, got {checkpoint!r}")
    out = raw.get("out", "sweeps")
    if not isinstance(out, str) or not out:
        raise SpecError(f"{path}: out: expected a folder name, got {out!r}")
    grid, random, n, rseed = {}, {}, 0, 0
    if "grid" in raw and "random" in raw:
        raise SpecError(f"{path}: [grid] and [random]: choose one")
    if "grid" in raw:
        if not isinstance(raw["grid"], dict) or not raw["grid"]:
            raise SpecError(f"{path}: grid: expected a table of SECTION.FIELD = [values]")
        for key, vals in _flat(raw["grid"], "grid", path).items():
            if not isinstance(vals, list) or not vals:
                raise SpecError(f'{path}: grid."{key}": expected a non-empty list of values, got {vals!r}')
            for v in vals:
                _check_value(base, key, v, "grid", path)
            grid[key] = vals
    if "random" in raw:
        table = raw["random"]
        if not isinstance(table, dict):
            raise SpecError(f"{path}: random: expected a table")
        n = _int(table, "n", 0, 1, path, "random.")
        rseed = _int(table, "seed", 0, 0, path, "random.")
        dists = {k: v for k, v in table.items() if k not in ("n", "seed")}
        for key, d in _flat(dists, "random", path, leaf_dicts=True).items():
            random[key] = _distribution(base, key, d, path)
        if not random:
            raise SpecError(
                f'{path}: random: no field to draw (add e.g. "optim.lr" = {{ log_uniform = [1e-5, 1e-3] }})'
            )
    return SweepSpec(
        path=path,
        name=name,
        text=text,
        explicit=explicit,
        base=base,
        seeds=tuple(seeds),
        folds=folds,
        population=population,
        checkpoint=checkpoint,
        out=Path(out),
        grid=grid,
        random=random,
        random_n=n,
        random_seed=rseed,
    )


def _distribution(base: Config, key: str, d, path: Path) -> tuple:
    where = f'random."{key}"'
    if not isinstance(d, dict) or len(d) != 1 or next(iter(d)) not in DISTRIBUTIONS:
        raise SpecError(f"{path}: {where}: expected one of {{ {' | '.join(DISTRIBUTIONS)} = [...] }}, got {d!r}")
    kind, args = next(iter(d.items()))
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise SpecError(f"{path}: {where}.choice: expected a non-empty list of values")
        for v in args:
            _check_value(base, key, v, where + ".choice", path)
        return kind, args
    ok = isinstance(args, list) and len(args) == 2 and all(isinstance(a, (int, float)) for a in args)
    ok = ok and args[0] <= args[1] and (kind != "log_uniform" or args[0] > 0)
    ok = ok and (kind != "int" or all(isinstance(a, int) for a in args))
    if not ok:
        what = "integers" if kind == "int" else "positive numbers" if kind == "log_uniform" else "numbers"
        raise SpecError(f"{path}: {where}.{kind}: expected [low, high] of {what}, low <= high, got {args!r}")
    for v in args:
        _check_value(base, key, v, f"{where}.{kind}", path)
    return kind, args
