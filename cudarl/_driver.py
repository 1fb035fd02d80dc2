"""The CUDA driver's start, through ``libcuda`` with ctypes (no CuPy, no NumPy): ``cuInit`` and the
primary context of device 0, the one CuPy starts on in a new process. A ctypes call lets go of the GIL,
so this runs beside the caller's host work. :func:`start_early` begins it in a thread of its own before
the rest of cudarl is imported (``cudarl.load_policy`` does, for a GPU request);
:func:`cudarl.backend.warm_up` waits for that thread rather than starting the driver a second time."""

from __future__ import annotations

import importlib.util
import os
import threading

#: the thread :func:`start_early` began, and what its :func:`start` returned (once it has)
_early: list = []
#: The environment variable that picks a backend when the caller asks for ``auto``.
ENV_VAR = "CUDARL_BACKEND"
#: A policy's or the CLI's ``device`` -> the backend it requests (None: ``auto``).
DEVICE_BACKENDS = {"auto": None, "gpu": "cupy", "cpu": "numpy"}


def backend_choice(requested: str | None) -> str:
    """What :func:`cudarl.backend.select` acts on: ``requested`` unless it is None, empty or ``auto``,
    else ``$CUDARL_BACKEND`` (``auto`` when unset), stripped and lower-cased (not yet validated)."""
    choice = requested if requested not in (None, "", "auto") else os.environ.get(ENV_VAR, "auto")
    return choice.strip().lower()


def start() -> bool:
    """``cuInit`` and device 0's primary context, made current in this thread. The retained context is
    kept (the runtime keeps the same one for the process). Returns whether it is current; any failure
    is left for the backend's selection to report."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        return (
            cu.cuInit(0) == 0
            and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
            and cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
            and cu.cuCtxSetCurrent(ctx) == 0
        )
    except (OSError, AttributeError):
        return False


def load_cublas() -> None:
    """Load cuBLAS, and with it cuBLASLt (its dependency), the way CuPy loads them (``cuda.pathfinder``),
    so CuPy's import of its cuBLAS module and :mod:`cudarl.blas` later find them loaded. Failures are
    left for the first GEMM to report."""
    try:
        from cuda import pathfinder

        pathfinder.load_nvidia_dynamic_lib("cublas")
    except Exception:
        pass


def cupy_installed() -> bool:
    """Whether CuPy can be found (without importing it)."""
    return importlib.util.find_spec("cupy") is not None


def start_early(device: str) -> None:
    """For a ``device`` whose backend (:data:`DEVICE_BACKENDS`, then :func:`backend_choice`: ``gpu``, or
    ``auto`` without ``CUDARL_BACKEND=numpy``) is not NumPy, where CuPy is installed: begin :func:`start`
    and, in a thread beside it, :func:`load_cublas`, in a thread now, once a process (:func:`join_early`
    waits for both). An unknown ``device`` starts nothing (its load reports it)."""
    if device not in DEVICE_BACKENDS or backend_choice(DEVICE_BACKENDS[device]) == "numpy" or _early:
        return
    if not cupy_installed():
        return
    result = {}

    def run():
        libraries = threading.Thread(target=load_cublas, name="cudarl-gemm-libraries", daemon=True)
        libraries.start()
        result["started"] = start()
        libraries.join()

    t = threading.Thread(target=run, name="cudarl-driver-early", daemon=True)
    _early.append((t, result))
    t.start()


def join_early() -> None:
    """Wait for the thread :func:`start_early` began, if any."""
    if _early:
        _early[0][0].join()
