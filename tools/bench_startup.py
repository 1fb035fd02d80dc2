#!/usr/bin/env python3
"""Start-up: from `cudarl-train train` to the first learner update, warm and cold kernel cache, GPU and CPU.

Each run is a fresh Python process (the import cost is real) that does what ``cudarl-train train
DATA`` does (``cudarl.cli.build_config``, then ``Trainer``: data, features, environments, replay,
agent, graphs, run directory), then ``Trainer.prime`` (capture both graphs, collect until a batch
can be sampled) and one collect step with its learner update, waited for. The parent clocks the
process from its spawn; the child reports when each stage ended (``Trainer.timings``,
``cudarl.timing``), so the breakdown is:

    interpreter  Python's start-up, to the first line of the child
    import       cudarl.cli and cudarl.trainer (typer, NumPy, SciPy, ...)
    config       the CLI's config (and the backend probe it makes)
    backend      picking the backend (on the GPU: CuPy's import and the device)
    data         loading the bars
    features     features, splits, normaliser
    allocation   environments, replay, agent, graph phases (device buffers, cuBLAS handles)
    run_dir      the run directory (config.toml, env.json, data_report.json)
    capture      both graphs captured (less the kernel time)
    compile      waiting for kernel binaries (NVRTC compiles, or cache reads) and loading them
    prime        collect steps until a batch can be sampled (enqueued)
    first_update one collect step and one learner update, and the wait for all queued work

A cold run starts with empty kernel caches (cudarl's ``CUDARL_CACHE_DIR`` and CuPy's
``CUPY_CACHE_DIR``, fresh folders); a warm run reuses the folders a cold run filled. On the CPU
there are no kernels: its cold and warm runs differ only by the operating system's file cache.
CuPy's own kernels (fills and arithmetic in the set-up) compile into ``CUPY_CACHE_DIR`` when cold and
count under the stage that first used them, not under ``compile`` (cudarl's kernels only).
Targets (issue 20): <= 2 s warm, <= 5 s cold, on the GPU.

cudarl's modules are byte-compiled before the runs (``compileall``, into their ``__pycache__``), as ``pip
install`` leaves an installed package and a first run leaves a checkout: a host with
``PYTHONDONTWRITEBYTECODE`` set and a fresh copy of the tree (a GPU host's) would otherwise compile every
module from source in every child (0.82 s of import on an H100 host at ``20a3871``, against about 0.15 s
with bytecode at ``2664cc6``). The JSON says whether it did (``bytecode``).

Usage: python tools/bench_startup.py [--device both|gpu|cpu] [--repeats 3] [--set SECTION.FIELD=VALUE]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from benchlib import parser, report, row  # noqa: E402

STAGES = (
    "interpreter",
    "import",
    "config",
    "backend",
    "data",
    "features",
    "allocation",
    "run_dir",
    "capture",
    "compile",
    "prime",
    "first_update",
)
TARGETS_S = {("gpu", "warm"): 2.0, ("gpu", "cold"): 5.0}


def child(args) -> int:
    """One start-up, in this (fresh) process; prints one JSON line of time.monotonic() stamps."""
    t_start = time.monotonic()
    from cudarl.cli import build_config
    from cudarl.trainer import Trainer

    t_import = time.monotonic()
    cfg, _ = build_config(args.data, None, args.set, None, args.device, 0, "startup", Path(args.run_out))
    t_config = time.monotonic()
    tr = Trainer(cfg, echo=lambda m: None)
    tr.prime()
    t_primed = time.monotonic()
    tr.advance(1)  # one collect step and its learner update(s), as run() starts
    tr.synchronize()
    t_first = time.monotonic()
    from cudarl import kernels

    out = {
        "t_start": t_start,
        "t_import": t_import,
        "t_config": t_config,
        "t_primed": t_primed,
        "t_first": t_first,
        "timings": tr.timings,
        "backend": tr.be.name,
        "device": tr.be.device,
        "updates_per_collect": cfg.agent.updates_per_collect,
        "kernels": kernels.compile_report(),
    }
    print("STARTUP " + json.dumps(out))
    return 0


def one_run(device: str, cache_root: Path, args) -> dict:
    """Spawn a child; return its stages in seconds and the total from spawn to the first update."""
    env = dict(os.environ)
    env["CUDARL_CACHE_DIR"] = str(cache_root / "cudarl")
    env["CUPY_CACHE_DIR"] = str(cache_root / "cupy")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="cudarl-startup-runs-") as runs:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--device", device, "--run-out", runs]
        cmd += ["--data", args.data] + [x for s in args.set for x in ("--set", s)]
        t_spawn = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=runs, timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("STARTUP ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"start-up child failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    r = json.loads(lines[-1][len("STARTUP ") :])
    tm = r["timings"]
    stages = {
        "interpreter": r["t_start"] - t_spawn,
        "import": r["t_import"] - r["t_start"],
        "config": r["t_config"] - r["t_import"],
        **{k: tm.get(k, 0.0) for k in ("backend", "data", "features", "allocation", "run_dir", "capture", "compile")},
        "prime": tm.get("prime_collect", 0.0),
        "first_update": r["t_first"] - r["t_primed"],
    }
    total = r["t_first"] - t_spawn
    stages["other"] = total - sum(stages.values())  # time between the stamps the trainer keeps
    compiled = [k for k in r["kernels"] if not k["cached"]]
    return {
        "total_s": total,
        "stages_s": stages,
        "backend": r["backend"],
        "device": r["device"],
        "families_compiled": len(compiled),  # binaries: a family, or one compile unit of it
        "families_cached": len(r["kernels"]) - len(compiled),
        "nvrtc_s": {k["family"] + (f".{k['unit']}" if k.get("unit") else ""): k["compile_s"] for k in compiled},
    }


def arm(device: str, args, rows: list, extra: dict) -> None:
    runs = {"cold": [], "warm": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="cudarl-startup-cache-") as cache:
            runs["cold"].append(one_run(device, Path(cache), args))  # fills the caches
            runs["warm"].append(one_run(device, Path(cache), args))
    for state in ("warm", "cold"):
        rs = sorted(runs[state], key=lambda r: r["total_s"])
        mid = rs[len(rs) // 2]  # the breakdown of the run with the median total
        target = TARGETS_S.get((device, state))
        case = f"{device.upper()} ({mid['device']}), {state} kernel cache"
        rows.append(
            row(
                case,
                f"start to first update, median of {len(rs)}",
                statistics.median(r["total_s"] for r in rs),
                "s",
                f"<= {target:g} s" if target else "",
            )
        )
        for k in (*STAGES, "other"):
            rows.append(row(case, f"  {k}", mid["stages_s"][k], "s"))
        if device == "gpu":
            rows.append(
                row(
                    case,
                    "  kernel binaries (families or units) compiled / from cache",
                    f"{mid['families_compiled']}/{mid['families_cached']}",
                    "",
                )
            )
            if mid["nvrtc_s"]:
                slow = max(mid["nvrtc_s"], key=mid["nvrtc_s"].get)
                rows.append(row(case, f"  slowest NVRTC compile ({slow})", mid["nvrtc_s"][slow], "s"))
                rows.append(row(case, "  NVRTC seconds, all binaries (in parallel)", sum(mid["nvrtc_s"].values()), "s"))
        extra.setdefault("runs", {}).setdefault(device, {})[state] = runs[state]


def byte_compile() -> str:
    """Byte-compile cudarl's modules into their ``__pycache__`` (what the children import); a line for the JSON."""
    import compileall

    ok = compileall.compile_dir(str(ROOT / "cudarl"), quiet=1)
    return "compiled before the runs (compileall)" if ok else "compileall failed for some modules (read-only tree?)"


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.set_defaults(repeats=3)
    ap.add_argument("--device", choices=("both", "gpu", "cpu"), default="both")
    ap.add_argument("--data", default="builtin:regime", help="the DATA argument of cudarl-train train")
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE, as cudarl-train's --set")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a child may take")
    ap.add_argument("--child", action="store_true", help=__import__("argparse").SUPPRESS)
    ap.add_argument("--run-out", default=None, help=__import__("argparse").SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from cudarl.backend import cupy_unavailable_reason

    why = cupy_unavailable_reason()
    devices = ["gpu", "cpu"] if args.device == "both" else [args.device]
    rows, extra = [], {"data": args.data, "set": args.set, "repeats": args.repeats, "bytecode": byte_compile()}
    for dev in devices:
        if dev == "gpu" and why:
            print(f"skipping the GPU arm: {why}")
            rows.append(row("GPU", "skipped", why[:60], ""))
            continue
        try:
            arm(dev, args, rows, extra)
        except Exception as exc:  # a failing arm is a row, like every benchmark's
            rows.append(row(dev.upper(), "failed", f"{type(exc).__name__}: {exc}"[:200], ""))
            print(f"{dev} arm failed: {exc}")
    if why and args.out is None:  # the committed file holds a GPU run; a machine without one only prints
        for r in rows:
            print(f"{r['case']:<40} {r['metric']:<44} {r['value']!s:>12} {r['unit']}")
        print("no GPU: nothing written (pass --out to write the JSON anyway)")
        return 0
    report("bench_startup", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
