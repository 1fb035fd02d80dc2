"""Launchers for ``cuda_src/auxsgd.cu`` (twin: ``cudarl/reference/auxsgd.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.auxsgd import MAX_SPANS
from ._arrays import address, check

_THREADS = 256
_MAX_BLOCKS = 1024


def steps(spans) -> None:
    """For each span ``(p, g, lr, clear)`` of ``spans`` (1 to 4; float32 ``[n]`` contiguous views, every
    array's memory apart from every other's): ``p -= lr g``, then ``g[:] = 0`` if ``clear``. 1 launch, the
    bits of a launch a span: each element's arithmetic is its own."""
    w = "auxsgd.steps"
    spans = [tuple(s) for s in spans]
    if not 1 <= len(spans) <= MAX_SPANS:
        raise ValueError(f"{w}: 1 to {MAX_SPANS} spans, got {len(spans)}")
    for k, (p, g, _, _) in enumerate(spans):
        (n,) = p.shape
        check(w, f"p{k}", p, np.float32, (n,))
        check(w, f"g{k}", g, np.float32, (n,))
    _apart(w, [a for p, g, _, _ in spans for a in (p, g)])
    # the slots past the spans: n = 0, the last span's arrays (never touched; no null pointer)
    table = spans + [(spans[-1][0], spans[-1][1], 0.0, False)] * (MAX_SPANS - len(spans))
    ns = [p.shape[0] if k < len(spans) else 0 for k, (p, _, _, _) in enumerate(table)]
    args = (
        *(a for p, g, _, _ in table for a in (p, g)),
        *ns,
        *(float(lr) for _, _, lr, _ in table),
        *(int(bool(clear)) for _, _, _, clear in table),
    )
    launch("auxsgd", "steps", min(blocks_for(max(ns), _THREADS), _MAX_BLOCKS), _THREADS, args)


def _apart(where: str, arrays: list) -> None:
    """Raise unless the arrays' byte ranges are pairwise disjoint (one launch steps them all at once)."""
    runs = sorted((address(a), address(a) + a.nbytes) for a in arrays)
    for (_, end), (start, _) in zip(runs[:-1], runs[1:], strict=True):
        if start < end:
            raise ValueError(f"{where}: the spans' parameters and gradients must not overlap")
