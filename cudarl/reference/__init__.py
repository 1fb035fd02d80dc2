"""NumPy twins of the CUDA kernel families: the CPU backend and the parity oracle.

``cudarl/reference/<family>.py`` mirrors ``cuda_src/<family>.cu`` op for op, with the same
function names as the launchers in ``cudarl/ops/<family>.py``.
"""
