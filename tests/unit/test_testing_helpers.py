"""cudarl.testing's oracle rule: a float32 result within twice the float32 twin's error of the float64 twin
(or a floor), and a failure that says what the twin's error was."""

import numpy as np
import pytest

from cudarl.testing import assert_oracle, rel_error


def test_oracle_bound_is_twice_the_float32_twins_error_or_the_floor():
    r64 = np.linspace(1.0, 2.0, 101)
    r32 = (r64 * (1 + 1e-4)).astype(np.float32)  # a float32 twin 1e-4 from float64
    e32 = rel_error(r32, r64)
    assert assert_oracle((r64 * (1 + 1.9e-4)).astype(np.float32), r32, r64) <= 2 * e32
    with pytest.raises(AssertionError, match=rf"grad w \(float32 twin {e32:.3e}\): relative error .* > 2\.0e-04"):
        assert_oracle((r64 * (1 + 2.5e-4)).astype(np.float32), r32, r64, what="grad w")
    exact = r64.astype(np.float32)  # a twin with (almost) no error: the floor is the bound
    assert assert_oracle((r64 * (1 + 5e-6)).astype(np.float32), exact, r64) <= 1e-5
    with pytest.raises(AssertionError, match=r"relative error .* > 1\.0e-05"):
        assert_oracle((r64 * (1 + 2e-5)).astype(np.float32), exact, r64)


def test_poison_pool_empties_the_pool_and_hands_back_one_block_of_0xff():
    """cudarl.testing.poison_pool with a stand-in for CuPy: synchronise, free every pooled block, then one
    block of ``nbytes`` filled with 0xFF and synchronised before it goes back to the pool."""
    from types import SimpleNamespace

    from cudarl.testing import poison_pool

    calls = []

    class Block:
        def __init__(self, n, dtype):
            calls.append(("empty", n, dtype))

        def fill(self, v):
            calls.append(("fill", v))

        def __del__(self):
            calls.append(("freed",))

    sync = lambda: calls.append(("sync",))  # noqa: E731
    fake = SimpleNamespace(
        uint8="uint8",
        empty=Block,
        cuda=SimpleNamespace(Device=lambda: SimpleNamespace(synchronize=sync)),
        get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: calls.append(("free_all",))),
    )
    poison_pool(fake, nbytes=4096)
    assert calls == [("sync",), ("free_all",), ("empty", 4096, "uint8"), ("fill", 0xFF), ("sync",), ("freed",)]
