"""tools/gpu_report.py writes a report that says when its GPU tests ran over a poisoned pool (gpu_check --poison),
and only then; tools/gpu_check.sh gives each benchmark its own arguments where asked."""

import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_report.py"
JUNIT = (
    '<testsuites><testsuite name="pytest" tests="1"><testcase classname="t" name="test_a" /></testsuite></testsuites>'
)


def _report(tmp_path, *flags) -> str:
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "bench").mkdir(exist_ok=True)
    out = tmp_path / "report.md"
    cmd = [sys.executable, str(TOOL), "--junit", str(tmp_path / "junit.xml"), "--bench-dir", str(tmp_path / "bench")]
    subprocess.run([*cmd, "--out", str(out), *flags], check=True, capture_output=True, timeout=120)
    return out.read_text()


def test_the_report_says_when_the_pool_was_poisoned(tmp_path):
    plain, poisoned = _report(tmp_path), _report(tmp_path, "--poisoned")
    assert "**1 passed, 0 failed, 0 skipped**" in plain and "**1 passed, 0 failed, 0 skipped**" in poisoned
    assert "poisoned" not in plain
    assert "- memory pool: poisoned before every GPU test" in poisoned


BENCH = """import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
json.dump({"benchmark": "x", "rows": []}, open(out, "w"))
print("ARGS", " ".join(sys.argv[sys.argv.index("--out") + 2 :]))
"""


def test_gpu_check_gives_a_benchmark_its_own_arguments_else_the_shared_ones(tmp_path):
    # tools/gpu_check.sh in a copy of tools/ (it writes its report into the tree it runs from), no test files,
    # two fake benchmarks: BENCH_ARGS_<name> replaces BENCH_ARGS for that benchmark alone
    tree = tmp_path / "tree"
    (tree / "tools").mkdir(parents=True)
    (tree / "docs").mkdir()
    (tree / "tests").mkdir()
    for name in ("gpu_check.sh", "gpu_report.py", "junit_read.py"):
        (tree / "tools" / name).write_text((TOOL.parent / name).read_text())
    for name in ("bench_a", "bench_b"):
        (tmp_path / f"{name}.py").write_text(BENCH)
    env = {
        **os.environ,
        "PYTHONPATH": str(TOOL.parents[1]),
        "BENCHES": f"{tmp_path / 'bench_a.py'} {tmp_path / 'bench_b.py'}",
        "BENCH_ARGS": "--shared 1",
        "BENCH_ARGS_bench_b": "--own 2",
        "OUT": str(tmp_path / "out"),
        "BENCH_DIR": str(tmp_path / "bench"),
        "CUDARL_COMMIT": "test",
    }
    r = subprocess.run(
        ["bash", str(tree / "tools" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    log = (tmp_path / "out" / "bench.log").read_text()
    assert "ARGS --shared 1\n" in log, (log, r.stderr)
    assert "ARGS --own 2\n" in log and "--shared 1 --own" not in log, log
    assert (tree / "docs" / "gpu-report.md").exists()
