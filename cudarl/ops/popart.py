"""Launchers for ``cuda_src/popart.cu`` (twin: ``cudarl/reference/popart.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.popart import STATE_SIZE
from ._arrays import check

F32 = np.float32
REDUCE_THREADS = 256  # must equal cudarl::popart::kReduceThreads (cuda_src/include/cudarl/popart.cuh)


def update(y, state, beta, sigma_min=1e-4, stream=None) -> None:
    """Move ``state [8]`` with targets ``y [B]``; ``beta`` is a float32 ``[1]`` device slot."""
    (B,) = y.shape
    check("popart.update", "y", y, F32, (B,))
    check("popart.update", "state", state, F32, (STATE_SIZE,))
    check("popart.update", "beta", beta, F32, (1,))
    launch(
        "popart",
        "update",
        1,
        REDUCE_THREADS,
        (y, state, beta, B, float(sigma_min)),
        stream=stream,
    )


def update_normalize_rewards(y, r_t, discount_t, state, beta, out, sigma_min=1e-4, stream=None) -> None:
    """:func:`update` with ``y [B]``, then ``out = (r - (1 - d) mu) / s`` with the updated statistics:
    one launch (one block). ``y`` may be ``r_t``; ``out`` must be a buffer of its own."""
    w = "popart.update_normalize_rewards"
    (B,) = y.shape
    for name, a in (("y", y), ("r_t", r_t), ("discount_t", discount_t), ("out", out)):
        check(w, name, a, F32, (B,))
    check(w, "state", state, F32, (STATE_SIZE,))
    check(w, "beta", beta, F32, (1,))
    if out.data.ptr in (y.data.ptr, r_t.data.ptr, discount_t.data.ptr):
        raise ValueError(f"{w}: out must not be one of the inputs")
    launch(
        "popart",
        "update_normalize_rewards",
        1,
        REDUCE_THREADS,
        (y, r_t, discount_t, state, beta, out, B, float(sigma_min)),
        stream=stream,
    )


def rescale(W, b, state, stream=None) -> None:
    """Rescale a last layer in place so its denormalised output is unchanged: ``W [n_in, n_out]``,
    ``b [n_out]`` as :class:`cudarl.nn.Linear` stores them (C-contiguous views of a network's flat
    parameters); a no-op when the statistics did not move."""
    n_in, n_out = W.shape
    check("popart.rescale", "W", W, F32, (n_in, n_out))
    check("popart.rescale", "b", b, F32, (n_out,))
    check("popart.rescale", "state", state, F32, (STATE_SIZE,))
    launch(
        "popart",
        "rescale",
        blocks_for(max(n_out * n_in, n_out)),
        256,
        (W, b, state, n_in, n_out),
        stream=stream,
    )


def normalize(x, state, out, inverse=False, stream=None) -> None:
    """``out = (x - mu) / s`` or, with ``inverse``, ``s x + mu`` (any shape, float32)."""
    check("popart.normalize", "x", x, F32, tuple(x.shape))
    check("popart.normalize", "out", out, F32, tuple(x.shape))
    check("popart.normalize", "state", state, F32, (STATE_SIZE,))
    launch(
        "popart",
        "normalize",
        blocks_for(x.size),
        256,
        (x, state, out, int(x.size), int(bool(inverse))),
        stream=stream,
    )


def normalize_rewards(r_t, discount_t, state, out, stream=None) -> None:
    """``out = (r - (1 - d) mu) / s``: rewards for targets in normalised coordinates."""
    (B,) = r_t.shape
    for name, a in (("r_t", r_t), ("discount_t", discount_t), ("out", out)):
        check("popart.normalize_rewards", name, a, F32, (B,))
    check("popart.normalize_rewards", "state", state, F32, (STATE_SIZE,))
    launch(
        "popart",
        "normalize_rewards",
        blocks_for(B),
        256,
        (r_t, discount_t, state, out, B),
        stream=stream,
    )


def td_targets(r_t, discount_t, v_hat, state, out, stream=None) -> None:
    """``out = r + d (s v_hat + mu)``: return-space TD targets for :func:`update`."""
    (B,) = r_t.shape
    for name, a in (("r_t", r_t), ("discount_t", discount_t), ("v_hat", v_hat), ("out", out)):
        check("popart.td_targets", name, a, F32, (B,))
    check("popart.td_targets", "state", state, F32, (STATE_SIZE,))
    launch(
        "popart",
        "td_targets",
        blocks_for(B),
        256,
        (r_t, discount_t, v_hat, state, out, B),
        stream=stream,
    )
