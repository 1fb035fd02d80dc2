"""Flat-gradient copies for the auxiliary signals that run a backward of their own: twin of
``cuda_src/auxgrad.cu``. A signal's extra backward overwrites the network's gradient buffer
(:meth:`cudarl.nn.QNetwork.backward`), so the step's gradient is saved first and recombined after
(:mod:`cudarl.auxiliary.base`)."""

from __future__ import annotations

import numpy as np


def copy(dst, src) -> None:
    """``dst[:] = src`` over float32 ``[n]``."""
    if dst.size != src.size:
        raise ValueError(f"auxgrad.copy: sizes {dst.size} and {src.size} differ")
    np.copyto(dst, src)
