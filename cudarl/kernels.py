"""The kernel loader and the one launch helper.

Every kernel family lives in ``cuda_src/<family>.cu`` with ``extern "C"`` kernels named
``cudarl_<family>_<op>``. This module compiles each family with NVRTC (``cudarl.nvrtc``), keeps
the cubin in a disk cache, and loads one ``cupy.RawModule`` per (family, context):

* ``context`` is ``"ungraphed"`` for eager launches, or the name of the graph that captures
  the kernel (``cudarl.graph.StepGraph`` sets it for the duration of a capture). So a function
  handle that is captured in a graph is never also launched outside it, and two graphs never
  share a handle (DESIGN.md rule 1; the seed system's 3100 ms replays came from sharing).
* A family is compiled once, whatever the contexts: the contexts differ only in the module the
  cubin is loaded into. CuPy memoises ``RawModule(path=...)`` by path, so each context loads the
  cubin through a name of its own (a hard link beside it); each load is a module of its own.
* A family may be split into compile units (``cudarl/units.cuh``: kernels between
  ``#if CUDARL_UNIT_IS(name)`` and ``#endif``), each one NVRTC program that emits only its own
  kernels; a kernel is then compiled and loaded from its unit alone, so a start-up waits only for
  the units holding the kernels it launches, and they compile side by side. A kernel's machine
  code is the same in its unit as in the whole family (``tests/unit/test_compile_units.py``).
* The disk cache (``$CUDARL_CACHE_DIR``, default ``~/.cache/cudarl``, under ``kernels/``) holds an
  entry per family or unit, keyed by the sha256 of the program text (which names the unit), every
  header under ``cuda_src/include``, the options, the target architecture and NVRTC's version;
  entries are written atomically (temporary file, fsync, rename), so processes may share it and a
  crash leaves no partial cubin.
* Compiles run lazily (a unit is compiled when a kernel of it is first resolved), and
  :func:`prefetch` starts several on a thread pool (NVRTC releases the GIL), which is how
  ``cudarl.graph`` compiles the units a graph launches in parallel before capturing it.

Compile options live here and nowhere else (:func:`compile_options`): no fast-math, and
``-ftz=false``, so float32 subnormals survive as they do in the NumPy twins (CuPy's own
``RawModule(code=...)`` appends ``-ftz=true``: the reason cudarl calls NVRTC itself).
``#line 1 "cuda_src/<family>.cu"`` makes a compile error point at the real file and line.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import nvrtc, signatures
from .atomic import atomic_link, atomic_open

UNGRAPHED = "ungraphed"
_CONTEXT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
#: Environment variables read here: the cache folder, flush-to-zero, source line info.
CACHE_ENV, LINEINFO_ENV = "CUDARL_CACHE_DIR", "CUDARL_LINEINFO"
#: Bumped when the layout of a cache entry changes, so old entries are never read as new ones.
CACHE_FORMAT = 1


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
    """NVRTC options for every family (the architecture is added per device by :func:`target`).

    No fast-math: the kernels must match their NumPy twins to float32 rounding, subnormals
    included (``-ftz=false``). ``--device-as-default-execution-space``
    is what CuPy passed, so the code is what it compiled. ``CUDARL_LINEINFO=1`` adds ``-lineinfo``
    (source lines for Nsight Compute's per-line stall sampling, ``tools/gpu_profile.sh``); it
    changes no generated instruction.
    """
    opts = (
        "-std=c++17",
        f"-I{INCLUDE_DIR}",
        "--device-as-default-execution-space",
        "-ftz=false",
    )
    return opts + ("-lineinfo",) if os.environ.get(LINEINFO_ENV) == "1" else opts


def headers() -> list[tuple[str, bytes]]:
    """Every file under ``cuda_src/include`` as (relative path, contents), in a fixed order."""
    return [
        (p.relative_to(INCLUDE_DIR).as_posix(), p.read_bytes()) for p in sorted(INCLUDE_DIR.rglob("*")) if p.is_file()
    ]


def check_context(context: str) -> str:
    if not isinstance(context, str) or not _CONTEXT_RE.match(context):
        raise KernelError(f"invalid kernel context {context!r}: use 'ungraphed' or a graph name like 'train'")
    return context


def _source(family: str) -> Path:
    path = SRC_DIR / f"{family}.cu"
    if not path.is_file():
        raise KernelError(f"no kernel family {family!r}: {path} does not exist (families: {', '.join(families())})")
    return path


def program(family: str, unit: str | None = None) -> str:
    """The exact text NVRTC compiles for ``family`` (or its compile unit ``unit``): a ``#line``
    directive, then the file; a unit's program first defines ``CUDARL_UNIT`` and ``CUDARL_UNIT_<unit>``
    (``cudarl/units.cuh``), so it emits that unit's kernels only. ``unit=None``: the whole family."""
    path = _source(family)
    head = ""
    if unit is not None:
        if unit not in units(family):
            raise KernelError(f"cuda_src/{family}.cu has no compile unit {unit!r} (units: {units(family)})")
        head = f"#define CUDARL_UNIT 1\n#define CUDARL_UNIT_{unit} 1\n"
    return head + f'#line 1 "cuda_src/{family}.cu"\n' + path.read_text()


def units(family: str) -> list[str | None]:
    """The compile units of ``family`` (``[None]``: the file is one unit), read from its guards."""
    _source(family)
    try:
        return signatures.units(family, SRC_DIR)
    except signatures.SignatureError as exc:
        raise KernelError(str(exc)) from None


def unit_of(family: str, op: str) -> str | None:
    """The compile unit holding ``cudarl_<family>_<op>`` (``None``: the family is one unit)."""
    _source(family)
    try:
        return signatures.unit_of(family, op, SRC_DIR)
    except signatures.SignatureError as exc:
        raise KernelError(str(exc)) from None


def unit_name(family: str, unit: str | None) -> str:
    """``family``, or ``family.unit`` for a compile unit: the name of a cache entry and a report row."""
    return family if unit is None else f"{family}.{unit}"


# --- the disk cache ------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$CUDARL_CACHE_DIR/kernels`` (default ``~/.cache/cudarl``)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "cudarl")
    return Path(root) / "kernels"


def target(compute_capability=None) -> tuple[str, str]:
    """``(arch option, kind)`` for the current device (or ``compute_capability``, e.g. ``90``)."""
    if compute_capability is None:
        import cupy

        compute_capability = cupy.cuda.Device().compute_capability
    try:
        return nvrtc.target(int(compute_capability))
    except nvrtc.NvrtcError as exc:
        raise KernelError(str(exc)) from None


def cache_key(family: str, arch: str, kind: str, unit: str | None = None) -> str:
    """sha256 over everything that decides the binary: the program (the unit's, which names it), the
    headers, the options (the include folder's path left out), the architecture and output kind,
    and NVRTC's version."""
    h = hashlib.sha256()

    def put(*parts) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            h.update(len(b).to_bytes(8, "little") + b)  # length-prefixed: no two splits collide

    put(f"cudarl-kernel-cache {CACHE_FORMAT}", family, program(family, unit))
    for name, data in headers():
        put(name, data)
    # the include folder by role, not by path: its files are hashed above, and two checkouts of one
    # commit (or a wheel and its source) then share their cubins
    put(*(o.replace(str(INCLUDE_DIR), "<include>") for o in compile_options()), arch, kind)
    put("nvrtc {}.{}".format(*nvrtc.version()))
    return h.hexdigest()


def _valid(data: bytes, kind: str) -> bool:
    return data.startswith(b"\x7fELF") if kind == "cubin" else data.lstrip().startswith(b"//")


#: One record a family compiled or found in the cache: what the start-up breakdown reads.
_report: list[dict] = []
_report_lock = threading.Lock()
_fallback_dir: list[Path] = []


def compile_report() -> list[dict]:
    """A record per binary (a family's, or a compile unit's) this process asked for: ``family``,
    ``unit`` (None: the whole family), ``cached`` (found on disk), ``compile_s`` (NVRTC's wall time,
    0 when cached), ``bytes``, ``path``."""
    with _report_lock:
        return [dict(r) for r in _report]


def _writable_dir() -> Path:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    if not _fallback_dir:
        import tempfile

        _fallback_dir.append(Path(tempfile.mkdtemp(prefix="cudarl-kernels-")))
        warnings.warn(
            f"kernel cache {d} is not writable; compiled kernels go to {_fallback_dir[0]} for this process only "
            f"(set {CACHE_ENV} to a writable folder to keep them)",
            stacklevel=3,
        )
    return _fallback_dir[0]


def binary(family: str, compute_capability=None, unit: str | None = None) -> Path:
    """The path of the compiled binary of ``family`` (of its compile unit ``unit``; None: the whole
    family) for the device, compiling it if the cache lacks it.

    Thread-safe, and safe between processes (an entry appears whole, by rename). Needs no GPU when
    ``compute_capability`` is given (e.g. ``90``).
    """
    arch, kind = target(compute_capability)
    key = cache_key(family, arch, kind, unit)
    path = cache_dir() / f"{unit_name(family, unit)}-{key[:32]}.{kind}"
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if _valid(data, kind):
        _record(family, unit, True, 0.0, len(data), path)
        return path
    t0 = time.perf_counter()
    try:
        data = nvrtc.compile_source(program(family, unit), f"{family}.cu", compile_options() + (arch,), kind)
    except nvrtc.NvrtcCompileError as exc:
        raise KernelCompileError(f"cuda_src/{family}.cu failed to compile:\n{exc.log.strip()}") from None
    except nvrtc.NvrtcError as exc:
        raise KernelError(f"cannot compile cuda_src/{family}.cu: {exc}") from None
    seconds = time.perf_counter() - t0
    path = _writable_dir() / path.name
    with atomic_open(path, "wb") as f:
        f.write(data)
    _record(family, unit, False, seconds, len(data), path)
    return path


def _record(family: str, unit: str | None, cached: bool, seconds: float, size: int, path: Path) -> None:
    rec = {"family": family, "unit": unit, "cached": cached, "compile_s": seconds, "bytes": size, "path": str(path)}
    with _report_lock:
        _report.append(rec)


# --- compiles in flight: the lazy path and the parallel one share them --------------------------
_pool: list[ThreadPoolExecutor] = []
_inflight: dict[tuple, Future] = {}
_inflight_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1)), thread_name_prefix="cudarl-nvrtc"))
    return _pool[0]


def _binary_future(family: str, unit: str | None, compute_capability, parallel: bool) -> Future:
    """The one compile of (family, unit, options, device) in this process: started now on the pool
    (``parallel``) or run in the caller's thread when first asked for without a prefetch."""
    key = (family, unit, compile_options(), compute_capability)
    with _inflight_lock:
        fut = _inflight.get(key)
        if fut is not None:
            return fut
        fut = _executor().submit(binary, family, compute_capability, unit) if parallel else Future()
        _inflight[key] = fut
    if not parallel:
        try:
            fut.set_result(binary(family, compute_capability, unit))
        except BaseException as exc:
            fut.set_exception(exc)
    return fut


def _forget(family: str, unit: str | None, compute_capability) -> None:
    with _inflight_lock:
        _inflight.pop((family, unit, compile_options(), compute_capability), None)


def _device_cc() -> str:
    import cupy

    return cupy.cuda.Device().compute_capability


def prefetch(names, compute_capability=None) -> list[Future]:
    """Start compiling in parallel (a thread pool) the compile units of ``names``; return at once.

    A name is a family (every unit of it) or a ``(family, op)`` pair (the unit holding that kernel:
    what :func:`discovering` notes). A unit already compiled or in flight is not started again; one
    future per distinct unit, in order. A compile error is raised where the unit is first used
    (:func:`get_module`), as without the prefetch.
    """
    cc = _device_cc() if compute_capability is None else compute_capability
    wanted = []
    for name in names:
        if isinstance(name, str):
            program(name)  # an unknown family fails here, in the caller
            wanted += [(name, u) for u in units(name)]
        else:
            family, op = name
            program(family)
            wanted.append((family, unit_of(family, op)))
    return [_binary_future(fam, unit, cc, parallel=True) for fam, unit in dict.fromkeys(wanted)]


# --- discovery: which kernels a block of launches needs, without launching ----------------------
_local = threading.local()


@contextmanager
def discovering():
    """Inside the block :func:`launch` records ``(family, op)`` of each kernel instead of launching
    it; the block yields that (growing) set. ``cudarl.graph`` runs a graph's phases this way, inside a
    capture that is then thrown away, to learn what to :func:`prefetch` before the real capture (the
    units holding those kernels, not whole families)."""
    prev = getattr(_local, "found", None)
    _local.found = found = set()
    try:
        yield found
    finally:
        _local.found = prev


# --- tracing: the launches of a capture, in order, for the critical path ------------------------
@contextmanager
def tracing():
    """Inside the block, every launch (still launched) and every event passed to :func:`trace` is
    appended to the yielded list: ``{"kind": "kernel", "name", "stream", "grid", "block"}`` from
    :func:`launch`; ``cudarl.graph`` adds phase starts and side-stream forks and joins,
    ``cudarl.blas`` its GEMMs. ``tools/critical_path.py`` builds the step's graph from it."""
    prev = getattr(_local, "trace", None)
    _local.trace = events = []
    try:
        yield events
    finally:
        _local.trace = prev


def trace(event: dict) -> None:
    """Note ``event`` if a :func:`tracing` block is open in this thread (cheap otherwise)."""
    events = getattr(_local, "trace", None)
    if events is not None:
        events.append(event)


# --- the current context: set by cudarl.graph during a capture -------------------------------
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
_modules: dict[tuple[str, str | None, str], object] = {}
_functions: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()
#: Seconds the loading thread waited for binaries (compiles or cache reads) and spent loading
#: modules (``cuModuleLoad``): the "compile" row of the start-up breakdown.
load_seconds = {"wait": 0.0, "load": 0.0}


def _context_path(path: Path, context: str) -> Path:
    """A name of ``context``'s own for the binary ``path`` (a hard link beside it, else a copy in a
    folder this process can write): CuPy memoises ``RawModule(path=...)`` by path, so one name per
    context gives one module per context."""
    name = f"{path.stem}.{context}{path.suffix}"
    try:
        atomic_link(path, path.with_name(name))
        return path.with_name(name)
    except OSError:  # a cache someone else filled, read-only to us
        atomic_link(path, _writable_dir() / name)
        return _writable_dir() / name


def _load(family: str, unit: str | None, context: str):
    import cupy

    cc = _device_cc()
    for attempt in (0, 1):
        t0 = time.perf_counter()
        path = _binary_future(family, unit, cc, parallel=False).result()
        t1 = time.perf_counter()
        own = _context_path(path, context)
        try:
            mod = cupy.RawModule(path=str(own))
            mod.compile()  # load now, so a bad binary fails here
        except cupy.cuda.driver.CUDADriverError as exc:
            if attempt:
                raise KernelError(f"cannot load {own} for cuda_src/{family}.cu: {exc}") from None
            path.unlink(missing_ok=True)  # a damaged cache entry: compile again, once
            own.unlink(missing_ok=True)
            _forget(family, unit, cc)
            continue
        load_seconds["wait"] += t1 - t0
        load_seconds["load"] += time.perf_counter() - t1
        return mod
    raise AssertionError("unreachable")


def get_module(family: str, context: str, unit: str | None = None):
    """The ``cupy.RawModule`` of (family's compile unit ``unit``, context), compiled (or read from
    the cache) and loaded on first use. ``unit=None``: the whole family (a family of one unit)."""
    key = (family, unit, check_context(context))
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                mod = _modules[key] = _load(family, unit, context)
    return mod


def get_function(family: str, op: str, context: str | None = None):
    """The ``cupy.RawKernel`` for ``cudarl_<family>_<op>`` in ``context`` (default: current), from
    the module of the compile unit that holds it."""
    ctx = current_context() if context is None else context
    key = (family, op, ctx)
    fn = _functions.get(key)
    if fn is None:
        name = f"cudarl_{family}_{op}"
        try:
            fn = get_module(family, ctx, unit_of(family, op)).get_function(name)
        except KernelError:
            raise
        except Exception as exc:
            raise KernelError(f"cuda_src/{family}.cu has no kernel {name} ({type(exc).__name__}: {exc})") from None
        _functions[key] = fn
    return fn


def loaded() -> dict[tuple[str, str | None, str], object]:
    """A snapshot of the loaded modules, keyed by (family, unit, context)."""
    return dict(_modules)


# --- arguments and the launch helper ----------------------------------------------------------
def check_args(where: str, params: tuple, args: tuple, empty_ok: tuple[str, ...] = ()) -> tuple:
    """Validate ``args`` against a kernel's C parameters (``signatures.of(...).params``: ``(name, dtype,
    is_pointer)``); return them with scalars cast to their C types.

    Pointers must be CuPy arrays of the declared dtype, C-contiguous, non-empty, with a
    non-null address (DESIGN.md rule 5: a disabled feature gets no launch, not a null pointer), except
    those the launcher names in ``empty_ok``: an array a kernel reads only when its shape gives it rows
    (the scan's chunk states when one chunk covers the window), which may then be empty.
    """
    if len(args) != len(params):
        text = ", ".join(n for n, _, _ in params)
        raise KernelError(f"{where}: expected {len(params)} arguments ({text}), got {len(args)}")
    unknown = set(empty_ok) - {n for n, _, p in params if p}
    if unknown:
        raise KernelError(f"{where}: empty_ok names {sorted(unknown)}, which are not pointer arguments")
    out = []
    for (name, dtype, is_ptr), a in zip(params, args, strict=True):
        if is_ptr:
            if not (type(a).__module__.startswith("cupy") and hasattr(a, "data")):
                raise KernelError(f"{where}: argument {name!r} must be a CuPy array of {dtype}, got {type(a).__name__}")
            if a.dtype != dtype:
                raise KernelError(f"{where}: argument {name!r} has dtype {a.dtype}, expected {dtype}")
            if not a.flags.c_contiguous:
                raise KernelError(f"{where}: argument {name!r} is not C-contiguous")
            if (a.size == 0 or a.data.ptr == 0) and not (a.size == 0 and name in empty_ok):
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


def launch(
    family: str,
    op: str,
    grid,
    block,
    args: tuple,
    *legacy,
    stream=None,
    shared_mem: int = 0,
    empty_ok: tuple[str, ...] = (),
) -> None:
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
    checked = check_args(where, sig.params, tuple(args), empty_ok)
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
    found = getattr(_local, "found", None)
    if found is not None:  # discovering(): note the kernel, launch nothing
        found.add((family, op))
        return
    fn = get_function(family, op, ctx)
    trace({"kind": "kernel", "name": where, "stream": s.ptr, "grid": list(grid), "block": list(block)})
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


def barrier_grid_fits(members: int, full_grid: int, limit: int) -> bool:
    """Whether an op's one launch with a grid barrier over ``members`` members (``gridDim.y``) gives each
    member as many blocks as the single agent's launch gets alone: ``limit // members >= min(full_grid,
    limit)``, ``limit`` the resident grid (:func:`resident_grid_limit`), ``full_grid`` the blocks the op
    covers a member with when nothing caps them.

    Why: every block of a launch that waits on ``cudarl::grid_barrier`` must be resident at once, so the
    whole launch has at most ``limit`` blocks and each member ``limit // members`` of them; the single
    agent has ``min(full_grid, limit)``. A member given fewer runs its work on fewer multiprocessors, a
    block doing the work of several one after another, while the op's form without the barrier (the same
    bits in two or three launches) has no residency limit and gives every member its full grid. The
    joined learner (:class:`cudarl.stacked_agent.StackedLearner`) takes the one launch only where this
    holds; one member always fits."""
    return int(limit) // int(members) >= min(int(full_grid), int(limit))
