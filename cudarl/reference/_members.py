"""The member axis of the twins that return their results (c51, qstats, popart), as
:func:`cudarl.reference.optim.members` and :func:`cudarl.reference.nn.members` give it to the twins that
write in place: a population's ``P`` agents in one call, member ``i`` the single call on member ``i``'s
arguments by construction, as the kernels' ``blockIdx.y`` makes it on the GPU."""

from __future__ import annotations

import functools
import inspect

import numpy as np


def over_members(split, combine=None):
    """The frame of every twin's member axis (:func:`members`, :func:`in_place`,
    :func:`cudarl.reference.optim.members`, :func:`cudarl.reference.replay.buffers.members`).

    ``split(fn, a)`` reads the twin ``fn``'s bound arguments ``a`` (a dict) and returns None (no member
    axis: the single call) or the list of member ``i``'s keyword arguments for every ``i``, having checked
    them all first (a ValueError naming ``fn`` when the axis is not one length). The twin then runs once
    per member, in order, and returns ``combine`` of the list of the members' results (None: the twin
    writes in place and returns None)."""

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kw):
            each = split(fn, sig.bind(*args, **kw).arguments)
            if each is None:
                return fn(*args, **kw)
            per = [fn(**one) for one in each]
            return None if combine is None else combine(per)

        return run

    return wrap


def _stack(per: list):
    """The members' results with the leading axis: an array's stacked, a tuple's field by field (None stays None)."""
    if not isinstance(per[0], tuple):
        return np.stack(per)
    return tuple(None if r[0] is None else np.stack(r) for r in zip(*per, strict=True))


def members(shared: tuple = (), **ranks: int):
    """Give a twin that returns its results the member axis.

    ``ranks`` maps an argument's name to its rank without the axis (a device scalar such as ``beta`` or
    ``gamma``: 0, a float or a ``[1]`` array alone and ``[P]`` with the axis; None: any rank, the axis
    there whenever the first argument has it). When the first named argument has one more axis than
    its rank, the twin runs once per member ``i`` on element ``i`` of each
    named argument (the names in ``shared`` may come without the axis: one value for every member; None,
    an absent optional argument, stays None), the others as given, and each result gains the leading
    axis (``np.stack``: a ``[B]`` result ``[P, B]``, a scalar ``[P]``; a None result stays None).
    Otherwise it is the single call."""

    first = next(iter(ranks))

    def split(fn, a):
        if np.ndim(a[first]) != ranks[first] + 1:
            return None
        P = np.shape(a[first])[0]
        lead = {}
        for k, r in ranks.items():
            v = a.get(k)
            if v is None:
                continue
            if (r is None or np.ndim(v) == r + 1) and np.shape(v)[0] == P:
                lead[k] = np.asarray(v)
            elif k not in shared:
                raise ValueError(f"{fn.__name__}: every argument has the member axis of one length, or none does")
        return [dict(a, **{k: v[i] for k, v in lead.items()}) for i in range(P)]

    return over_members(split, _stack)


def in_place(scalars: tuple = (), shared: tuple = (), **ranks: int):
    """Give a twin that writes in place the member axis (the agent and env twins: the act and env-step
    kernels' ``blockIdx.y``).

    ``ranks`` maps an argument's name to its rank without the axis (a NamedTuple of arrays, such as an
    ``EnvState`` or ``Transitions``: its first field's rank; every field gains the axis); ``scalars``
    names its device scalars, ``[1]`` alone and ``[P]`` with the axis. When the first argument named has
    one more axis than its rank (a twin without ranks: its first scalar has more than one element), the
    twin runs once per member ``i`` on element ``i`` of each named argument (views, so its writes land
    in the member's rows; a scalar as a 1-element view of its element ``i``), the names in ``shared``
    passed whole when they come without the axis, the other arguments as given. Otherwise it is the
    single call."""

    def lead_ndim(v) -> int:
        return np.ndim(v[0]) if isinstance(v, tuple) else np.ndim(v)

    def pick(v, i: int):
        return type(v)(*(f[i] for f in v)) if isinstance(v, tuple) else v[i]

    def split(fn, a):
        if ranks:
            first = next(iter(ranks))
            if lead_ndim(a[first]) != ranks[first] + 1:
                return None
            P = np.shape(a[first][0] if isinstance(a[first], tuple) else a[first])[0]
        else:
            P = np.shape(a[scalars[0]])[0]
            if P == 1:
                return None
        lead = [k for k, r in ranks.items() if not (k in shared and lead_ndim(a[k]) == r)]
        fields = {k: a[k] if isinstance(a[k], tuple) else (a[k],) for k in lead}
        bad = [k for k in lead if lead_ndim(a[k]) != ranks[k] + 1 or any(np.shape(f)[:1] != (P,) for f in fields[k])]
        bad += [k for k in scalars if a.get(k) is not None and np.shape(a[k]) != (P,)]
        if bad:
            raise ValueError(f"{fn.__name__}: every buffer has the member axis of one length, or none does: {bad}")
        each = []
        for i in range(P):
            one = {k: pick(a[k], i) for k in lead}
            one.update({k: a[k][i : i + 1] for k in scalars if a.get(k) is not None})
            each.append(dict(a, **one))
        return each

    return over_members(split)
