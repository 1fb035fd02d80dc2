"""Recorded experience: a run's transitions in a file, and training from one without collecting.

``cudarl-train train --record FILE`` (``run.record``) writes, when the run ends, the transitions its
replay buffer holds (the last ``replay.capacity`` rows, oldest first), collected by the run's own
epsilon-greedy policy: the behaviour policy. ``cudarl-train train --offline FILE`` (``run.offline``)
fills the replay buffer from such a file and trains without collecting a transition (offline RL;
``agent.cql_alpha`` adds the conservative penalty). Evaluation is unchanged.

The file is a safetensors file (:mod:`cudarl.tensorfile`: no pickle; any safetensors reader opens it),
format ``cudarl-experience``, version 1. ``S`` collection steps of ``M`` rows each (row ``g * N + i``
is row group ``g`` of environment ``i``, as :meth:`cudarl.TradingEnv.record` writes them). A state is
the replay's row (:mod:`cudarl.reference.window`): ``[bar, mirror, position, hold]``, the bar index
into the run's features and the position features; the network's window of bars is gathered from
the features when sampled, so an offline run may read another ``net.window`` than the recording run:

==================== ======================= ========================================================
tensor               dtype, shape            meaning
==================== ======================= ========================================================
``state``            float32 ``[S, M, 4]``   the state ``s_t`` the action was taken in
``action``           int32 ``[S, M]``        the action taken, in ``[0, n_actions)``
``reward``           float32 ``[S, M]``      ``r_t`` (the env's cost model)
``done``             uint8 ``[S, M]``        1 where the episode ended after this step, else 0
``next_state``       float32 ``[S, M, 4]``   ``s_{t+1}`` of each row: only when the rows carry their own
                                             next state (``env.counterfactual``: replay.n_step must be 1)
``normaliser/mean``  float64 ``[F]``         the feature normaliser of the recording run
``normaliser/std``   float64 ``[F]``
==================== ======================= ========================================================

Metadata (strings; JSON where marked): ``format``, ``version``, ``features`` (JSON: the feature
names), ``levels`` (JSON: the position of each action), ``gamma`` (the behaviour run's; offline runs
discount with their own ``agent.gamma`` and ``done``), ``step`` (learner updates of the behaviour run),
``config`` (JSON), ``data`` (JSON: a fingerprint of the bars, :func:`cudarl.policy.data_fingerprint`),
``versions`` (JSON).

A file that is not one, of a newer version, or with a field of the wrong dtype, shape or values is
refused naming the file and the field; one recorded on other bars, or with other features, normaliser
or actions than the offline run's, is refused saying which (its bar indices would name other bars).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import backend as _backend
from . import tensorfile

FORMAT = "cudarl-experience"
VERSION = 1


class ExperienceError(ValueError):
    """A recorded-experience file cannot be read or does not fit this run (names the file and field)."""


@dataclass
class Experience:
    """A recording on the host: the tensors of the module docstring and its metadata (decoded)."""

    state: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    next_state: np.ndarray | None
    mean: np.ndarray
    std: np.ndarray
    meta: dict

    @property
    def steps(self) -> int:
        return int(self.state.shape[0])

    @property
    def rows_per_step(self) -> int:
        return int(self.state.shape[1])


def record(trainer, path) -> Path:
    """Write the transitions ``trainer``'s replay holds (complete collection steps, oldest first) to
    ``path`` (atomically); returns the path."""
    cfg = trainer.cfg
    if cfg.agent.gamma == 0:
        raise ExperienceError(f"{path}: agent.gamma = 0 stores no episode ends in the replay; record with gamma > 0")
    trainer.synchronize()
    rb = trainer.replay
    C, M = rb.capacity, rb.spec.n_envs
    added = rb.added()
    first = -(-(added - min(added, C)) // M)  # the first collection step whose rows are all held
    steps = np.arange(first, added // M)
    if steps.size == 0:
        raise ExperienceError(f"{path}: the replay holds no complete collection step to record")
    slots = (steps[:, None] * M + np.arange(M)[None, :]) % C  # [S, M]
    host = {k: _backend.to_numpy(getattr(rb.bufs, k)) for k in ("obs", "action", "reward", "discount")}
    tensors = {
        "state": host["obs"][slots],
        "action": host["action"][slots],
        "reward": host["reward"][slots],
        "done": (host["discount"][slots] == 0).astype(np.uint8),
        "normaliser/mean": np.asarray(trainer.data.normaliser.mean, np.float64),
        "normaliser/std": np.asarray(trainer.data.normaliser.std, np.float64),
    }
    if rb.store_next_obs:
        tensors["next_state"] = _backend.to_numpy(rb.bufs.next_obs)[slots]
    from .policy import data_fingerprint
    from .trainer import versions

    meta = {
        "format": FORMAT,
        "version": str(VERSION),
        "features": json.dumps(list(trainer.data.names)),
        "levels": json.dumps([float(x) for x in cfg.env.position_levels()]),
        "gamma": repr(float(cfg.agent.gamma)),
        "step": str(int(trainer.step)),
        "config": json.dumps(cfg.to_dict()),
        "data": json.dumps(data_fingerprint(trainer.data.bars)),
        "versions": json.dumps(versions()),
    }
    return tensorfile.save(path, tensors, meta)


def read(path) -> Experience:
    """Read and validate a recording (module docstring); raises :class:`ExperienceError` naming the field."""
    path = Path(path)
    try:
        tensors, meta = tensorfile.load(path, mmap=False)
    except tensorfile.TensorFileError as exc:
        raise ExperienceError(f"{exc} (expected a cudarl experience file, cudarl-train train --record)") from None
    if meta.get("format") != FORMAT:
        raise ExperienceError(f"{path}: not a cudarl experience file (format {meta.get('format')!r}, want {FORMAT!r})")
    try:
        version = int(meta.get("version", ""))
    except ValueError:
        raise ExperienceError(f"{path}: field 'version': {meta.get('version')!r} is not an integer") from None
    if version > VERSION:
        raise ExperienceError(f"{path}: experience version {version} is newer than this cudarl reads ({VERSION})")

    def field(name: str, dtype, ndim: int, required: bool = True):
        if name not in tensors:
            if required:
                raise ExperienceError(f"{path}: field {name!r} is missing")
            return None
        a = tensors[name]
        if a.dtype != np.dtype(dtype) or a.ndim != ndim:
            raise ExperienceError(
                f"{path}: field {name!r} is {a.dtype} {list(a.shape)}, expected {np.dtype(dtype)} of {ndim} dimensions"
            )
        return a

    from .reference.window import STATE_DIM

    state = field("state", np.float32, 3)
    S, M, D = state.shape
    if S < 1 or M < 1 or D != STATE_DIM:
        raise ExperienceError(
            f"{path}: field 'state' has shape {list(state.shape)}, expected [steps, rows, {STATE_DIM}]"
        )
    arrays = {"state": state}
    for name, dt in (("action", np.int32), ("reward", np.float32), ("done", np.uint8)):
        arrays[name] = field(name, dt, 2)
        if arrays[name].shape != (S, M):
            raise ExperienceError(f"{path}: field {name!r} has shape {list(arrays[name].shape)}, expected {[S, M]}")
    next_state = field("next_state", np.float32, 3, required=False)
    if next_state is not None and next_state.shape != state.shape:
        raise ExperienceError(f"{path}: field 'next_state' has shape {list(next_state.shape)}, expected {[S, M, D]}")
    mean, std = field("normaliser/mean", np.float64, 1), field("normaliser/std", np.float64, 1)
    try:
        m = {k: json.loads(meta[k]) for k in ("features", "levels", "config", "data")}
        m["gamma"], m["step"] = float(meta["gamma"]), int(meta["step"])
    except KeyError as exc:
        raise ExperienceError(f"{path}: metadata field {exc.args[0]!r} is missing") from None
    except ValueError as exc:
        raise ExperienceError(f"{path}: a metadata field does not parse ({exc})") from None
    n_features, n_actions = len(m["features"]), len(m["levels"])
    if mean.shape != (n_features,) or std.shape != (n_features,):
        raise ExperienceError(
            f"{path}: field 'normaliser/mean' has {mean.shape[0]} values; the metadata names {n_features} features"
        )
    for name, a in (("state", state), ("reward", arrays["reward"]), ("next_state", next_state)):
        if a is not None and not np.isfinite(a).all():
            at = [int(i) for i in np.argwhere(~np.isfinite(a))[0]]
            raise ExperienceError(f"{path}: field {name!r} has a value that is not finite at {at}")
    for name, a in (("state", state), ("next_state", next_state)):
        if a is not None and ((a[..., 0] < 0) | (a[..., 0] != np.floor(a[..., 0]))).any():
            raise ExperienceError(f"{path}: field {name!r} has a bar index (column 0) that is not a whole number >= 0")
    bad = (arrays["action"] < 0) | (arrays["action"] >= n_actions)
    if bad.any():
        at = [int(i) for i in np.argwhere(bad)[0]]
        value = int(arrays["action"][tuple(at)])
        raise ExperienceError(f"{path}: field 'action' has {value} at {at}, outside [0, {n_actions})")
    if (arrays["done"] > 1).any():
        raise ExperienceError(f"{path}: field 'done' holds values other than 0 and 1")
    return Experience(state, arrays["action"], arrays["reward"], arrays["done"], next_state, mean, std, m)


def check_fits(exp: Experience, path, data, levels, n_step: int) -> None:
    """Refuse a recording an offline run cannot learn from: other bars (its states index them), features,
    normaliser or actions (``data``: the run's :class:`cudarl.prepare.Prepared`), or rows with their own
    next state and ``replay.n_step`` > 1."""
    from .policy import data_fingerprint

    mine, theirs = data_fingerprint(data.bars), exp.meta["data"] or {}
    if theirs.get("close_sha256") != mine["close_sha256"]:
        raise ExperienceError(
            f"{path}: recorded on other bars ({theirs.get('source')}, {theirs.get('bars')} bars; this run: "
            f"{mine['source']}, {mine['bars']} bars): its states index the recording's bars"
        )
    if list(exp.meta["features"]) != list(data.names):
        raise ExperienceError(
            f"{path}: recorded with features {exp.meta['features']}; this run computes {list(data.names)} "
            "(use the recording run's features section)"
        )
    if not (np.array_equal(exp.mean, data.normaliser.mean) and np.array_equal(exp.std, data.normaliser.std)):
        raise ExperienceError(
            f"{path}: field 'normaliser/mean' or 'normaliser/std' differs from this run's: the features were "
            "normalised with statistics of other splits (record and train with the same data section)"
        )
    if not np.array_equal(np.float32(exp.meta["levels"]), np.asarray(levels, np.float32)):
        raise ExperienceError(
            f"{path}: recorded with positions {exp.meta['levels']}, this run's env has {list(levels)}"
        )
    if exp.next_state is not None and n_step != 1:
        raise ExperienceError(
            f"{path}: its rows carry their own next state (recorded with env.counterfactual); set replay.n_step = 1"
        )


def load_into(exp: Experience, replay, gamma: float) -> int:
    """Insert the recording into ``replay`` (built with ``n_envs = exp.rows_per_step``), oldest first, with
    ``discount = gamma (1 - done)``: only the steps the buffer can hold. Returns the rows inserted."""
    M = exp.rows_per_step
    keep = min(exp.steps, replay.capacity // M)
    g = np.float32(gamma)
    for s in range(exp.steps - keep, exp.steps):
        disc = (g * (np.float32(1) - exp.done[s].astype(np.float32))).astype(np.float32)
        kw = {} if exp.next_state is None else {"next_obs": np.ascontiguousarray(exp.next_state[s])}
        replay.add(np.ascontiguousarray(exp.state[s]), exp.action[s], exp.reward[s], disc, **kw)
    return keep * M
