"""The tools' one reader of a pytest JUnit XML file (tools/gpu_report.py, tools/mutation_check.py)."""

from __future__ import annotations

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
