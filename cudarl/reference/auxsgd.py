"""The auxiliary signals' own optimiser step in NumPy: twin of ``cuda_src/auxsgd.cu``.

Plain stochastic gradient descent (Robbins & Monro 1951) on contiguous spans of flat parameter
buffers: ``p <- p - lr g``, then ``g <- 0`` when ``clear`` (the span's gradient is spent, so the shared
Adam that runs after it sees zeros there and, with its moments still zero, leaves the span alone).
The risk head steps its own parameters this way (the seed's "risk SGD"); denoise steps the encoder
and its decoder with the gradient of its own backward. Every span of a step goes in one launch
(:func:`steps`, the agent's ``aux_sgd`` phase: :class:`cudarl.auxiliary.base.AuxSgd`); each element's
arithmetic is its own, so the bits are those of a step a span in any order.
"""

from __future__ import annotations

#: The most spans one launch takes (the kernel's AS_MAX_SPANS).
MAX_SPANS = 4


def steps(spans) -> None:
    """For each span ``(p, g, lr, clear)`` (``p``, ``g``: float ``[n]``, same dtype; disjoint memory):
    ``p -= lr g`` in place, then ``g[:] = 0`` if ``clear``."""
    for p, g, lr, clear in spans:
        p -= p.dtype.type(lr) * g
        if clear:
            g[...] = 0
