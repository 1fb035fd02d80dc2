"""tools/junit_read.py: the one JUnit reader of tools/gpu_report.py and tools/mutation_check.py."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from junit_read import merge_junit, read_junit  # noqa: E402

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_ok"/>
<testcase classname="tests.a" name="test_bad"><failure message="assert 0"/></testcase>
<testcase classname="tests.a" name="test_err"><error message="fixture"/></testcase>
<testcase classname="tests.b" name="tests.b"><error message="collection failure"/></testcase>
<testcase classname="tests.a" name="test_gpu"><skipped message="no GPU"/></testcase>
<testcase classname="tests.a" name="test_gpu2"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>"""


def test_counts_names_and_reasons(tmp_path):
    p = tmp_path / "junit.xml"
    p.write_text(XML)
    c = read_junit(p)
    assert (c["passed"], c["failed"], c["errors"], c["collection_errors"], c["skipped"]) == (1, 1, 1, 1, 2)
    assert c["failed_tests"] == ["tests.a::test_bad", "tests.a::test_err", "tests.b::tests.b"]
    assert c["skip_reasons"] == ["no GPU"] and c["missing"] is False


def test_a_missing_or_broken_file_says_so(tmp_path):
    assert read_junit(tmp_path / "none.xml")["missing"]
    (tmp_path / "cut.xml").write_text("<testsuites><testsuite>")
    c = read_junit(tmp_path / "cut.xml")
    assert c["missing"] and c["passed"] == 0


def test_merge_sums_the_processes_cases_and_counts_a_missing_one(tmp_path):
    """tools/gpu_check.sh's parallel test processes: every case of each file in one suite, read as the
    sum; a process that wrote no file is counted as missing."""
    a, b = tmp_path / "a.xml", tmp_path / "b.xml"
    a.write_text(XML)
    b.write_text(XML.replace('name="test_ok"', 'name="test_ok2"'))
    out = tmp_path / "m.xml"
    assert merge_junit([a, b, tmp_path / "gone.xml"], out) == 1
    c = read_junit(out)
    assert (c["passed"], c["failed"], c["errors"], c["collection_errors"], c["skipped"]) == (2, 2, 2, 2, 4)
    assert "tests.a::test_bad" in c["failed_tests"] and c["missing"] is False
