#!/usr/bin/env python3
"""Which places of a 64-row float32 GEMM give a row the same bits (this machine's NumPy BLAS).

For each shape of the CPU walk's GEMMs, one row is put at each of the 64 places of a block of random
rows and its output bits are grouped: one group means the BLAS sums every row alike at this shape (the
old ``RowExactQ`` design's assumption); more mean a row's bits depend on its place (OpenBLAS 0.3.31,
DYNAMIC_ARCH, on an AMD EPYC: three groups, places ``p mod 12`` in 0-5, in 6-11, and the tail 60-63).
:class:`cudarl.policy.ExactGemm` does not depend on it. Prints the groups; exits 0 either way.
"""

from __future__ import annotations

import numpy as np

SHAPES = [(13, 256), (66, 256), (256, 256), (256, 204), (51, 2)]


def groups(k_in: int, m: int, rows: int = 64, seed: int = 0) -> list[list[int]]:
    """The places of a ``rows``-row SGEMM ``[rows, k_in] @ [k_in, m]`` that give one row the same bits."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k_in, m)).astype(np.float32)
    x = rng.standard_normal(k_in).astype(np.float32)
    found: dict[bytes, list[int]] = {}
    for p in range(rows):
        block = rng.standard_normal((rows, k_in)).astype(np.float32)
        block[p] = x
        found.setdefault((block @ w)[p].tobytes(), []).append(p)
    return list(found.values())


def main() -> None:
    for k_in, m in SHAPES:
        g = groups(k_in, m)
        print(f"{k_in:4d} -> {m:4d}: {len(g)} group(s) of places: {g if len(g) > 1 else 'all alike'}")


if __name__ == "__main__":
    main()
