"""Policy files (safetensors), load_policy, and evaluate without a trainer (issue 16, points 9-10)."""

import json
import struct

import numpy as np
import pytest
from test_trainer import gpu_small, small
from typer.testing import CliRunner

from cudarl import tensorfile
from cudarl.checkpoint import CheckpointError
from cudarl.cli import app
from cudarl.features import Normaliser
from cudarl.nn import QNetwork
from cudarl.policy import Policy, PolicyState, greedy_actions, load_policy, read_policy_info, row_exact_q
from cudarl.trainer import Trainer

runner = CliRunner()


def quiet(m):
    pass


# --- the safetensors reader and writer ------------------------------------------------------------
def test_tensorfile_round_trip_is_exact_and_memory_mapped(tmp_path, rng):
    t = {
        "w": rng.standard_normal((3, 5)).astype(np.float32),
        "mean": rng.standard_normal(7),
        "count": np.array([2**40 + 3], np.int64),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.float32),
        "be": np.arange(4, dtype=">f8"),  # big-endian in, little-endian on disk
    }
    path = tensorfile.save(tmp_path / "x.safetensors", t, {"who": "me"})
    got, meta = tensorfile.load(path)
    assert meta == {"who": "me"} and set(got) == set(t)
    for k, v in t.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype.newbyteorder("<") and got[k].shape == v.shape
    assert isinstance(got["w"].base, np.memmap) or isinstance(got["w"], np.memmap)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert n % 8 == 0  # padded, so the data (and every tensor, largest items first) is aligned
    assert all(got[k].ctypes.data % got[k].dtype.itemsize == 0 for k in got if got[k].size)


def test_tensorfile_refuses_broken_files_naming_them(tmp_path):
    good = tensorfile.save(tmp_path / "g.safetensors", {"a": np.ones(4, np.float32)})
    raw = good.read_bytes()
    cases = {
        "short": raw[:5],
        "huge_header": struct.pack("<Q", 10**12) + raw[8:],
        "not_json": struct.pack("<Q", 8) + b"not json" + raw[16:],
        "truncated_data": raw[:-4],
    }
    for name, data in cases.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(data)
        with pytest.raises(tensorfile.TensorFileError, match=str(p)):
            tensorfile.load(p)


def test_the_safetensors_package_reads_our_files_and_we_read_its():
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    t = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, 2], np.int64)}
    tensorfile.save(d / "ours.safetensors", t, {"k": "v"})
    theirs = st.load_file(str(d / "ours.safetensors"))
    for k in t:
        np.testing.assert_array_equal(theirs[k], t[k])
    st.save_file(t, str(d / "theirs.safetensors"), metadata={"x": "y"})
    got, meta = tensorfile.load(d / "theirs.safetensors")
    assert meta == {"x": "y"} and all(np.array_equal(got[k], t[k]) for k in t)


# --- policy files ---------------------------------------------------------------------------------
def trained(tmp_path, **over):
    t = Trainer(small(tmp_path / "runs", run={"eval_every": 20, "checkpoint_every": 20}, **over), echo=quiet)
    t.run(40)
    return t


def test_policy_files_are_small_safetensors_without_the_replay(tmp_path):
    t = trained(tmp_path)
    ck = t.run_dir / "checkpoints"
    names = sorted(p.name for p in ck.iterdir())
    assert "step-00000020.safetensors" in names and "step-00000040.safetensors" in names
    assert not any(n.startswith("step-") and n.endswith(".npz") for n in names)
    pol = ck / "step-00000040.safetensors"
    # no replay buffer (whose rows are 4-float state rows: the checkpoint is a few times the policy)
    assert pol.stat().st_size * 5 < (ck / "latest.npz").stat().st_size
    tensors, meta = tensorfile.load(pol)
    assert meta["format"] == "cudarl-policy" and json.loads(meta["config"])["net"]["hidden"] == [32, 32]
    assert {"normaliser/mean", "normaliser/std"} <= set(tensors)
    assert not any("replay" in k or "adam" in k or "target" in k for k in tensors)
    info = read_policy_info(pol)
    assert info["step"] == 40 and info["data"]["bars"] == len(t.data.bars)
    assert len(info["data"]["close_sha256"]) == 64


@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn", "c51+iqn"])
def test_load_policy_gives_the_trainers_greedy_evaluation(tmp_path, head):
    t = trained(tmp_path, net={"head": head})
    want = t.greedy_positions(t.data.splits.val)
    ev_t = t.evaluate("val", write=False)
    for f in ("step-00000040.safetensors", "latest.npz"):
        p = load_policy(t.run_dir / "checkpoints" / f, device="cpu")
        ev = p.evaluate(split="val")
        np.testing.assert_array_equal(ev.position, want)
        assert ev.summary["policy"] == ev_t["policy"] and ev.summary["step"] == 40
    # act and q_values agree with the trainer's network on the same observations (C51: with the walk's Q)
    env = t._eval_env(t.data.splits.val)
    env.reset()
    obs = np.repeat(env.obs, 5, axis=0)
    obs[:, -2] = [-1, 0, 1, 0, 1]
    q = np.zeros((5, 3), np.float32)
    t.agent.q_values(obs, q)
    got = p.q_values(obs)
    if p._q_rows() is None:  # the network's forward itself
        np.testing.assert_array_equal(got, q)
    else:  # the walk's block Q (its own GEMM shape and expectation): its bits, the trainer's values
        np.testing.assert_array_equal(got, p._q_rows()(obs))
        np.testing.assert_allclose(got, q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p.act(obs), got.argmax(1))


@pytest.mark.parametrize("late", [False, True])
def test_a_policy_makes_its_device_side_in_the_warm_up_once(tmp_path, monkeypatch, late):
    """On a backend not started yet, Policy makes its network and walk in the backend's warm-up thread
    (beside the caller's host work) and the first use waits for them: one network, made there, and the
    same evaluation as a policy made without a warm-up. (The "GPU" here is NumPy under another name:
    the thread and the waiting are what is tested; the GPU's own test is the walk tests above.) ``late``:
    the thread asks for the network before warm_up has returned it to the policy (a busy machine's
    schedule: the thread's first use read an attribute not yet assigned, failed, and the caller made the
    network again in its own thread)."""
    import threading
    import time

    from cudarl import backend
    from cudarl import policy as policy_module
    from cudarl.nn import network

    t = trained(tmp_path)
    path = t.run_dir / "checkpoints" / "best.safetensors"
    want = load_policy(path, device="cpu").evaluate(split="test")
    monkeypatch.setattr(backend, "select", lambda r: backend.Backend("numpy", np, f"pretend {r}"))
    monkeypatch.setattr(backend, "_cached", backend.functools.cache(lambda r, env: backend.select(r)))
    monkeypatch.setattr(backend, "_warming", {})
    monkeypatch.setattr(backend, "_selected", set())
    monkeypatch.setattr(backend, "_cupy_installed", lambda: True)
    monkeypatch.setattr(backend, "_start_driver", lambda: None)
    made, init = [], network.QNetwork.__init__
    monkeypatch.setattr(
        network.QNetwork,
        "__init__",
        lambda self, *a, **k: made.append(threading.current_thread().name) or init(self, *a, **k),
    )
    rows, q_rows = [], policy_module.row_exact_q

    def slow_rows(*a):  # the main thread asks while the warm-up still makes them
        rows.append(threading.current_thread().name)
        time.sleep(1.0 if len(rows) == 1 else 0.0)
        return q_rows(*a)

    monkeypatch.setattr(policy_module, "row_exact_q", slow_rows)
    if late:
        warm_up = backend.warm_up

        def late_warm_up(*a, **k):  # returns once the thread is inside its first use of the policy
            t = warm_up(*a, **k)
            for _ in range(500):
                if rows:
                    break
                time.sleep(0.01)
            return t

        monkeypatch.setattr(backend, "warm_up", late_warm_up)
    p = load_policy(path, device="gpu")
    ev = p.evaluate(split="test")
    assert made == rows == ["cudarl-backend-warm-up"] and p.be.device == "pretend cupy"
    np.testing.assert_array_equal(ev.position, want.position)
    assert json.dumps(ev.summary["policy"], sort_keys=True) == json.dumps(want.summary["policy"], sort_keys=True)


def test_evaluate_builds_no_trainer_and_reads_no_replay(tmp_path, monkeypatch):
    t = trained(tmp_path)
    import cudarl.checkpoint as ckpt
    import cudarl.trainer

    def no_trainer(*a, **k):
        raise AssertionError("evaluate built a Trainer")

    monkeypatch.setattr(cudarl.trainer.Trainer, "__init__", no_trainer)
    read = []
    orig = ckpt.load
    monkeypatch.setattr(ckpt, "load", lambda path, only=None: read.append(only) or orig(path, only=only))
    for f in ("best.safetensors", "latest.npz"):
        r = runner.invoke(app, ["evaluate", str(t.run_dir / "checkpoints" / f), "--split", "test", "--device", "cpu"])
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout)
        assert summary["split"]["name"] == "test"
    assert read and all(o is not None and not any(k.startswith("replay") for k in o) for o in read)


def test_a_policy_of_other_bars_is_refused_and_a_changed_source_is_said(tmp_path):
    t = trained(tmp_path)
    p = load_policy(t.run_dir / "checkpoints" / "best.safetensors", device="cpu")
    said = []
    p.evaluate(split="test", echo=said.append)
    assert said == []  # the same bars
    p.state.data["close_sha256"] = "0" * 64
    p.evaluate(split="test", echo=said.append)
    assert said and "differ" in said[0]
    with pytest.raises(ValueError, match="features"):
        p.evaluate("builtin:eurusd-1h", split="test")  # hourly bars: time-of-day features, other columns


def test_the_gate_reads_the_validation_psr_the_policy_file_recorded(tmp_path, monkeypatch):
    """The trainer records the validation PSR of the saved weights in the policy file; evaluate's gate
    reads it instead of walking the validation split, and it equals the one walked again. With other
    bars the split is walked."""
    import cudarl.policy as pol

    t = trained(tmp_path, eval={"gate_psr": 0.5})
    p = load_policy(t.run_dir / "checkpoints" / "step-00000040.safetensors", device="cpu")
    assert p.state.validation == {"step": 40, "psr": t.validation_psr()}
    assert p.validation_psr() == p.validation_psr(recompute=True)  # the file's equals the walked one
    walked = []
    orig = pol.evaluate_split
    monkeypatch.setattr(
        pol, "evaluate_split", lambda prep, split, *a, **k: walked.append(split) or orig(prep, split, *a, **k)
    )
    ev = p.evaluate(split="test")
    dep = ev.summary["deployment"]
    assert walked == ["test"] and dep["validation_psr_from"] == "policy file"
    assert dep["validation_psr"] == p.validation_psr(recompute=True)
    assert dep["trading"] == (p.validation_psr(recompute=True) >= 0.5)
    walked.clear()
    p.state.data["close_sha256"] = "0" * 64  # bars other than the training run's: walk their split
    dep2 = p.evaluate(split="test").summary["deployment"]
    assert walked[0] == "val" and dep2["validation_psr_from"] == "recomputed"
    assert dep2["validation_psr"] == dep["validation_psr"]  # (the same bars, in truth)


def test_policy_state_round_trip(tmp_path):
    t = trained(tmp_path)
    a = PolicyState.of_trainer(t)
    a.save(tmp_path / "p.safetensors")
    b = PolicyState.read(tmp_path / "p.safetensors")
    assert b.config == a.config and b.step == a.step and b.best == a.best and b.data == a.data
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert isinstance(Policy(b, device="cpu"), Policy)
    with pytest.raises(CheckpointError, match="not a cudarl policy"):
        tensorfile.save(tmp_path / "other.safetensors", {"x": np.ones(2)}, {"format": "hf"})
        load_policy(tmp_path / "other.safetensors")


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn", "c51+iqn"])
def test_gpu_load_policy_gives_the_trainers_greedy_evaluation(tmp_path, head):
    import cupy

    run = {"eval_every": 20, "checkpoint_every": 20, "out_dir": str(tmp_path)}
    t = Trainer(gpu_small(run=run, net={"head": head}), echo=quiet)
    t.run(40)
    want = t.greedy_positions(t.data.splits.val)
    # the policy of the last update (best.safetensors may hold update 20's weights)
    p = load_policy(t.run_dir / "checkpoints" / "step-00000040.safetensors", device="gpu")
    np.testing.assert_array_equal(p.evaluate(split="val").position, want)
    obs = cupy.asarray(np.random.default_rng(0).standard_normal((7, p.obs_dim)).astype(np.float32))
    q = p.q_values(obs)
    assert isinstance(q, cupy.ndarray) and q.shape == (7, 3)
    np.testing.assert_array_equal(p.act(obs).get(), q.get().argmax(1))
    np.testing.assert_array_equal(p.q_values(obs.get()), q.get())


@pytest.mark.gpu
def test_gpu_warm_plans_makes_the_walks_plans_through_the_driver(tmp_path, monkeypatch):
    """Policy._warm_plans (the warm-up's on_context) makes the cuBLASLt plans of the GPU walk's forward
    through the driver and cuBLASLt alone; the walk's workspace then makes none of its own, and the
    evaluation is the one made with the plans gemm_lt_prepare makes."""
    import cupy

    from cudarl import blas
    from cudarl.nn.network import forward_plan_keys
    from cudarl.policy import EVAL_ROWS

    run = {"eval_every": 1000, "checkpoint_every": 40, "out_dir": str(tmp_path)}
    t = Trainer(gpu_small(run=run), echo=quiet)
    t.run(40)
    path = t.run_dir / "checkpoints" / "step-00000040.safetensors"
    monkeypatch.setattr(blas, "_plans", {})  # as in a new process
    want = load_policy(path, device="gpu").evaluate(split="val")
    monkeypatch.setattr(blas, "_plans", {})
    p = load_policy(path, device="gpu")
    keys = forward_plan_keys(p.obs_dim, p.n_actions, p.config.net, EVAL_ROWS, **p._net_args)
    assert len(keys) == 3
    cupy.cuda.Device().synchronize()
    p._warm_plans()
    made = dict(blas._plans)
    assert set(made) == set(keys)
    ev = p.evaluate(split="val")
    assert all(blas._plans[k] is made[k] for k in keys)  # the walk's workspace found them made
    np.testing.assert_array_equal(ev.position, want.position)
    assert json.dumps(ev.summary["policy"], sort_keys=True) == json.dumps(want.summary["policy"], sort_keys=True)


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_the_host_walk_equals_the_envs_walk(tmp_path, head):
    """The NumPy evaluation walks the bars on the host; the env's act and step give the same actions,
    and so does the policy's walk by blocks of bars (C51). A C51 bar's Q is its row of the block Q's
    row-exact forward (RowExactQ), which the policy's q_values go through, a bar alone or in a block."""
    t = trained(tmp_path, net={"head": head}, env={"cost_bps": 3.0, "hold_cap": 5})
    p = Policy(PolicyState.of_trainer(t), device="cpu")
    assert (p._q_rows() is None) == (head != "c51")
    q_values = p.q_values_into if head == "c51" else t.agent.q_values  # a bar at a time
    for split in (t.data.splits.val, t.data.splits.test):
        env = t._eval_env(split)
        host = greedy_actions(env, q_values)
        via_env = greedy_actions(env, q_values, walk_on_host=False)
        np.testing.assert_array_equal(host, via_env)
        assert len(set(host.tolist())) > 1  # the walk moves between positions (hold and position matter)
        # the no-trade margin (eval.margin): the env's path finds the held action from its position
        for m in (0.01, 0.05):
            held = greedy_actions(env, q_values, margin=m)
            np.testing.assert_array_equal(held, greedy_actions(env, q_values, walk_on_host=False, margin=m))
            assert np.count_nonzero(np.diff(held)) <= np.count_nonzero(np.diff(host))
            if head == "c51":  # the block walk adds the margin as the bar-by-bar walk does
                np.testing.assert_array_equal(greedy_actions(env, p.q_values_into, margin=m, q_rows=p._q_rows()), held)
        if head == "c51":
            np.testing.assert_array_equal(greedy_actions(env, p.q_values_into, q_rows=p._q_rows()), host)
            # the trainer's own network and rule give the same rows (what Trainer.evaluate passes)
            q_rows = row_exact_q(t.agent.online, t.agent.rule.values)
            np.testing.assert_array_equal(greedy_actions(env, t.agent.q_values, q_rows=q_rows), host)


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["cublaslt_nosplit", "cudarl", "cublas"])
def test_gpu_block_walk_gives_each_bar_the_q_it_gets_alone(tmp_path, monkeypatch, gemm):
    """On the GPU the evaluation forward always runs at EVAL_ROWS rows, so a row's Q does not depend on
    the other rows (at one shape; cuBLASLt's algorithm for 1 to 4 rows differs from 17 and more): each
    row of a block equals that row in a block of one, and the walk by blocks takes the actions of the
    walk bar by bar and of the env's own act and step fed the same Q, with and without a margin."""
    import cupy

    import cudarl.policy as pol

    run = {"eval_every": 1000, "checkpoint_every": 0, "out_dir": str(tmp_path)}
    t = Trainer(gpu_small(run=run, net={"gemm": gemm}, env={"cost_bps": 3.0, "hold_cap": 5}), echo=quiet)
    t.run(60)
    q_rows = t.agent.eval_rows()
    assert q_rows is not None and q_rows.max_rows == pol.EVAL_ROWS
    rng = np.random.default_rng(1)
    obs = cupy.asarray(rng.standard_normal((pol.EVAL_ROWS, t.agent.online.n_in)).astype(np.float32))
    block = q_rows(obs)
    for i in range(0, pol.EVAL_ROWS, 17):
        np.testing.assert_array_equal(q_rows(obs[i : i + 1])[0].view(np.int32), block[i].view(np.int32))

    def q_values(o, out):  # a bar alone through the same fixed-shape forward
        out[...] = cupy.asarray(q_rows(o))

    env = t._eval_env(t.data.splits.val)
    for margin in (0.0, 0.05):
        by_block = greedy_actions(env, t.agent.q_values, margin=margin, q_rows=q_rows)
        np.testing.assert_array_equal(by_block, greedy_actions(env, q_values, walk_on_host=False, margin=margin))
        with monkeypatch.context() as m:  # one bar a block, and trees of every hold
            for shape in [(1, 0), (32, 32)]:  # (32, 32): 1,520 rows, within EVAL_ROWS
                m.setattr(pol, "WalkPlanner", fixed_planner(*shape))
                np.testing.assert_array_equal(
                    by_block, greedy_actions(env, t.agent.q_values, margin=margin, q_rows=q_rows)
                )
    assert len(set(by_block.tolist())) > 1


def random_policy(rng, normaliser=None, agent=None, **net) -> Policy:
    """A C51 (or ``net``) policy of ``small()``'s config (and ``agent``'s fields) with random weights in
    every layer, biases too; ``normaliser`` (default: 11 made-up features) sets the features it reads."""
    cfg = small(net={"hidden": [64, 48], **net}, agent=agent or {})
    if normaliser is None:
        names = tuple(f"f{i}" for i in range(11))
        normaliser = Normaliser(mean=np.zeros(len(names)), std=np.ones(len(names)), names=names)
    layout = QNetwork(len(normaliser.names) + 2, cfg.env.n_actions, cfg.net).layout
    weights = {e.name: (rng.standard_normal(e.shape) * 0.4).astype(np.float32) for e in layout.entries}
    tau = 0 if cfg.net.head == "iqn" else None
    state = PolicyState(config=cfg, weights=weights, normaliser=normaliser, step=0, tau_counter=tau)
    return Policy(state, device="cpu")


@pytest.mark.parametrize("layernorm,act_by", [(False, "mean"), (True, "mean"), (False, "cvar")])
def test_q_rows_gives_every_row_bit_for_bit_as_that_row_alone(rng, layernorm, act_by):
    """The block walk's Q of k bars at once equals the Q of each bar alone, to the bit, wherever it sits
    in the block: every matrix product is an ExactGemm (exact in float64, so no BLAS's summation order or
    tiling by row position can show; a float32 SGEMM's can: OpenBLAS 0.3.31 on an AMD EPYC sums a row of a
    64-row block in one of three orders by its place), and this holds the BLAS of the machine it runs on
    to it. Its forward into buffers made once
    is also the composition of the twins it restates (``reference``), and the policy's q_values go
    through it, for one row as for many."""
    from cudarl.policy import RowExactQ
    from cudarl.reference.nn import SIGMOID

    p = random_policy(rng, layernorm=layernorm, agent={"act_by": act_by})
    n = 2 * RowExactQ.max_rows + 5  # q_values over more rows than a block
    obs = rng.standard_normal((n, p.obs_dim)).astype(np.float32)
    obs[:, -2] = rng.choice([-1.0, 0.0, 1.0], n)
    obs[:, -1] = rng.integers(0, 65, n) / np.float32(64)
    q_rows = p._q_rows()
    # the buffered forward restates identity and ReLU only: a layer with another activation is refused
    first = q_rows.layers[0][0]
    act = first.act
    first.act = SIGMOID
    with pytest.raises(ValueError, match="neither identity nor ReLU"):
        RowExactQ(q_rows.net, q_rows.values)
    first.act = act
    alone = np.concatenate([q_rows(obs[i : i + 1]).copy() for i in range(300)])
    for k in (1, 2, 7, 12, 64, 65, 300):
        got = q_rows(obs[:k]).copy()
        np.testing.assert_array_equal(got.view(np.int32), q_rows.reference(obs[:k]).view(np.int32))
        np.testing.assert_array_equal(got.view(np.int32), alone[:k].view(np.int32))
    for shift in (1, 6, 37):  # the same rows at other places of the block, after other rows
        shifted = q_rows(np.concatenate([obs[300 : 300 + shift], obs[:300]])).copy()
        np.testing.assert_array_equal(shifted[shift:].view(np.int32), alone.view(np.int32))
    via_policy = p.q_values(obs)
    np.testing.assert_array_equal(via_policy[:300].view(np.int32), alone.view(np.int32))
    for i in (0, 1, 299):
        np.testing.assert_array_equal(p.q_values(obs[i : i + 1])[0].view(np.int32), alone[i].view(np.int32))
    np.testing.assert_array_equal(via_policy[-5:].view(np.int32), q_rows(obs[-5:]).view(np.int32))

    for head in ("iqn", "qrdqn"):  # the bar-by-bar walk (IQN's acting taus depend on the batch)
        assert random_policy(rng, head=head)._q_rows() is None


def _openblas_kernel_families() -> tuple:
    """OpenBLAS kernel families OPENBLAS_CORETYPE can pick for NumPy's BLAS, () where it cannot (another BLAS, or
    an OpenBLAS built for one CPU)."""
    import platform
    from pathlib import Path

    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    if "openblas" not in str(blas.get("name", "")) or "DYNAMIC_ARCH" not in str(blas.get("openblas configuration")):
        return ()
    if platform.machine() not in ("x86_64", "AMD64") or not Path("/proc/cpuinfo").exists():
        return ()
    flags = set(Path("/proc/cpuinfo").read_text().split())
    # each family's kernels run only where the CPU has their instructions (else: an illegal instruction;
    # SSE3 is "pni" in /proc/cpuinfo)
    need = {"Prescott": {"pni"}, "Sandybridge": {"avx"}, "Haswell": {"avx2", "fma"}, "Zen": {"avx2", "fma"}}
    families = tuple(f for f, n in need.items() if n <= flags)
    return families if len(families) > 1 else ()  # one family compares nothing


_Q_BITS = """
import hashlib, sys
import numpy as np
sys.path[:0] = sys.argv[1:]
from test_policy import random_policy
for layernorm in (False, True):
    p = random_policy(np.random.default_rng(3), layernorm=layernorm)
    obs = np.random.default_rng(4).standard_normal((700, p.obs_dim)).astype(np.float32)
    print(hashlib.sha256(p._q_rows()(obs).tobytes()).hexdigest())
"""


@pytest.mark.skipif(not _openblas_kernel_families(), reason="NumPy's BLAS is not an OpenBLAS with DYNAMIC_ARCH")
def test_the_cpu_walks_q_is_the_same_bits_under_every_openblas_kernel_family():
    """The NumPy walk's Q (RowExactQ: exact float64 sums, rounded once) is a function of the weights and the
    row alone, not of the BLAS: the same bits in processes whose OpenBLAS runs its Sandybridge, Haswell, Zen or
    Prescott kernels (which tile and sum a float32 GEMM's rows differently)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    paths = [str(here), str(here.parent), str(here.parents[1])]
    got = {}
    for family in _openblas_kernel_families():
        env = {**os.environ, "OPENBLAS_CORETYPE": family}
        run = subprocess.run([sys.executable, "-c", _Q_BITS, *paths], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        got[family] = run.stdout.split()
    assert len({tuple(v) for v in got.values()}) == 1, got


@pytest.mark.parametrize("k_in,m", [(13, 256), (66, 256), (256, 256), (256, 204), (51, 2), (1000, 7)])
def test_exact_gemm_is_exact_and_a_function_of_each_row_alone(rng, k_in, m):
    """ExactGemm: its float64 GEMM of the split rows and columns is exact (the same bits as an exact
    integer sum done in Python), each row's output is the same bits at every place of every block size
    (BLASes tile rows by place: OpenBLAS 0.3.31 on an AMD EPYC takes three summation orders in a 64-row
    SGEMM), and the result is within float32 rounding of the float64 product of the float32 inputs."""

    from cudarl.policy import ExactGemm

    w = (rng.standard_normal((k_in, m)) * np.exp2(rng.integers(-12, 4, (k_in, m)))).astype(np.float32)
    x = (rng.standard_normal((70, k_in)) * np.exp2(rng.integers(-20, 8, (70, k_in)))).astype(np.float32)
    x[3] = 0  # a zero row
    x[4, 0] = 3e38  # a row near float32's largest
    x[5, : k_in // 2] = 0
    g = ExactGemm(k_in, m, 256)
    g.set(w)
    assert g.bx + g.bw + int(k_in - 1).bit_length() <= 52
    block = np.empty((70, m), np.float32)
    with np.errstate(over="ignore"):  # row 4's output overflows float32
        g(x, block)
    xq = g.xq[:70]  # the rows rounded to their grids, and the columns to theirs
    gx = np.ldexp(1.0, np.frexp(np.abs(x).max(axis=1))[1] - g.bx)[:, None]
    gw = np.ldexp(1.0, np.frexp(np.abs(w).max(axis=0))[1] - g.bw)
    xi, wi = xq / gx, g.w / gw
    assert np.array_equal(xi, np.rint(xi)) and np.array_equal(wi, np.rint(wi))
    assert np.abs(xi).max() <= 2**g.bx and np.abs(wi).max() <= 2**g.bw
    assert np.array_equal(xq, np.rint(x / gx) * gx)
    y = xq @ g.w  # the call's float64 GEMM, again: its bits are an exact integer sum's
    for i in (0, 5, 69):
        for j in (0, m - 1):
            assert int(y[i, j] / (gx[i, 0] * gw[j])) == sum(
                int(a) * int(b) for a, b in zip(xi[i], wi[:, j], strict=True)
            )
    # the documented bound: x and w rounded to bx and bw bits below their largest, the result once
    ref = x.astype(np.float64) @ w.astype(np.float64)
    ax, aw = np.abs(x).astype(np.float64), np.abs(w).astype(np.float64)
    tol = 2.0**-g.bx * ax.max(axis=1, keepdims=True) * aw.sum(axis=0) + 2.0**-g.bw * aw.max(axis=0) * ax.sum(
        axis=1, keepdims=True
    )
    ok = np.arange(70) != 4  # row 4 overflows float32 (its bits are still its own: below)
    assert np.all((np.abs(block - ref) <= tol + 2.0**-24 * np.abs(ref))[ok])
    for rows in (1, 4, 12, 64, 200):
        for place in (0, 5, 6, rows - 1):
            if 0 <= place < rows:
                other = rng.standard_normal((rows, k_in)).astype(np.float32)
                for i in (0, 1, 3, 4, 5, 17, 69):
                    other[place] = x[i]
                    got = np.empty((rows, m), np.float32)
                    with np.errstate(over="ignore"):
                        g(other, got)
                    np.testing.assert_array_equal(got[place].view(np.int32), block[i].view(np.int32))


@pytest.mark.parametrize("n_actions", [2, 3, 5])
def test_the_folded_dueling_head_gives_the_dueling_logits(rng, n_actions):
    """fold_dueling: one GEMM with the folded weights gives the logits of dueling_forward over the head's
    GEMM, within float32 rounding (the walk's block Q defines its own bits with it)."""
    from cudarl.policy import fold_dueling
    from cudarl.reference.nn import dueling_forward

    n, k = 48, 51
    w = rng.standard_normal((n, (n_actions + 1) * k)).astype(np.float32)
    b = rng.standard_normal((n_actions + 1) * k).astype(np.float32)
    h = rng.standard_normal((130, n)).astype(np.float32)
    want = np.empty((130, n_actions, k), np.float32)
    dueling_forward((h.astype(np.float64) @ w + b).astype(np.float32), want)
    w_f, b_f = np.empty((n, n_actions * k), np.float32), np.empty(n_actions * k, np.float32)
    fold_dueling(w, b, n_actions, w_f, b_f)
    got = (h @ w_f + b_f).reshape(130, n_actions, k)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


class FnRows:
    """A block Q of a function of observations, with the interface of RowExactQ."""

    row_cost = 1 / 30

    def __init__(self, fn, max_rows: int):
        self.fn, self.max_rows = fn, max_rows

    def begin(self):
        pass

    def of_states(self, rows, windows):
        return self(windows.of(rows))

    def __call__(self, obs):
        return self.fn(obs)


def fixed_planner(depth: int, hold_max: int):
    """A WalkPlanner that always plans blocks of ``(depth, hold_max)`` (fewer bars at the episode's end)."""
    import cudarl.policy as pol

    class Fixed(pol.WalkPlanner):
        def next(self, left):
            return min(depth, left), hold_max

    return Fixed


@pytest.mark.parametrize("rule", ["holds", "moves_on_hold", "alternates", "nan", "mixed"])
def test_the_block_walk_takes_the_bar_by_bar_actions(monkeypatch, rule):
    """Positions held for long (past the largest block), moved by the hold feature, flipped at every bar,
    Q-values with NaN (the first maximum by a strict > scan, as env.act) and runs of every length: the
    walk by blocks of bars (every block shape, from one bar to a whole tree, and the planner's), the walk
    bar by bar and the env's own act and step agree."""
    import cudarl.policy as pol
    from cudarl.prepare import prepare_data

    cfg = small(env={"hold_cap": 5, "cost_bps": 1.0})
    prepared = prepare_data(cfg)
    env = pol.eval_env(prepared, prepared.splits.val, cfg.env, "numpy")
    f = env.n_features

    def q_rows(obs):
        x, pos, hold = obs[:, 0], obs[:, f], obs[:, f + 1]
        zero = np.zeros_like(x)
        q = {
            "holds": [zero, zero, zero + 1],
            "moves_on_hold": [hold + 0.1 * x, zero + 0.1, 0.6 - hold],
            "alternates": [pos, zero, -pos],
            "nan": [np.where(x > 0.8, np.nan, hold + 0.1 * x), np.where(x < -0.5, np.nan, zero + 0.1), 0.6 - hold],
            "mixed": [np.sin(37 * x + 3 * pos + 2 * hold), np.sin(11 * x - pos) * 0.9, np.cos(5 * x + 7 * hold + pos)],
        }[rule]
        return np.stack(q, axis=1).astype(np.float32)

    def q_values(obs, out):
        out[...] = q_rows(obs)

    shapes = [(1, 0), (2, 0), (4, 1), (8, 3), (16, 16), None]  # None: the planner's own
    for margin in (0.05, 0.0):  # the no-trade margin, added to the held action's Q in every walk
        want = greedy_actions(env, q_values, margin=margin)
        np.testing.assert_array_equal(want, greedy_actions(env, q_values, walk_on_host=False, margin=margin))
        for shape in shapes:
            with monkeypatch.context() as m:
                if shape is not None:
                    m.setattr(pol, "WalkPlanner", fixed_planner(*shape))
                by_block = greedy_actions(env, q_values, margin=margin, q_rows=FnRows(q_rows, 512))
            np.testing.assert_array_equal(by_block, want, err_msg=f"blocks of {shape}, margin {margin}")
    moves = int(np.count_nonzero(np.diff(cfg.env.position_levels()[want])))
    assert moves == 0 if rule == "holds" else moves > len(want) // 8


def test_a_block_tree_holds_every_state_a_walk_can_reach():
    """block_tree(depth, hold_max, L): the held path and, for each bar, every (level, hold <= hold_max) a
    walk that moved inside the block can be in, each once, found by its index; no other rows."""

    from cudarl.policy import block_tree, tree_rows

    levels = 3
    for depth, hold_max in [(1, 0), (4, 0), (5, 2), (6, 6), (8, 3)]:
        bar, level, hold, index = block_tree(depth, hold_max, levels)
        assert len(bar) == tree_rows(depth, hold_max, levels)
        rows = set(zip(bar.tolist(), level.tolist(), hold.tolist(), strict=True))
        assert len(rows) == len(bar)
        # the walk's states bar by bar: (-1, 0) the block's first position held, or (level, hold); an
        # action holds the position or moves to another level (from the held path: to any level)
        states, reach = {(-1, 0)}, set()
        for i in range(depth):
            reach |= {(i, lv, h) for lv, h in states if lv < 0 or h <= hold_max}
            states = {(lv, h + 1 if lv >= 0 else 0) for lv, h in states} | {
                (c, 1) for lv, _ in states for c in range(levels) if c != lv
            }
        assert rows == reach, (depth, hold_max)
        for b, lv, h in rows - {(i, -1, 0) for i in range(depth)}:
            r = index[b, h, lv]
            assert (bar[r], level[r], hold[r]) == (b, lv, h)


def test_the_walk_planner_fits_blocks_to_the_walks_moves():
    """A walk that never moves gets blocks that double up to the most rows, with no tree; one that moves
    at every bar, trees of short holds; both within max_rows; only short episodes' ends cut a block."""
    from cudarl.policy import WalkPlanner, tree_rows

    p = WalkPlanner(max_rows=1024, row_cost=0.0, n_levels=3)
    depths = []
    for _ in range(12):
        d, h = p.next(10**6)
        p.note_held()
        depths.append((d, h))
    assert (
        depths[0] == (4, 0)
        and depths[-1] == (1024, 0)
        and all(b[0] >= a[0] for a, b in zip(depths[:-1], depths[1:], strict=True))
    )
    churn = WalkPlanner(max_rows=4096, row_cost=0.0, n_levels=3)
    for _ in range(64):
        churn.note_move(1)
    for _ in range(20):
        d, h = churn.next(10**6)
        assert tree_rows(d, h, 3) <= 4096
    assert h >= 1 and d >= 16  # a tree of short holds covers many moves in one forward
    assert churn.next(3)[0] == 3
    assert WalkPlanner(max_rows=1, row_cost=0.0, n_levels=3).next(100) == (1, 0)


def test_evaluating_a_policy_imports_no_scipy_signal(tmp_path, rng):
    """The features of a short series need no scipy.signal, and the statistics no scipy.stats (each most
    of a second of start-up); nor does a policy's evaluation import the trainer or what only training
    needs (the agent, the replay: ~15 ms more of start-up)."""
    import subprocess
    import sys
    from pathlib import Path

    from cudarl.prepare import prepare_data

    path = tmp_path / "p.safetensors"
    random_policy(rng, normaliser=prepare_data(small()).normaliser).state.save(path)
    code = (
        "import sys, cudarl; p = cudarl.load_policy(sys.argv[1], device='cpu'); p.evaluate(split='test'); "
        "print(sorted(m for m in sys.modules if m.startswith(('scipy.signal', 'scipy.stats')) "
        "or m in ('cudarl.trainer', 'cudarl.agent', 'cudarl.replay')))"
    )
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
