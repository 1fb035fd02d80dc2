"""NVRTC through ctypes: CUDA C source to a cubin (or PTX), with exactly the options cudarl gives.

CuPy's ``RawModule(code=...)`` appends ``-ftz=true`` to every compile (``cupy/cuda/compiler.py``),
so its kernels flush float32 subnormals to zero while their NumPy twins keep them. cudarl therefore
compiles with NVRTC itself and loads the cubin with ``RawModule(path=...)`` (``cudarl.kernels``).

NVRTC needs no GPU and no CUDA context, so this module imports nothing from CuPy: a compile runs on
a machine without a GPU (the CPU tests use it when the library is installed) and in a worker
process. The library is found in this order: a ``libnvrtc`` this process already loaded (CuPy's),
``cuda.pathfinder`` (how CuPy 14 finds its CUDA libraries), the dynamic loader's search path, and
``$CUDA_PATH``/``$CUDA_HOME``/``/usr/local/cuda``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from pathlib import Path


class NvrtcError(RuntimeError):
    """NVRTC is missing, or refused a program; a compile error carries NVRTC's log."""


class NvrtcCompileError(NvrtcError):
    """The source did not compile; ``log`` is NVRTC's log (file:line: error ...)."""

    def __init__(self, name: str, log: str):
        super().__init__(f"{name} failed to compile:\n{log.strip()}")
        self.log = log


_LOADED = re.compile(r"/libnvrtc\.so(\.\d+)*$")


def _loaded_path() -> str | None:
    """The ``libnvrtc.so`` already mapped into this process (CuPy's, once it compiled or loaded)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if _LOADED.search(path):
                    return path
    except OSError:
        pass
    return None


def _candidates() -> list[str]:
    out = []
    loaded = _loaded_path()
    if loaded:
        out.append(loaded)
    try:
        from cuda import pathfinder

        out.append(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception:
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        out.append(found)
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            out.extend(sorted(str(p) for p in Path(os.environ[env], "lib64").glob("libnvrtc.so*")))
    out.extend(sorted(str(p) for p in Path("/usr/local/cuda/lib64").glob("libnvrtc.so*")))
    return out


@functools.cache
def library() -> ctypes.CDLL:
    """The NVRTC shared library, opened once (raises :class:`NvrtcError` naming where it looked)."""
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        _declare(lib)
        return lib
    raise NvrtcError(
        "cannot find libnvrtc (install cudarl[cuda13], or the nvidia-cuda-nvrtc wheel, or set CUDA_PATH); "
        f"tried: {', '.join(tried) or 'nothing found'}"
    )


def available() -> str | None:
    """``None`` if NVRTC can be used here, otherwise one sentence saying why not. Never raises."""
    try:
        library()
    except NvrtcError as exc:
        return str(exc)
    return None


def _declare(lib: ctypes.CDLL) -> None:
    vp, ci, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    ccpp, szp = ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)
    for name, argtypes in {
        "nvrtcVersion": [ctypes.POINTER(ci), ctypes.POINTER(ci)],
        "nvrtcGetNumSupportedArchs": [ctypes.POINTER(ci)],
        "nvrtcGetSupportedArchs": [ctypes.POINTER(ci)],
        "nvrtcCreateProgram": [ctypes.POINTER(vp), cp, cp, ci, ccpp, ccpp],
        "nvrtcDestroyProgram": [ctypes.POINTER(vp)],
        "nvrtcCompileProgram": [vp, ci, ccpp],
        "nvrtcGetProgramLogSize": [vp, szp],
        "nvrtcGetProgramLog": [vp, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [vp, szp],
        "nvrtcGetCUBIN": [vp, ctypes.c_char_p],
        "nvrtcGetPTXSize": [vp, szp],
        "nvrtcGetPTX": [vp, ctypes.c_char_p],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ci
    lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [ci], cp


def _check(status: int, what: str) -> None:
    if status != 0:
        msg = library().nvrtcGetErrorString(status)
        raise NvrtcError(f"{what} failed: {msg.decode() if msg else status}")


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The compute capabilities NVRTC can emit a cubin for, e.g. ``(75, 80, ..., 90, ...)``."""
    lib = library()
    n = ctypes.c_int()
    _check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
    arr = (ctypes.c_int * n.value)()
    _check(lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
    return tuple(sorted(arr))


def target(compute_capability: int) -> tuple[str, str]:
    """``(arch option, kind)`` for a device: ``("-arch=sm_90", "cubin")`` when NVRTC can emit SASS
    for it; otherwise PTX for the newest virtual arch it knows that the device can run (the driver
    compiles PTX at load), as CuPy does for a device newer than its NVRTC."""
    cc = int(compute_capability)
    archs = supported_archs()
    if cc in archs:
        return f"-arch=sm_{cc}", "cubin"
    older = [a for a in archs if a <= cc]
    if not older:
        raise NvrtcError(f"NVRTC {version()} cannot compile for compute capability {cc} (it supports {archs})")
    return f"-arch=compute_{older[-1]}", "ptx"


def compile_source(source: str, name: str, options: tuple[str, ...], kind: str = "cubin") -> bytes:
    """Compile ``source`` with ``options`` (which carry ``-arch``); return the cubin or PTX bytes.

    ``name`` is the program's file name in NVRTC's messages (``#line`` directives in the source
    override it). Raises :class:`NvrtcCompileError` with NVRTC's log if the source does not compile.
    Safe to call from several threads at once (one program each); ctypes releases the GIL.
    """
    if kind not in ("cubin", "ptx"):
        raise ValueError(f"kind must be 'cubin' or 'ptx', got {kind!r}")
    lib = library()
    prog = ctypes.c_void_p()
    _check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram"
    )
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        if status != 0:
            raise NvrtcCompileError(name, _log(prog) or f"status {status}")
        get_size, get = (
            (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if kind == "cubin" else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
        )
        size = ctypes.c_size_t()
        _check(get_size(prog, ctypes.byref(size)), f"nvrtcGet{kind.upper()}Size")
        buf = ctypes.create_string_buffer(size.value)
        _check(get(prog, buf), f"nvrtcGet{kind.upper()}")
        return buf.raw[: size.value]
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _log(prog) -> str:
    lib = library()
    size = ctypes.c_size_t()
    if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")
