"""Fixtures shared by the kernel loader's tests (tests/unit/test_kernel_cache.py, test_compile_units.py), and a
recorder of the batched GEMMs' ``algo`` (test_stacked_agent.py, test_population.py)."""

import hashlib
import shutil
import time
from pathlib import Path

import pytest

from cudarl import kernels, nvrtc


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh cache folder, default options, and a clean slate of compiles in flight."""
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(kernels.LINEINFO_ENV, raising=False)
    monkeypatch.setattr(kernels, "_inflight", {})
    monkeypatch.setattr(kernels, "_fallback_dir", [])
    return tmp_path / "cache" / "kernels"


class _Calls(list):
    """The names compiled, in order (their program texts in ``sources``); ``delay`` seconds each."""

    delay = 0.0

    def __init__(self):
        super().__init__()
        self.sources = []


@pytest.fixture
def fake_nvrtc(monkeypatch, cache):
    """NVRTC replaced by a function that records each compile and returns a fake ELF image."""
    calls = _Calls()

    def compile_source(source, name, options, kind="cubin"):
        calls.append(name)
        calls.sources.append(source)
        time.sleep(calls.delay)
        if "#error" in source:
            raise nvrtc.NvrtcCompileError(name, f"cuda_src/{name}(2): error: boom")
        return b"\x7fELF" + hashlib.sha256(source.encode() + repr(options).encode()).digest()

    monkeypatch.setattr(nvrtc, "compile_source", compile_source)
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: (80, 90))
    return calls


@pytest.fixture
def cuda_tree(tmp_path, monkeypatch) -> Path:
    """A copy of cuda_src/ that the loader reads instead (to change a file without touching the repo)."""
    src = tmp_path / "cuda_src"
    shutil.copytree(kernels.SRC_DIR, src)
    monkeypatch.setattr(kernels, "SRC_DIR", src)
    monkeypatch.setattr(kernels, "INCLUDE_DIR", src / "include")
    return src


@pytest.fixture
def batched_algos(monkeypatch) -> list:
    """The ``algo`` keyword (``net.batched_algo``) of every :func:`cudarl.blas.gemm_lt_batched` call from now
    on, in order (None where a call passed none); the calls still run."""
    from cudarl import blas

    algos = []
    batched = blas.gemm_lt_batched

    def spy(*args, **kw):
        algos.append(kw.get("algo"))
        return batched(*args, **kw)

    monkeypatch.setattr(blas, "gemm_lt_batched", spy)
    return algos
