"""tools/gpu_report.py writes a report that says when its GPU tests ran over a poisoned pool (gpu_check --poison),
and only then."""

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
