"""The step benchmark: train and collect graph replays of the reference workload (DESIGN.md).

Reference workload: 64 features, MLP 256-256, dueling C51 with 51 atoms, 3 actions, batch 512,
replay capacity 1M, n-step 3. ``tools/bench_step.py`` adds the PyTorch arms and the epoch over
4M bars; ``cudarl-train bench`` prints this part.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .config import Config, from_dict

#: Replays per timing in the back-to-back metric (tools/bench_step.py times the PyTorch graph the same way).
BACK_TO_BACK = 20

#: The metric of :func:`step_benchmark`'s device-memory row
DEVICE_MEMORY = "device memory held (CuPy pool)"
#: Issue 20's targets for the reference step in FP32: the train step and the collect step of 4,096 environments (us)
TRAIN_TARGET_US, COLLECT_TARGET_US = 50.0, 30.0


def _pool_bytes_in_use() -> int:
    """Bytes CuPy's default memory pool has handed out now, after collecting the garbage of earlier
    trainers and releasing their streams' cuBLAS workspaces (0 when CuPy is not loaded: nothing is)."""
    import gc
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is None:
        return 0
    from . import blas

    gc.collect()
    blas.release_queued()
    return cupy.get_default_memory_pool().used_bytes()


def reference_config(device: str = "gpu", capacity: int = 1_000_000, **over) -> Config:
    """The DESIGN.md reference workload as a :class:`Config` (64 features come from the extra columns of
    :func:`reference_bars`, every one named: ``features.extra = ["*"]``)."""
    d = {
        "run": {"device": device, "eval_every": 0, "checkpoint_every": 0, "log_every": 10**9},
        "features": {"extra": ["*"]},
        "net": {"hidden": [256, 256], "head": "c51", "atoms": 51},
        "agent": {"batch_size": 512, "learning_starts": 512},
        "replay": {"capacity": capacity, "n_step": 3},
        "env": {"n_envs": 4096, "episode_len": 1024, "n_actions": 3},
    }
    for sec, vals in over.items():
        d.setdefault(sec, {}).update(vals)
    return from_dict(d)


#: The temporal encoders' workload of issue 22: window 64, d_model 128, 2 layers, ssm expand 2 and state 64
#: (head dim 64, chunk 32), attention 4 heads; the rest is the reference workload (batch 512, 4096 envs).
ENCODER_WORKLOAD = {"window": 64, "d_model": 128, "layers": 2, "ssm_expand": 2, "ssm_state": 64, "ssm_headdim": 64}


def encoder_config(encoder: str, device: str = "gpu", **net) -> Config:
    """:func:`reference_config` with ``encoder`` (``ssm`` or ``attention``) at :data:`ENCODER_WORKLOAD`."""
    return reference_config(device, net={"encoder": encoder, **ENCODER_WORKLOAD, **net})


def memory_rows(trainer, case: str) -> list[dict]:
    """Bytes per replay row and per acting environment (its state row, its window and its share of the
    acting workspace, which holds the acting forward's activations) of a :class:`cudarl.trainer.Trainer`."""
    env, ws = trainer.env, trainer.agent.buffers.ws_act
    per_env = (env.rows.nbytes + env.obs.nbytes + sum(b.nbytes for b in ws.bufs.values())) / env.n_envs
    return [
        {"case": case, "metric": "replay bytes per row", "value": trainer.replay.nbytes() / trainer.replay.capacity,
         "unit": "B", "target": ""},
        {"case": case, "metric": f"acting bytes per env (window {env.window})", "value": per_env, "unit": "B",
         "target": ""},
    ]  # fmt: skip


def reference_bars(n_bars: int = 20_000, n_features: int = 64, seed: int = 0, bar_minutes: int = 0):
    """Regime bars with extra random columns so the observation has ``n_features`` features + 2
    (``bar_minutes`` > 0 for more bars than daily dates hold, e.g. the 4M-bar epoch)."""
    from .datasets import regime
    from .features import FeatureConfig, compute

    # sigma 0.2% (mu 0.04%, the default's signal-to-noise): over 4M bars the default's 1% volatility
    # drags the simulated price to float32 zero (log drift -sigma^2/2 per bar).
    def make(n):
        return regime(n=n, seed=seed, mu=0.0004, sigma=0.002, bar_minutes=bar_minutes)

    bars = make(n_bars)
    # the feature names do not depend on the number of bars: count them on a short series
    # (computing every feature of 4M bars only to count them took a third of the epoch's set-up)
    base = len(compute(make(min(n_bars, 2048)), FeatureConfig(extra=("*",))).names)
    rng = np.random.default_rng(seed)
    for k in range(max(0, n_features - base)):
        bars.extra[f"noise_{k:02d}"] = rng.standard_normal(n_bars)
    return bars


def _time(fn, sync, repeats: int) -> float:
    """Median microseconds per call, each call followed by ``sync`` (the replays are timed whole)."""
    for _ in range(5):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def step_benchmark(
    repeats: int = 200, device: str = "gpu", cfg: Config | None = None, bars=None, phases: bool = True, label: str = ""
) -> list[dict]:
    """Median µs per train-graph replay and per collect-graph replay, timed with CUDA events on the GPU
    (and per phase, each captured alone, when ``phases``). ``label`` is appended to the case name."""
    from .trainer import Trainer

    cfg = cfg or reference_config(device)
    held_before = _pool_bytes_in_use()
    t = Trainer(cfg, run_dir=False, bars=bars if bars is not None else reference_bars(), echo=lambda m: None)
    t._capture()
    while t._ready_rows() < cfg.agent.batch_size:
        t.collect_graph.replay()
        t.collect_steps += 1
    rows = []
    if t.be.is_gpu:
        import cupy

        def timed(graph, inner: int = 1):
            """Median us per replay of ``inner`` back-to-back replays between two events."""
            for _ in range(10):
                graph.replay()
            s = t.stream
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            ts = []
            for _ in range(repeats):
                start.record(s)
                for _ in range(inner):
                    graph.replay()
                end.record(s)
                end.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / inner)
            return statistics.median(ts)

        train_us, collect_us = timed(t.train_graph), timed(t.collect_graph)
        # as a training loop runs them: replays queued back to back, the next launch overlapping the
        # one in flight (the trainer reads the guard's values a step late, so it never waits)
        train_b2b = timed(t.train_graph, BACK_TO_BACK)
    else:
        train_us = _time(t.train_graph.replay, t.synchronize, repeats)
        collect_us = _time(t.collect_graph.replay, t.synchronize, repeats)
    case = f"reference step ({t.be.device}){label}"
    rows += memory_rows(t, case)
    if t.be.is_gpu:  # buffers, replay, workspaces (one 32 MiB cuBLAS workspace per stream); not the graphs' own
        held = (_pool_bytes_in_use() - held_before) / 2**20
        rows.append({"case": case, "metric": DEVICE_MEMORY, "value": held, "unit": "MiB", "target": ""})
    rows.append(
        {
            "case": case,
            "metric": "train step (graph replay)",
            "value": train_us,
            "unit": "us",
            "target": f"<= {TRAIN_TARGET_US:g} us",
        }
    )
    rows.append(
        {
            "case": case,
            "metric": f"collect step, {cfg.env.n_envs} envs",
            "value": collect_us,
            "unit": "us",
            "target": f"<= {COLLECT_TARGET_US:g} us",
        }
    )
    if t.be.is_gpu:
        rows.append(
            {
                "case": case,
                "metric": f"train step, {BACK_TO_BACK} replays back to back",
                "value": train_b2b,
                "unit": "us",
                "target": "",
            }
        )
    if t.be.is_gpu and phases:  # per-phase time: each phase captured alone and replayed (it runs its own phase again)
        for gname, graph in (("train", t.train_graph), ("collect", t.collect_graph)):
            for phase, ms in graph.profile(repeats=max(5, repeats // 10)).items():
                rows.append(
                    {"case": case, "metric": f"{gname} phase {phase}", "value": ms * 1e3, "unit": "us", "target": ""}
                )
    return rows
