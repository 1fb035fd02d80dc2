"""The Q statistics' member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages",
stage 4): ``per_sample`` and ``reduce`` over P members in one launch give member ``i`` the bits of the
single op on member ``i``'s rows.

Every member draws its own logits (its own concentration, so its own entropy and utilisation) and, in
some cases, its own support, so a launch that read member ``j`` for member ``i`` would fail; the CPU test
also checks that the members' statistics differ.

CPU: the twins (they loop over members), the launchers' refusals. GPU: both kernels at P = 1, 3, 64
against single launches on copies of each member's rows (bitwise; entries padded to 256 bytes or
packed), and the stacked launch against the stacked twin within the single op's tolerances.
"""

import numpy as np
import pytest

from cudarl.reference import qstats as ref
from cudarl.testing import assert_bitwise, assert_parity


def _host(rng, P: int, B: int, A: int, K: int, own_support: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(logits [P, B, A, K], z [P, K] or [K])``: member ``i``'s logits drawn at a scale of its own."""
    logits = np.stack([rng.normal(size=(B, A, K)) * rng.uniform(0.5, 4.0) for _ in range(P)]).astype(np.float32)
    z = np.stack([np.linspace(-10, 10, K) * (1 + 0.25 * i) for i in range(P)]).astype(np.float32)
    return logits, z if own_support else z[0]


def _z(z: np.ndarray, i: int) -> np.ndarray:
    return z[i] if z.ndim == 2 else z


# --- CPU ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("own_support", [False, True])
def test_twins_member_axis_is_single_calls(rng, P, own_support):
    logits, z = _host(rng, P, 11, 3, 13, own_support)
    rows = ref.per_sample(logits, z)
    stats = ref.reduce(*rows)
    assert_bitwise(ref.q_stats(logits, z), stats, what="q_stats with the member axis")
    for i in range(P):
        one = ref.per_sample(logits[i], _z(z, i))
        for n, (got, want) in enumerate(zip(rows, one, strict=True)):
            assert_bitwise(got[i], want, what=f"per_sample output {n}, member {i} of {P}")
        assert_bitwise(stats[i], ref.reduce(*one), what=f"reduce, member {i} of {P}")
    if P > 1:  # a member read from another's rows would show: no two members' statistics agree
        assert not np.array_equal(stats[0], stats[1]) and not np.array_equal(stats[1], stats[2])


def test_launchers_refuse_a_broken_member_axis():
    from cudarl.ops import qstats as ops

    P, B, A, K = 3, 5, 2, 7
    z = np.zeros
    logits, q, ent, mass = (
        z((P, B, A, K), np.float32),
        z((P, B, A), np.float32),
        z((P, B), np.float32),
        z((P, B, K), np.float32),
    )
    with pytest.raises(ValueError, match="member axis or none"):
        ops.per_sample(logits, z(K, np.float32), q[0], ent, mass)
    with pytest.raises(ValueError, match="one stride apart"):  # every member on one row
        ops.per_sample(logits, z(K, np.float32), q, np.broadcast_to(z(B, np.float32), (P, B)), mass)
    with pytest.raises(ValueError, match=r"out has shape \(6,\), expected \[3, 6\]"):
        ops.reduce(q, ent, mass, z(2 * A + 2, np.float32))
    with pytest.raises(ValueError, match="member axis or none"):
        ops.reduce(q, ent[0], mass, z((P, 2 * A + 2), np.float32))


# --- GPU ----------------------------------------------------------------------------------------------
def _rows(cp, P, shape, padded, dtype=np.float32):
    from cudarl.nn.params import stacked_zeros
    from cudarl.testing import poison

    a = stacked_zeros(cp, P, shape, dtype) if padded else cp.zeros((P, *shape), dtype)
    poison(a)
    return a


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (512, 3, 51), (300, 2, 101), (1000, 5, 11)])
@pytest.mark.parametrize("padded,own_support", [(True, False), (False, True)])
def test_gpu_q_stats_member_is_a_single_launch(cp, rng, P, B, A, K, padded, own_support):
    from cudarl.ops import qstats as ops
    from cudarl.testing import poison

    logits, z = _host(rng, P, B, A, K, own_support)
    d_logits = _rows(cp, P, (B, A, K), padded)
    d_logits[...] = cp.asarray(logits)
    d_z = cp.asarray(z)
    q, ent, mass = _rows(cp, P, (B, A), padded), _rows(cp, P, (B,), padded), _rows(cp, P, (B, K), padded)
    out = cp.empty((P, 2 * A + 2), np.float32)
    poison(out)
    ops.q_stats(d_logits, d_z, q, ent, mass, out)
    for i in range(P):
        one = [cp.empty(s, np.float32) for s in ((B, A), (B,), (B, K), (2 * A + 2,))]
        for x in one:
            poison(x)
        ops.q_stats(cp.asarray(logits[i]), cp.asarray(_z(z, i)), *one)
        for name, got, want in zip(("q", "ent", "mass", "out"), (q[i], ent[i], mass[i], out[i]), one, strict=True):
            assert_bitwise(got, want, what=f"{name}: member {i} of {P}")


@pytest.mark.gpu
def test_gpu_q_stats_members_match_the_twin(cp, rng):
    """The stacked launch against the stacked twin, with the single op's tolerances
    (test_qstats.py::test_gpu_q_stats_match_reference; utilisation, a count, compared exactly away from
    its threshold)."""
    from cudarl.ops import qstats as ops

    P, B, A, K = 3, 512, 3, 51
    logits, z = _host(rng, P, B, A, K, own_support=True)
    q, ent, mass = _rows(cp, P, (B, A), True), _rows(cp, P, (B,), True), _rows(cp, P, (B, K), True)
    out = cp.full((P, 2 * A + 2), np.nan, np.float32)
    ops.q_stats(cp.asarray(logits), cp.asarray(z), q, ent, mass, out)
    r_q, r_ent, r_mass = ref.per_sample(logits, z)
    assert_parity(q, r_q, what="expected Q")
    assert_parity(ent, r_ent, what="entropy per sample")
    assert_parity(mass, r_mass, what="atom mass per sample")
    want, got, L = ref.reduce(r_q, r_ent, r_mass), out.get(), ref.layout(A)
    for name in ("mean_q", "var_q", "entropy"):
        assert_parity(got[:, L[name]], want[:, L[name]], what=name)
    for i in range(P):
        col = r_mass[i].astype(np.float64).mean(0)
        near = np.sum(np.abs(col - 1.0 / (10 * K)) < 1e-6)
        assert abs(got[i, L["utilisation"]] - want[i, L["utilisation"]]) <= near / K + 1e-7
