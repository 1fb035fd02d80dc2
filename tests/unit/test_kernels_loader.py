"""The loader's module-separation logic, compile options, signatures: all checkable on the CPU."""

import numpy as np
import pytest

from cudarl import kernels


def test_sources_found_and_families_listed():
    assert (kernels.SRC_DIR / "include" / "cudarl" / "philox.cuh").is_file()
    fams = kernels.families()
    assert {"util", "philox", "testing"} <= set(fams)


def test_program_is_the_file_behind_a_line_directive():
    src = kernels.program("util")
    assert src.startswith('#line 1 "cuda_src/util.cu"\n')  # compile errors name the real file and line
    assert src.endswith((kernels.SRC_DIR / "util.cu").read_text())


def test_compile_options_in_one_place(monkeypatch):
    monkeypatch.delenv(kernels.FTZ_ENV, raising=False)
    opts = kernels.compile_options()
    assert "-std=c++17" in opts
    assert f"-I{kernels.INCLUDE_DIR}" in opts
    assert "-ftz=false" in opts and "-ftz=true" not in opts  # subnormals kept, as in the NumPy twins
    assert not any("fast" in o for o in opts)
    monkeypatch.setenv(kernels.FTZ_ENV, "1")
    assert "-ftz=true" in kernels.compile_options() and "-ftz=false" not in kernels.compile_options()


@pytest.mark.parametrize("bad", ["", "1abc", "has space", "x" * 80, None])
def test_bad_contexts_rejected(bad):
    with pytest.raises(kernels.KernelError):
        kernels.check_context(bad)


def test_unknown_family_names_the_file():
    with pytest.raises(kernels.KernelError, match="no kernel family 'nope'"):
        kernels.program("nope")


def test_use_context_nests_and_restores():
    assert kernels.current_context() == kernels.UNGRAPHED
    with kernels.use_context("collect"):
        assert kernels.current_context() == "collect"
        with kernels.use_context("train"):
            assert kernels.current_context() == "train"
        assert kernels.current_context() == "collect"
    assert kernels.current_context() == kernels.UNGRAPHED


def test_parse_signature():
    spec = kernels.parse_signature("f32* out, const u64* counter, i64 n, u32 stream_id")
    assert [s[0] for s in spec] == ["out", "counter", "n", "stream_id"]
    assert [s[1] for s in spec] == [np.dtype(np.float32), np.dtype(np.uint64), np.dtype(np.int64), np.dtype(np.uint32)]
    assert [s[2] for s in spec] == [True, True, False, False]
    with pytest.raises(kernels.KernelError, match="bad kernel signature"):
        kernels.parse_signature("float* x")


def test_check_args_refuses_host_arrays_and_bad_scalars():
    with pytest.raises(kernels.KernelError, match="expected 2 arguments"):
        kernels.check_args("k", "f32* x, i64 n", (1,))
    with pytest.raises(kernels.KernelError, match="must be a CuPy array"):
        kernels.check_args("k", "f32* x, i64 n", (np.zeros(3, np.float32), 3))
    with pytest.raises(kernels.KernelError, match="does not fit"):
        kernels.check_args("k", "i32 n", (2**40,))
    with pytest.raises(kernels.KernelError, match="does not fit"):
        kernels.check_args("k", "u32 n", (-1,))
    with pytest.raises(kernels.KernelError, match="scalar"):
        kernels.check_args("k", "i32 n", (np.zeros(2),))
    (v,) = kernels.check_args("k", "f32 a", (0.1,))
    assert isinstance(v, np.float32)


def test_blocks_for():
    assert kernels.blocks_for(0) == 1 and kernels.blocks_for(256) == 1 and kernels.blocks_for(257) == 2
