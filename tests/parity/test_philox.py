"""Philox4x32-10: Random123 known-answer vectors on the CPU; the GPU stream equals NumPy's bit for bit."""

import numpy as np
import pytest

from cudarl.reference import philox

# Random123's kat_vectors for philox4x32 with 10 rounds: (counter, key, expected output).
KAT = [
    ("00000000 00000000 00000000 00000000", "00000000 00000000", "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ("ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff", "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ("243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0", "d16cfe09 94fdcceb 5001e420 24126ea1"),
]


def _hex(s):
    return np.array([int(x, 16) for x in s.split()], dtype=np.uint32)


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answer_vectors(ctr, key, expected):
    np.testing.assert_array_equal(philox.philox4x32(_hex(ctr), _hex(key)), _hex(expected))


def test_vectorised_equals_one_at_a_time():
    rng = np.random.default_rng(1)
    ctr = rng.integers(0, 2**32, size=(50, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, size=2, dtype=np.uint64).astype(np.uint32)
    batch = philox.philox4x32(ctr, key)
    for i in range(50):
        np.testing.assert_array_equal(batch[i], philox.philox4x32(ctr[i], key))


def test_stream_layout_and_offsets():
    seed, counter, sid = 0x1234_5678_9ABC_DEF0, 7 + (3 << 32), 5
    full = philox.u32(seed, counter, sid, 37)
    np.testing.assert_array_equal(philox.u32(seed, counter, sid, 30, offset=7), full[7:])
    b = philox.philox4x32(np.array([2, sid, counter & 0xFFFFFFFF, counter >> 32], np.uint32), philox.key_of(seed))
    np.testing.assert_array_equal(full[8:12], b)


def test_keys_counters_and_streams_differ():
    a = philox.u32(1, 0, 0, 64)
    assert not np.array_equal(a, philox.u32(2, 0, 0, 64))
    assert not np.array_equal(a, philox.u32(1, 1, 0, 64))
    assert not np.array_equal(a, philox.u32(1, 0, 1, 64))
    assert not np.array_equal(a, philox.u32(1 << 32, 0, 0, 64))  # the seed's high word is used


def test_uniform_range_and_moments():
    u = philox.uniform(42, 0, 0, 200_000)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    # mean of U(0,1): standard error 1/sqrt(12 n) ~ 6.5e-4; allow 5 sigma
    assert abs(float(u.mean()) - 0.5) < 5 * (1 / np.sqrt(12 * u.size))
    np.testing.assert_array_equal(
        philox.to_uniform(np.array([0, 0xFFFFFFFF], np.uint32)), np.array([0.0, 1 - 2**-24], np.float32)
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seed,counter,sid", [(0, 0, 0), (0xDEADBEEFCAFEF00D, 12345, 3), (7, (1 << 40) + 9, 0xFFFFFFFF)]
)
def test_gpu_stream_bitwise_equals_numpy(cp, seed, counter, sid):
    from cudarl.ops import philox as ops
    from cudarl.testing import assert_bitwise

    n = 1_000_003  # > 1e6 draws, not a multiple of 4
    c = cp.asarray(np.array([counter], np.uint64))
    out = cp.empty(n, dtype=np.uint32)
    out.fill(0xA5A5A5A5)
    ops.u32(out, seed, c, sid)
    assert_bitwise(out, philox.u32(seed, counter, sid, n), "u32 stream")
    f = cp.full(n, np.nan, dtype=np.float32)
    ops.uniform(f, seed, c, sid)
    assert_bitwise(f, philox.uniform(seed, counter, sid, n), "uniform stream")
