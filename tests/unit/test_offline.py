"""Offline training: ``--record`` writes the replay's transitions, ``--offline`` trains from them without
collecting; the recording format (cudarl/experience.py) is versioned and a malformed file is refused
naming the file and the field; CQL (agent.cql_alpha) on top, through the trainer."""

import json

import numpy as np
import pytest
from test_trainer import gpu_small, small
from typer.testing import CliRunner

from cudarl import experience, tensorfile
from cudarl.cli import app
from cudarl.config import ConfigError
from cudarl.experience import ExperienceError
from cudarl.trainer import Trainer


def quiet(cfg, **kw):
    return Trainer(cfg, run_dir=False, echo=lambda m: None, **kw)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A behaviour run of 60 updates (epsilon-greedy, its own learner) and the file it recorded."""
    path = tmp_path_factory.mktemp("rec") / "exp.safetensors"
    t = quiet(small(run={"record": str(path)}))
    t.run(60)
    return t, path


def test_the_recording_is_the_replay_oldest_first(recording):
    t, path = recording
    exp = experience.read(path)
    M = t.replay.spec.n_envs
    assert exp.rows_per_step == M and exp.steps == t.collect_steps  # nothing wrapped: every step is held
    np.testing.assert_array_equal(exp.state.reshape(-1, 4), t.replay.bufs.obs[: exp.steps * M])  # state rows
    np.testing.assert_array_equal(exp.action.reshape(-1), t.replay.bufs.action[: exp.steps * M])
    np.testing.assert_array_equal(exp.done.reshape(-1), t.replay.bufs.discount[: exp.steps * M] == 0)
    assert exp.done.any() and exp.meta["gamma"] == t.cfg.agent.gamma and exp.meta["step"] == 60
    assert exp.meta["features"] == list(t.data.names)


@pytest.mark.parametrize("cql", [0.0, 1.0])
def test_offline_training_collects_nothing_and_learns_from_the_recording(recording, cql):
    t, path = recording
    off = quiet(small(run={"offline": str(path)}, agent={"cql_alpha": cql}))
    M = off.replay.spec.n_envs
    np.testing.assert_array_equal(off.replay.bufs.obs[: t.collect_steps * M], t.replay.bufs.obs[: t.collect_steps * M])
    assert off.replay.spec.obs_dim == 4  # state rows: the window is gathered when sampled
    env0 = off.env.state.t.copy()
    p0 = off.agent.online.params.copy()
    off.run(40)
    assert off.collect_steps == 0 and off.replay.added() == t.collect_steps * M
    np.testing.assert_array_equal(off.env.state.t, env0)  # the environments never stepped
    assert not np.array_equal(p0, off.agent.online.params) and np.isfinite(off.losses).all()
    again = quiet(small(run={"offline": str(path)}, agent={"cql_alpha": cql}))
    again.run(40)
    assert again.losses == off.losses  # deterministic
    if cql:
        assert off.monitor.last_stats["cql_loss"] > 0


def test_cql_pushes_down_the_actions_the_data_did_not_take(recording):
    """CQL's observable: the gap logsumexp_a Q - Q(a_data) on the batch shrinks with alpha."""
    _, path = recording
    gaps = {}
    for alpha in (0.0, 5.0):
        t = quiet(small(run={"offline": str(path), "log_every": 10}, agent={"cql_alpha": alpha}))
        t.run(80)
        q = t.agent.buffers.q_s
        a = t.batch.action
        m = q.max(1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(q - m).sum(1))).astype(np.float64)
        gaps[alpha] = float(np.mean(lse - q[np.arange(q.shape[0]), a]))
    assert gaps[5.0] < gaps[0.0], gaps


def test_the_cli_records_and_trains_offline(tmp_path):
    runner = CliRunner()
    rec = tmp_path / "behaviour.safetensors"
    common = ["--device", "cpu", "--out", str(tmp_path / "runs"), "--set", "run.eval_every=0"]
    common += ["--set", "env.n_envs=4", "--set", "agent.learning_starts=100", "--set", "agent.batch_size=32"]
    r = runner.invoke(app, ["train", "builtin:regime?n=1500", "--steps", "40", "--record", str(rec), *common])
    assert r.exit_code == 0, r.output
    assert rec.is_file() and "--offline" in r.output
    r = runner.invoke(app, ["train", "builtin:regime?n=1500", "--steps", "40", "--offline", str(rec), *common])
    assert r.exit_code == 0, r.output
    assert "recorded transitions" in r.output
    r = runner.invoke(app, ["train", "builtin:sp500", "--steps", "40", "--offline", str(rec), *common])
    assert r.exit_code == 1 and "recorded on other bars" in r.output and "Traceback" not in r.output


# --- the format, refused cleanly -------------------------------------------------------------------
def _rewrite(src, dst, tensors=None, meta=None, drop=()):
    t, m = tensorfile.load(src, mmap=False)
    t = {k: np.array(v) for k, v in t.items() if k not in drop}
    t.update(tensors or {})
    m = {**m, **(meta or {})}
    tensorfile.save(dst, t, m)
    return dst


def test_a_malformed_recording_is_refused_naming_the_file_and_the_field(recording, tmp_path):
    _, path = recording
    bad = tmp_path / "bad.safetensors"
    exp = experience.read(path)
    S, M, D = exp.state.shape
    cases = [
        (dict(meta={"format": "cudarl-policy"}), "not a cudarl experience file"),
        (dict(meta={"version": "2"}), "version 2 is newer"),
        (dict(drop=("reward",)), "field 'reward' is missing"),
        (dict(tensors={"action": exp.action.astype(np.int64)}), "field 'action' is int64"),
        (dict(tensors={"done": exp.done[:-1]}), "field 'done' has shape"),
        (dict(tensors={"action": np.full((S, M), 7, np.int32)}), r"field 'action' has 7 at \[0, 0\], outside \[0, 3\)"),
        (dict(tensors={"state": np.where(np.arange(D) == 2, np.nan, exp.state).astype(np.float32)}), "finite"),
        (dict(tensors={"state": exp.state + np.float32([0.5, 0, 0, 0])}), "field 'state' has a bar index"),
        (dict(tensors={"state": exp.state[..., :3].copy()}), r"field 'state' has shape .* expected \[steps, rows, 4\]"),
        (dict(meta={"features": json.dumps(["a"])}), "field 'normaliser/mean' has .* values"),
        (dict(meta={"gamma": "x"}), "metadata field does not parse"),
    ]
    for kw, msg in cases:
        _rewrite(path, bad, **kw)
        with pytest.raises(ExperienceError, match=msg) as e:
            experience.read(bad)
        assert str(bad) in str(e.value)
    (tmp_path / "junk").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ExperienceError, match="junk.*cudarl experience file"):
        experience.read(tmp_path / "junk")


def test_a_recording_that_does_not_fit_the_run_is_refused(recording, tmp_path):
    _, path = recording
    with pytest.raises(ExperienceError, match="recorded on other bars"):
        quiet(small(run={"offline": str(path)}, data={"source": "builtin:regime?n=1600"}))
    with pytest.raises(ExperienceError, match="normaliser"):
        quiet(small(run={"offline": str(path)}, data={"train_frac": 0.6}))
    with pytest.raises(ExperienceError, match="recorded with features"):
        quiet(small(run={"offline": str(path)}, features={"horizons": [1, 2]}))
    with pytest.raises(ConfigError, match="record and offline"):
        small(run={"offline": str(path), "record": str(tmp_path / "x")})


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_offline_with_cql_graphed_equals_eager(tmp_path, head):
    """Record on the GPU, then train offline with CQL: graphed and eager, bit for bit."""
    path = tmp_path / "exp.safetensors"
    rec = quiet(gpu_small(net={"head": head}, run={"record": str(path)}))
    rec.run(40)
    over = {"net": {"head": head}, "run": {"offline": str(path)}, "agent": {"cql_alpha": 1.0}}
    g, e = quiet(gpu_small(**over)), quiet(gpu_small(**over))
    e.train_graph.replay = e.train_graph.run_eager
    g.run(30)
    e.run(30)
    assert g.losses == e.losses and g.collect_steps == e.collect_steps == 0
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())
    assert g.monitor.last_stats == e.monitor.last_stats and g.monitor.last_stats["cql_loss"] > 0


def test_an_offline_run_may_read_another_window_than_the_recording(recording):
    """The recording holds state rows (bar indices and position features): the window of bars the network
    reads is gathered when sampled, so an offline run with net.window = 4 learns from a window-1 recording."""
    _, path = recording
    off = quiet(small(run={"offline": str(path)}, net={"window": 4}))
    off.run(20)
    assert off.agent.batch.obs.shape[1] == 4 * off.agent.batch.obs.shape[1] // 4 and off.env.windows.window == 4
    assert np.isfinite(off.losses).all()
