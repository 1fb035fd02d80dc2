"""Every kernel family has its CUDA, launcher, reference and parity-test faces with matching op names."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_tool(name: str):
    """Import ``tools/<name>.py`` (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tool():
    return _load_tool("check_faces")


def test_every_family_has_four_faces():
    assert _tool().problems() == []


def test_the_checker_catches_a_missing_face(tmp_path, monkeypatch):
    tool = _tool()
    (tmp_path / "cuda_src").mkdir()
    (tmp_path / "cuda_src" / "demo.cu").write_text(
        'extern "C" __global__ void cudarl_demo_op(float* x) {}\nextern "C" __global__ void wrong(float* x) {}\n'
        "#define DEMO_DIMS\n"
        'extern "C" __global__ __launch_bounds__(256) void DEMO_DIMS cudarl_demo_clustered(float* x) {}\n'
    )
    (tmp_path / "cudarl" / "reference").mkdir(parents=True)
    (tmp_path / "cudarl" / "reference" / "demo.py").write_text("def other():\n    pass\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    found = "\n".join(tool.problems())
    assert "kernel wrong is not named cudarl_demo_<op>" in found
    assert "cudarl/reference/demo.py: no function for op(s) clustered, op" in found  # an attribute macro too
    assert "cudarl/ops/demo.py: missing" in found
    assert "tests/parity/test_demo.py: missing" in found


def _demo_family(tmp_path, launcher: str):
    """A family ``demo`` whose kernel takes (f32* x, i64 n, f32 scale) and whose launcher is ``launcher``."""
    (tmp_path / "cuda_src").mkdir()
    (tmp_path / "cuda_src" / "demo.cu").write_text(
        'extern "C" __global__ void cudarl_demo_scale(float* __restrict__ x, long long n, float scale) {}\n'
    )
    for face in ("reference", "ops"):
        (tmp_path / "cudarl" / face).mkdir(parents=True, exist_ok=True)
    (tmp_path / "cudarl" / "reference" / "demo.py").write_text("def scale(x, scale):\n    x *= scale\n")
    (tmp_path / "cudarl" / "ops" / "demo.py").write_text(launcher)
    (tmp_path / "tests" / "parity").mkdir(parents=True)
    (tmp_path / "tests" / "parity" / "test_demo.py").write_text("")


_LAUNCHER = """from ..kernels import launch


def scale(x, scale):
    launch("demo", "scale", 1, 256, {args})
"""


def test_the_checker_catches_a_launch_that_disagrees_with_the_c_signature(tmp_path, monkeypatch):
    tool = _tool()
    wrong = (
        _LAUNCHER.format(args="(x, scale)")  # one argument short
        + '    launch("demo", "scale", 1, 256, "f32* x, i64 n, f32 scale", (x, x.size, scale))\n'  # the old form
        + '    launch("demo", "scal", 1, 256, (x, x.size, scale))\n'  # no such kernel
    )
    _demo_family(tmp_path, wrong)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    found = tool.problems()
    assert len(found) == 3, found
    assert "2 arguments for cudarl_demo_scale, which takes 3 (f32* x, i64 n, f32 scale)" in found[0]
    assert "launch passes a signature string" in found[1]
    assert "no kernel for op 'scal'" in found[2]


def test_the_checker_passes_a_launch_that_agrees(tmp_path, monkeypatch):
    tool = _tool()
    _demo_family(tmp_path, _LAUNCHER.format(args="(x, x.size, scale)"))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.problems() == []


_VARIANTS_LAUNCHER = """from ..kernels import launch

KERNEL_VARIANTS = {{"scale": ("small", "big")}}


def scale(x, scale):
    launch("demo", f"scale_{{'small' if x.size < 64 else 'big'}}", 1, 256, {args})
"""


def test_an_ops_kernel_variants_share_its_faces_and_its_signature(tmp_path, monkeypatch):
    """``cudarl_demo_scale_small`` and ``_big``, declared in the launcher's ``KERNEL_VARIANTS``, are two
    kernels of the one op ``scale``: one launcher and one twin named ``scale``. A declared variant
    without its kernel, variants that take different parameters, and an ``f"scale_{...}"`` launch
    with the wrong argument count are each reported."""
    tool = _tool()
    _demo_family(tmp_path, _VARIANTS_LAUNCHER.format(args="(x, x.size, scale)"))
    cu = tmp_path / "cuda_src" / "demo.cu"
    kernel = 'extern "C" __global__ void cudarl_demo_scale_{}(float* __restrict__ x, long long n, float scale) {{}}\n'
    cu.write_text(kernel.format("small") + kernel.format("big"))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.problems() == []
    cu.write_text(kernel.format("small") + kernel.format("big").replace("long long n", "int n"))
    assert tool.problems() == ["cuda_src/demo.cu: the kernels of scale (small, big) take different parameters"]
    cu.write_text(kernel.format("small"))
    found = tool.problems()
    assert "cudarl/ops/demo.py: KERNEL_VARIANTS names cudarl_demo_scale_big, which cuda_src/demo.cu lacks" in found
    assert any("no kernel for op 'scale_big'" in f for f in found)
    cu.write_text(kernel.format("small") + kernel.format("big"))
    (tmp_path / "cudarl" / "ops" / "demo.py").write_text(_VARIANTS_LAUNCHER.format(args="(x, scale)"))
    found = tool.problems()
    assert len(found) == 2 and all("2 arguments for cudarl_demo_scale_" in f for f in found), found


_BASE_AND_VARIANT_LAUNCHER = """from ..kernels import launch

KERNEL_VARIANTS = {{"scale": ("tc",)}}


def scale(x, scale, tf32=False):
    launch("demo", "scale_tc" if tf32 else "scale", 1, 256, {args})
"""


def test_an_ops_own_kernel_and_its_variant_are_checked_together(tmp_path, monkeypatch):
    """``cudarl_demo_scale`` and ``cudarl_demo_scale_tc`` (declared ``{"scale": ("tc",)}``, as ssm's scans): one
    op; the two must take the same parameters, and a launch choosing between them by ``a if c else b`` is
    checked against both."""
    tool = _tool()
    _demo_family(tmp_path, _BASE_AND_VARIANT_LAUNCHER.format(args="(x, x.size, scale)"))
    cu = tmp_path / "cuda_src" / "demo.cu"
    variant = 'extern "C" __global__ void cudarl_demo_scale_tc(float* __restrict__ x, long long n, float scale) {}\n'
    cu.write_text(cu.read_text() + variant)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.problems() == []
    cu.write_text(cu.read_text().replace("float scale) {}\n", "int scale) {}\n", 1))
    assert tool.problems() == ["cuda_src/demo.cu: the kernels of scale (tc) take different parameters"]
    cu.write_text(cu.read_text().replace("int scale", "float scale"))
    (tmp_path / "cudarl" / "ops" / "demo.py").write_text(_BASE_AND_VARIANT_LAUNCHER.format(args="(x, scale)"))
    found = tool.problems()
    assert len(found) == 2 and all("2 arguments for cudarl_demo_scale" in f for f in found), found
    assert any("cudarl_demo_scale_tc" in f for f in found)


def test_config_reference_is_current():
    """docs/config.md is generated from the dataclasses; a changed default must regenerate it."""
    mod = _load_tool("gen_config_reference")
    assert (ROOT / "docs" / "config.md").read_text() == mod.render(), "run python tools/gen_config_reference.py"
    for name, cls in mod.SECTIONS.items():
        undocumented = [f.name for f in mod.dataclasses.fields(cls) if f.name not in mod.field_docs(cls)]
        assert not undocumented, f"[{name}] fields without a docstring: {undocumented}"


def test_api_reference_is_current_and_every_public_name_is_documented():
    """docs/api.md is generated from the docstrings of ``import cudarl``'s public names."""
    pytest.importorskip("gymnasium", reason="cudarl.gym is public: the gym extra (in test) is needed")
    mod = _load_tool("gen_api_reference")
    assert (ROOT / "docs" / "api.md").read_text() == mod.render(), "run python tools/gen_api_reference.py"
    assert mod.undocumented() == []
    names = [n for n, _ in mod.public_names()]
    for needed in ("cudarl.load_policy", "cudarl.Policy", "cudarl.data.from_pandas", "cudarl.gym.make_vec"):
        assert needed in names


def _compile_tool():
    return _load_tool("compile_cuda")


def test_float_atomics_are_found_in_ptx():
    """DESIGN rule 3 is checked on the PTX of every kernel in CI (tools/compile_cuda.py)."""
    find = _compile_tool().float_atomics
    ptx = (
        "\tatom.global.add.u64 \t%rd1, [%rd2], %rd3;\n\tatom.global.add.f32 \t%f1, [%rd2], 0f3F800000;\n"
        "\t@%p1 red.global.add.f64 \t[%rd4], %fd1;\n\tatom.shared.cas.b32 \t%r1, [%r2], %r3, %r4;\n"
    )
    assert find(ptx) == ["atom.global.add.f32", "@%p1 red.global.add.f64"]


def test_a_float_atomic_kernel_fails_the_compile_check(tmp_path):
    import shutil

    import pytest

    tool = _compile_tool()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed here (CI has it)")
    src = tmp_path / "bad.cu"
    src.write_text('extern "C" __global__ void cudarl_bad_op(float* x) { atomicAdd(x, 1.0f); }\n')
    _, rc, log = tool.compile_one(nvcc, src, "sm_90", str(tmp_path))
    assert rc == 1 and "atom.global.add.f32" in log


def test_a_twin_split_into_a_package_is_one_face(tmp_path, monkeypatch):
    """reference/<family>/__init__.py may gather the ops from modules by concept (reference/replay/)."""
    tool = _tool()
    _demo_family(tmp_path, _LAUNCHER.format(args="(x, x.size, scale)"))
    (tmp_path / "cudarl" / "reference" / "demo.py").unlink()
    pkg = tmp_path / "cudarl" / "reference" / "demo"
    pkg.mkdir()
    (pkg / "math.py").write_text("def scale(x, scale):\n    x *= scale\n")
    (pkg / "__init__.py").write_text("from .math import scale\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.problems() == []
    (pkg / "__init__.py").write_text("from .math import scale as other\n")
    assert tool.problems() == ["cudarl/reference/demo/__init__.py: no function for op(s) scale"]
