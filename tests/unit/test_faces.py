"""Every kernel family has its CUDA, launcher, reference and parity-test faces with matching op names."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("check_faces", ROOT / "tools" / "check_faces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_family_has_four_faces():
    assert _tool().problems() == []


def test_the_checker_catches_a_missing_face(tmp_path, monkeypatch):
    tool = _tool()
    (tmp_path / "cuda_src").mkdir()
    (tmp_path / "cuda_src" / "demo.cu").write_text('extern "C" __global__ void cudarl_demo_op(float* x) {}\nextern "C" __global__ void wrong(float* x) {}\n')
    (tmp_path / "cudarl" / "reference").mkdir(parents=True)
    (tmp_path / "cudarl" / "reference" / "demo.py").write_text("def other():\n    pass\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    found = "\n".join(tool.problems())
    assert "kernel wrong is not named cudarl_demo_<op>" in found
    assert "cudarl/reference/demo.py: no function for op(s) op" in found
    assert "cudarl/ops/demo.py: missing" in found
    assert "tests/parity/test_demo.py: missing" in found


def test_config_reference_is_current():
    """docs/config.md is generated from the dataclasses; a changed default must regenerate it."""
    spec = importlib.util.spec_from_file_location("gen", ROOT / "tools" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "config.md").read_text() == mod.render(), "run python tools/gen_config_reference.py"
    for name, cls in mod.SECTIONS.items():
        undocumented = [f.name for f in mod.dataclasses.fields(cls) if f.name not in mod.field_docs(cls)]
        assert not undocumented, f"[{name}] fields without a docstring: {undocumented}"
