"""Compile units (cuda_src/include/cudarl/units.cuh): a family split into several NVRTC programs, each
emitting only its own kernels, so a start-up compiles and waits for only the units it launches.

The parsing and loader tests need no compiler; those marked for NVRTC compile for real (no GPU) and
hold the promise the split rests on: a kernel's machine code (its cubin's ``.text.<kernel>``) is the
same bytes in its unit as in the whole family, so no GPU bit can move.
"""

import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from cudarl import kernels, nvrtc, signatures

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from compare_kernels import elf_sections  # noqa: E402

needs_nvrtc = pytest.mark.skipif(nvrtc.available() is not None, reason=f"NVRTC: {nvrtc.available()}")


def split_families() -> list[str]:
    return [f for f in kernels.families() if kernels.units(f) != [None]]


# --- the split, as the sources declare it ----------------------------------------------------------


def test_c51_is_split_into_a_unit_per_kernel_variant():
    """Every variant of targets_loss[_popart] (cudarl/ops/c51.py KERNEL_VARIANTS: a register path by
    action count, or the generic path) is a unit of its own, apart from n_step and from each other."""
    from cudarl.ops import c51 as ops

    assert "c51" in split_families()
    ops_ = [f"{op}_{v}" for op, vs in ops.KERNEL_VARIANTS.items() for v in vs] + ["n_step"]
    assert sorted(signatures.parse_source(kernels.SRC_DIR / "c51.cu", "c51")) == sorted(ops_)
    assert len({kernels.unit_of("c51", op) for op in ops_}) == len(ops_) == len(kernels.units("c51"))


def test_every_kernel_of_a_split_family_is_in_exactly_one_unit():
    for fam in kernels.families():
        ops = signatures.parse_source(kernels.SRC_DIR / f"{fam}.cu", fam)
        where = signatures.parse_units(kernels.SRC_DIR / f"{fam}.cu", fam)
        assert set(where) == set(ops), fam
        if kernels.units(fam) == [None]:
            assert set(where.values()) == {None}
        else:
            assert None not in where.values() and set(where.values()) == set(kernels.units(fam)), fam


def test_a_kernel_outside_every_unit_or_a_nested_if_is_refused(tmp_path):
    unit = '#if CUDARL_UNIT_IS(a)\nextern "C" __global__ void cudarl_f_x(int n) {}\n#endif  // a\n'
    stray = 'extern "C" __global__ void cudarl_f_y(int n) {}\n'
    nested = '#if CUDARL_UNIT_IS(b)\n#if 1\nextern "C" __global__ void cudarl_f_z(int n) {}\n#endif\n#endif\n'
    path = tmp_path / "f.cu"
    path.write_text(unit)
    assert signatures.parse_units(path, "f") == {"x": "a"}
    path.write_text(unit + stray)
    with pytest.raises(signatures.SignatureError, match="cudarl_f_y is in no compile unit"):
        signatures.parse_units(path, "f")
    path.write_text(unit + nested)
    with pytest.raises(signatures.SignatureError, match="nested #if"):
        signatures.parse_units(path, "f")
    path.write_text(stray)
    assert signatures.parse_units(path, "f") == {"y": None}


def test_a_unit_program_names_its_unit_and_the_whole_family_is_unchanged():
    whole = kernels.program("c51")
    assert whole.startswith('#line 1 "cuda_src/c51.cu"\n') and "CUDARL_UNIT" not in whole.split("\n", 1)[0]
    for unit in kernels.units("c51"):
        text = kernels.program("c51", unit)
        assert text == f"#define CUDARL_UNIT 1\n#define CUDARL_UNIT_{unit} 1\n" + whole
    with pytest.raises(kernels.KernelError, match="no compile unit 'nope'"):
        kernels.program("c51", "nope")
    with pytest.raises(kernels.KernelError, match="no kernel cudarl_c51_nope"):
        kernels.unit_of("c51", "nope")


# --- the loader: a cache entry per unit, prefetch by kernel ----------------------------------------


def test_each_unit_has_its_own_cache_entry(fake_nvrtc, cache):
    paths = {u: kernels.binary("c51", 90, u) for u in kernels.units("c51")}
    assert len(set(paths.values())) == len(paths) == len(fake_nvrtc)
    for unit, path in paths.items():
        assert path.name.startswith(f"c51.{unit}-")
    whole = kernels.binary("c51", 90)
    assert whole.name.startswith("c51-") and whole not in paths.values()
    n = len(fake_nvrtc)
    assert {u: kernels.binary("c51", 90, u) for u in kernels.units("c51")} == paths and len(fake_nvrtc) == n
    report = kernels.compile_report()[-len(paths) :]
    assert [r["unit"] for r in report] == kernels.units("c51") and all(r["cached"] for r in report)


def test_prefetch_of_a_kernel_compiles_only_its_unit(fake_nvrtc, monkeypatch):
    monkeypatch.setattr(kernels, "_pool", [])
    unit = kernels.unit_of("c51", "targets_loss_regs3")
    futures = kernels.prefetch([("c51", "targets_loss_regs3"), ("c51", "targets_loss_regs3"), ("util", "add_i64")], 90)
    for f in futures:
        f.result()
    assert len(futures) == 2 and len(fake_nvrtc) == 2
    c51_program = next(p for p in fake_nvrtc.sources if "c51.cu" in p.split("\n", 3)[2])
    assert c51_program.startswith(f"#define CUDARL_UNIT 1\n#define CUDARL_UNIT_{unit} 1\n")
    assert any(p.startswith('#line 1 "cuda_src/util.cu"') for p in fake_nvrtc.sources)  # one unit: the whole file
    assert len(kernels.prefetch(["c51"], 90)) == len(kernels.units("c51"))  # a family: all its units
    kernels._pool[0].shutdown()


class _DeviceArray:
    """What a launcher and ``kernels.launch`` read of a CuPy array (dtype, shape, flags, an address),
    with no memory behind it: enough for :func:`kernels.discovering`, which launches nothing."""

    __module__ = "cupy.fake"  # kernels.check_args takes arrays of CuPy's modules only
    _address = 0x10000

    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype, self.size = tuple(shape), np.dtype(dtype), int(np.prod(shape))
        self.flags = types.SimpleNamespace(c_contiguous=True)
        _DeviceArray._address += 0x10000
        self.data = types.SimpleNamespace(ptr=_DeviceArray._address)


@pytest.fixture
def fake_cupy(monkeypatch):
    """CuPy's stream and device queries, for a launcher run under :func:`kernels.discovering`."""
    stream = types.SimpleNamespace(is_capturing=lambda: False, ptr=0)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels, "resident_grid_limit", lambda: 132)  # the PopArt launch's grid cap


def _discover_targets_loss(B, A, K, popart, grid_barrier=True) -> set:
    """The ``(family, op)`` pairs the targets_loss launcher launches for ``B`` samples, ``A`` actions and
    ``K`` atoms (kernels.discovering: what a graph's prefetch asks for)."""
    from cudarl.ops import c51 as ops

    def f(*shape, dtype=np.float32):
        return _DeviceArray(shape, dtype)

    row = (1 + A) * K
    common = (f(B, row), f(B, row), f(B, row), f(B, dtype=np.int32), f(B), f(K), f(B), f(B))
    outs = dict(out_probs=f(B, K), out_a_star=f(B, dtype=np.int32), out_target=f(B, K), out_loss_per=f(B))
    outs.update(out_loss=f(1), out_priority=f(B), out_dva=f(B, row), done=f(1, dtype=np.uint32))
    with kernels.discovering() as found:
        if popart:
            outs.update(out_y=f(B), out_r_norm=f(B), barrier=f(1, dtype=np.uint32), scratch=f(8))
            ops.targets_loss_popart(*common, state=f(8), beta=f(1), **outs, grid_barrier=grid_barrier)
        else:
            ops.targets_loss(*common, **outs)
    return set(found)


@pytest.mark.parametrize("popart", [False, True])
@pytest.mark.parametrize(
    "A,K,variant",
    [(1, 51, "regs3"), (2, 51, "regs3"), (3, 64, "regs3"), (4, 2, "regs4"), (5, 51, "regs8"), (8, 64, "regs8"),
     (9, 51, "generic"), (3, 65, "generic"), (2, 1024, "generic")],
)  # fmt: skip
def test_the_launcher_launches_the_variant_for_its_actions_and_atoms(fake_cupy, A, K, variant, popart):
    """The register path for the fewest actions (3, 4, 8) holding A when K <= 64, else the generic path:
    the dispatch one kernel did at run time, now the launcher's (both PopArt forms launch the same)."""
    op = "targets_loss_popart" if popart else "targets_loss"
    assert _discover_targets_loss(64, A, K, popart) == {("c51", f"{op}_{variant}")}
    if popart:
        assert _discover_targets_loss(64, A, K, popart, grid_barrier=False) == {("c51", f"{op}_{variant}")}


def test_the_reference_step_compiles_only_its_targets_loss_variant(fake_cupy, fake_nvrtc, monkeypatch):
    """The reference config's C51 step (its actions, atoms, batch and PopArt setting) launches one
    targets_loss kernel, and its discovery prefetches that kernel's unit alone: one NVRTC program,
    none of the other variants'."""
    from cudarl.bench import reference_config

    cfg = reference_config("gpu")
    assert cfg.net.head == "c51"
    found = _discover_targets_loss(cfg.agent.batch_size, cfg.env.n_actions, cfg.net.atoms, cfg.agent.popart)
    assert found == {("c51", "targets_loss_popart_regs3" if cfg.agent.popart else "targets_loss_regs3")}
    monkeypatch.setattr(kernels, "_pool", [])
    for fut in kernels.prefetch(sorted(found), 90):  # what StepGraph.prefetch does with its kernel_ops()
        fut.result()
    unit = kernels.unit_of(*next(iter(found)))
    assert len(fake_nvrtc) == 1 and fake_nvrtc.sources[0].startswith(
        f"#define CUDARL_UNIT 1\n#define CUDARL_UNIT_{unit} 1\n"
    )
    assert [(r["family"], r["unit"]) for r in kernels.compile_report()[-1:]] == [("c51", unit)]
    kernels._pool[0].shutdown()


def test_an_edited_unit_keys_every_unit_of_the_family_again(fake_nvrtc, monkeypatch, tmp_path, cuda_tree):
    """The key hashes the whole file: an edit anywhere in it (shared helpers) recompiles every unit."""
    src = cuda_tree
    keys = {u: kernels.cache_key("c51", "-arch=sm_90", "cubin", u) for u in kernels.units("c51")}
    assert len(set(keys.values())) == len(keys)
    (src / "c51.cu").write_text((src / "c51.cu").read_text() + "\n// one more line\n")
    assert all(kernels.cache_key("c51", "-arch=sm_90", "cubin", u) != k for u, k in keys.items())


# --- NVRTC for real: the same machine code ------------------------------------------------------------


def _texts(path: Path) -> dict[str, bytes]:
    return {n[len(".text.") :]: b for n, b in elf_sections(path.read_bytes()).items() if n.startswith(".text.")}


def _recompiled_text(family: str, unit: str, kernel: str, cc: int) -> bytes:
    """``kernel``'s ``.text`` from one more compile of ``unit``'s program, alone (no other compile beside it)."""
    arch, kind = kernels.target(cc)
    opts = kernels.compile_options() + (arch,)
    data = nvrtc.compile_source(kernels.program(family, unit), f"{family}.cu", opts, kind)
    return {n[len(".text.") :]: b for n, b in elf_sections(data).items() if n.startswith(".text.")}[kernel]


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.parametrize("family", split_families())
def test_nvrtc_each_unit_emits_its_kernels_with_the_whole_familys_machine_code(family, cache):
    """Each unit's cubin holds exactly its own kernels (plus never-launched helpers that are not
    ``cudarl_`` kernels), and each kernel's ``.text`` is byte-identical to the whole family's.

    NVRTC itself is not a function of its input: about once in 70 compiles of the ssm fp32 unit's
    unchanged program (NVRTC 13.5, three compiles side by side) it emits another register allocation
    of cudarl_ssm_ssd_last_backward (the same length and opcodes but two more LDS for two NOPs; 2047
    of 3616 instruction words differ; no relocation touches .text). A unit whose kernel differs from
    the whole family's is therefore compiled once more, alone: the promise holds if its program
    emits the whole family's exact bytes, and fails if it does not (a split that changed the
    kernel's code does so every time); if the unit's compiles agree with each other, the whole family
    is compiled once more, alone, and must give them. Both first sections are kept, and the variance
    is warned of.
    """
    cc = 90
    futures = kernels.prefetch([family], cc)  # the units side by side
    whole = _texts(kernels.binary(family, cc))
    where = signatures.parse_units(kernels.SRC_DIR / f"{family}.cu", family)
    assert set(whole) >= {f"cudarl_{family}_{op}" for op in where}
    for unit, fut in zip(kernels.units(family), futures, strict=True):
        got = {k: b for k, b in _texts(fut.result()).items() if k.startswith("cudarl_")}
        want = {f"cudarl_{family}_{op}" for op, u in where.items() if u == unit}
        assert set(got) == want, f"{family}.{unit}"
        for k, b in got.items():
            if b == whole[k]:
                continue
            (cache.parent / f"{k}.{unit}.text").write_bytes(b)  # for a look (cuobjdump, nvdisasm)
            (cache.parent / f"{k}.whole.text").write_bytes(whole[k])
            pairs = enumerate(zip(b, whole[k], strict=False))
            first = next((i for i, (x, y) in pairs if x != y), min(len(b), len(whole[k])))
            again = _recompiled_text(family, unit, k, cc)
            # the odd one may be the whole family's compile: then the unit's two agree, and the whole
            # family compiled again, alone, must give them
            assert again == whole[k] or (again == b and _recompiled_text(family, None, k, cc) == b), (
                f"{k}: its machine code in unit {unit} differs from the whole family's twice ({len(b)} and "
                f"{len(whole[k])} bytes, the first difference at byte {first}; both kept in {cache.parent})"
            )
            warnings.warn(
                f"NVRTC emitted another machine code for {k} in unit {unit} or the whole family once (first "
                f"difference at byte {first}; kept in {cache.parent}); compiled again, they agree",
                stacklevel=1,
            )


def test_get_function_loads_the_module_of_the_kernels_unit(fake_nvrtc, monkeypatch):
    """Kernel lookup by (family, op) compiles and loads only the unit holding the kernel (CuPy faked:
    the module records the binary it was loaded from)."""
    import types

    class RawModule:
        def __init__(self, path):
            self.path = path

        def compile(self):
            pass

        def get_function(self, name):
            return (name, Path(self.path).name)

    fake = types.SimpleNamespace(
        RawModule=RawModule,
        cuda=types.SimpleNamespace(
            Device=lambda: types.SimpleNamespace(compute_capability="90"),
            driver=types.SimpleNamespace(CUDADriverError=RuntimeError),
        ),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels, "_modules", {})
    monkeypatch.setattr(kernels, "_functions", {})
    name, loaded_from = kernels.get_function("c51", "n_step", "ungraphed")
    unit = kernels.unit_of("c51", "n_step")
    assert name == "cudarl_c51_n_step" and loaded_from.startswith(f"c51.{unit}-")
    assert len(fake_nvrtc) == 1 and f"#define CUDARL_UNIT_{unit} 1\n" in fake_nvrtc.sources[0]
    assert list(kernels.loaded()) == [("c51", unit, "ungraphed")]
    with pytest.raises(kernels.KernelError, match="no kernel cudarl_c51_nope"):
        kernels.get_function("c51", "nope", "ungraphed")
