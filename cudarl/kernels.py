"""The kernel loader and the one launch helper.

Every kernel family lives in ``cuda_src/<family>.cu`` with ``extern "C"`` kernels named
``cudarl_<family>_<op>``. This module builds one ``cupy.RawModule`` per (family, context):

* ``context`` is ``"ungraphed"`` for eager launches, or the name of the graph that captures
  the kernel (``cudarl.graph.StepGraph`` sets it for the duration of a capture). So a function
  handle that is captured in a graph is never also launched outside it, and two graphs never
  share a handle (DESIGN.md rule 1; the seed system's 3100 ms replays came from sharing).
* CuPy caches modules by source, so two modules of identical source share one CUmodule. The
  source of each context therefore starts with a line naming the context, and with a digest
  of the headers under ``cuda_src/include`` (CuPy's cache key does not see included files).

Compile options live here and nowhere else. ``#line 1 "cuda_src/<family>.cu"`` makes a
compile error point at the real file and line.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import signatures

UNGRAPHED = "ungraphed"
_CONTEXT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")


class KernelError(RuntimeError):
    """A kernel could not be loaded or launched as asked."""


class KernelCompileError(KernelError):
    """NVRTC rejected a ``.cu`` file; the message quotes the file and line."""


def _find_src_dir() -> Path:
    pkg = Path(__file__).resolve().parent
    for cand in (pkg / "cuda_src", pkg.parent / "cuda_src"):  # wheel, then source checkout
        if (cand / "include").is_dir():
            return cand
    raise KernelError(
        f"cannot find the CUDA sources next to {pkg} (looked for cuda_src/ in the package and the checkout)"
    )


SRC_DIR = _find_src_dir()
INCLUDE_DIR = SRC_DIR / "include"


def families() -> list[str]:
    """Every kernel family shipped (the stems of ``cuda_src/*.cu``)."""
    return sorted(p.stem for p in SRC_DIR.glob("*.cu"))


def compile_options() -> tuple[str, ...]:
    """NVRTC options for every module. CuPy adds ``-arch`` for the current device itself.

    No fast-math: the kernels must match their NumPy twins to float32 rounding.
    ``CUDARL_LINEINFO=1`` adds ``-lineinfo`` (source lines for Nsight Compute's per-line stall
    sampling, ``tools/gpu_profile.sh``); it changes no generated instruction.
    """
    opts = ("-std=c++17", f"-I{INCLUDE_DIR}")
    return opts + ("-lineinfo",) if os.environ.get("CUDARL_LINEINFO") == "1" else opts


@functools.lru_cache(maxsize=1)
def headers_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INCLUDE_DIR.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(INCLUDE_DIR).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def check_context(context: str) -> str:
    if not isinstance(context, str) or not _CONTEXT_RE.match(context):
        raise KernelError(f"invalid kernel context {context!r}: use 'ungraphed' or a graph name like 'train'")
    return context


def module_source(family: str, context: str) -> str:
    """The exact source compiled for (family, context): a context banner, then the file."""
    path = SRC_DIR / f"{family}.cu"
    if not path.is_file():
        raise KernelError(f"no kernel family {family!r}: {path} does not exist (families: {', '.join(families())})")
    check_context(context)
    banner = (
        f'#define CUDARL_CONTEXT "{context}"\n'
        f"// cudarl module: family={family} context={context} headers={headers_digest()}\n"
        f'#line 1 "cuda_src/{family}.cu"\n'
    )
    return banner + path.read_text()


# --- the current context: set by cudarl.graph during a capture -------------------------------
_local = threading.local()


def current_context() -> str:
    return getattr(_local, "context", UNGRAPHED)


@contextmanager
def use_context(context: str):
    """Resolve kernels from ``context``'s modules inside the block (used by graph capture)."""
    check_context(context)
    prev = current_context()
    _local.context = context
    try:
        yield
    finally:
        _local.context = prev


# --- module and function caches ----------------------------------------------------------------
_modules: dict[tuple[str, str], object] = {}
_functions: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()


def get_module(family: str, context: str):
    """The ``cupy.RawModule`` of (family, context), compiled and cached on first use."""
    key = (family, check_context(context))
    mod = _modules.get(key)
    if mod is None:
        import cupy

        with _lock:
            mod = _modules.get(key)
            if mod is None:
                src = module_source(family, context)
                try:
                    mod = cupy.RawModule(code=src, options=compile_options())
                    mod.compile()  # compile now so errors surface here, not at first launch
                except cupy.cuda.compiler.CompileException as exc:
                    raise KernelCompileError(
                        f"cuda_src/{family}.cu failed to compile:\n"
                        f"{exc.get_message() if hasattr(exc, 'get_message') else exc}"
                    ) from None
                _modules[key] = mod
    return mod


def get_function(family: str, op: str, context: str | None = None):
    """The ``cupy.RawKernel`` for ``cudarl_<family>_<op>`` in ``context`` (default: current)."""
    ctx = current_context() if context is None else context
    key = (family, op, ctx)
    fn = _functions.get(key)
    if fn is None:
        name = f"cudarl_{family}_{op}"
        try:
            fn = get_module(family, ctx).get_function(name)
        except KernelError:
            raise
        except Exception as exc:
            raise KernelError(f"cuda_src/{family}.cu has no kernel {name} ({type(exc).__name__}: {exc})") from None
        _functions[key] = fn
    return fn


def loaded() -> dict[tuple[str, str], object]:
    """A snapshot of the loaded modules, keyed by (family, context)."""
    return dict(_modules)


# --- arguments and the launch helper ----------------------------------------------------------
def check_args(where: str, params: tuple, args: tuple) -> tuple:
    """Validate ``args`` against a kernel's C parameters (``signatures.of(...).params``: ``(name, dtype,
    is_pointer)``); return them with scalars cast to their C types.

    Pointers must be CuPy arrays of the declared dtype, C-contiguous, non-empty, with a
    non-null address (DESIGN.md rule 5: a disabled feature gets no launch, not a null pointer).
    """
    if len(args) != len(params):
        text = ", ".join(n for n, _, _ in params)
        raise KernelError(f"{where}: expected {len(params)} arguments ({text}), got {len(args)}")
    out = []
    for (name, dtype, is_ptr), a in zip(params, args, strict=True):
        if is_ptr:
            if not (type(a).__module__.startswith("cupy") and hasattr(a, "data")):
                raise KernelError(f"{where}: argument {name!r} must be a CuPy array of {dtype}, got {type(a).__name__}")
            if a.dtype != dtype:
                raise KernelError(f"{where}: argument {name!r} has dtype {a.dtype}, expected {dtype}")
            if not a.flags.c_contiguous:
                raise KernelError(f"{where}: argument {name!r} is not C-contiguous")
            if a.size == 0 or a.data.ptr == 0:
                raise KernelError(
                    f"{where}: argument {name!r} is empty or a null pointer; a disabled feature must not be launched"
                )
            out.append(a)
        else:
            if isinstance(a, (np.ndarray,)) or hasattr(a, "data") and not np.isscalar(a):
                raise KernelError(f"{where}: argument {name!r} must be a scalar {dtype}, got an array")
            try:
                v = dtype.type(a)
            except (OverflowError, ValueError, TypeError) as exc:
                raise KernelError(f"{where}: argument {name!r}={a!r} does not fit {dtype}: {exc}") from None
            if dtype.kind in "iu" and int(v) != int(a):
                raise KernelError(f"{where}: argument {name!r}={a!r} does not fit {dtype}")
            out.append(v)
    return tuple(out)


def pack_struct(sig: signatures.Signature, checked: tuple) -> np.ndarray:
    """The one-element NumPy array of ``sig.struct`` holding ``checked`` (pointers as device addresses):
    CuPy passes it to the kernel by value, and a graph capture copies it into the node like any argument."""
    rec = np.zeros(1, dtype=sig.struct)
    for (name, _, is_ptr), v in zip(sig.params, checked, strict=True):
        rec[name] = v.data.ptr if is_ptr else v
    return rec


def _is_capturing(stream) -> bool:
    return bool(stream.is_capturing())


#: Dynamic shared memory a launch gets without opting in (bytes).
_DEFAULT_SMEM = 48 * 1024


def launch(family: str, op: str, grid, block, args: tuple, *legacy, stream=None, shared_mem: int = 0) -> None:
    """Launch ``cudarl_<family>_<op>`` with ``args`` on ``stream`` (default: CuPy's current stream).

    ``args`` are checked against the kernel's ``extern "C"`` parameters as ``cuda_src/<family>.cu``
    declares them (:func:`cudarl.signatures.of`: the one source of a signature); for a kernel that
    takes a struct by value they are its fields in order, packed here. The module is the current
    context's; launching an ``ungraphed`` kernel into a capturing stream, or a graph's kernel outside
    its capture, raises (DESIGN.md rule 1).
    """
    where = f"cudarl_{family}_{op}"
    if isinstance(args, str) or legacy:
        raise KernelError(f"{where}: launch takes no signature string; it is read from cuda_src/{family}.cu")
    import cupy

    sig = signatures.of(family, op)
    checked = check_args(where, sig.params, tuple(args))
    if sig.struct is not None:
        checked = (pack_struct(sig, checked),)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    block = (block,) if isinstance(block, int) else tuple(block)
    if any(int(g) < 1 for g in grid) or any(int(b) < 1 for b in block) or int(np.prod(block)) > 1024:
        raise KernelError(f"{where}: bad launch shape grid={grid} block={block}")
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    ctx = current_context()
    capturing = _is_capturing(s)
    if capturing and ctx == UNGRAPHED:
        raise KernelError(f"{where}: launched into a capturing stream outside cudarl.graph (context 'ungraphed')")
    if not capturing and ctx != UNGRAPHED:
        raise KernelError(f"{where}: context {ctx!r} belongs to a capture, but the stream is not capturing")
    fn = get_function(family, op, ctx)
    if shared_mem > _DEFAULT_SMEM and fn.max_dynamic_shared_size_bytes < shared_mem:
        fn.max_dynamic_shared_size_bytes = int(
            shared_mem
        )  # the opt-in past 48 KiB (a function attribute, not a launch)
    with s:
        fn(grid, block, checked, shared_mem=shared_mem)


def blocks_for(n: int, threads: int = 256) -> int:
    """Number of blocks of ``threads`` covering ``n`` items (at least 1)."""
    return max(1, (int(n) + threads - 1) // threads)


@functools.cache
def _multiprocessors(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def resident_grid_limit() -> int:
    """The largest grid of a kernel that waits on ``cudarl::grid_barrier`` (reduce.cuh): one block
    per multiprocessor of the current device, so every block is resident at once however the
    SMs are shared (each SM takes one block as soon as its other work drains)."""
    import cupy

    return _multiprocessors(cupy.cuda.Device().id)
