#!/usr/bin/env python3
"""TradingEnv throughput: env-steps per second at 256, 4096 and 65536 environments on the GPU,
without acting (step only), with acting (act + step), and collecting (act + record with
counterfactual and mirror rows + step; and the same as the collect step runs it, ``record_step``:
record, discount, step and the next windows in one launch), next to one gym-anytrading StocksEnv on
the CPU.

Each GPU arm captures ``--inner`` consecutive steps in one StepGraph and times its replays with
CUDA events; "eager" launches one step at a time from Python. Target: >= 1e8 env-steps/s at
4096 environments without acting. Market: a random walk of ``--bars`` bars, 64 features, 3 actions.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row  # noqa: E402

TARGET_4096 = 1e8


def synthetic_market(t_n: int, f_n: int, seed: int = 0):
    """open, close float32 [T], features float32 [T, F], return_sign bool [F]."""
    rng = np.random.default_rng(seed)
    close = (100 * np.exp(np.cumsum(rng.normal(0, 0.01, t_n)))).astype(np.float32)
    open_ = (close * (1 + rng.normal(0, 0.002, t_n))).astype(np.float32)
    feats = rng.standard_normal((t_n, f_n), dtype=np.float32)
    sign = np.arange(f_n) % 2 == 0
    return open_, close, feats, sign


def gym_anytrading_steps_per_s(n_steps: int, t_n: int = 20_000) -> tuple[float | None, str]:
    """Steps per second of one gym-anytrading StocksEnv with random actions, or (None, why not)."""
    try:
        import pandas as pd
        from gym_anytrading.envs import StocksEnv
    except Exception as exc:  # not installed on the GPU host
        return None, f"gym-anytrading not importable ({type(exc).__name__}: {exc}); pip install gym-anytrading"
    rng = np.random.default_rng(1)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, t_n)))
    df = pd.DataFrame({"Open": close, "High": close, "Low": close, "Close": close, "Volume": np.ones(t_n)})
    env = StocksEnv(df=df, window_size=10, frame_bound=(10, t_n))
    env.reset(seed=0)
    actions = rng.integers(0, 2, n_steps)
    t0 = time.perf_counter()
    for a in actions:
        out = env.step(int(a))
        if out[2] or (len(out) == 5 and out[3]):
            env.reset()
    return n_steps / (time.perf_counter() - t0), "gym-anytrading StocksEnv, window 10, random actions"


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--envs", type=int, nargs="+", default=[256, 4096, 65536])
    ap.add_argument("--inner", type=int, default=100, help="steps captured per graph")
    ap.add_argument("--bars", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--gym-steps", type=int, default=20_000)
    ap.add_argument("--cpu-only", action="store_true", help="only the gym-anytrading arm")
    args = ap.parse_args()
    rows, extra = [], {"inner_steps_per_graph": args.inner, "bars": args.bars, "features": args.features, "actions": 3}

    gym_rate, gym_note = gym_anytrading_steps_per_s(args.gym_steps)
    if gym_rate is None:
        print(f"skipping the gym-anytrading arm: {gym_note}")
        rows.append(row("gym-anytrading (1 env, CPU)", "env-steps/s", "skipped", "steps/s", gym_note))
    else:
        rows.append(row("gym-anytrading (1 env, CPU)", "env-steps/s", gym_rate, "steps/s", gym_note))
    extra["gym_anytrading_steps_per_s"] = gym_rate
    if args.cpu_only:
        report("bench_env", rows, args.out, extra)
        return 0

    import cupy as cp

    from cudarl.env import EnvConfig, TradingEnv
    from cudarl.graph import StepGraph
    from cudarl.pinned import DeviceScalars

    open_, close, feats, sign = synthetic_market(args.bars, args.features)
    rng = np.random.default_rng(2)
    k = args.inner
    for n in args.envs:
        cfg = EnvConfig(n_envs=n, episode_len=1000, n_actions=3, counterfactual=True, mirror=True, cost_bps=1.0)
        env = TradingEnv(open_, close, feats, sign, cfg, backend="cupy")
        env.actions[...] = cp.asarray(rng.integers(0, 3, n).astype(np.int32))
        q = cp.asarray(rng.standard_normal((n, 3), dtype=np.float32))
        eps = DeviceScalars({"epsilon": np.float32}, xp=cp, initial={"epsilon": 0.1})
        out = env.make_transitions()
        disc, gamma = cp.zeros(out.done.shape, np.float32), cp.full(1, 0.99, np.float32)
        case = f"TradingEnv x {n} (H200)"
        target = f">= {TARGET_4096:.0e}" if n == 4096 else ""

        # eager: one Python launch per step (launch overhead bound)
        t_eager = cuda_time_us(env.step, cp.cuda.get_current_stream(), repeats=max(20, args.repeats // 4))
        cp.cuda.Device().synchronize()
        arms = {
            "step only (graph)": lambda env=env: [env.step() for _ in range(k)],
            "act + step (graph)": lambda env=env, q=q, eps=eps: [
                (env.act(q, eps.view("epsilon")), env.step()) for _ in range(k)
            ],
            "act + record cf+mirror + step (graph)": lambda env=env, q=q, eps=eps, out=out: [
                (env.act(q, eps.view("epsilon")), env.record(out), env.step()) for _ in range(k)
            ],
            # the collect step's env phase: record, discount, step and the next windows in one launch
            "act + record_step cf+mirror, fused (graph)": lambda env=env, q=q, eps=eps, out=out, d=disc, g=gamma: [
                (env.act(q, eps.view("epsilon")), env.record_step(out, d, g)) for _ in range(k)
            ],
        }
        rows.append(row(case, "step only (eager), env-steps/s", n / (t_eager * 1e-6), "steps/s"))
        for i, (arm, fn) in enumerate(arms.items()):
            g = StepGraph(f"bench_env_{n}_{i}", [("steps", fn)], xp=cp)
            g.capture()
            t_us = cuda_time_us(g.replay, g.stream, repeats=args.repeats, warmup=3)
            rate = n * k / (t_us * 1e-6)
            rows.append(row(case, f"{arm}, env-steps/s", rate, "steps/s", target if i == 0 else ""))
            rows.append(row(case, f"{arm}, us per step", t_us / k, "us"))
            if gym_rate:
                rows.append(row(case, f"{arm}, x gym-anytrading", rate / gym_rate, "x"))
            if i == 0 and n == 4096:
                extra["steps_per_s_4096_no_acting"] = rate
                extra["target_met"] = bool(rate >= TARGET_4096)
        del env, out, disc, arms, fn, g  # the arms' lambdas (and the graph holding one) keep env and out alive
    report("bench_env", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
