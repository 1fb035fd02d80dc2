"""The denoising objective in NumPy: twin of ``cuda_src/denoise.cu``.

A denoising autoencoder (Vincent, Larochelle, Bengio & Manzagol 2008, "Extracting and Composing Robust
Features with Denoising Autoencoders"): the encoder reads a corrupted observation window and a linear
decoder on its output reconstructs the clean window. The corruption is masking noise (our variant of the
paper's, below)::

    u_i   = draw i of the Philox stream (seed, counter, STREAM)          (uniform in [0, 1))
    x~_i  = 0 if u_i < p else x_i                                         (p = agent.aux_denoise_mask)
    x^    = decoder(encoder(x~))                                          ([B, m], m = the window's width)
    loss  = 1 / (B m) sum_{b, j} (x^_bj - x_bj)^2,   dloss / dx^ = 2 / (B m) (x^ - x)

The counter lives in device memory and :func:`loss` advances it, so every update draws a new mask.

Our variant of the masking noise: Vincent et al. zero a fixed number ``p m`` of the ``m`` components of
each example, chosen at random; here each element is zeroed independently with probability ``p`` (one
Philox draw per element, no per-row selection in the kernel), the same expected share with a binomial
count per row (tests/unit/test_paper_oracles_aux.py).
"""

from __future__ import annotations

import numpy as np

from . import philox
from .horizons import total

F32 = np.float32


def corrupt(x, out, counter, p, seed, stream_id) -> None:
    """``out [n...] = x`` with each element zeroed where its draw is below ``p`` (float32; ``counter``:
    int64 ``[1]``, read)."""
    n = x.size
    u = philox.uniform(int(seed), int(counter[0]), int(stream_id), n)
    out.reshape(-1)[:] = np.where(u < F32(p), x.dtype.type(0), x.reshape(-1))


def loss(recon, clean, grad, loss_per, counter, scale) -> None:
    """``grad [B, m] = 2 scale (recon - clean)``, ``loss_per [B] = scale sum_j (recon - clean)^2`` (in
    column order), then ``counter[0] += 1``. ``scale``: ``1 / (B m)`` (float32 on the GPU; the dtype of
    ``recon`` here, so float64 for gradient checks)."""
    recon = np.asarray(recon)
    dt = recon.dtype.type
    s = dt(scale)
    e = recon - np.asarray(clean, recon.dtype)
    grad[...] = (dt(2) * s) * e
    loss_per[:] = s * np.cumsum(e * e, axis=1, dtype=recon.dtype)[:, -1]
    counter[0] += 1


__all__ = ["corrupt", "loss", "total"]
