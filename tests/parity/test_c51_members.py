"""The C51 family's member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages",
stage 4): ``targets_loss``, ``targets_loss_popart`` and ``n_step`` over P members in one launch give
member ``i`` the bits of the single op on member ``i``'s rows and scalars.

Every member draws its own data (va rows, actions, weights, rewards, discounts, PopArt statistics and
step size, gamma, and in some cases its own support), so a launch that read member ``j``'s rows or
scalars for member ``i`` would fail; the CPU tests also check that the members' results do differ.

CPU: the twins (they loop over members: this holds by construction, the test keeps it so); the
launchers' refusals. GPU: each kernel variant at P = 1, 3, 64 against single launches on copies of each
member's inputs (bitwise; entries padded to 256 bytes as ``params.stacked_zeros`` lays them, or packed),
and the stacked launch against the stacked twin within the single op's tolerances.
"""

import numpy as np
import pytest
from c51_cases import empty, gpu_inputs

from cudarl.reference import c51 as ref
from cudarl.reference import popart as pref
from cudarl.testing import assert_bitwise, assert_parity

#: The inputs of targets_loss (and their ranks without the member axis), in the launcher's order.
INPUTS = ("va_tm1", "va_on", "va_tg", "a", "w", "z", "r", "d")
#: The outputs: name -> (shape without the member axis as a function of B, A, K; dtype).
OUTPUTS = {
    "probs": (lambda B, A, K: (B, K), np.float32),
    "a_star": (lambda B, A, K: (B,), np.int32),
    "m": (lambda B, A, K: (B, K), np.float32),
    "per": (lambda B, A, K: (B,), np.float32),
    "prio": (lambda B, A, K: (B,), np.float32),
    "dva": (lambda B, A, K: (B, (1 + A) * K), np.float32),
}
POPART_OUTPUTS = {"y": (lambda B, A, K: (B,), np.float32), "r_norm": (lambda B, A, K: (B,), np.float32)}


def _host(rng, P: int, B: int, A: int, K: int, own_support: bool) -> dict:
    """P members' inputs, each drawn apart: ``[P, ...]`` arrays (``z`` ``[P, K]`` with ``own_support``,
    each member its own range; else ``[K]``, shared), PopArt ``state [P, 8]`` and ``beta [P]``."""
    h = {k: [] for k in (*INPUTS, "state")}
    for i in range(P):
        z, _, _, r, d, a, w = gpu_inputs(rng, B, A, K)
        for k, v in (("z", z * (1 + 0.25 * i)), ("r", r), ("d", d), ("a", a), ("w", w)):
            h[k].append(v)
        for k in ("va_tm1", "va_on", "va_tg"):
            h[k].append((rng.normal(size=(B, (1 + A) * K)) * rng.uniform(0.5, 2.0)).astype(np.float32))
        y = rng.normal(rng.uniform(-3, 3), rng.uniform(0.5, 4), 64).astype(np.float32)
        h["state"].append(pref.update(y, pref.init_state(10 / 3), beta=rng.uniform(0.05, 0.3)))
    out = {k: np.stack(v) for k, v in h.items()}
    if not own_support:
        out["z"] = out["z"][0]
    out["beta"] = rng.uniform(0.01, 0.2, P).astype(np.float32)
    return out


def _member(h: dict, i: int) -> dict:
    """Member ``i``'s inputs in the single op's form (copies; ``beta`` a ``[1]`` array)."""
    one = {k: v[i].copy() for k, v in h.items() if k not in ("z", "beta")}
    one["z"] = (h["z"][i] if h["z"].ndim == 2 else h["z"]).copy()
    one["beta"] = h["beta"][i : i + 1].copy()
    return one


def _twin(h: dict, popart: bool) -> tuple:
    args = tuple(h[k] for k in INPUTS)
    return ref.targets_loss_popart(*args, h["state"], h["beta"]) if popart else ref.targets_loss(*args)


# --- CPU: the twins ------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("popart", [False, True])
@pytest.mark.parametrize("own_support", [False, True])
def test_twin_member_axis_is_single_calls(rng, P, popart, own_support):
    B, A, K = 13, 3, 21
    h = _host(rng, P, B, A, K, own_support)
    h["a"][0, 2] = A  # an action out of range in member 0 only: NaN there, in no other member
    stacked = _twin(h, popart)
    for i in range(P):
        single = _twin(_member(h, i), popart)
        for n, (got, want) in enumerate(zip(stacked, single, strict=True)):
            assert_bitwise(np.asarray(got)[i], np.asarray(want), what=f"output {n}, member {i} of {P}")
    if P > 1:  # a member read from another member's inputs would show: no two members agree
        for n, got in enumerate(stacked):
            got = np.asarray(got)
            assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2]), f"output {n}"
        per = stacked[-4]  # loss_per
        assert np.isnan(per[0][2]) and not np.isnan(per[1:]).any()


def test_n_step_twin_member_axis_is_single_calls(rng):
    P, B, n = 3, 17, 4
    rewards = rng.uniform(-1, 1, (P, B, n)).astype(np.float32)
    terminal = (rng.random((P, B, n)) < 0.2).astype(np.float32)
    gamma = np.float32([0.9, 0.97, 0.995])
    r_t, d_t = ref.n_step(rewards, terminal, gamma)
    for i in range(P):
        want_r, want_d = ref.n_step(rewards[i], terminal[i], gamma[i])
        assert_bitwise(r_t[i], want_r, what=f"r_t member {i}")
        assert_bitwise(d_t[i], want_d, what=f"discount_t member {i}")
    assert not np.array_equal(d_t[0], d_t[1])


def test_losses_c51_targets_loss_takes_the_member_axis_on_numpy(rng):
    """``losses.c51_targets_loss`` on NumPy passes the axis to the twin; the PopArt state ``[P, 8]`` moves
    in place, member by member."""
    from cudarl import losses

    h = _host(rng, 3, 9, 4, 11, own_support=False)
    state = h["state"].copy()
    res = losses.c51_targets_loss(*(h[k] for k in INPUTS), popart_state=state, popart_beta=h["beta"])
    want = _twin(h, popart=True)
    assert_bitwise(res.dva, want[-1], what="dva")
    assert_bitwise(res.loss, want[-3], what="loss [P]")
    assert_bitwise(state, want[5], what="PopArt state [P, 8]")
    out = losses.C51TargetsLoss.empty(np, 9, 4, 11, popart=True, members=3)
    assert out.dva.shape == (3, 9, 55) and out.loss.shape == (3,) and out.scratch.shape == (3, 8)
    again = losses.c51_targets_loss(
        *(h[k] for k in INPUTS), popart_state=h["state"].copy(), popart_beta=h["beta"], out=out
    )
    assert again is out
    assert_bitwise(out.dva, want[-1], what="dva into out")
    assert_bitwise(out.loss, want[-3], what="loss into out")


def _np_args(P: int, B: int, A: int, K: int, popart: bool) -> dict:
    """NumPy stand-ins for the launcher's arguments with the member axis (its checks run on the host)."""
    z = np.zeros
    a = dict(
        va_tm1=z((P, B, (1 + A) * K), np.float32),
        va_online_tp1=z((P, B, (1 + A) * K), np.float32),
        va_target_tp1=z((P, B, (1 + A) * K), np.float32),
        a_tm1=z((P, B), np.int32),
        weights=z((P, B), np.float32),
        support=z(K, np.float32),
        r_t=z((P, B), np.float32),
        discount_t=z((P, B), np.float32),
    )
    if popart:
        a.update(state=z((P, 8), np.float32), beta=z(P, np.float32), out_y=z((P, B), np.float32))
        a.update(out_r_norm=z((P, B), np.float32))
    a.update(
        out_probs=z((P, B, K), np.float32),
        out_a_star=z((P, B), np.int32),
        out_target=z((P, B, K), np.float32),
        out_loss_per=z((P, B), np.float32),
        out_loss=z(P, np.float32),
        out_priority=z((P, B), np.float32),
        out_dva=z((P, B, (1 + A) * K), np.float32),
        done=z(P, np.uint32),
    )
    if popart:
        a.update(barrier=z(P, np.uint32), scratch=z((P, 8), np.float32))
    return a


def test_launchers_refuse_a_broken_member_axis(monkeypatch):
    """Every array with the member axis or none; each row family one stride, members not overlapping;
    the device scalars ``[P]``, the PopArt state ``[P, 8]``; more members than resident blocks take the
    form without the grid barrier (``targets_loss_popart_one_launch``), not a refusal."""
    from cudarl import kernels
    from cudarl.ops import c51 as ops

    P, B, A, K = 3, 5, 3, 11
    a = _np_args(P, B, A, K, False)
    with pytest.raises(ValueError, match="member axis or none"):
        ops.targets_loss(**dict(a, weights=a["weights"][0]))
    with pytest.raises(ValueError, match="one stride apart"):  # probs packed, target padded: two strides
        ops.targets_loss(**dict(a, out_target=np.zeros((P, B * K + 64), np.float32)[:, : B * K].reshape(P, B, K)))
    with pytest.raises(ValueError, match="one stride apart"):  # every member on one row
        ops.targets_loss(**dict(a, out_loss_per=np.broadcast_to(np.zeros(B, np.float32), (P, B))))
    with pytest.raises(ValueError, match=r"out_loss has shape \(1,\), expected \[3\]"):
        ops.targets_loss(**dict(a, out_loss=np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match=r"done has shape \(1,\), expected \[3\]"):
        ops.targets_loss(**dict(a, done=np.zeros(1, np.uint32)))
    b = _np_args(P, B, A, K, True)
    with pytest.raises(ValueError, match=r"state has shape \(8,\), expected \[3, 8\]"):
        ops.targets_loss_popart(**dict(b, state=np.zeros(8, np.float32)))
    with pytest.raises(ValueError, match=r"beta has shape \(1,\), expected \[3\]"):
        ops.targets_loss_popart(**dict(b, beta=np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match="out_y and out_r_norm"):
        ops.targets_loss_popart(**dict(b, out_y=np.zeros(B, np.float32), out_r_norm=np.zeros(B, np.float32)))
    monkeypatch.setattr(kernels, "resident_grid_limit", lambda: 2)
    # more members than resident blocks: no refusal, the launcher picks the two launches without the barrier
    assert ops.targets_loss_popart_one_launch(1, B) and not ops.targets_loss_popart_one_launch(P, B)
    with pytest.raises(ValueError, match=r"gamma has shape \(1,\), expected \[3\]"):
        ops.n_step(
            np.zeros((P, B, 2), np.float32),
            np.zeros((P, B, 2), np.float32),
            np.zeros(1, np.float32),
            np.zeros((P, B), np.float32),
            np.zeros((P, B), np.float32),
        )


# --- GPU -------------------------------------------------------------------------------------------------
#: (B, A, K) of the GPU tests: each kernel variant (ops.tl_variant): regs3 at one sample and at the
#: reference step's shape, regs4, regs8, the generic path by actions and by atoms.
MEMBER_CASES = [(1, 3, 11), (512, 3, 51), (40, 4, 40), (20, 6, 17), (64, 9, 51), (70, 3, 65)]


def _device(cp, h: dict, P: int, popart: bool, padded: bool) -> tuple[dict, dict]:
    """The stacked launch's inputs and poisoned outputs on the device: rows ``[P, ...]`` padded to 256-byte
    member strides (``params.stacked_zeros``) or packed; the scalars ``[P]`` and states ``[P, 8]``."""
    from cudarl.nn.params import stacked_zeros
    from cudarl.testing import poison

    def rows(shape, dtype):
        return stacked_zeros(cp, P, shape, dtype) if padded else cp.zeros((P, *shape), dtype)

    dev = {}
    for k in INPUTS:
        v = h[k]
        if k == "z" and v.ndim == 1:
            dev[k] = cp.asarray(v)
            continue
        dev[k] = rows(v.shape[1:], v.dtype)
        dev[k][...] = cp.asarray(v)
    dev.update(state=cp.asarray(h["state"]), beta=cp.asarray(h["beta"]))
    dev.update(done=cp.zeros(P, np.uint32), barrier=cp.zeros(P, np.uint32), scratch=empty(cp, (P, 8)))
    B, K = h["a"].shape[1], h["z"].shape[-1]
    A = h["va_tm1"].shape[2] // K - 1
    outs = {}
    for k, (shape, dtype) in {**OUTPUTS, **(POPART_OUTPUTS if popart else {})}.items():
        outs[k] = rows(shape(B, A, K), dtype)
        poison(outs[k])
    outs["loss"] = empty(cp, (P,))
    return dev, outs


def _single_device(cp, one: dict, popart: bool) -> tuple[dict, dict]:
    B, K = one["a"].shape[0], one["z"].shape[0]
    A = one["va_tm1"].shape[1] // K - 1
    dev = {k: cp.asarray(v) for k, v in one.items()}
    dev.update(done=cp.zeros(1, np.uint32), barrier=cp.zeros(1, np.uint32), scratch=empty(cp, (8,)))
    outs = {k: empty(cp, shape(B, A, K), dtype) for k, (shape, dtype) in OUTPUTS.items()}
    if popart:
        outs.update({k: empty(cp, shape(B, A, K), dtype) for k, (shape, dtype) in POPART_OUTPUTS.items()})
    outs["loss"] = empty(cp, (1,))
    return dev, outs


def _launch(dev: dict, outs: dict, popart: bool, grid_barrier) -> None:
    from cudarl.ops import c51 as ops

    args = tuple(dev[k] for k in INPUTS)
    res = (outs["probs"], outs["a_star"], outs["m"], outs["per"], outs["loss"], outs["prio"], outs["dva"])
    if not popart:
        ops.targets_loss(*args, *res, dev["done"])
        return
    ops.targets_loss_popart(
        *args,
        dev["state"],
        dev["beta"],
        outs["y"],
        outs["r_norm"],
        *res,
        dev["done"],
        dev["barrier"],
        dev["scratch"],
        grid_barrier=grid_barrier,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("B,A,K", MEMBER_CASES)
@pytest.mark.parametrize("popart,grid_barrier", [(False, True), (True, True), (True, "always"), (True, False)])
@pytest.mark.parametrize("padded,own_support", [(True, False), (False, True)])
def test_gpu_targets_loss_member_is_a_single_launch(cp, rng, P, B, A, K, popart, grid_barrier, padded, own_support):
    """Member ``i`` of one stacked launch equals one single launch on copies of member ``i``'s inputs:
    every output, the PopArt state, and the counters left 0."""
    from cudarl.kernels import resident_grid_limit

    if popart and grid_barrier == "always" and P > resident_grid_limit():
        pytest.skip(f"{P} members need more resident blocks than this GPU has")
    h = _host(rng, P, B, A, K, own_support)
    if B >= 7:
        h["a"][P - 1, 3] = A  # an action out of range in the last member only
    dev, outs = _device(cp, h, P, popart, padded)
    _launch(dev, outs, popart, grid_barrier)
    for i in range(P):
        d1, o1 = _single_device(cp, _member(h, i), popart)
        _launch(d1, o1, popart, grid_barrier)
        cp.cuda.get_current_stream().synchronize()
        for k in o1:
            got = outs[k][i : i + 1] if k == "loss" else outs[k][i]
            assert_bitwise(got, o1[k], what=f"{k}: member {i} of {P}")
        assert_bitwise(dev["state"][i], d1["state"], what=f"PopArt state: member {i} of {P}")
    assert not dev["done"].any() and not dev["barrier"].any(), "every member's counters must be left at 0"
    if popart:
        assert not np.array_equal(dev["state"].get(), h["state"]), "the PopArt statistics did not move"


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
def test_gpu_targets_loss_members_match_the_twin(cp, rng, popart):
    """The stacked launch against the stacked twin, with the single op's tolerances
    (test_c51.py::test_gpu_targets_loss_matches_the_twin)."""
    P, B, A, K = 3, 512, 3, 51
    h = _host(rng, P, B, A, K, own_support=True)
    dev, outs = _device(cp, h, P, popart, padded=True)
    _launch(dev, outs, popart, grid_barrier=True)
    cp.cuda.get_current_stream().synchronize()
    want = _twin(h, popart)
    if popart:
        m, probs, a_star, y, r_norm, state, per, loss, prio, dva = want
        assert_parity(outs["y"], y, what="y")
        assert_parity(outs["r_norm"], r_norm, what="normalised rewards")
        np.testing.assert_allclose(dev["state"].get(), state, rtol=1e-5, atol=1e-6)
    else:
        m, probs, a_star, per, loss, prio, dva = want
    assert_bitwise(outs["a_star"], a_star, what="a* (no near-ties in these draws)")
    for k, v in (("probs", probs), ("m", m), ("per", per), ("prio", prio), ("dva", dva)):
        assert_parity(outs[k], v, what=k)
    np.testing.assert_allclose(outs["loss"].get(), loss, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_n_step_member_is_a_single_launch(cp, rng, P):
    from cudarl.ops import c51 as ops

    B, n = 1000, 3
    rewards = rng.uniform(-1, 1, (P, B, n)).astype(np.float32)
    terminal = (rng.random((P, B, n)) < 0.2).astype(np.float32)
    gamma = rng.uniform(0.9, 0.999, P).astype(np.float32)
    r_t, d_t = empty(cp, (P, B)), empty(cp, (P, B))
    ops.n_step(cp.asarray(rewards), cp.asarray(terminal), cp.asarray(gamma), r_t, d_t)
    for i in range(P):
        r1, d1 = empty(cp, (B,)), empty(cp, (B,))
        ops.n_step(cp.asarray(rewards[i]), cp.asarray(terminal[i]), cp.asarray(gamma[i : i + 1]), r1, d1)
        assert_bitwise(r_t[i], r1, what=f"r_t member {i}")
        assert_bitwise(d_t[i], d1, what=f"discount_t member {i}")
    want_r, want_d = ref.n_step(rewards, terminal, gamma)
    assert_parity(r_t, want_r, what="n-step reward")
    assert_parity(d_t, want_d, what="n-step discount")


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
def test_gpu_losses_c51_targets_loss_takes_the_member_axis(cp, rng, popart):
    """``losses.c51_targets_loss`` with the member axis and no ``out`` allocates ``[P, ...]`` buffers
    (``C51TargetsLoss.empty(members=P)``) and gives the stacked launch's bits."""
    from cudarl import losses

    P, B, A, K = 3, 64, 3, 51
    h = _host(rng, P, B, A, K, own_support=False)
    dev, outs = _device(cp, h, P, popart, padded=False)
    _launch(dev, outs, popart, grid_barrier=True)
    state = cp.asarray(h["state"])
    kw = dict(popart_state=state, popart_beta=dev["beta"]) if popart else {}
    res = losses.c51_targets_loss(*(dev[k] for k in INPUTS), **kw)
    cp.cuda.get_current_stream().synchronize()
    for k, got in (
        ("m", res.target),
        ("probs", res.probs),
        ("per", res.loss_per),
        ("dva", res.dva),
        ("loss", res.loss),
    ):
        assert_bitwise(got, outs[k], what=k)
    if popart:
        assert_bitwise(state, dev["state"], what="PopArt state")
