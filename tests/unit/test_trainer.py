"""The trainer on the NumPy backend: run directory, determinism, exact resume, the guard."""

import signal

import numpy as np
import pytest

from cudarl.config import from_dict, resolve_for_backend
from cudarl.env import stream_seed
from cudarl.guard import GuardStop
from cudarl.interrupt import Interrupted
from cudarl.trainer import Trainer


def small(tmp_path=None, **over):
    cfg = resolve_for_backend(from_dict({"run": {"device": "cpu"}}), False, {})
    base = {
        "run": {
            "steps": 60,
            "eval_every": 0,
            "checkpoint_every": 0,
            "log_every": 20,
            "out_dir": str(tmp_path or "runs"),
        },
        "data": {"source": "builtin:regime?n=1500"},
        "env": {"n_envs": 8, "episode_len": 128},
        "replay": {"capacity": 4096},
        "net": {"hidden": [32, 32]},
        "agent": {"batch_size": 32, "learning_starts": 200},
        "guard": {"snapshot_every": 20},
    }
    for sec, vals in over.items():
        base.setdefault(sec, {}).update(vals)
    return from_dict(base, base=cfg)


def test_same_seed_runs_are_bitwise_identical(tmp_path):
    a = Trainer(small(), run_dir=False, echo=lambda m: None)
    b = Trainer(small(), run_dir=False, echo=lambda m: None)
    a.run(40)
    b.run(40)
    assert len(a.losses) == 40 and a.losses == b.losses
    np.testing.assert_array_equal(a.agent.online.params, b.agent.online.params)
    c = Trainer(small(run={"seed": 1}), run_dir=False, echo=lambda m: None)
    c.run(40)
    assert c.losses != a.losses


def test_run_seed_seeds_the_environments_too_and_seed_0_keeps_env_seeds_key(tmp_path):
    # run.seed is the seed of every stream: runs of two seeds draw different episode starts and exploration;
    # at run.seed = 0 the environments' key is env.seed itself (the bits every default run had before)
    a, b = (Trainer(small(run={"seed": s}), run_dir=False, echo=lambda m: None) for s in (0, 1))
    c = Trainer(small(run={"seed": 1}, env={"seed": 5}), run_dir=False, echo=lambda m: None)
    assert int(a.env.seed[0]) == 0 == a.cfg.env.seed
    assert int(b.env.seed[0]) == stream_seed(1, 0) != 0 and int(c.env.seed[0]) == stream_seed(1, 5)
    assert len({int(t.env.seed[0]) for t in (a, b, c)}) == 3
    starts = [np.asarray(t.env.state.t).copy() for t in (a, b)]  # each env's bar after the first reset
    assert not np.array_equal(*starts)
    assert stream_seed(0, 7) == 7 and stream_seed(2**63, 2**64 - 1) < 2**64


def resumed_and_uninterrupted(cfg, tmp_path):
    """A run of 100 updates, and one stopped at 50, saved, resumed from that checkpoint and run to 100."""
    full = Trainer(cfg, run_dir=tmp_path / "full", echo=lambda m: None)
    full.run(100)
    half = Trainer(cfg, run_dir=tmp_path / "half", echo=lambda m: None)
    half.run(50)
    path = half.save()
    resumed = Trainer.resume(path, run_dir=tmp_path / "resumed", echo=lambda m: None)
    assert resumed.step == 50
    resumed.run(100)
    assert resumed.losses == full.losses[50:100]  # the next 50 losses, bit for bit
    return resumed, full


def test_resume_continues_exactly(tmp_path):
    resumed, full = resumed_and_uninterrupted(small(), tmp_path)
    np.testing.assert_array_equal(resumed.agent.online.params, full.agent.online.params)


def test_run_directory_is_complete(tmp_path):
    t = Trainer(small(run={"eval_every": 30}), run_dir=tmp_path / "run", echo=lambda m: None)
    t.run()
    d = tmp_path / "run"
    for f in ("config.toml", "env.json", "data_report.json", "metrics.jsonl", "metrics.csv", "checkpoints/latest.npz"):
        assert (d / f).is_file(), f
    evals = sorted(p.name for p in (d / "eval").iterdir())
    assert evals == ["val-00000030", "val-00000060"]
    assert (d / "eval" / "val-00000060" / "summary.json").is_file()
    assert "sharpe" in t.last_eval and np.isfinite(t.last_eval["sharpe"])


def test_best_validation_checkpoint_is_the_argmax_and_survives_resume(tmp_path):
    import json

    from cudarl.policy import load_policy, read_policy_info

    t = Trainer(small(run={"eval_every": 20, "steps": 100}), run_dir=tmp_path / "run", echo=lambda m: None)
    t.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("event") == "eval" and r["split"] == "val"]
    assert [r["step"] for r in evals] == [20, 40, 60, 80, 100]
    best = max(evals, key=lambda r: r["sharpe"])  # first of equals: only a strict improvement moves it
    assert t.best == {"step": best["step"], "sharpe": best["sharpe"]}
    assert [r["step"] for r in rows if r.get("event") == "best"][-1] == best["step"]
    info = read_policy_info(tmp_path / "run" / "checkpoints" / "best.safetensors")
    assert info["step"] == best["step"]  # later evaluations left it alone
    assert info["best"] == t.best  # it carries its own best record
    assert load_policy(tmp_path / "run" / "checkpoints" / "best.safetensors", device="cpu").step == best["step"]
    resumed = Trainer.resume(
        tmp_path / "run" / "checkpoints" / "latest.npz", run_dir=tmp_path / "resumed", echo=lambda m: None
    )
    assert resumed.best == t.best  # a resumed run only replaces best.safetensors with a better one
    off = Trainer(small(run={"eval_every": 20, "keep_best": False}), run_dir=tmp_path / "off", echo=lambda m: None)
    off.run()
    assert off.best is None and not (tmp_path / "off" / "checkpoints" / "best.safetensors").exists()


@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_nan_in_the_features_trips_the_guard(action):
    """NaN in the stored rows the learner reads gives a NaN loss; the guard acts as configured."""
    from cudarl.reference.window import POSITION

    t = Trainer(small(guard={"action": action, "max_rollbacks": 2}), run_dir=False, echo=lambda m: None)
    t.run(30)
    t.replay.bufs.obs[:, POSITION] = np.nan  # every stored row is poisoned (its position feature)
    with pytest.raises(GuardStop, match=r"loss = nan.*action: stop"):
        t.run(60)
    kinds = [(e["event"], e.get("action")) for e in t.events]
    if action == "stop":
        assert kinds == [("guard", "stop")]
    else:
        assert kinds == [
            ("guard", "rollback"),
            ("rollback", None),
            ("guard", "rollback"),
            ("rollback", None),
            ("guard", "stop"),
        ]


def gpu_small(**over):
    base = {
        "run": {"device": "gpu"},
        "env": {"n_envs": 64},
        "replay": {"capacity": 20_000},
        "agent": {"batch_size": 128, "learning_starts": 1000},
        "net": {"hidden": [64, 64]},
    }
    for sec, vals in over.items():
        base.setdefault(sec, {}).update(vals)
    return small(**base)


def test_the_networks_and_auxiliary_layers_take_the_configured_dw_gemm():
    """net.dw_gemm reaches the agent's online and target networks (an auxiliary head among their layers)
    and the layers an auxiliary signal builds outside them (denoise's encoder and decoder)."""
    t = Trainer(small(net={"dw_gemm": "one_kernel"}, agent={"aux": ["horizons", "denoise"]}), run_dir=False)
    a = t.agent
    assert "aux.horizons" in a.online.linears
    denoise = next(s for s in a.aux if s.name == "denoise")
    layers = [*a.online.linears.values(), *a.target.linears.values(), denoise.dec, *denoise.enc.children]
    assert {lin.dw_gemm for lin in layers if hasattr(lin, "dw_gemm")} == {"one_kernel"}


@pytest.mark.gpu
def test_gpu_same_seed_runs_are_bitwise_identical():
    a = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    b = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    a.run(60)
    b.run(60)
    assert len(a.losses) == 60 and a.losses == b.losses
    assert np.array_equal(a.agent.online.params.get(), b.agent.online.params.get())


@pytest.mark.gpu
def test_gpu_graphed_step_equals_eager_step():
    g = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    e = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    e.collect_graph.replay = e.collect_graph.run_eager  # the same phases, launched one by one
    e.train_graph.replay = e.train_graph.run_eager
    g.run(40)
    e.run(40)
    assert g.losses == e.losses
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())
    assert np.array_equal(g.replay.priorities(), e.replay.priorities())


@pytest.mark.gpu
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_dw_gemm_picks_the_train_graphs_weight_gradients_and_graphed_equals_eager(dw_gemm):
    """net.dw_gemm in the trainer's train graph, captured without an eager step (Agent's prepare_backward
    made the one-kernel plans): each layer's weight gradient (m, n, k) = (n_in, n_out, batch) is a cuBLAS
    GEMM under "split_k" and a cuBLASLt one under "one_kernel"; either trains
    (finite losses) and the graphed run equals the eager one bit for bit."""
    from cudarl import kernels

    over = {"net": {"dw_gemm": dw_gemm}}
    g = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    e = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    g.collect_graph.capture()  # as the trainer does: the replay's host count of rows is then unknown
    with kernels.tracing() as events:  # the train graph's capture, in this thread
        g.train_graph.capture()
    B = g.cfg.agent.batch_size
    dw = {(lin.n_in, lin.n_out, B * lin.rows) for lin in g.agent.online.linears.values()}
    shapes = {}
    for ev in events:
        if ev.get("kind") == "library":
            shapes.setdefault(ev["name"], set()).add((ev["m"], ev["n"], ev["k"]))
    cublas, lt = shapes.get("cublas_sgemm", set()), shapes.get("cublaslt_matmul", set())
    if dw_gemm == "split_k":
        assert dw <= cublas and not dw & lt, shapes
    else:
        assert dw <= lt and not dw & cublas, shapes
    e.collect_graph.replay = e.collect_graph.run_eager  # the same phases, launched one by one
    e.train_graph.replay = e.train_graph.run_eager
    g.run(40)
    e.run(40)
    assert len(g.losses) == 40 and np.all(np.isfinite(g.losses))
    assert g.losses == e.losses
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())


def unfuse(t: Trainer) -> None:
    """Point ``t`` (before its capture) at the launches the fused ones replaced: env.record, the
    discount and env.step (with its window gather) for env.record_step; the dueling kernel then
    act_c51 for the C51 rule's act; sample(out=) then two window gathers for sample(windows=)."""
    env, rule, replay = t.env, t.agent.rule, t.replay

    def record_step(out, discount, gamma):
        env.record(out)
        t.agent.ops.discount(discount, out.done, gamma)
        env.step()
        return out

    def act(env_, eps_args):
        buf = rule.buf
        logits = buf.online.forward(env_.obs, buf.ws_act, heads=buf.online.acting_heads)["q"]
        rule.agent_ops.act_c51(env_.actions, buf.q_act, logits, rule.support, env_.state.count, env_.seed, *eps_args)

    fused_sample = replay.sample

    def sample(batch_size, side=None, out=None, windows=None, windows_out=None):
        got = fused_sample(batch_size, side=side, out=out)
        windows.gather(out.obs, windows_out[:batch_size])
        windows.gather(out.next_obs, windows_out[batch_size:])
        return got

    env.record_step, rule.act, replay.sample = record_step, act, sample


#: per graph: the fused launches each graph makes, and the launches they replaced (which must be gone
#: from that graph; the train graph still combines the dueling head for the Q statistics)
FUSED = {"collect": {"cudarl_env_record_step", "cudarl_agent_act_c51_dueling"},
         "train": {"cudarl_replay_sample_search_gather_windows"}}  # fmt: skip
UNFUSED = {"collect": {"cudarl_env_record", "cudarl_env_step", "cudarl_agent_discount", "cudarl_nn_dueling_forward",
                       "cudarl_window_gather"},
           "train": {"cudarl_replay_sample_search_gather"}}  # fmt: skip


@pytest.mark.gpu
def test_gpu_fused_launches_equal_the_launches_they_replace():
    """The trainer's graphs launch the fused kernels (collect: record_step, act_c51_dueling; train:
    the sample with windows) and none they replaced; the same trainer pointed at the replaced launches
    (:func:`unfuse`) gives the same losses, parameters, priorities, replay rows and env state, bit for bit."""
    from cudarl import kernels

    fused = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    split = Trainer(gpu_small(), run_dir=False, echo=lambda m: None)
    unfuse(split)
    for t, made, gone in ((fused, FUSED, UNFUSED), (split, UNFUSED, FUSED)):
        for name in ("collect", "train"):
            with kernels.tracing() as events:  # this graph's capture, in this thread
                getattr(t, f"{name}_graph").capture()
            names = {e["name"] for e in events if e.get("kind") == "kernel"}
            assert made[name] <= names, (name, made[name] - names)
            assert not gone[name] & names, (name, gone[name] & names)
    fused.run(40)
    split.run(40)
    assert fused.losses == split.losses and np.all(np.isfinite(fused.losses))
    assert np.array_equal(fused.agent.online.params.get(), split.agent.online.params.get())
    assert np.array_equal(fused.replay.priorities(), split.replay.priorities())
    for name in ("obs", "action", "reward", "discount"):
        assert np.array_equal(getattr(fused.replay.bufs, name).get(), getattr(split.replay.bufs, name).get()), name
    for name in ("rows", "obs", "actions"):
        assert np.array_equal(getattr(fused.env, name).get(), getattr(split.env, name).get()), name


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt_nosplit", "cudarl"])
def test_gpu_grid_barrier_off_gives_the_same_bits(gemm):
    """run.grid_barrier = false (a GPU shared with other processes): the C51 targets-and-loss with
    PopArt in two launches and the optimiser in three, no launch waiting for all its blocks; the same
    losses and parameters, bit for bit."""
    over = {"agent": {"popart": True}, "net": {"gemm": gemm}}
    on = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    off = Trainer(gpu_small(run={"grid_barrier": False}, **over), run_dir=False, echo=lambda m: None)
    on.run(40)
    off.run(40)
    assert on.losses == off.losses
    assert np.array_equal(on.agent.online.params.get(), off.agent.online.params.get())
    assert np.array_equal(on.agent.target.params.get(), off.agent.target.params.get())
    assert np.array_equal(on.agent.popart.state.get(), off.agent.popart.state.get())


@pytest.mark.gpu
def test_gpu_resume_continues_exactly(tmp_path):
    resumed_and_uninterrupted(gpu_small(), tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn", "c51+iqn"])
def test_gpu_every_feature_moves_its_observable(head):
    """DESIGN rule 8: with PopArt (C51), counterfactual rows and the mirror on, each observable moves."""
    over = {"net": {"head": head}, "env": {"counterfactual": True, "mirror": True}, "replay": {"n_step": 1}}
    if head == "c51":
        over["agent"] = {"popart": True}
    t = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    p0 = t.agent.online.params.get().copy()
    t.run(30)
    assert not np.array_equal(p0, t.agent.online.params.get())
    if head == "c51":
        mu, sigma = t.agent.popart.statistics()
        assert mu != 0.0 and sigma != 1.0
    rows = t.replay.bufs.action.get()[: t.rows_per_collect]
    assert t.env.rows_per_step == 4 and len(set(rows.tolist())) == 3  # real, two counterfactual actions, mirror


@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn", "c51+iqn"])
def test_every_enabled_feature_moves_its_observable(head):
    """DESIGN rule 8 on the CPU: PopArt's statistics move, counterfactual and mirror rows reach the
    replay, the online and target networks move. (The seed system had a normaliser it never called.)"""
    over = {
        "net": {"head": head},
        "env": {"counterfactual": True, "mirror": True},
        "replay": {"n_step": 1},
        "agent": {"popart": True},
    }
    t = Trainer(small(**over), run_dir=False, echo=lambda m: None)
    p0, tg0 = t.agent.online.params.copy(), t.agent.target.params.copy()
    state0 = t.agent.popart.state.copy()
    t.run(30)
    assert not np.array_equal(p0, t.agent.online.params) and not np.array_equal(tg0, t.agent.target.params)
    assert not np.array_equal(state0, t.agent.popart.state)
    mu, sigma = t.agent.popart.statistics()
    assert np.isfinite(mu) and np.isfinite(sigma) and sigma > 0
    n = t.env.n_envs
    rows = t.replay.bufs.action[: t.rows_per_collect]
    assert t.env.rows_per_step == 4  # real, two counterfactual actions, mirror
    real, cf1, cf2, mirror = rows[:n], rows[n : 2 * n], rows[2 * n : 3 * n], rows[3 * n :]
    np.testing.assert_array_equal(cf1, (real + 1) % 3)
    np.testing.assert_array_equal(cf2, (real + 2) % 3)
    np.testing.assert_array_equal(mirror, 2 - real)
    assert t.replay.spec.store_next_obs


@pytest.mark.parametrize("when", ["eval", "end", "never"])
def test_resume_checkpoint_says_when_latest_npz_is_written(tmp_path, when):
    """run.resume_checkpoint: ``eval`` writes latest.npz at the evaluation at update 20, ``end`` only at
    the end, ``never`` not at all; SIGTERM at update 30 writes it at that update but with ``never``, whose
    message says none was written."""
    cfg = small(tmp_path, run={"steps": 40, "eval_every": 20, "log_every": 10, "resume_checkpoint": when})
    latest = tmp_path / when / "checkpoints" / "latest.npz"
    seen = {}
    t = Trainer(cfg, run_dir=tmp_path / when, echo=lambda m: None)
    t.run(progress=lambda step, row, ev: seen.setdefault(step, latest.is_file()))
    assert seen[30] == (when == "eval") and latest.is_file() == (when != "never")
    assert t.checkpoint_bytes == (latest.stat().st_size if when != "never" else None)

    def stop(step, row, ev):
        if step == 30:
            signal.raise_signal(signal.SIGTERM)  # the run's handler sets its stop flag

    cut = Trainer(cfg, run_dir=tmp_path / f"{when}-cut", echo=lambda m: None)
    with pytest.raises(Interrupted) as e:
        cut.run(progress=stop)
    written = cut.run_dir / "checkpoints" / "latest.npz"
    assert written.is_file() == (when != "never")
    assert ("no checkpoint written (run.resume_checkpoint = never)" in str(e.value)) == (when == "never")
