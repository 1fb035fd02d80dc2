"""cudarl: distributional deep-Q trading agents with the whole training step on the GPU.

The CUDA path (CuPy) and the NumPy path compute the same functions; every kernel in
``cuda_src/`` has a NumPy twin in ``cudarl.reference`` that is both the CPU backend and
the oracle of its parity test.
"""

__version__ = "0.1.0"
