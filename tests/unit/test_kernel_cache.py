"""The kernel compile path: the disk cache and its key, parallel prefetch, NVRTC's options, subnormals.

Most tests stand a fake in for NVRTC (the cache logic needs no compiler); those marked for NVRTC
compile for real and skip, with the reason, where ``libnvrtc`` is missing; the GPU tests load and
run what was compiled.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cudarl import kernels, nvrtc

ROOT = Path(__file__).resolve().parents[2]
needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC: {nvrtc.available()}")


def test_a_miss_compiles_once_and_a_hit_reads_the_file(fake_nvrtc, cache):
    path = kernels.binary("util", 90)
    assert path.parent == cache and path.name.startswith("util-") and path.suffix == ".cubin"
    assert path.read_bytes().startswith(b"\x7fELF")
    assert [p.name for p in cache.iterdir()] == [path.name], "a temporary file was left behind"
    assert fake_nvrtc == ["util.cu"] and kernels.compile_report()[-1]["cached"] is False
    assert kernels.binary("util", 90) == path
    assert fake_nvrtc == ["util.cu"], "a cache hit compiled again"
    last = kernels.compile_report()[-1]
    assert last["cached"] is True and last["compile_s"] == 0.0 and last["family"] == "util"


def test_each_context_loads_the_cubin_through_a_name_of_its_own(fake_nvrtc, cache):
    """CuPy memoises RawModule(path=...) by path: one name per context, one module per context."""
    path = kernels.binary("util", 90)
    train, collect = kernels._context_path(path, "train"), kernels._context_path(path, "collect")
    assert train != collect and train.name == f"{path.stem}.train.cubin"
    assert os.path.samefile(train, path) and os.path.samefile(collect, path)
    assert kernels._context_path(path, "train") == train
    assert sorted(p.name for p in cache.iterdir()) == sorted([path.name, train.name, collect.name])


def test_the_key_covers_source_headers_options_arch_and_nvrtc(fake_nvrtc, monkeypatch, tmp_path, cuda_tree):
    def key():
        return kernels.cache_key("util", "-arch=sm_90", "cubin")

    base = key()
    assert key() == base and len(base) == 64
    assert kernels.cache_key("util", "-arch=sm_80", "cubin") != base
    assert kernels.cache_key("util", "-arch=sm_90", "ptx") != base
    assert kernels.cache_key("philox", "-arch=sm_90", "cubin") != base
    monkeypatch.setenv(kernels.LINEINFO_ENV, "1")
    assert key() != base
    monkeypatch.delenv(kernels.LINEINFO_ENV)
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 1))
    assert key() != base
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    assert key() == base
    src = cuda_tree
    assert key() == base  # the same files elsewhere (another checkout): the same cubin
    (src / "include" / "cudarl" / "reduce.cuh").write_text("// util.cu does not include this header\n")
    assert key() != base, "a change to any header must change the key"
    header_changed = key()
    (src / "util.cu").write_text((src / "util.cu").read_text() + "\n// one more line\n")
    assert key() != header_changed


def test_an_edited_header_compiles_again(fake_nvrtc, monkeypatch, tmp_path, cuda_tree):
    src = cuda_tree
    first = kernels.binary("util", 90)
    (src / "include" / "cudarl" / "philox.cuh").write_text("// edited\n")
    second = kernels.binary("util", 90)
    assert first != second and fake_nvrtc == ["util.cu", "util.cu"] and first.exists()


def test_a_damaged_entry_is_compiled_again(fake_nvrtc):
    path = kernels.binary("util", 90)
    good = path.read_bytes()
    path.write_bytes(good[:3])  # truncated: not an ELF image any more
    assert kernels.binary("util", 90) == path
    assert path.read_bytes() == good and len(fake_nvrtc) == 2


def test_cache_dir_from_the_environment_or_home(monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path / "here"))
    assert kernels.cache_dir() == tmp_path / "here" / "kernels"
    monkeypatch.delenv(kernels.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernels.cache_dir() == tmp_path / "home" / ".cache" / "cudarl" / "kernels"


def test_an_unusable_cache_dir_falls_back_with_a_warning(fake_nvrtc, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(kernels.CACHE_ENV, str(blocker / "cache"))
    with pytest.warns(UserWarning, match="not writable"):
        path = kernels.binary("util", 90)
    assert path.is_file() and blocker.read_text() == "not a folder"
    try:
        assert kernels.binary("util", 90).parent == path.parent  # the same fallback, no second warning
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def test_a_compile_error_names_the_file(fake_nvrtc, monkeypatch, tmp_path, cuda_tree):
    src = cuda_tree
    (src / "broken.cu").write_text('extern "C" __global__ void cudarl_broken_x() {}\n#error here\n')
    with pytest.raises(kernels.KernelCompileError, match=r"cuda_src/broken\.cu failed to compile:\n.*boom"):
        kernels.binary("broken", 90)
    assert not list(kernels.cache_dir().glob("broken-*")), "a failed compile left a cache entry"


def test_prefetch_compiles_side_by_side_and_each_family_once(fake_nvrtc, monkeypatch):
    monkeypatch.setattr(kernels, "_pool", [])
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # the pool's size; the compiles only sleep
    fake_nvrtc.delay = 0.4
    t0 = time.perf_counter()
    futures = kernels.prefetch(["util", "philox", "testing", "util"], compute_capability=90)
    assert time.perf_counter() - t0 < 0.2, "prefetch waited for the compiles"
    paths = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    assert len(paths) == 3 and all(p.is_file() for p in paths)
    assert sorted(fake_nvrtc) == ["philox.cu", "testing.cu", "util.cu"]
    assert wall < 0.9, f"three 0.4 s compiles took {wall:.2f} s: not in parallel"
    assert kernels.prefetch(["philox"], compute_capability=90)[0] is futures[1]  # in flight or done: not again
    assert len(fake_nvrtc) == 3
    kernels._pool[0].shutdown()


def test_prefetch_raises_a_compile_error_where_the_family_is_used(fake_nvrtc, monkeypatch, tmp_path, cuda_tree):
    src = cuda_tree
    (src / "broken.cu").write_text("#error here\n")
    (fut,) = kernels.prefetch(["broken"], compute_capability=90)
    with pytest.raises(kernels.KernelCompileError, match="cuda_src/broken.cu"):
        fut.result()
    with pytest.raises(kernels.KernelError, match="no kernel family 'nope'"):
        kernels.prefetch(["nope"], compute_capability=90)


def test_numpy_graphs_launch_no_kernels():
    from cudarl.graph import StepGraph, capture_all

    g = StepGraph("train", [("a", lambda: None)], xp=np)
    assert g.kernel_ops() == set()
    capture_all([g])
    assert g.captured


# --- NVRTC for real (no GPU needed) -------------------------------------------------------------


@needs_nvrtc
def test_nvrtc_compiles_a_family_and_the_next_call_hits(cache):
    path = kernels.binary("util", 90)
    assert path.read_bytes().startswith(b"\x7fELF")
    assert kernels.compile_report()[-1]["cached"] is False and kernels.compile_report()[-1]["compile_s"] > 0
    assert kernels.binary("util", 90) == path and kernels.compile_report()[-1]["cached"] is True


@needs_nvrtc
def test_nvrtc_errors_point_at_the_cu_file_and_line(cache, monkeypatch, tmp_path, cuda_tree):
    src = cuda_tree
    (src / "broken.cu").write_text('#include <cudarl/philox.cuh>\n\nextern "C" __global__ void k() { int x = ; }\n')
    with pytest.raises(kernels.KernelCompileError, match=r"cuda_src/broken\.cu\(3\): error"):
        kernels.binary("broken", 90)


def _float_ops(ptx: str) -> list[str]:
    return re.findall(r"\b(?:add|sub|mul|fma|div|max|min)\.[a-z.]*f32\b", ptx)


@needs_nvrtc
def test_the_ftz_choice_reaches_the_compiler(cache, monkeypatch):
    """PTX of the testing family: no flush-to-zero instruction (CuPy's own compile adds ``-ftz=true``)."""

    def ptx():
        opts = kernels.compile_options() + ("-arch=compute_90",)
        return nvrtc.compile_source(kernels.program("testing"), "testing.cu", opts, "ptx").decode()

    ops = _float_ops(ptx())
    assert ops and not any(".ftz" in o for o in ops), ops


@pytest.mark.slow
@needs_nvrtc
def test_every_family_compiles_with_nvrtc_and_then_hits(cache, monkeypatch):
    """NVRTC with the GPU's options accepts every compile unit of every family, as the loader compiles
    them (nvcc in tools/compile_cuda.py is another compiler, and compiles whole files)."""
    fams = kernels.families()
    want = sorted(kernels.unit_name(f, u) for f in fams for u in kernels.units(f))
    n0 = len(kernels.compile_report())
    for f in kernels.prefetch(fams, compute_capability=90):
        assert f.result().read_bytes().startswith(b"\x7fELF")
    first = kernels.compile_report()[n0:]
    assert sorted(kernels.unit_name(r["family"], r["unit"]) for r in first) == want
    assert not any(r["cached"] for r in first)
    monkeypatch.setattr(kernels, "_inflight", {})
    for f in kernels.prefetch(fams, compute_capability=90):
        f.result()
    assert all(r["cached"] for r in kernels.compile_report()[n0 + len(want) :])


# --- GPU ------------------------------------------------------------------------------------------

#: float32 subnormals (and zeros and normals beside them), as bit patterns.
_SUBNORMAL_BITS = np.array([1, 2, 3, 0x00000100, 0x00400000, 0x007FFFFF, 0x80000001, 0x807FFFFF], np.uint32)


def _subnormals() -> np.ndarray:
    x = np.concatenate([_SUBNORMAL_BITS.view(np.float32), np.float32([0.0, -0.0, 1.5, 1.17549435e-38])])
    assert np.count_nonzero((x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)) == len(_SUBNORMAL_BITS)
    return x


def _assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit for bit where the value is not zero; a zero's sign is the kernel's business (max(-0, 0))."""
    np.testing.assert_array_equal(got, want, err_msg=what)
    nz = want != 0
    np.testing.assert_array_equal(got[nz].view(np.uint32), want[nz].view(np.uint32), err_msg=what)


@pytest.mark.gpu
def test_gpu_subnormals_survive_a_kernel_bit_for_bit(cp):
    """The default build keeps float32 subnormals, as the NumPy twins do (CuPy's own -ftz=true flushed them)."""
    from cudarl.ops import nn as ops_nn
    from cudarl.ops import testing as ops_testing
    from cudarl.reference import nn as ref_nn
    from cudarl.reference import testing as ref_testing

    x = _subnormals()
    for a in (1.0, 2.0, -3.0):  # no product rounds to zero (whose sign an FMA and the twin's a*x + 0 disagree on)
        d = cp.asarray(x)
        ops_testing.axpb(d, a, 0.0)
        want = x.copy()
        ref_testing.axpb(want, a, 0.0)
        _assert_same_bits(cp.asnumpy(d), want, f"axpb a={a}")
        assert np.count_nonzero(want) > 2, "the oracle itself flushed"
    y = np.stack([x, x[::-1]])
    bias = x[::-1].copy() * np.float32(0.5)
    for act in (ref_nn.IDENTITY, ref_nn.RELU):
        out = cp.zeros(y.shape, np.float32)
        ops_nn.bias_act_forward(cp.asarray(y), cp.asarray(bias), out, act)
        want = np.zeros_like(y)
        ref_nn.bias_act_forward(y, bias, want, act)
        _assert_same_bits(cp.asnumpy(out), want, f"bias_act_forward act {act}")


@pytest.mark.gpu
def test_gpu_discovery_names_the_families_and_runs_nothing(cp):
    from cudarl.graph import StepGraph, capture_all
    from cudarl.ops import philox, testing, util

    u = cp.full(64, 7.0, np.float32)
    counter = cp.zeros(1, np.int64)
    phases = [
        ("sample", lambda: philox.uniform(u, 99, counter.view(np.uint64), 1)),
        ("mix", lambda: testing.axpb(u, 0.5, 0.25)),
        ("advance", lambda: util.add_i64(counter, 1)),
    ]
    g = StepGraph("discovery_probe", phases)
    assert {family for family, _ in g.kernel_ops()} == {"philox", "testing", "util"}
    g.synchronize()
    assert float(u[0]) == 7.0 and int(counter[0]) == 0, "discovery ran a kernel"
    assert not g.captured
    capture_all([g])
    g.replay()
    g.synchronize()
    assert int(counter[0]) == 1 and float(u[0]) != 7.0


_CHILD = """
import json, sys
from cudarl import kernels
fn = kernels.get_function("util", "add_i64", "ungraphed")
print(json.dumps([{k: r[k] for k in ("family", "cached")} for r in kernels.compile_report()]))
"""


@pytest.mark.gpu
def test_gpu_a_second_process_loads_from_the_disk_cache(tmp_path):
    env = {**os.environ, kernels.CACHE_ENV: str(tmp_path / "c"), "PYTHONPATH": str(ROOT)}
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        runs.append(r.stdout.strip().splitlines()[-1])
    assert runs[0] == '[{"family": "util", "cached": false}]'
    assert runs[1] == '[{"family": "util", "cached": true}]'
    assert len(list((tmp_path / "c" / "kernels").glob("util-*.cubin"))) == 2  # the entry and its context's name
