"""PopArt's member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
each op of ``cuda_src/popart.cu`` over P members in one launch gives member ``i`` the bits of the single
op on member ``i``'s rows, statistics (``state [P, 8]``) and step size (``beta [P]``).

Every member draws its own targets, rewards, discounts, values, last layer, statistics and step size,
so a launch that read member ``j``'s for member ``i`` would fail; the CPU test also checks that the
members' results differ.

CPU: the twins (they loop over members), the launchers' refusals. GPU: each op at P = 1, 3, 64 against
single launches on copies of each member's inputs (bitwise; rows padded to 256 bytes as
``params.stacked_zeros`` lays them, or packed), and the stacked launch against the stacked twin within
the single ops' tolerances (test_popart.py).
"""

import numpy as np
import pytest

from cudarl.reference import popart as ref
from cudarl.testing import assert_bitwise, assert_parity

N_IN, N_OUT, X_SHAPE = 33, 5, (3, 7)
#: What each op writes (the launchers in place; the twins return them).
WRITES = {
    "update": ("state",),
    "update_normalize_rewards": ("state", "out"),
    "rescale": ("W", "b"),
    "normalize": ("out_x",),
    "denormalize": ("out_x",),
    "normalize_rewards": ("out",),
    "td_targets": ("out",),
}


def _host(rng, P: int, B: int) -> dict:
    """P members' inputs, each drawn apart (``[P, ...]``; ``state [P, 8]``, ``beta [P]``)."""
    f32 = np.float32
    state = []
    for _ in range(P):  # two updates: mu_prev, sigma_prev differ from mu, sigma (rescale is no identity)
        st = ref.init_state(50 / 3)
        for _ in range(2):
            st = ref.update(rng.normal(rng.uniform(-3, 3), rng.uniform(0.5, 4), 64), st, rng.uniform(0.05, 0.3))
        state.append(st)
    return dict(
        y=np.stack([rng.normal(rng.uniform(-10, 10), rng.uniform(1, 5), B) for _ in range(P)]).astype(f32),
        r=rng.uniform(-1, 1, (P, B)).astype(f32),
        d=rng.choice(f32([0.0, 0.9, 0.99]), (P, B)),
        v=rng.normal(size=(P, B)).astype(f32),
        x=rng.normal(size=(P, *X_SHAPE)).astype(f32),
        W=rng.normal(size=(P, N_IN, N_OUT)).astype(f32),
        b=rng.normal(size=(P, N_OUT)).astype(f32),
        state=np.stack(state).astype(f32),
        beta=rng.uniform(0.01, 0.3, P).astype(f32),
    )


def _twin(op: str, h: dict) -> dict:
    """The twin of ``op`` on ``h`` (the member axis or not): ``{name: value}`` of :data:`WRITES`."""
    if op == "update":
        return {"state": ref.update(h["y"], h["state"], h["beta"])}
    if op == "update_normalize_rewards":
        state, out = ref.update_normalize_rewards(h["y"], h["r"], h["d"], h["state"], h["beta"])
        return {"state": state, "out": out}
    if op == "rescale":
        W, b = ref.rescale(h["W"], h["b"], h["state"])
        return {"W": W, "b": b}
    if op in ("normalize", "denormalize"):
        return {"out_x": ref.normalize(h["x"], h["state"], inverse=op == "denormalize")}
    if op == "normalize_rewards":
        return {"out": ref.normalize_rewards(h["r"], h["d"], h["state"])}
    return {"out": ref.td_targets(h["r"], h["d"], h["v"], h["state"])}


def _member(h: dict, i: int) -> dict:
    return {k: v[i] for k, v in h.items()}


# --- CPU ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("op", list(WRITES))
def test_twins_member_axis_is_single_calls(rng, P, op):
    h = _host(rng, P, 19)
    stacked = _twin(op, h)
    for i in range(P):
        for k, want in _twin(op, _member(h, i)).items():
            assert_bitwise(stacked[k][i], np.asarray(want), what=f"{op} {k}: member {i} of {P}")
    if op == "rescale":
        assert not np.array_equal(stacked["W"], h["W"]), "the statistics moved: rescale must change W"
    if P > 1:  # a member read from another's inputs would show: no two members agree
        for k, got in stacked.items():
            assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[2]), f"{op} {k}"


def test_launchers_refuse_a_broken_member_axis():
    from cudarl.ops import popart as ops

    P, B = 3, 5
    z = np.zeros
    with pytest.raises(ValueError, match=r"state has shape \(8,\), expected \[3, 8\]"):
        ops.update(z((P, B), np.float32), z(8, np.float32), z(P, np.float32))
    with pytest.raises(ValueError, match=r"beta has shape \(1,\), expected \[3\]"):
        ops.update(z((P, B), np.float32), z((P, 8), np.float32), z(1, np.float32))
    with pytest.raises(ValueError, match="member axis or none"):
        ops.normalize_rewards(z((P, B), np.float32), z(B, np.float32), z((P, 8), np.float32), z((P, B), np.float32))
    with pytest.raises(ValueError, match="one stride apart"):
        r = z((P, 2 * B), np.float32)[:, :B]
        ops.td_targets(r, z((P, B), np.float32), z((P, B), np.float32), z((P, 8), np.float32), z((P, B), np.float32))
    flat = z((P, N_IN * N_OUT + N_OUT), np.float32)
    with pytest.raises(ValueError, match="one member stride apart"):
        ops.rescale(flat[:, : N_IN * N_OUT].reshape(P, N_IN, N_OUT), z((P, N_OUT), np.float32), z((P, 8), np.float32))


# --- GPU ----------------------------------------------------------------------------------------------
def _device(cp, h: dict, padded: bool) -> dict:
    """The stacked launch's buffers: rows ``[P, ...]`` padded or packed; W and b views of one ``[P, size]``
    parameter buffer (as a stacked network's last layer); outputs poisoned."""
    from cudarl.nn.params import member_view, stacked_zeros
    from cudarl.testing import poison

    P = h["y"].shape[0]

    def rows(v):
        a = stacked_zeros(cp, P, v.shape[1:], v.dtype) if padded else cp.zeros(v.shape, v.dtype)
        a[...] = cp.asarray(v)
        return a

    d = {k: rows(h[k]) for k in ("y", "r", "d", "v", "x")}
    size = N_IN * N_OUT + N_OUT
    flat = cp.zeros((P, -(-size // 64) * 64 if padded else size), np.float32)
    d["W"] = member_view(cp, flat, 0, (N_IN, N_OUT))
    d["b"] = member_view(cp, flat, N_IN * N_OUT, (N_OUT,))
    d["W"][...], d["b"][...] = cp.asarray(h["W"]), cp.asarray(h["b"])
    d.update(state=cp.asarray(h["state"]), beta=cp.asarray(h["beta"]))
    d["out"], d["out_x"] = rows(np.zeros_like(h["r"])), rows(np.zeros_like(h["x"]))
    poison(d["out"])
    poison(d["out_x"])
    return d


def _single(cp, h: dict, i: int) -> dict:
    from cudarl.testing import poison

    d = {k: cp.asarray(v[i]) for k, v in h.items() if k != "beta"}
    d["beta"] = cp.asarray(h["beta"][i : i + 1])
    d["out"], d["out_x"] = cp.empty_like(d["r"]), cp.empty_like(d["x"])
    poison(d["out"])
    poison(d["out_x"])
    return d


def _launch(op: str, d: dict) -> None:
    from cudarl.ops import popart as ops

    if op == "update":
        ops.update(d["y"], d["state"], d["beta"])
    elif op == "update_normalize_rewards":
        ops.update_normalize_rewards(d["y"], d["r"], d["d"], d["state"], d["beta"], d["out"])
    elif op == "rescale":
        ops.rescale(d["W"], d["b"], d["state"])
    elif op in ("normalize", "denormalize"):
        ops.normalize(d["x"], d["state"], d["out_x"], inverse=op == "denormalize")
    elif op == "normalize_rewards":
        ops.normalize_rewards(d["r"], d["d"], d["state"], d["out"])
    else:
        ops.td_targets(d["r"], d["d"], d["v"], d["state"], d["out"])


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("B", [1, 257, 4096])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("op", list(WRITES))
def test_gpu_member_is_a_single_launch(cp, rng, P, B, padded, op):
    h = _host(rng, P, B)
    d = _device(cp, h, padded)
    _launch(op, d)
    for i in range(P):
        one = _single(cp, h, i)
        _launch(op, one)
        for k in WRITES[op]:
            assert_bitwise(d[k][i], one[k], what=f"{op} {k}: member {i} of {P}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(WRITES))
def test_gpu_members_match_the_twin(cp, rng, op):
    h = _host(rng, 3, 256)
    d = _device(cp, h, padded=True)
    _launch(op, d)
    for k, want in _twin(op, h).items():
        if k == "state":
            np.testing.assert_allclose(d[k].get(), want, rtol=1e-5, atol=1e-6)
        else:
            assert_parity(d[k], np.asarray(want, np.float32), what=f"{op} {k}")


# --- the object -----------------------------------------------------------------------------------------
def _object_run(xp, P: int, seed: int) -> tuple[list, list]:
    """A :class:`StackedPopArt` and P single :class:`PopArt` objects (member ``i``'s beta and scale) fed the
    same calls, member ``i``'s rows to PopArt ``i``: ``(stacked snapshots, per-member snapshots)``, each a
    list of ``{name: host array}`` after every call."""
    from cudarl.backend import to_numpy
    from cudarl.nn.params import member_view
    from cudarl.popart import PopArt, StackedPopArt

    rng = np.random.default_rng(seed)
    betas, scales = rng.uniform(0.05, 0.3, P), rng.uniform(2, 20, P)
    stacked = StackedPopArt(P, beta=betas, scale=scales, xp=xp)
    singles = [PopArt(beta=float(betas[i]), scale=float(scales[i]), xp=xp) for i in range(P)]
    size = N_IN * N_OUT + N_OUT
    flat = xp.asarray(rng.normal(size=(P, size)).astype(np.float32))
    W, b = member_view(xp, flat, 0, (N_IN, N_OUT)), member_view(xp, flat, N_IN * N_OUT, (N_OUT,))
    W1 = [W[i].copy() for i in range(P)]
    b1 = [b[i].copy() for i in range(P)]
    snaps, snaps1 = [], [[] for _ in range(P)]

    def snap(out, outs1):
        snaps.append({"state": to_numpy(stacked.state).copy(), "W": to_numpy(W).copy(), "out": to_numpy(out).copy()})
        for i, pa in enumerate(singles):
            snaps1[i].append(
                {"state": to_numpy(pa.state).copy(), "W": to_numpy(W1[i]).copy(), "out": to_numpy(outs1[i])}
            )

    for step in range(4):
        B = 37
        y = xp.asarray((rng.normal(size=(P, B)) * rng.uniform(1, 5, (P, 1)) + 3 * step).astype(np.float32))
        r = xp.asarray(rng.uniform(-1, 1, (P, B)).astype(np.float32))
        d = xp.asarray(rng.choice(np.float32([0.0, 0.97]), (P, B)))
        if step % 2 == 0:
            stacked.update(y)
            for i, pa in enumerate(singles):
                pa.update(y[i].copy())
            out = stacked.td_targets(r, d, y)
            outs1 = [pa.td_targets(r[i].copy(), d[i].copy(), y[i].copy()) for i, pa in enumerate(singles)]
        else:
            out = stacked.update_normalize_rewards(y, r, d)
            outs1 = [pa.update_normalize_rewards(y[i].copy(), r[i].copy(), d[i].copy()) for i, pa in enumerate(singles)]
        stacked.rescale(W, b)
        for i, pa in enumerate(singles):
            pa.rescale(W1[i], b1[i])
        snap(out, outs1)
        snap(stacked.denormalize(y), [pa.denormalize(y[i].copy()) for i, pa in enumerate(singles)])
    stacked.freeze()
    assert stacked.frozen
    sd = stacked.state_dict()
    for i, pa in enumerate(singles):
        one = pa.state_dict()
        got = stacked.member_state_dict(i)
        assert_bitwise(got["state"], one["state"], what=f"state_dict member {i}")
        assert got["beta"] == 0.0 and got["sigma_min"] == one["sigma_min"]
    stacked.load_state_dict(sd)
    return snaps, snaps1


@pytest.mark.parametrize("P", [1, 3])
def test_stacked_popart_is_p_single_popart_objects(P):
    snaps, snaps1 = _object_run(np, P, seed=5)
    for t, s in enumerate(snaps):
        for i in range(P):
            for k in s:
                assert_bitwise(s[k][i], snaps1[i][t][k], what=f"call {t}: {k}, member {i} of {P}")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_stacked_popart_is_p_single_popart_objects(cp, P):
    snaps, snaps1 = _object_run(cp, P, seed=5)
    for t, s in enumerate(snaps):
        for i in range(P):
            for k in s:
                assert_bitwise(s[k][i], snaps1[i][t][k], what=f"call {t}: {k}, member {i} of {P}")
