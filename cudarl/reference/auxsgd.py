"""The auxiliary signals' own optimiser step in NumPy: twin of ``cuda_src/auxsgd.cu``.

Plain stochastic gradient descent (Robbins & Monro 1951) on one contiguous span of a flat parameter
buffer: ``p <- p - lr g``, then ``g <- 0`` when ``clear`` (the span's gradient is spent, so the shared
Adam that runs after it sees zeros there and, with its moments still zero, leaves the span alone).
The risk head steps its own parameters this way (the seed's "risk SGD"); denoise steps the encoder
and its decoder with the gradient of its own backward.
"""

from __future__ import annotations


def step(p, g, lr, clear: bool = True) -> None:
    """``p -= lr g`` in place (``p``, ``g``: float ``[n]``, same dtype), then ``g[:] = 0`` if ``clear``."""
    p -= p.dtype.type(lr) * g
    if clear:
        g[...] = 0
