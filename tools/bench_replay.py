#!/usr/bin/env python3
"""Prioritized replay: sample + gather + priority update, batch 512 from capacity 1M, 64 features.

Arms (one run, side by side):
* cudarl, CuPy: the step (sample, gather of obs/next_obs/action/n-step return, update) and the
  sample + update alone, ``--inner`` consecutive steps captured in one StepGraph and timed by
  CUDA events, and eagerly from Python. Target: sample + update <= 17 us on an H200. Also the
  collect step's insert on its own: 4096 rows (n = 3 over 4096 envs), ``--inner`` per graph.
* PyTorch on the GPU: float32 priorities, ``cumsum`` of ``p**alpha`` and ``searchsorted`` of
  stratified uniforms, ``index_select`` gathers, ``index_put_`` updates; eager and in one
  ``torch.cuda.graph``. Skipped with a printed reason when torch or CUDA is missing.
* cpprb (``PrioritizedReplayBuffer``, segment trees in C++) on the CPU. Skipped with a printed
  reason when cpprb is not importable (it is not installed on the GPU host).
* cudarl on the NumPy backend (the CPU twin; a correctness oracle, not built for speed).

Prints a table and writes JSON (``--out``, default ``docs/bench/bench_replay.json``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, host_time_us, parser, report, row  # noqa: E402

TARGET_US = 17.0
INSERT_ROWS = 4096  # rows per insert in the insert arm: one collect step of the reference workload's envs
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6


def fill_rows(rng, n, d):
    return (
        rng.standard_normal((n, d), dtype=np.float32),
        rng.integers(0, 3, n).astype(np.int32),
        rng.standard_normal(n, dtype=np.float32),
        np.full(n, 0.99, np.float32),
    )


def cudarl_arms(args, rows, extra):
    from cudarl.backend import cupy_unavailable_reason

    why = cupy_unavailable_reason()
    if why:
        print(f"skipping the cudarl GPU arms: {why}")
        return None
    import cupy as cp

    from cudarl.graph import StepGraph
    from cudarl.replay import PrioritizedReplay

    C, D, B = args.capacity, args.dim, args.batch
    rng = np.random.default_rng(0)
    r = PrioritizedReplay(C, D, n_step=3, alpha=ALPHA, beta0=BETA, seed=1, backend="cupy")
    chunk = 1 << 16
    for start in range(0, C, chunk):
        n = min(chunk, C - start)
        r.add(*(cp.asarray(x) for x in fill_rows(rng, n, D)))
    ready = r.ready()
    for start in range(0, ready, chunk):  # skewed priorities over every ready row
        idx = cp.arange(start, min(start + chunk, ready), dtype=cp.int32)
        r.update_priorities(idx, cp.asarray((rng.pareto(1.5, idx.size) + 1e-3).astype(np.float32)))
    td = cp.asarray(rng.standard_normal(B, dtype=np.float32))
    r.reserve(B)
    cp.cuda.Device().synchronize()

    def sample_update():
        idx, _ = r.sample(B)
        r.update_priorities(idx, td)

    def step():
        idx, _ = r.sample(B)
        r.gather(idx)
        r.update_priorities(idx, td)

    case = f"cudarl CuPy, {C} x {D}, batch {B}"
    k = args.inner
    for name, fn in (("sample + update", sample_update), ("sample + gather + update", step)):
        g = StepGraph(f"bench_replay_{len(name)}", [("per", lambda fn=fn: [fn() for _ in range(k)])], xp=cp)
        g.capture()
        t = cuda_time_us(g.replay, g.stream, repeats=args.repeats, warmup=3) / k
        target = f"<= {TARGET_US:g} us" if name == "sample + update" else ""
        rows.append(row(case, f"{name} (graph), us", t, "us", target))
        extra[f"cudarl_graph_{name.replace(' ', '_').replace('+', 'and')}_us"] = t
        cp.cuda.Device().synchronize()
        te = cuda_time_us(fn, cp.cuda.get_current_stream(), repeats=max(20, args.repeats // 4))
        rows.append(row(case, f"{name} (eager), us", te, "us"))
    # the collect step's insert: a batch of INSERT_ROWS env rows, n = 3 (rows ready 3 env-steps later)
    E = INSERT_ROWS
    if C > 3 * E:
        ins = PrioritizedReplay(C, D, n_step=3, n_envs=E, alpha=ALPHA, beta0=BETA, seed=2, backend="cupy")
        batch = [cp.asarray(x) for x in fill_rows(rng, E, D)]
        cp.cuda.Device().synchronize()
        g = StepGraph("bench_replay_insert", [("insert", lambda: [ins.add(*batch) for _ in range(k)])], xp=cp)
        g.capture()
        t = cuda_time_us(g.replay, g.stream, repeats=args.repeats, warmup=3) / k
        rows.append(row(case, f"insert {E} rows (graph), us", t, "us"))
        extra["cudarl_graph_insert_us"] = t
    extra["target_met"] = bool(extra["cudarl_graph_sample_and_update_us"] <= TARGET_US)
    if r.status():
        print(f"warning: replay status bits set during the benchmark: {r.status()}")
    return extra["cudarl_graph_sample_and_update_us"]


def torch_arm(args, rows):
    try:
        import torch
    except Exception as exc:
        print(f"skipping the PyTorch arm: torch is not importable ({type(exc).__name__}: {exc})")
        return
    if not torch.cuda.is_available():
        print("skipping the PyTorch arm: torch sees no CUDA device")
        return
    C, D, B = args.capacity, args.dim, args.batch
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    obs = torch.randn(C, D, device=dev)
    act = torch.randint(0, 3, (C,), device=dev, dtype=torch.int32)
    prio = torch.rand(C, device=dev) * 10 + 1e-3
    td = torch.randn(B, device=dev)
    j = torch.arange(B, device=dev, dtype=torch.float32)
    out = {}

    def sample_update(gather: bool):
        pa = prio.pow(ALPHA)
        cdf = torch.cumsum(pa, 0)
        total = cdf[-1]
        u = (j + torch.rand(B, device=dev)) * (total / B)
        idx = torch.searchsorted(cdf, u).clamp_(max=C - 1)
        p = pa[idx] / total
        w = (C * p).pow(-BETA)
        out["w"] = w / w.max()
        if gather:
            out["obs"] = obs.index_select(0, idx)
            out["next"] = obs.index_select(0, (idx + 3) % C)
            out["act"] = act.index_select(0, idx)
        prio.index_put_((idx,), (td.abs() + EPS))

    case = f"PyTorch {torch.__version__} GPU, {C} x {D}, batch {B}"
    stream = torch.cuda.Stream()

    def event_time(fn, repeats):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        return float(np.median(ts))

    for name, gather in (("sample + update", False), ("sample + gather + update", True)):
        rows.append(
            row(
                case,
                f"{name} (eager), us",
                event_time(lambda gather=gather: sample_update(gather), max(20, args.repeats // 4)),
                "us",
            )
        )
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    sample_update(gather)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.inner):
                    sample_update(gather)
            t = event_time(graph.replay, args.repeats) / args.inner
            rows.append(row(case, f"{name} (CUDA graph), us", t, "us"))
        except Exception as exc:
            print(f"PyTorch CUDA-graph arm of {name!r} failed: {type(exc).__name__}: {exc}")
    del stream, g


def cpprb_arm(args, rows, extra):
    try:
        from cpprb import PrioritizedReplayBuffer
    except Exception as exc:
        print(f"skipping the cpprb arm: cpprb is not importable ({type(exc).__name__}: {exc}); pip install cpprb")
        return None
    C, D, B = args.capacity, args.dim, args.batch
    rng = np.random.default_rng(0)
    rb = PrioritizedReplayBuffer(
        C,
        {"obs": {"shape": D}, "act": {"dtype": np.int32}, "rew": {}, "next_obs": {"shape": D}, "done": {}},
        alpha=ALPHA,
        eps=EPS,
    )
    chunk = 1 << 16
    for start in range(0, C, chunk):
        n = min(chunk, C - start)
        o, a, rew, _ = fill_rows(rng, n, D)
        rb.add(
            obs=o,
            act=a,
            rew=rew,
            next_obs=o,
            done=np.zeros(n, np.float32),
            priorities=(rng.pareto(1.5, n) + 1e-3).astype(np.float64),
        )
    td = np.abs(rng.standard_normal(B)) + EPS

    def sample_update():
        s = rb.sample(B, beta=BETA)
        rb.update_priorities(s["indexes"], td)

    t = host_time_us(sample_update, repeats=max(20, args.repeats // 4))
    import os

    case = f"cpprb CPU ({os.cpu_count()} cores), {C} x {D}, batch {B}"
    rows.append(row(case, "sample (with gather) + update, us", t, "us"))
    extra["cpprb_sample_update_us"] = t
    return t


def numpy_arm(args, rows):
    from cudarl.replay import PrioritizedReplay

    C, D, B = args.capacity, args.dim, args.batch
    rng = np.random.default_rng(0)
    r = PrioritizedReplay(C, D, n_step=3, alpha=ALPHA, beta0=BETA, backend="numpy")
    chunk = 1 << 16
    for start in range(0, C, chunk):
        r.add(*fill_rows(rng, min(chunk, C - start), D))
    td = rng.standard_normal(B, dtype=np.float32)

    def step():
        idx, _ = r.sample(B)
        r.gather(idx)
        r.update_priorities(idx, td)

    rows.append(
        row(
            f"cudarl NumPy backend, {C} x {D}, batch {B}",
            "sample + gather + update, us",
            host_time_us(step, repeats=5, warmup=1),
            "us",
        )
    )


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--inner", type=int, default=20, help="steps captured per graph")
    ap.add_argument("--skip-numpy", action="store_true", help="skip the (slow) NumPy-backend arm")
    args = ap.parse_args()
    rows, extra = [], {"capacity": args.capacity, "dim": args.dim, "batch": args.batch, "target_us": TARGET_US}
    t0 = time.perf_counter()
    ours = cudarl_arms(args, rows, extra)
    torch_arm(args, rows)
    cp_t = cpprb_arm(args, rows, extra)
    if ours and cp_t:
        rows.append(row("cudarl graph vs cpprb", "speed-up of sample + update", cp_t / ours, "x", ">= 50 x"))
    if not args.skip_numpy:
        numpy_arm(args, rows)
    extra["wall_s"] = time.perf_counter() - t0
    report("bench_replay", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
