"""Launchers for ``cuda_src/popart.cu`` (twin: ``cudarl/reference/popart.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4): every
launcher also takes ``state [P, 8]`` (C-contiguous: member ``i``'s statistics at ``8 i``), ``beta [P]``
and its arrays with a leading axis of ``P`` members: the per-sample arrays ``[P, B]``, rescale's ``W
[P, n_in, n_out]`` and ``b [P, n_out]`` (one member stride: views of stacked parameter rows), normalize's
``x`` and ``out`` ``[P, ...]``; each member's entry C-contiguous, each family one member stride apart.
One launch whose ``blockIdx.y`` is the member gives member ``i`` the bits of a single launch on its
entries; arrays without the axis are the single launch. ``sigma_min`` is one value for every member.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.popart import STATE_SIZE
from ._arrays import check, family_stride, member_scalars, member_state, members

F32 = np.float32
REDUCE_THREADS = 256  # must equal cudarl::popart::kReduceThreads (cuda_src/include/cudarl/popart.cuh)


def _samples(w: str, state, **arrays) -> tuple[int, dict, int, int]:
    """``(P, entries, B, s_b)`` of per-sample ``[B]`` arrays (``[P, B]`` with the member axis, one stride)
    and the state (``[8]``, or ``[P, 8]`` with the axis)."""
    P, e, st = members(w, {k: (a, 1) for k, a in arrays.items()})
    first = next(iter(e.values()))
    (B,) = first.shape
    for name, a in e.items():
        check(w, name, a, F32, (B,))
    member_state(w, "state", state, STATE_SIZE, P, len(next(iter(arrays.values())).shape) == 2)
    return P, e, B, family_stride(w, P, e, st, tuple(arrays))


def update(y, state, beta, sigma_min=1e-4, stream=None) -> None:
    """Move ``state [8]`` with targets ``y [B]``; ``beta`` is a float32 ``[1]`` device slot (members:
    ``y [P, B]``, ``state [P, 8]``, ``beta [P]``)."""
    w = "popart.update"
    P, e, B, s_b = _samples(w, state, y=y)
    member_scalars(w, P, F32, len(y.shape) == 2, beta=beta)
    launch(
        "popart",
        "update",
        (1, P),
        REDUCE_THREADS,
        (e["y"], state, beta, B, float(sigma_min), s_b),
        stream=stream,
    )


def update_normalize_rewards(y, r_t, discount_t, state, beta, out, sigma_min=1e-4, stream=None) -> None:
    """:func:`update` with ``y [B]``, then ``out = (r - (1 - d) mu) / s`` with the updated statistics:
    one launch (one block a member). ``y`` may be ``r_t``; ``out`` must be a buffer of its own."""
    w = "popart.update_normalize_rewards"
    P, e, B, s_b = _samples(w, state, y=y, r_t=r_t, discount_t=discount_t, out=out)
    member_scalars(w, P, F32, len(y.shape) == 2, beta=beta)
    if out.data.ptr in (y.data.ptr, r_t.data.ptr, discount_t.data.ptr):
        raise ValueError(f"{w}: out must not be one of the inputs")
    launch(
        "popart",
        "update_normalize_rewards",
        (1, P),
        REDUCE_THREADS,
        (e["y"], e["r_t"], e["discount_t"], state, beta, e["out"], B, float(sigma_min), s_b),
        stream=stream,
    )


def rescale(W, b, state, stream=None) -> None:
    """Rescale a last layer in place so its denormalised output is unchanged: ``W [n_in, n_out]``,
    ``b [n_out]`` as :class:`cudarl.nn.Linear` stores them (C-contiguous views of a network's flat
    parameters); a no-op when the statistics did not move. Members: ``W [P, n_in, n_out]``, ``b [P,
    n_out]`` one member stride apart (views of ``[P, size]`` stacked parameters), ``state [P, 8]``."""
    w = "popart.rescale"
    P, e, st = members(w, {"W": (W, 2), "b": (b, 1)})
    n_in, n_out = e["W"].shape
    check(w, "W", e["W"], F32, (n_in, n_out))
    check(w, "b", e["b"], F32, (n_out,))
    member_state(w, "state", state, STATE_SIZE, P, len(W.shape) == 3)
    s = st["W"]
    if st["b"] != s or (P > 1 and s < n_in * n_out + n_out):
        raise ValueError(
            f"{w}: W and b must be one member stride apart (rows of stacked parameters), got strides "
            f"{st['W']} and {st['b']} (elements)"
        )
    launch(
        "popart",
        "rescale",
        (blocks_for(max(n_out * n_in, n_out)), P),
        256,
        (e["W"], e["b"], state, n_in, n_out, s),
        stream=stream,
    )


def normalize(x, state, out, inverse=False, stream=None) -> None:
    """``out = (x - mu) / s`` or, with ``inverse``, ``s x + mu`` (any shape, float32). Members: ``state
    [P, 8]``, x and out ``[P, ...]``."""
    w = "popart.normalize"
    axis = len(state.shape) == 2
    rank = len(x.shape) - 1 if axis else len(x.shape)
    P, e, st = members(w, {"x": (x, rank), "out": (out, rank)})
    check(w, "x", e["x"], F32, tuple(e["x"].shape))
    check(w, "out", e["out"], F32, tuple(e["x"].shape))
    member_state(w, "state", state, STATE_SIZE, P, axis)
    launch(
        "popart",
        "normalize",
        (blocks_for(e["x"].size), P),
        256,
        (e["x"], state, e["out"], int(e["x"].size), int(bool(inverse)), family_stride(w, P, e, st, ("x", "out"))),
        stream=stream,
    )


def normalize_rewards(r_t, discount_t, state, out, stream=None) -> None:
    """``out = (r - (1 - d) mu) / s``: rewards for targets in normalised coordinates."""
    P, e, B, s_b = _samples("popart.normalize_rewards", state, r_t=r_t, discount_t=discount_t, out=out)
    launch(
        "popart",
        "normalize_rewards",
        (blocks_for(B), P),
        256,
        (e["r_t"], e["discount_t"], state, e["out"], B, s_b),
        stream=stream,
    )


def td_targets(r_t, discount_t, v_hat, state, out, stream=None) -> None:
    """``out = r + d (s v_hat + mu)``: return-space TD targets for :func:`update`."""
    P, e, B, s_b = _samples("popart.td_targets", state, r_t=r_t, discount_t=discount_t, v_hat=v_hat, out=out)
    launch(
        "popart",
        "td_targets",
        (blocks_for(B), P),
        256,
        (e["r_t"], e["discount_t"], e["v_hat"], state, e["out"], B, s_b),
        stream=stream,
    )
