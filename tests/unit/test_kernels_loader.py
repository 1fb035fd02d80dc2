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
    opts = kernels.compile_options()
    assert "-std=c++17" in opts
    assert f"-I{kernels.INCLUDE_DIR}" in opts
    assert "-ftz=false" in opts and "-ftz=true" not in opts  # subnormals kept, as in the NumPy twins
    assert not any("fast" in o for o in opts)


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


def _params(text: str) -> tuple:
    """The parameters of ``extern "C" __global__ void cudarl_t_k(<text>)``, read as from cuda_src."""
    return _sigs(f'extern "C" __global__ void cudarl_t_k({text}) {{}}')["k"].params


def _sigs(src: str) -> dict:
    import tempfile
    from pathlib import Path

    from cudarl import signatures

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "t.cu").write_text(src)
        return signatures.parse_source(Path(d) / "t.cu", "t")


def test_signatures_are_read_from_the_c_declaration():
    from cudarl import signatures

    spec = _params("float* __restrict__ out, const unsigned long long* counter, long long n, unsigned int stream_id")
    assert [s[0] for s in spec] == ["out", "counter", "n", "stream_id"]
    assert [s[1] for s in spec] == [np.dtype(np.float32), np.dtype(np.uint64), np.dtype(np.int64), np.dtype(np.uint32)]
    assert [s[2] for s in spec] == [True, True, False, False]
    with pytest.raises(signatures.SignatureError, match="unsupported type 'half\\*'"):
        _params("half* x")
    every = [signatures.of(f, op) for f in kernels.families() for op in signatures._family(str(kernels.SRC_DIR), f)]
    assert len(every) >= 80 and [s.kernel for s in every if not s.params] == ["cudarl_testing_empty"]
    act = signatures.of("agent", "act_c51")  # ends with a macro of parameters (ACT_SCHEDULE_PARAMS)
    assert act.text().endswith(
        "f32* eps_out, i64* count, u32* arrivals, f64 start, f64 end, i64 steps, u64* seed, i64 sn, i64 sq, i64 sl"
    )


def test_a_struct_by_value_is_read_with_the_c_layout():
    sig = _sigs(
        "struct KArgs {\n  const float* x;\n  int n, m;\n  double scale;\n  char flag;\n  float* out;\n};\n"
        'extern "C" __global__ void cudarl_t_k(const KArgs a) {}\n'
    )["k"]
    assert [p[0] for p in sig.params] == ["x", "n", "m", "scale", "flag", "out"]
    offsets = {name: sig.struct.fields[name][1] for name in sig.struct.names}
    assert offsets == {"x": 0, "n": 8, "m": 12, "scale": 16, "flag": 24, "out": 32} and sig.struct.itemsize == 40


class _Device:
    """Stands for a CuPy array in the argument checks (its type's module starts with ``cupy``)."""

    __module__ = "cupy._fake"

    def __init__(self, a, ptr):
        self.dtype, self.flags, self.size, self.data = a.dtype, a.flags, a.size, type("P", (), {"ptr": ptr})()


def test_check_args_refuses_host_arrays_and_bad_scalars():
    xn = _params("float* x, long long n")
    with pytest.raises(kernels.KernelError, match=r"expected 2 arguments \(x, n\)"):
        kernels.check_args("k", xn, (1,))
    with pytest.raises(kernels.KernelError, match="must be a CuPy array"):
        kernels.check_args("k", xn, (np.zeros(3, np.float32), 3))
    with pytest.raises(kernels.KernelError, match="has dtype float64, expected float32"):
        kernels.check_args("k", xn, (_Device(np.zeros(3), 64), 3))
    with pytest.raises(kernels.KernelError, match="does not fit"):
        kernels.check_args("k", _params("int n"), (2**40,))
    with pytest.raises(kernels.KernelError, match="does not fit"):
        kernels.check_args("k", _params("unsigned int n"), (-1,))
    with pytest.raises(kernels.KernelError, match="scalar"):
        kernels.check_args("k", _params("int n"), (np.zeros(2),))
    (v,) = kernels.check_args("k", _params("float a"), (0.1,))
    assert isinstance(v, np.float32)


def test_check_args_lets_through_only_the_empty_arrays_a_launcher_names():
    """An empty array (address 0) is refused unless the launcher names it in ``empty_ok`` (the scan's chunk
    states when one chunk covers the window); a null address of a non-empty array never passes, and a name
    that is not a pointer argument is an error."""
    xs = _params("float* x, float* states, int n")
    x, empty = _Device(np.zeros(3, np.float32), 64), _Device(np.zeros(0, np.float32), 0)
    with pytest.raises(kernels.KernelError, match="argument 'states' is empty or a null pointer"):
        kernels.check_args("k", xs, (x, empty, 3))
    assert kernels.check_args("k", xs, (x, empty, 3), ("states",))[1] is empty
    with pytest.raises(kernels.KernelError, match="argument 'x' is empty or a null pointer"):
        kernels.check_args("k", xs, (empty, x, 3), ("states",))
    with pytest.raises(kernels.KernelError, match="argument 'states' is empty or a null pointer"):
        kernels.check_args("k", xs, (x, _Device(np.zeros(2, np.float32), 0), 3), ("states",))
    with pytest.raises(kernels.KernelError, match=r"empty_ok names \['n'\]"):
        kernels.check_args("k", xs, (x, empty, 3), ("n",))


def test_struct_arguments_are_packed_field_by_field():
    sig = _sigs(
        "struct KArgs {\n  const float* x;\n  int n;\n  double scale;\n  unsigned int* done;\n};\n"
        'extern "C" __global__ void cudarl_t_k(KArgs a) {}\n'
    )["k"]
    x, done = _Device(np.zeros(4, np.float32), 0x7F00), _Device(np.zeros(1, np.uint32), 0x8800)
    rec = kernels.pack_struct(sig, kernels.check_args("k", sig.params, (x, 5, 0.25, done)))
    assert rec.shape == (1,) and rec.dtype.itemsize == 32
    assert (int(rec["x"][0]), int(rec["n"][0]), float(rec["scale"][0]), int(rec["done"][0])) == (
        0x7F00,
        5,
        0.25,
        0x8800,
    )
    raw = rec.tobytes()
    assert int.from_bytes(raw[24:32], "little") == 0x8800  # the C offset of done
    with pytest.raises(kernels.KernelError, match="has dtype float32, expected uint32"):
        kernels.check_args("k", sig.params, (x, 5, 0.25, x))


def test_launch_takes_no_signature_string():
    with pytest.raises(kernels.KernelError, match="no signature string; it is read from cuda_src/util.cu"):
        kernels.launch("util", "add_i64", 1, 1, "i64* dst, i64 by", (np.zeros(1, np.int64), 1))


def test_blocks_for():
    assert kernels.blocks_for(0) == 1 and kernels.blocks_for(256) == 1 and kernels.blocks_for(257) == 2


def test_a_struct_kernel_forwards_its_fields_in_order(tmp_path):
    from cudarl import signatures

    src = (
        "struct KArgs {\n  float* x;\n  long long n;\n  long long m;\n};\n"
        "__device__ __forceinline__ void k_impl(float* x, long long n, long long m) {}\n"
        'extern "C" __global__ void cudarl_t_k(const KArgs a) { k_impl(CALL); }\n'
    )
    path = tmp_path / "t.cu"
    path.write_text(src.replace("CALL", "a.x, a.n, a.m"))
    assert signatures.forwarding_problems(path) == []
    path.write_text(src.replace("CALL", "a.x, a.m, a.n"))  # two fields of one type swapped: it compiles
    assert "passes ['a.x', 'a.m', 'a.n'] to k_impl, not the fields of KArgs in order" in "".join(
        signatures.forwarding_problems(path)
    )
    path.write_text(
        src.replace("long long n, long long m)", "long long m, long long n)").replace("CALL", "a.x, a.n, a.m")
    )
    assert "the parameters of k_impl are ['x', 'm', 'n']" in "".join(signatures.forwarding_problems(path))


def test_struct_layouts_are_the_c_compilers():
    """Every kernel that takes a struct: the NumPy dtype kernels.launch packs has the size and field
    offsets a C++ compiler gives the struct (host and device lay such structs out alike)."""
    import re
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from cudarl import signatures

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to ask for the struct layouts")
    cases = []
    for fam in kernels.families():
        src = signatures.strip_comments((kernels.SRC_DIR / f"{fam}.cu").read_text())
        structs = {m.group(1): m.group(0) for m in signatures._STRUCT_RE.finditer(src)}
        for sig in signatures._family(str(kernels.SRC_DIR), fam).values():
            if sig.struct is not None:  # the struct the kernel declares (two may share field names)
                name = re.search(rf"\b{sig.kernel}\s*\(\s*(?:const\s+)?(\w+)\s+\w+\s*\)", src).group(1)
                cases.append((sig, name, structs[name]))
    assert len(cases) >= 5
    prog = ["#include <cstdio>", "#include <cstddef>", "typedef long long i64;", "typedef unsigned long long u64;"]
    prog += ["typedef unsigned int u32;"] + list(dict.fromkeys(text for _, _, text in cases)) + ["int main() {"]
    for sig, name, _ in cases:
        prog.append(f'  printf("%zu", sizeof({name}));')
        prog += [f'  printf(" %zu", offsetof({name}, {f}));' for f, _, _ in sig.params]
        prog.append('  printf("\\n");')
    prog.append("  return 0;\n}")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "layout.cpp").write_text("\n".join(prog))
        subprocess.run([cxx, "-o", f"{d}/layout", f"{d}/layout.cpp"], check=True)
        lines = subprocess.run([f"{d}/layout"], capture_output=True, text=True, check=True).stdout.split("\n")
    for (sig, name, _), line in zip(cases, lines, strict=False):
        size, *offsets = (int(v) for v in line.split())
        assert size == sig.struct.itemsize, f"{name}: C says {size} bytes, the dtype {sig.struct.itemsize}"
        assert offsets == [sig.struct.fields[f][1] for f in sig.struct.names], f"{name}: field offsets differ"


def test_define_reads_an_integer_and_names_the_file_otherwise(tmp_path):
    from cudarl import signatures

    (tmp_path / "f.cu").write_text("#define A 0x20  // a block\n#define B (A * 2)\n")
    assert signatures.define("f", "A", src_dir=tmp_path) == 32
    with pytest.raises(signatures.SignatureError, match=r"cuda_src/f.cu: #define B is '\(A \* 2\)', not an integer"):
        signatures.define("f", "B", src_dir=tmp_path)
    with pytest.raises(signatures.SignatureError, match="cuda_src/f.cu has no #define C"):
        signatures.define("f", "C", src_dir=tmp_path)
