"""tools/gpu_stress.sh: pytest in several copies side by side, rounds of them; counts the failing copies, keeps
only their logs, exits 1 if any failed (here without the GEMM loop: NO_LOAD=1)."""

import os
import subprocess
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_stress.sh"


def _run(target: str, out: Path):
    env = {**os.environ, "COPIES": "2", "ROUNDS": "2", "OUT": str(out), "NO_LOAD": "1"}
    return subprocess.run(["bash", str(TOOL), target], env=env, capture_output=True, text=True, timeout=300)


def test_stress_counts_failing_copies_and_keeps_only_their_logs(tmp_path):
    case = tmp_path / "test_case.py"
    case.write_text("def test_ok():\n    pass\n\n\ndef test_bad():\n    assert False\n")
    ok = _run(f"{case}::test_ok", tmp_path / "ok")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "round 2: 2 of 2 copies passed" in ok.stdout and "stress: 0 failing copies in 4" in ok.stdout
    assert not list((tmp_path / "ok").glob("*.log"))
    bad = _run(f"{case}::test_bad", tmp_path / "bad")
    assert bad.returncode == 1 and "stress: 4 failing copies in 4" in bad.stdout, bad.stdout
    logs = sorted(p.name for p in (tmp_path / "bad").glob("*.log"))
    assert logs == ["r1_c1.log", "r1_c2.log", "r2_c1.log", "r2_c2.log"]
    assert "assert False" in (tmp_path / "bad" / "r1_c1.log").read_text()
