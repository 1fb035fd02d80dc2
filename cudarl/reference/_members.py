"""The member axis of the twins that return their results (c51, qstats, popart), as
:func:`cudarl.reference.optim.members` and :func:`cudarl.reference.nn.members` give it to the twins that
write in place: a population's ``P`` agents in one call, member ``i`` the single call on member ``i``'s
arguments by construction, as the kernels' ``blockIdx.y`` makes it on the GPU."""

from __future__ import annotations

import functools
import inspect

import numpy as np


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

    def wrap(fn):
        sig = inspect.signature(fn)
        first = next(iter(ranks))

        @functools.wraps(fn)
        def run(*args, **kw):
            bound = sig.bind(*args, **kw)
            a = bound.arguments
            if np.ndim(a[first]) != ranks[first] + 1:
                return fn(*args, **kw)
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
            per = [fn(**dict(a, **{k: v[i] for k, v in lead.items()})) for i in range(P)]
            if not isinstance(per[0], tuple):
                return np.stack(per)
            return tuple(None if r[0] is None else np.stack(r) for r in zip(*per, strict=True))

        return run

    return wrap
