#!/usr/bin/env python3
"""Write docs/gpu-report.md from a pytest JUnit XML and the benchmark JSON files.

Each benchmark JSON holds {"benchmark": name, "rows": [{"case": ..., "metric": ..., "value": ...,
"unit": ..., "target": ...}], ...}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from junit_read import read_junit  # noqa: E402


def load_benches(d: Path) -> list[dict]:
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(json.loads(p.read_text()))
        except json.JSONDecodeError as exc:
            out.append({"benchmark": p.stem, "error": f"unreadable JSON: {exc}", "rows": []})
    return out


def bench_table(benches: list[dict]) -> str:
    lines = ["| benchmark | case | metric | value | unit | target |", "|---|---|---|---|---|---|"]
    for b in benches:
        if b.get("error"):
            lines.append(f"| {b.get('benchmark')} | ERROR | {b['error']} | | | |")
        for r in b.get("rows", []):
            v = r.get("value")
            vs = f"{v:.4g}" if isinstance(v, (int, float)) else str(v)
            lines.append(
                f"| {b.get('benchmark')} | {r.get('case', '')} | {r.get('metric', '')} | {vs} | "
                f"{r.get('unit', '')} | {r.get('target', '')} |"
            )
    return "\n".join(lines)


def versions() -> dict:
    v = {"python": platform.python_version()}
    try:
        import cupy

        v["cupy"] = cupy.__version__
        v["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        v["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    except Exception as exc:  # report what we can
        v["cupy"] = f"unavailable ({exc})"
    try:
        import numpy

        v["numpy"] = numpy.__version__
    except Exception:
        pass
    return v


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--junit", type=Path, required=True)
    ap.add_argument("--bench-dir", type=Path, required=True)
    ap.add_argument("--gpu-file", type=Path)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--bench-json", type=Path)
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--poisoned", action="store_true", help="the tests ran over a poisoned pool (gpu_check --poison)")
    a = ap.parse_args()
    c = read_junit(a.junit)
    failed = c["failed"] + c["errors"] + c["collection_errors"]
    benches = load_benches(a.bench_dir)
    if a.summary_only:
        print(f"GPU tests: {c['passed']} passed, {failed} failed, {c['skipped']} skipped")
        for f in c["failed_tests"][:30]:
            print(f"  FAILED {f}")
        print(bench_table(benches))
        return 0
    gpu = a.gpu_file.read_text().strip() if a.gpu_file and a.gpu_file.is_file() else "unknown"
    v = versions()
    md = [
        "# GPU report",
        "",
        "Written by `tools/gpu_check.sh` on a GPU host. CI has no GPU; this file is the record that the kernels run.",
        "",
        f"- commit: `{a.commit}`",
        f"- date: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- GPU: {gpu}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- wall time of the check: {a.seconds} s",
        *(["- memory pool: poisoned before every GPU test (`gpu_check --poison`, CUDARL_POISON_POOL=1)"] * a.poisoned),
        "",
        "## GPU tests (`pytest -m gpu`)",
        "",
        f"**{c['passed']} passed, {failed} failed, {c['skipped']} skipped**"
        + (" (no JUnit file: the test run did not finish)" if c["missing"] else ""),
        "",
    ]
    md += [f"- FAILED `{f}`" for f in c["failed_tests"]]
    md += ["", "## Benchmarks", "", bench_table(benches), ""]
    if a.out:
        a.out.write_text("\n".join(md))
    if a.bench_json:
        a.bench_json.write_text(
            json.dumps({"commit": a.commit, "gpu": gpu, "versions": v, "tests": c, "benchmarks": benches}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
