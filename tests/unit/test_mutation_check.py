"""tools/mutation_check.py: edits applied exactly once or refused, files restored byte for byte (also on
an interrupt), verdicts from real pytest runs, and the seed-bug mutations still applying to the tree."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_check"] = mod  # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("mutation_check", None)


ORIGINAL = "x = 1\r\ny = 'é'\r\nx = 1  # twice\r\nz = 3\r\n".encode()


def test_apply_then_restore_is_byte_exact(tool, tmp_path):
    f = tmp_path / "m.py"
    f.write_bytes(ORIGINAL)
    originals = tool.apply([tool.Edit("m.py", "z = 3", "z = 4"), tool.Edit("m.py", "y = 'é'", "y = 'è'")], tmp_path)
    assert f.read_bytes() == ORIGINAL.replace(b"z = 3", b"z = 4").replace("é".encode(), "è".encode())
    tool.restore(originals)
    assert f.read_bytes() == ORIGINAL


@pytest.mark.parametrize("old,count", [("w = 0", 0), ("x = 1", 2)])
def test_an_edit_not_found_exactly_once_is_refused_and_nothing_is_written(tool, tmp_path, old, count):
    f, g = tmp_path / "m.py", tmp_path / "n.py"
    f.write_bytes(ORIGINAL)
    g.write_bytes(b"a = 1\n")
    with pytest.raises(tool.MutationError, match=f"occurs {count} times"):
        tool.apply([tool.Edit("n.py", "a = 1", "a = 2"), tool.Edit("m.py", old, "q")], tmp_path)
    assert f.read_bytes() == ORIGINAL and g.read_bytes() == b"a = 1\n"


def test_the_file_is_restored_when_the_run_is_interrupted(tool, tmp_path, monkeypatch):
    f = tmp_path / "m.py"
    f.write_bytes(ORIGINAL)
    seen = []

    def interrupted(m, root, timeout):
        seen.append(f.read_bytes())
        raise KeyboardInterrupt

    monkeypatch.setattr(tool, "_run", interrupted)
    m = tool.Mutation("demo", "a bug", (tool.Edit("m.py", "z = 3", "z = 4"),), ("test_m.py",))
    with pytest.raises(KeyboardInterrupt):
        tool.check(m, tmp_path, baseline=False)
    assert seen == [ORIGINAL.replace(b"z = 3", b"z = 4")] and f.read_bytes() == ORIGINAL


def test_verdicts_from_real_pytest_runs(tool, tmp_path):
    """Caught when a named test fails, missed when they pass, not checked when all skip (never caught),
    invalid when they fail unmutated, error for a node id pytest cannot find or a module that no longer
    imports."""
    (tmp_path / "lib.py").write_text("X = 1\nY = 1\n")
    (tmp_path / "test_lib.py").write_text(
        "import pytest\nimport lib\n\n"
        "def test_x():\n    assert lib.X == 1\n\n"
        "def test_y_loosely():\n    assert lib.Y > 0\n\n"
        "@pytest.mark.skip(reason='no GPU')\ndef test_gpu():\n    assert lib.X == 1\n\n"
        "def test_broken():\n    assert False\n"
    )

    def verdict(old, new, *tests, baseline=True):
        m = tool.Mutation("demo", "a bug", (tool.Edit("lib.py", old, new),), tuple(f"test_lib.py::{t}" for t in tests))
        rec = tool.check(m, tmp_path, timeout=120, baseline=baseline)
        assert rec["restored"] and (tmp_path / "lib.py").read_text() == "X = 1\nY = 1\n"
        return rec["verdict"]

    assert verdict("X = 1", "X = 2", "test_x", "test_y_loosely") == "caught"
    assert verdict("Y = 1", "Y = 2", "test_y_loosely") == "MISSED"
    assert verdict("X = 1", "X = 2", "test_gpu") == "not checked (skipped)"
    assert verdict("X = 1", "X = 2", "test_broken").startswith("invalid")
    assert verdict("X = 1", "X = 2", "test_nothing", baseline=False) == "error"
    assert verdict("X = 1", "X = (", "test_x") == "error"  # a mutation that breaks the import is no catch


def test_every_seed_bug_mutation_applies_and_names_tests_that_exist(tool):
    names = [m.name for m in tool.MUTATIONS]
    assert len(names) == len(set(names))
    for m in tool.MUTATIONS:
        tool._planned(m.edits)  # raises if an edit's text is gone or ambiguous; writes nothing
        for node in m.tests:
            path, _, func = node.partition("::")
            func = func.split("[")[0]
            assert f"def {func}(" in (ROOT / path).read_text(), f"{m.name}: no test {node}"
    assert {m.name for m in tool.MUTATIONS if m.gpu} >= {
        "size-baked-at-capture",
        "launch-accepts-null-pointers",
        "allocation-during-capture",
        "cublas-workspace-per-capture",
    }


def test_gpu_mutations_are_refused_while_an_mps_daemon_runs(tool, tmp_path, monkeypatch, capsys):
    # Under MPS the null-pointer mutation's fault ends every client of the GPU (12 learning runs beside it
    # died on an H200): the GPU mutations must not start then (listing them still works).
    (tmp_path / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert tool.mps_pipe() == tmp_path / "control"
    assert tool.main(["--gpu-only"]) == 2
    assert "MPS" in capsys.readouterr().err
    assert tool.main(["--cpu-only", "--list"]) == 0
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    assert tool.mps_pipe() is None
