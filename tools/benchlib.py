"""Shared benchmark plumbing: GPU timing with events, the result table, and the JSON file.

A benchmark builds rows ``{"case", "metric", "value", "unit", "target"}`` and calls
:func:`report`, which prints the table and writes ``{"benchmark": name, "rows": [...], ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The commit measured: ``$CUDARL_COMMIT`` (a GPU host's tree has no ``.git``, or a stale one), else
    ``git rev-parse --short HEAD``, else ``"unknown"``."""
    if os.environ.get("CUDARL_COMMIT"):
        return os.environ["CUDARL_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, default=None, help="JSON output path (default docs/bench/<name>.json)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument(
        "--torch-compile", action="store_true", help="also run the torch.compile arms (2-5 minutes of compiling)"
    )
    return ap


def cuda_time_us(fn, stream, repeats: int = 200, warmup: int = 10, inner: int = 1) -> float:
    """Median microseconds of ``inner`` calls of ``fn()`` on ``stream``, timed with CUDA events."""
    import cupy

    for _ in range(warmup):
        fn()
    stream.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    ts = []
    for _ in range(repeats):
        start.record(stream)
        for _ in range(inner):
            fn()
        end.record(stream)
        end.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / inner)
    return statistics.median(ts)


def host_time_us(fn, repeats: int = 50, warmup: int = 3, sync=None) -> float:
    """Median microseconds of ``fn()`` by the host clock (``sync()`` after each call if given)."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def row(case: str, metric: str, value, unit: str, target: str = "") -> dict:
    return {"case": case, "metric": metric, "value": value, "unit": unit, "target": target}


def device_name() -> str:
    try:
        import cupy

        p = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        return p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    except Exception:
        return "cpu"


def fp32_peak_tflops() -> float:
    """The device's FP32 peak: SMs x 128 FP32 lanes x 2 (fused multiply-add) x the SM clock."""
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return p["multiProcessorCount"] * 128 * 2 * p["clockRate"] * 1e3 / 1e12


def report(name: str, rows: list[dict], out: Path | None, extra: dict | None = None) -> None:
    """Print the table and write the JSON."""
    w = max([len(r["case"]) for r in rows] + [4])
    m = max([len(r["metric"]) for r in rows] + [6])
    print(f"{'case':<{w}}  {'metric':<{m}}  {'value':>12}  unit  target")
    for r in rows:
        v = r["value"]
        vs = f"{v:12.4g}" if isinstance(v, (int, float)) else f"{str(v):>12}"
        print(f"{r['case']:<{w}}  {r['metric']:<{m}}  {vs}  {r['unit']}  {r['target']}")
    path = out or Path(__file__).resolve().parents[1] / "docs" / "bench" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "device": device_name(), "rows": rows, **(extra or {})}
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


def skipped_without_gpu(name: str, case: str, out: Path | None) -> bool:
    """True (after printing why) when no GPU can run the benchmark ``name``. The skip is written only
    to an explicit ``out``: the committed default file keeps its numbers."""
    from cudarl.backend import cupy_unavailable_reason

    why = cupy_unavailable_reason()
    if why is None:
        return False
    print(f"skipping: {why}")
    if out:
        report(name, [row(case, "skipped", why[:60], "")], out)
    return True
