"""Shape and dtype checks shared by the loss-family launchers (c51, quantile, regularizers,
popart, qstats). Host-side metadata only: nothing here reads device memory, so it is
capture-safe."""

from __future__ import annotations

import numpy as np

from ..backend import address  # noqa: F401 (the launchers' import; one definition, cudarl.backend)


def check(where: str, name: str, a, dtype, shape: tuple) -> None:
    """Raise ``ValueError`` unless ``a`` has ``dtype`` and ``shape`` (``None`` entries match any)."""
    if a is None:
        raise ValueError(f"{where}: {name} is required (disabled features are not launched)")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{where}: {name} has dtype {a.dtype}, expected {np.dtype(dtype)}")
    if len(a.shape) != len(shape) or any(s is not None and s != t for s, t in zip(shape, a.shape, strict=True)):
        want = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{where}: {name} has shape {tuple(a.shape)}, expected {want}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{where}: {name} must be C-contiguous")


def check_counter(where: str, name: str, a, members: int = 1) -> None:
    """A uint32 ``[1]`` ticket counter of a kernel that finishes with ``cudarl::last_block`` (``[P]``,
    one a member, for a launch over ``members`` P): it must hold 0 before the launch (allocate it
    with zeros; the kernel leaves it 0)."""
    check(where, name, a, np.uint32, (members,))


# --- the member axis (a population's agents: docs/perf-notes.md "The agent axis, in stages") --------
#: gridDim.y's limit: the most members one launch takes.
MAX_MEMBERS = 65535


def members(where: str, arrays: dict, shared: tuple = ()) -> tuple[int, dict, dict]:
    """The member axis of a launch's arrays: ``(P, entries, strides)``.

    ``arrays`` maps a name to ``(array, rank)``, its rank without the member axis. Either none has the
    axis (``P`` 1, the arrays themselves, every stride 0: the single launch) or each has a leading axis
    of one length ``P`` (entries: each array's member 0, to be checked as the single launch's array;
    strides: its member stride in elements). The names in ``shared`` may come without the axis while
    the others have it: one array for every member, stride 0. Each entry's own layout is the caller's
    to check (:func:`check`); :func:`family_stride` gives the one stride of a row family."""
    lead = [k for k, (a, nd) in arrays.items() if len(a.shape) == nd + 1]
    if not lead:
        return 1, {k: a for k, (a, _) in arrays.items()}, dict.fromkeys(arrays, 0)
    if any(k not in lead and k not in shared for k in arrays):
        raise ValueError(
            f"{where}: every array has the member axis or none does, got "
            f"{ {k: tuple(a.shape) for k, (a, _) in arrays.items()} }"
        )
    P = arrays[lead[0]][0].shape[0]
    if not 1 <= P <= MAX_MEMBERS or any(arrays[k][0].shape[0] != P for k in lead):
        raise ValueError(
            f"{where}: 1 to {MAX_MEMBERS} members, the same in every array, got "
            f"{ {k: tuple(arrays[k][0].shape) for k in lead} }"
        )
    entries, strides = {}, {}
    for k, (a, _) in arrays.items():
        if k not in lead:
            entries[k], strides[k] = a, 0
            continue
        if a.strides[0] < 0 or a.strides[0] % a.itemsize:
            raise ValueError(f"{where}: {k}'s member stride must be whole elements >= 0, got {a.strides}")
        entries[k], strides[k] = a[0], a.strides[0] // a.itemsize
    return P, entries, strides


def family_stride(where: str, P: int, entries: dict, strides: dict, names: tuple) -> int:
    """The one member stride (elements) of a row family, the arrays ``names`` (those present): every
    one the same stride, and with more than one member at least an entry's size (members do not
    overlap). One stride argument serves the family in the kernel."""
    got = {strides[k] for k in names if k in strides}
    s = got.pop() if len(got) == 1 else None
    if s is None or (P > 1 and s < max(entries[k].size for k in names if k in entries)):
        raise ValueError(
            f"{where}: the members of {', '.join(k for k in names if k in strides)} must be one stride apart, "
            f"at least an entry's size, got strides {[strides[k] for k in names if k in strides]} (elements)"
        )
    return int(s)


def member_scalars(where: str, P: int, dtype, members_axis: bool, **arrays) -> None:
    """Device scalars: ``[1]`` for the single launch, ``[P]`` (one a member, C-contiguous) with the
    member axis."""
    for name, a in arrays.items():
        check(where, name, a, dtype, (P if members_axis else 1,))


def member_state(where: str, name: str, a, size: int, P: int, members_axis: bool) -> None:
    """A per-member state vector (PopArt's ``[8]``): ``[size]`` for the single launch, C-contiguous
    ``[P, size]`` with the member axis (member ``i`` at ``i * size``, as the kernel reads it)."""
    check(where, name, a, np.float32, (P, size) if members_axis else (size,))


#: Warps per block for the one-warp-per-sample kernels.
WARPS_PER_BLOCK = 4


def warp_grid(n: int) -> tuple[int, int]:
    """``(grid, block)`` for one warp per item over ``n`` items."""
    return max(1, (int(n) + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK
