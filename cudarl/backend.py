"""Backend selection: CuPy when a CUDA device is usable, NumPy otherwise.

``CUDARL_BACKEND=numpy|cupy`` forces a choice. Asking for ``cupy`` on a machine without a
usable GPU raises :class:`BackendError` with one sentence saying why, never a traceback from
inside CuPy.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from . import _driver

ENV_VAR = _driver.ENV_VAR
CHOICES = ("numpy", "cupy")


class BackendError(RuntimeError):
    """The requested backend cannot be used on this machine."""


@dataclass(frozen=True)
class Backend:
    """The array module in use and what it runs on.

    Attributes:
        name: ``"numpy"`` or ``"cupy"``.
        xp: the array module (``numpy`` or ``cupy``).
        device: a human-readable device name (``"cpu"`` or the GPU's name).
        compute_capability: e.g. ``"90"`` for an H200; ``None`` on the CPU.
    """

    name: str
    xp: ModuleType
    device: str
    compute_capability: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.name == "cupy"


def cupy_unavailable_reason() -> str | None:
    """Why CuPy cannot run here, or ``None`` if it can. Never raises."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return f"CuPy is not importable ({type(exc).__name__}: {exc}); install cudarl[cuda13] or cudarl[cuda12]"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return "no CUDA device is visible"
    return None


def _make_cupy() -> Backend:
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Backend("cupy", cupy, name, dev.compute_capability)


def select(requested: str | None = None) -> Backend:
    """Pick a backend. ``requested`` overrides ``$CUDARL_BACKEND``; ``None``/``"auto"`` chooses."""
    choice = _driver.backend_choice(requested)
    if choice not in CHOICES + ("auto",):
        raise BackendError(f"{ENV_VAR}={choice!r} is not one of numpy, cupy, auto")
    if choice == "numpy":
        return Backend("numpy", np, "cpu")
    reason = cupy_unavailable_reason()
    if choice == "cupy":
        if reason is not None:
            raise BackendError(f"the cupy backend was requested but {reason}")
        return _make_cupy()
    return Backend("numpy", np, "cpu") if reason is not None else _make_cupy()


@functools.cache
def _cached(requested: str | None, env: str | None) -> Backend:
    return select(requested)


#: background selections started by :func:`warm_up` (key of :func:`_cached` -> an Event set once that
#: selection has ended, in success or failure), and the keys :func:`get` has returned
_warming: dict = {}
_selected: set = set()


def warm_up(requested: str | None = None, then=None, on_context=None) -> threading.Thread | None:
    """Start :func:`get` ``(requested)`` in a background thread, so that CuPy's import and the device's
    initialisation (about half a second on an H200 host) overlap with host work the caller does before
    its first :func:`get` (reading a policy file and the bars, say), which then waits for the selection.
    A failure is not raised there: :func:`get` selects again and raises it in the caller's thread.
    Nothing starts for ``numpy``, once the backend is known, or where CuPy is not installed.

    ``then(backend)``, if given, runs in that thread after a selection that succeeded: device work the
    caller will need, made while it works on (its own objects: :func:`get` does not wait for it; the
    caller joins the returned thread before it uses what ``then`` makes). What ``then`` raises is
    dropped, so the caller must be able to redo its work. Returns the thread, or None if none started.

    The driver's start (``cuInit``, the device's primary context) runs in a thread of its own through
    the driver library (:func:`_start_driver`): a ctypes call lets go of the GIL, so it overlaps with
    CuPy's import and with the caller, where CuPy's own first calls would hold the GIL through it.
    Beside it, a third thread loads cuBLAS (:func:`cudarl._driver.start_early`, which
    ``cudarl.load_policy`` may have begun before cudarl's modules were imported). Then
    ``on_context()``, if given, runs in the driver's thread with the device's primary context current:
    device work through the driver API alone (no CuPy; ctypes calls, which let go of the GIL), such as
    :func:`cudarl.blas.warm_plans`. The selection does not wait for it; ``then`` does. What it raises
    is dropped, like ``then``'s."""
    key = (requested, os.environ.get(ENV_VAR))
    if _driver.backend_choice(requested) == "numpy" or key in _warming or key in _selected:
        return None
    if not _cupy_installed():
        return None  # get() says why, in the caller's thread
    selected, context = threading.Event(), threading.Event()

    def drive():
        started = False
        try:
            _driver.start_early("gpu")  # the driver's start beside cuBLAS's load, unless load_policy began them
            _driver.join_early()
            started = _start_driver()  # quick once started: the context, current in this thread
        finally:
            context.set()
        if started and on_context is not None:
            try:
                on_context()
            except Exception:
                pass  # the same work is redone, and any error raised, where it is needed

    def select_quietly():
        driver = threading.Thread(target=drive, name="cudarl-driver-start", daemon=True)
        driver.start()
        try:
            import cupy  # noqa: F401  (beside the driver's start)
        except Exception:
            pass  # get() selects again in the caller's thread and raises it there
        context.wait()  # CuPy's first call would otherwise wait inside cuInit holding the GIL
        try:
            be = _cached(*key)
        except Exception:
            return
        finally:
            selected.set()  # the selection does not wait for on_context; then does
        driver.join()
        if then is not None:
            try:
                then(be)
            except Exception:
                pass

    t = threading.Thread(target=select_quietly, name="cudarl-backend-warm-up", daemon=True)
    _warming[key] = selected
    t.start()
    return t


#: Whether CuPy can be found, without importing it (:func:`cudarl._driver.cupy_installed`)
_cupy_installed = _driver.cupy_installed


#: ``cuInit`` and the primary context, current in the calling thread (:func:`cudarl._driver.start`)
_start_driver = _driver.start


def get(requested: str | None = None) -> Backend:
    """The process-wide backend (cached per request and environment value)."""
    key = (requested, os.environ.get(ENV_VAR))
    selected = _warming.pop(key, None)
    if selected is not None:
        selected.wait()  # a warm-up still selecting: functools.cache would let both threads select
    be = _cached(*key)
    _selected.add(key)
    return be


def get_array_module(*arrays) -> ModuleType:
    """``cupy`` if any argument is a CuPy array, else ``numpy`` (without importing CuPy)."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


def is_numpy(xp) -> bool:
    """Whether ``xp`` is NumPy (the CPU backend); anything else is CuPy."""
    return xp is np or getattr(xp, "__name__", "") == "numpy"


def family(name: str, xp) -> ModuleType:
    """The one dispatch point of a kernel family: ``cudarl.reference.<name>`` (the NumPy twin) for
    ``xp = numpy``, ``cudarl.ops.<name>`` (the launchers of ``cuda_src/<name>.cu``) for CuPy. Both
    define the same op names (``tools/check_faces.py``); every object picks its ops here."""
    return importlib.import_module(f"cudarl.{'reference' if is_numpy(xp) else 'ops'}.{name}")


def address(a) -> int:
    """The address of ``a``'s first element: a CuPy array's device pointer, a NumPy array's host address (for
    comparing where views lie: the same buffer, or spans that must not overlap; the launchers', cuBLAS's and
    the agent's checks)."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


def to_numpy(a) -> np.ndarray:
    """A host copy of ``a`` (NumPy passes through). Never call inside a capture."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)
