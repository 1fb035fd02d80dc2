"""Launchers for the CUDA kernel families: check shapes and dtypes, then launch.

A launcher writes only into buffers it is given; it never allocates, synchronises, or reads
device values, so every launcher is safe inside a CUDA graph capture.
"""
