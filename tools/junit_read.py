"""The tools' one reader of a pytest JUnit XML file (tools/gpu_report.py, tools/mutation_check.py), and
the merge of several into one (tools/gpu_check.sh's parallel test processes):
``python3 tools/junit_read.py --merge OUT IN [IN ...]``."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read_junit(path: Path) -> dict:
    """Counts ``passed``, ``failed``, ``errors``, ``skipped``, ``collection_errors`` (a module that did
    not import: counted apart from ``errors``), ``failed_tests`` (``classname::name`` of every failure
    and error, collection errors included), ``skip_reasons`` (each once), and ``missing`` (no file, or
    not XML: the test run did not finish)."""
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "collection_errors": 0}
    out.update(failed_tests=[], skip_reasons=[], missing=False)
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        out["missing"] = True
        return out
    for case in tree.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag: child for child in case}
        if "error" in tags and tags["error"].get("message", "") == "collection failure":
            out["collection_errors"] += 1
            out["failed_tests"].append(name)
        elif "failure" in tags or "error" in tags:
            out["failed" if "failure" in tags else "errors"] += 1
            out["failed_tests"].append(name)
        elif "skipped" in tags:
            out["skipped"] += 1
            reason = tags["skipped"].get("message", "")
            if reason not in out["skip_reasons"]:
                out["skip_reasons"].append(reason)
        else:
            out["passed"] += 1
    return out


def merge_junit(paths, out: Path) -> int:
    """Every test case of the JUnit files ``paths`` (those that exist and parse) in one suite written to
    ``out``, its counts summed and its time the longest file's (the processes ran side by side); returns
    how many inputs were missing or unreadable (a process that did not finish)."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="pytest")
    counts, seconds, missing = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0), 0.0, 0
    for path in paths:
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            missing += 1
            continue
        for ts in tree.getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(ts.get(key, 0))
            seconds = max(seconds, float(ts.get("time", 0)))
            suite.extend(ts.findall("testcase"))
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", f"{seconds:.3f}")
    ET.ElementTree(root).write(out)
    return missing


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "--merge":
        sys.exit("usage: python3 tools/junit_read.py --merge OUT IN [IN ...]")
    gone = merge_junit([Path(p) for p in sys.argv[3:]], Path(sys.argv[2]))
    if gone:
        print(f"junit_read: {gone} of {len(sys.argv) - 3} JUnit files missing or unreadable (a process cut short)")
