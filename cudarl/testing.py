"""The one parity comparison, poisoning, and GPU availability for tests and benchmarks.

Parity is judged by ``||actual - expected|| / ||expected||`` with a per-dtype tolerance
(DESIGN.md); integers and anything declared bitwise must match exactly.
"""

from __future__ import annotations

import numpy as np

from .backend import cupy_unavailable_reason, to_numpy

#: The ``[set]`` table of a tiny sweep trial, quick on either backend (a 16-wide network, 4 environments, 2,048
#: replay rows, no evaluation during training): ``TINY_SWEEP_SET.format(device=..., steps=...)``. The sweep
#: tests' specs and ``tools/sweep_scaling.py``'s share it.
TINY_SWEEP_SET = """"run.device" = "{device}"
"run.steps" = {steps}
"run.eval_every" = 0
"run.checkpoint_every" = 0
"env.n_envs" = 4
"env.episode_len" = 64
"agent.learning_starts" = 64
"agent.batch_size" = 32
"eval.resamples" = 50
"eval.gate_psr" = 0
"net.hidden" = [16, 16]
"replay.capacity" = 2048
"""

#: Relative-norm tolerances by kind (DESIGN.md: float32 1e-5 unless the math says otherwise).
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "tf32": 2e-3}


def rel_error(actual, expected) -> float:
    """``||a - e||_2 / ||e||_2`` in float64 (``||a - e||`` when ``e`` is all zeros)."""
    a = np.asarray(to_numpy(actual), dtype=np.float64)
    e = np.asarray(to_numpy(expected), dtype=np.float64)
    num = float(np.linalg.norm((a - e).ravel()))
    den = float(np.linalg.norm(e.ravel()))
    return num / den if den > 0 else num


def assert_parity(
    actual, expected, *, kind: str | None = None, rtol: float | None = None, what: str = "output"
) -> float:
    """Assert shape, dtype and values agree; return the relative error.

    ``kind`` picks a tolerance from :data:`TOLERANCE` (default: by ``expected``'s dtype);
    integer and boolean arrays must be equal. NaN or inf in ``actual`` always fails, and an
    all-zero ``expected`` is refused (it hides unwritten outputs).
    """
    a, e = to_numpy(actual), to_numpy(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != {e.dtype}"
    if a.dtype.kind in "iub":
        bad = np.flatnonzero(a.ravel() != e.ravel())
        assert bad.size == 0, (
            f"{what}: {bad.size} of {a.size} elements differ, first at flat index {bad[0]}: "
            f"{a.ravel()[bad[0]]} != {e.ravel()[bad[0]]}"
        )
        return 0.0
    assert np.all(np.isfinite(a) | ~np.isfinite(e)), f"{what}: non-finite values where the reference is finite"
    assert np.any(e != 0), f"{what}: the reference is all zeros; test on data that can show a difference"
    tol = rtol if rtol is not None else TOLERANCE[kind or str(e.dtype)]
    err = rel_error(a, e)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    return err


def assert_oracle(actual, ref32, ref64, *, floor: float = 1e-5, what: str = "output") -> float:
    """Assert a float32 result is as close to the float64 twin as the float32 twin is, within a factor of two
    (flash-attention's rule for reductions and scans; STYLE.md), or within ``floor``; return its error."""
    e32 = rel_error(ref32, ref64)
    # the float32 twin's own error in the message: the bound moves with it (a failure at 13421b4 could not
    # be told from a twin that rounded closer in that process)
    return assert_parity(
        actual, np.asarray(ref64, dtype=np.float32), rtol=max(floor, 2 * e32), what=f"{what} (float32 twin {e32:.3e})"
    )


def bitwise_difference(actual, expected, what: str = "output") -> str | None:
    """None where two arrays are identical bit for bit, else what differs: shapes or dtypes, or how many
    bytes and where (with the values for arrays of at most four elements, e.g. a scalar statistic)."""
    a, e = np.ascontiguousarray(to_numpy(actual)), np.ascontiguousarray(to_numpy(expected))
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"{what}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
    bad = np.flatnonzero(a.reshape(-1).view(np.uint8) != e.reshape(-1).view(np.uint8))
    if bad.size == 0:
        return None
    values = f": {a.ravel().tolist()} vs {e.ravel().tolist()}" if a.size <= 4 else ""
    return f"{what}: {bad.size} bytes differ (first at byte {bad[0]}){values}"


def assert_bitwise(actual, expected, what: str = "output") -> None:
    """Assert two arrays are identical bit for bit (graphed vs eager, repeated runs)."""
    diff = bitwise_difference(actual, expected, what)
    assert diff is None, diff


def state_differences(actual, expected, what: str = "state") -> list[str]:
    """Every difference between two state trees (nested dicts, as ``state_dict()`` returns), one line per
    leaf, in ``expected``'s key order: keys missing or extra at a level, a leaf's type, an array's or NumPy
    scalar's dtype, shape or bits (:func:`bitwise_difference`), a plain value (ints, floats, strings,
    layouts as lists of tuples; NaN equals NaN). Empty: the same state."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{what}: {type(actual).__name__}, expected a dict"]
        out = (
            []
            if sorted(actual) == sorted(expected)
            else [f"{what}: keys {sorted(actual)}, expected {sorted(expected)}"]
        )
        for k in expected:
            if k in actual:
                out += state_differences(actual[k], expected[k], f"{what}/{k}")
        return out
    if type(actual) is not type(expected):
        return [f"{what}: {type(actual).__name__}, expected {type(expected).__name__}"]
    if isinstance(expected, (np.ndarray, np.generic)) or type(expected).__module__.startswith("cupy"):
        diff = bitwise_difference(actual, expected, what)
        return [] if diff is None else [diff]
    nan = isinstance(expected, float) and expected != expected and actual != actual
    return [] if nan or actual == expected else [f"{what}: {actual!r}, expected {expected!r}"]


def assert_state_bitwise(actual, expected, what: str = "state") -> None:
    """Assert two state trees are the same (:func:`state_differences`); the message lists every differing
    leaf (the first 20), not only the first, so one failing run says how far a difference spread."""
    diffs = state_differences(actual, expected, what)
    assert not diffs, f"{len(diffs)} differing leaves:\n" + "\n".join(diffs[:20])


def finite_difference(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences ``(f(x + eps e_i) - f(x - eps e_i)) / (2 eps)`` of a scalar ``f`` at every
    element of float64 ``x`` (the gradient checks of the loss twins)."""
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += eps
        lo[idx] -= eps
        num[idx] = (f(hi) - f(lo)) / (2 * eps)
    return num


def poison_pool(cupy, nbytes: int = 1 << 30) -> None:
    """Empty CuPy's memory pool and hand it back one block of ``nbytes`` 0xFF bytes (NaN as floats, -1 as
    integers): the next allocations on the default stream are carved from it, so a kernel that reads what
    nothing wrote shows it. A fresh pool is mostly zeros, and a test process's pool holds whatever the tests
    before left, so such a read otherwise passes or fails with the test's neighbours (tests/conftest.py's
    ``cp`` fixture calls this under ``CUDARL_POISON_POOL=1``; ``tools/gpu_check.sh --poison``)."""
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    block = cupy.empty(nbytes, dtype=cupy.uint8)
    block.fill(0xFF)
    cupy.cuda.Device().synchronize()
    del block


def poison(arr) -> None:
    """Fill an output buffer with NaN (floats) or 0xA5 bytes (integers) before a launch."""
    if arr.dtype.kind == "f":
        arr.fill(np.nan)
    else:
        arr.view(np.uint8).fill(0xA5) if isinstance(arr, np.ndarray) else arr.view("uint8").fill(0xA5)


def assert_reruns_bitwise(
    graph, outputs: dict, expected: dict, attempts=("graphed", "eager"), *, reset=None, check=None
) -> None:
    """Rerun a :class:`cudarl.graph.StepGraph` once per attempt (``"graphed"``: replay, which needs a
    capture first; ``"eager"``: run_eager) and assert every ``outputs[name]`` equals ``expected[name]``
    bit for bit.

    Before each attempt the outputs are poisoned and ``reset()`` restores any state the phases
    move (e.g. PopArt statistics); ``check(attempt)`` runs after each for further assertions.
    """
    for attempt in attempts:
        for v in outputs.values():
            poison(v)
        if reset is not None:
            reset()
        if graph.is_gpu:  # the poison and reset ran on the default stream, the graph runs on its own
            import cupy

            cupy.cuda.Device().synchronize()
        graph.replay() if attempt == "graphed" else graph.run_eager()
        graph.synchronize()
        for name, v in outputs.items():
            assert_bitwise(v, expected[name], what=f"{attempt} {name}")
        if check is not None:
            check(attempt)


def assert_launch_args(family: str, op: str, args: tuple) -> None:
    """``args`` as ``cuda_src/<family>.cu`` declares ``cudarl_<family>_<op>``'s parameters, in order: an
    array of the declared dtype for each pointer, a scalar for each value. For a launcher's tuple
    recorded on the CPU (its module's ``launch`` patched, NumPy arrays in); on the GPU
    :func:`cudarl.kernels.launch` checks the same, and more, when it launches."""
    from . import signatures

    params = signatures.of(family, op).params
    assert len(args) == len(params), f"{op}: {len(args)} arguments, the kernel takes {len(params)}"
    for (name, dtype, is_ptr), a in zip(params, args, strict=True):
        assert isinstance(a, np.ndarray) == is_ptr, f"{op}: {name} is {'a pointer' if is_ptr else 'a value'}"
        assert not is_ptr or a.dtype == dtype, f"{op}: {name} is {a.dtype}, the kernel takes {dtype}"


def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here (``None`` if they can)."""
    return cupy_unavailable_reason()
