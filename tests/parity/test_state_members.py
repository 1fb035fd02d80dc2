"""Per-member state of the stacked objects (issue 23's agent axis: docs/perf-notes.md "The agent axis, in
stages"): each object's ``member_state_dict(i)`` is the single object's ``state_dict()`` after the same
operations (same keys, same arrays bit for bit), ``load_member_state_dict(i, single state)`` puts a single
object's state into member ``i`` alone, and ``state_dict`` / ``load_state_dict`` (through a checkpoint
file) resume every member. The stacked-vs-single setups are the members' own parity tests'
(``test_optim_members``, ``test_popart_members``, ``test_replay_members``, ``test_collect_members``).

CPU: NumPy at P = 1 and 3. GPU (marked): the replay, the env and the optimiser at P = 3 and 64.
"""

import numpy as np
import pytest
from test_collect_members import _env_objects, _env_stream
from test_optim_members import _objects as _optim_objects
from test_optim_members import _step as _optim_step
from test_replay_members import _one_batch, _stream_equals_singles

from cudarl import checkpoint as ckpt
from cudarl.backend import to_numpy
from cudarl.nn import QNetwork, StackedQNetwork
from cudarl.pinned import DeviceScalars, MemberScalars
from cudarl.popart import PopArt, StackedPopArt
from cudarl.replay import Batch
from cudarl.stacked_replay import StackedPrioritizedReplay
from cudarl.testing import assert_bitwise, assert_state_bitwise


def _through_file(tmp_path, state: dict) -> dict:
    state, _ = ckpt.load(ckpt.save(tmp_path / "state.npz", {"s": state}))
    return state["s"]


def _untouched(before: dict, after: dict, i: int, P: int, what: str) -> None:
    """Every member but ``i`` of two stacked ``member_state_dict`` lists is the same."""
    for j in range(P):
        if j != i:
            assert_state_bitwise(after[j], before[j], what=f"{what}: member {j} after loading member {i}")


# --- device scalars ---------------------------------------------------------------------------------------
def test_member_scalars_member_state_is_device_scalars_state():
    spec = {"step": np.int64, "lr": np.float32, "seed": np.uint64, "bc": np.float64}
    values = {"step": [3, 0, 9], "lr": [1e-3, 2.5e-4, 7e-5], "seed": [2**64 - 1, 5, 0], "bc": [0.1, 0.2, 0.3]}
    stacked = MemberScalars(spec, 3, np)
    for k, v in values.items():
        stacked.set(k, v)
    for i in range(3):
        one = DeviceScalars(spec, np, initial={k: v[i] for k, v in values.items()})
        assert_state_bitwise(stacked.member_state_dict(i), one.state_dict(), what=f"member {i}")
    before = [stacked.member_state_dict(j) for j in range(3)]
    single = DeviceScalars(spec, np, initial={"step": 41, "lr": 0.5, "seed": 7, "bc": 0.75})
    stacked.load_member_state_dict(1, single.state_dict())
    assert_state_bitwise(stacked.member_state_dict(1), single.state_dict(), what="loaded member")
    _untouched(before, [stacked.member_state_dict(j) for j in range(3)], 1, 3, "scalars")
    with pytest.raises(KeyError, match="missing"):
        stacked.load_member_state_dict(0, {"step": 1})
    for bad in (3, -1, True, 1.0):
        with pytest.raises(IndexError, match="out of range"):
            stacked.member_state_dict(bad)


# --- optimiser ----------------------------------------------------------------------------------------------
def _optimiser_members(tmp_path, P, fused, xp=np, sync=lambda: None):
    """StackedAdam and StackedSoftUpdate against P single ones over 6 steps: member states equal the singles'
    after each; a fresh pair loads one single's state as member 0 and the whole state through a file, and
    steps on with the same bits."""
    stacked, singles = _optim_objects(xp, P, 257, seed=11)
    rng = np.random.default_rng(12)

    def grads(k):
        return (rng.standard_normal((P, 257)) * (0.2 + k % 3)).astype(np.float32)

    for k in range(6):
        g = grads(k)
        stacked["g"][...] = xp.asarray(g)
        _optim_step(stacked, fused)
        for i, s in enumerate(singles):
            s["g"][...] = xp.asarray(g[i])
            _optim_step(s, fused)
        sync()
        for i, s in enumerate(singles):
            assert_state_bitwise(stacked["adam"].member_state_dict(i), s["adam"].state_dict(), what=f"{k}: adam {i}")
            assert_state_bitwise(stacked["soft"].member_state_dict(i), s["soft"].state_dict(), what=f"{k}: soft {i}")
    fresh, _ = _optim_objects(xp, P, 257, seed=11)  # the same decay mask (the network's, not state)
    before = [fresh["adam"].member_state_dict(j) for j in range(P)]
    fresh["adam"].load_member_state_dict(0, _through_file(tmp_path, singles[0]["adam"].state_dict()))
    fresh["soft"].load_member_state_dict(0, singles[0]["soft"].state_dict())
    assert_state_bitwise(fresh["adam"].member_state_dict(0), singles[0]["adam"].state_dict(), what="loaded adam")
    assert_state_bitwise(fresh["soft"].member_state_dict(0), singles[0]["soft"].state_dict(), what="loaded soft")
    _untouched(before, [fresh["adam"].member_state_dict(j) for j in range(P)], 0, P, "adam")
    fresh["adam"].load_state_dict(_through_file(tmp_path, stacked["adam"].state_dict()))
    fresh["soft"].load_state_dict(_through_file(tmp_path, stacked["soft"].state_dict()))
    g = grads(6)
    for o in (stacked, fresh):
        o["g"][...] = xp.asarray(g)
    fresh["p"][...], fresh["target"][...] = stacked["p"], stacked["target"]  # the networks' own checkpoints
    for o in (stacked, fresh):
        _optim_step(o, fused)
    sync()
    for k in ("p", "target"):
        assert_bitwise(fresh[k], stacked[k], what=f"resumed {k}")
    assert_state_bitwise(fresh["adam"].state_dict(), stacked["adam"].state_dict(), what="resumed adam")
    assert_state_bitwise(fresh["soft"].state_dict(), stacked["soft"].state_dict(), what="resumed soft")
    with pytest.raises(ValueError, match="shape"):
        fresh["adam"].load_member_state_dict(0, {**singles[0]["adam"].state_dict(), "m": np.zeros(3)})


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("fused", [True, False])
def test_optimiser_members_are_single_states(tmp_path, P, fused):
    _optimiser_members(tmp_path, P, fused)


# --- PopArt ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
def test_popart_members_are_single_states(tmp_path, P):
    rng = np.random.default_rng(P)
    betas, scales = rng.uniform(0.05, 0.3, P), rng.uniform(2, 20, P)
    stacked = StackedPopArt(P, beta=betas, scale=scales, xp=np)
    singles = [PopArt(beta=float(betas[i]), scale=float(scales[i]), xp=np) for i in range(P)]
    for t in range(3):
        y = (rng.normal(size=(P, 29)) * rng.uniform(1, 5, (P, 1)) + t).astype(np.float32)
        stacked.update(y)
        for i, pa in enumerate(singles):
            pa.update(y[i].copy())
        for i, pa in enumerate(singles):
            assert_state_bitwise(stacked.member_state_dict(i), pa.state_dict(), what=f"update {t}: member {i}")
    singles[-1].freeze()
    fresh = StackedPopArt(P, beta=0.5, scale=1.0, xp=np)
    before = [fresh.member_state_dict(j) for j in range(P)]
    fresh.load_member_state_dict(P - 1, _through_file(tmp_path, singles[-1].state_dict()))
    assert_state_bitwise(fresh.member_state_dict(P - 1), singles[-1].state_dict(), what="loaded member")
    _untouched(before, [fresh.member_state_dict(j) for j in range(P)], P - 1, P, "PopArt")
    assert fresh.frozen == (P == 1)
    fresh.load_state_dict(_through_file(tmp_path, stacked.state_dict()))
    assert_state_bitwise(fresh.state_dict(), stacked.state_dict(), what="whole state")
    with pytest.raises(ValueError, match="sigma_min"):
        fresh.load_member_state_dict(0, {**singles[0].state_dict(), "sigma_min": 1.0})


# --- network ----------------------------------------------------------------------------------------------
def test_network_members_are_single_states(tmp_path):
    seeds = [4, 17, 2]
    stacked = StackedQNetwork(9, 3, members=3, hidden=(16, 8), atoms=11, seeds=seeds, max_batch=None)
    singles = [QNetwork(9, 3, hidden=(16, 8), atoms=11, seed=s, max_batch=None) for s in seeds]
    for i, one in enumerate(singles):
        assert_state_bitwise(stacked.member_state_dict(i), one.state_dict(), what=f"member {i}")
    other = QNetwork(9, 3, hidden=(16, 8), atoms=11, seed=99, max_batch=None)
    before = [stacked.member_state_dict(j) for j in range(3)]
    stacked.load_member_state_dict(1, _through_file(tmp_path, other.state_dict()))
    assert_state_bitwise(stacked.member_state_dict(1), other.state_dict(), what="loaded member")
    _untouched(before, [stacked.member_state_dict(j) for j in range(3)], 1, 3, "network")
    fresh = StackedQNetwork(9, 3, members=3, hidden=(16, 8), atoms=11, max_batch=None)
    fresh.load_state_dict(_through_file(tmp_path, stacked.state_dict()))
    assert_state_bitwise(fresh.state_dict(), stacked.state_dict(), what="whole state")
    wider = QNetwork(9, 3, hidden=(16, 9), atoms=11, max_batch=None)
    with pytest.raises(ValueError, match="layout"):
        stacked.load_member_state_dict(0, wider.state_dict())
    with pytest.raises(ValueError, match="spectral"):
        stacked.load_member_state_dict(0, {**other.state_dict(), "spectral": {"enc.0": {}}})
    with pytest.raises(ValueError, match="shape"):
        stacked.load_state_dict(other.state_dict())


# --- replay ---------------------------------------------------------------------------------------------
def _replay_members(tmp_path, xp, backend, rng, P, store_next, sync=lambda: None):
    """A stacked replay against P singles over a stream (``test_replay_members``): member states equal
    the singles'; a fresh one loads the file of the whole state, another each single's state as its
    member, and both then sample and update what the original does."""
    n = 1 if store_next else 3
    stacked, singles = _stream_equals_singles(xp, backend, rng, P, 300, n, 4, store_next, steps=3, sync=sync)
    for i, r in enumerate(singles):
        assert_state_bitwise(stacked.member_state_dict(i), r.state_dict(), what=f"member {i}")
    kw = dict(n_step=n, n_envs=4, store_next_obs=store_next, beta_steps=7, backend=backend)
    whole = StackedPrioritizedReplay(P, 300, 4, seeds=stacked.seeds, **kw)
    whole.load_state_dict(_through_file(tmp_path, stacked.state_dict()))
    members = StackedPrioritizedReplay(P, 300, 4, seeds=stacked.seeds, **kw)
    for i in reversed(range(P)):
        members.load_member_state_dict(i, _through_file(tmp_path, singles[i].state_dict()))
    B = 16
    td = xp.asarray(rng.standard_normal((P, B)).astype(np.float32))
    for r in (stacked, whole, members):
        assert_state_bitwise(r.state_dict(), stacked.state_dict(), what="loaded")
        assert_bitwise(r.bufs.tree, stacked.bufs.tree, what="sum trees")
    drawn = []
    for r in (stacked, whole, members):
        out = Batch(*(xp.zeros((P, *a.shape), a.dtype) for a in _one_batch(xp, B)))
        idx, w = r.sample(B, out=out)
        r.update_priorities(idx, td)
        sync()
        drawn.append((to_numpy(idx).copy(), to_numpy(w).copy(), r.state_dict()))
    for got in drawn[1:]:
        assert_bitwise(got[0], drawn[0][0], what="indices after the load")
        assert_bitwise(got[1], drawn[0][1], what="weights after the load")
        assert_state_bitwise(got[2], drawn[0][2], what="state after a sample and an update")
    return stacked, singles


@pytest.mark.parametrize("P, store_next", [(1, False), (3, False), (3, True)])
def test_replay_members_are_single_states(tmp_path, rng, P, store_next):
    _replay_members(tmp_path, np, "numpy", rng, P, store_next)


def test_replay_load_checks_every_member_before_writing(rng):
    stacked, singles = _stream_equals_singles(np, "numpy", rng, 3, 300, 3, 4, False, steps=2)
    other = StackedPrioritizedReplay(3, 300, 4, seeds=stacked.seeds, n_step=3, n_envs=4, beta_steps=7, backend="numpy")
    before = other.state_dict()
    bad = stacked.state_dict()
    bad["reward"][2, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        other.load_state_dict(bad)
    assert_state_bitwise(other.state_dict(), before, what="nothing written")
    bad = singles[1].state_dict()
    bad["capacity"] = 301
    with pytest.raises(ValueError, match="capacity"):
        other.load_member_state_dict(1, bad)
    with pytest.raises(ValueError, match="leading axis"):
        other.load_state_dict({**stacked.state_dict(), "added": np.int64(5)})
    with pytest.raises(ValueError, match="seeds"):
        other.load_state_dict({**stacked.state_dict(), "seeds": stacked.seeds[::-1]})


# --- env ----------------------------------------------------------------------------------------------------
def _env_members(tmp_path, xp, backend, rng, P, sync=lambda: None):
    """A stacked env against P singles (``test_collect_members``): member states equal the singles'; a
    fresh env loads the whole state, another each single's as its member; all three then act and step
    alike."""
    seed = int(rng.integers(1 << 30))  # the same market and seeds again for the fresh envs
    stacked, singles = _env_objects(backend, np.random.default_rng(seed), P, True, True)
    _env_stream(xp, stacked, singles, rng, steps=4)
    sync()
    for i, e in enumerate(singles):
        assert_state_bitwise(stacked.member_state_dict(i), e.state_dict(), what=f"member {i}")

    def make():
        return _env_objects(backend, np.random.default_rng(seed), P, True, True)[0]

    whole, members = make(), make()
    whole.load_state_dict(_through_file(tmp_path, stacked.state_dict()))
    for i in range(P):
        members.load_member_state_dict(i, _through_file(tmp_path, singles[i].state_dict()))
    q = xp.asarray(rng.standard_normal((P, stacked.n_envs, stacked.n_actions)).astype(np.float32))
    eps, gamma = xp.full(P, 0.3, np.float32), xp.full(P, 0.97, np.float32)
    for e in (whole, members):
        assert_bitwise(e.obs, stacked.obs, what="windows gathered at the load")
    after = []
    for e in (stacked, whole, members):
        out, disc = e.make_transitions(), xp.zeros((P, e.rows_per_step * e.n_envs), np.float32)
        e.act(q, eps)
        e.record_step(out, disc, gamma)
        sync()
        after.append(({k: to_numpy(v).copy() for k, v in out._asdict().items()}, e.state_dict(), to_numpy(e.obs)))
    for got in after[1:]:
        assert_state_bitwise(got[0], after[0][0], what="transitions after the load")
        assert_state_bitwise(got[1], after[0][1], what="state after a step")
        assert_bitwise(got[2], after[0][2], what="windows after a step")
    with pytest.raises(ValueError, match="seeds"):
        whole.load_state_dict({**stacked.state_dict(), "seeds": stacked.seeds + np.uint64(1)})
    with pytest.raises(ValueError, match="does not fit"):
        whole.load_member_state_dict(0, stacked.state_dict())


@pytest.mark.parametrize("P", [1, 3])
def test_env_members_are_single_states(tmp_path, rng, P):
    _env_members(tmp_path, np, "numpy", rng, P)


# --- GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
def test_gpu_replay_members_are_single_states(cp, tmp_path, rng, P):
    _replay_members(tmp_path, cp, "cupy", rng, P, False, sync=cp.cuda.Device().synchronize)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
def test_gpu_env_members_are_single_states(cp, tmp_path, rng, P):
    _env_members(tmp_path, cp, "cupy", rng, P, sync=cp.cuda.Device().synchronize)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_optimiser_members_are_single_states(cp, tmp_path, fused):
    _optimiser_members(tmp_path, 3, fused, xp=cp, sync=cp.cuda.Device().synchronize)
