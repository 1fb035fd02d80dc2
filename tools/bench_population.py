#!/usr/bin/env python3
"""Populations (issue 23): P agents of the reference workload trained in one graph, against P
single-agent graphs one after another and against PyTorch vectorised over the agents.

Reference workload per agent (DESIGN.md): observation 66 floats, MLP 256-256, dueling C51 51 atoms x 3
actions, batch 512, replay 1M rows with PER, n-step 3, 4,096 environments. Agent ``i`` has seed ``i``.

Arms (``--arms``, default every one but ``joined-probe``: ``vmap,branches,joined,joined-onekernel``), at each P of
``--sizes`` (default 1, 8, 64, 256; a size whose measured memory does not fit the free device memory is
skipped, saying so):

* cudarl joined (``joined``; issue 23's agent axis, stage 6 in docs/perf-notes.md):
  :class:`cudarl.stacked_agent.StackedLearner`, the train step of P members with one launch per
  operation for all of them (batched GEMMs, kernels with a member axis), captured as one graph
  (:class:`cudarl.graph.StepGraph`) over :func:`cudarl.stacked_agent.stacked_replay` filled with random
  rows over a shared random feature matrix of 20,000 bars x 64 features (the cost does not depend on the
  values); a fresh learner per size, timed as the other arms; memory per agent by CuPy's pool and by the
  device's free-memory drop, and the replay's bytes per agent. The learner runs ``run.grid_barrier`` on:
  the PopArt loss and the optimiser each take their one launch with a grid barrier where every member gets
  the blocks the single agent gets alone, and their two-launch forms (the same bits) otherwise, as
  their launchers choose (:meth:`cudarl.stacked_agent.StackedLearner.one_launch_forms`; ``--forms one|two``
  forces either); rows ``P=<P>: loss`` and ``P=<P>: optimiser`` say which form ran. A size it refuses is
  a row ``refused: <reason>`` and is tried again with ``run.grid_barrier = false`` (the barrier-free forms)
  as a case of its own. Beside it, at each
  P the other arms ran: its speed-up over the branches, over the PyTorch vmap arm (target at P = 64) and
  over P x the single agent. Its weight gradients are ``net.dw_gemm``'s default, ``split_k``: P cuBLAS
  split-K GEMMs a layer (a row ``weight gradients (net.dw_gemm)`` says which).
* cudarl joined, one-kernel dW (``joined-onekernel``): the joined arm with ``net.dw_gemm = "one_kernel"``
  (each layer's weight gradients one strided-batched one-kernel cuBLASLt GEMM over every member; members
  equal single agents of that setting), as cases ``cudarl joined (agent axis), one-kernel dW, <prec>``;
  beside the joined arm, its speed-up over it (``split-K dW / one-kernel dW``). Its ratio against P x the
  single agent uses the single agent of the default ``split_k`` (the branches arm's).
* cudarl joined, probed batched algorithms (``joined-probe``, opt-in): the ``joined-onekernel`` arm with
  ``net.batched_algo = "probe"`` (each batched GEMM's plan adopts the fastest, timed by its probe, of the
  single algorithm and cuBLASLt's candidates for the batched problem whose probe output is bitwise the
  single algorithm's), as cases ``cudarl joined (agent
  axis), one-kernel dW, probed batched algorithms, <prec>``; rows ``P=<P>: batched plans on another
  algorithm`` (how many of the step's batched plans took another algorithm than the single one) and one row
  per such plan (its shape, the two tiles, candidates probed, the probe's times of the single algorithm
  and of each bitwise-equal candidate, the adopted one starred), the records of
  :func:`cudarl.blas.batched_plan_info` in the JSON (``batched_plans``); beside the ``joined-onekernel`` arm,
  its speed-up over it (``single / probed batched algorithms``).
* cudarl population (``branches``): :class:`cudarl.population.Population`, every member's train phases on a parallel
  branch of ONE graph; median us per replay (CUDA events), agent-updates per second summed over the
  agents (P / step time), achieved GFLOP/s and its fraction of the FP32 peak, memory per agent (the
  allocator's bytes of one more member, :func:`cudarl.population.memory_per_member`; and the device's
  free memory drop over the whole population divided by P, which also counts graphs and streams).
  One population of the largest size that fits is built; each smaller P is a graph over its first P
  members.
* cudarl sequential (with ``branches``): the same P members' own single-agent train graphs replayed one after another on
  one stream (members of a population run with run.grid_barrier = false; the single agent alone, with
  it on, is its own row).
* PyTorch vmap (``vmap``): the step of ``tools/bench_step.py`` (``TorchC51Step.loss``: PER sample, double-DQN C51
  targets, weighted cross-entropy, KL priorities) for P agents at once: ``torch.func.vmap`` of
  ``torch.func.grad`` over stacked parameters (``torch.func.stack_module_state``), per-agent gradient
  clipping and Adam on the stacked tensors, per-agent replays ``[P, capacity]``; the whole step in one
  ``torch.cuda.CUDAGraph``. With ``--torch-compile`` also ``torch.compile`` of it (minutes; a failure
  is a row). Its replay is smaller than 1M rows when P x 1M rows do not fit (said in the row).

Precisions: FP32 at every size; TF32 (``net.tf32``; ``allow_tf32`` for PyTorch) at ``--tf32-sizes``
(default 64, the size of the target; building a second population of 256 costs minutes).

FLOPs per agent-update: the GEMMs of three forwards (online s and s', target s') and one backward
(weight gradients of every layer, input gradients of all but the first): about 0.69 GFLOP.

Targets (issue 23, H200): P = 64 in <= 1.2 ms FP32 and >= 2.5x the PyTorch vmap arm; <= 0.4 ms TF32.
Prints a table and writes JSON (``--out``, default ``docs/bench/bench_population.json``).

``--device cpu``: the joined arms alone on the NumPy backend at tiny sizes (:data:`CPU_WORKLOAD`, P = 1, 3;
host-clock times, memory by ``tracemalloc``), a smoke run; its JSON goes to ``--out`` or the temporary
directory, never over the GPU numbers.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_step import (  # noqa: E402
    ALPHA,
    BETA0,
    BETA_FINAL,
    BETA_STEPS,
    CAPACITY,
    CLIP,
    GAMMA,
    HIDDEN,
    LR,
    N_ENVS,
    N_STEP,
    OBS,
    PER_EPS,
    TAU,
    A,
    B,
    K,
    TorchC51Step,
)
from benchlib import (  # noqa: E402
    cuda_time_us,
    fp32_peak_tflops,
    host_time_us,
    parser,
    report,
    row,
    skipped_without_gpu,
)

SIZES, TF32_SIZES, QUICK_SIZES = (1, 8, 64, 256), (64,), (1, 8)
TARGET_P, TARGET_FP32_US, TARGET_TF32_US, TARGET_VS_TORCH = 64, 1200.0, 400.0, 2.5
#: Fraction of the free device memory a population (or the PyTorch replays) may plan to use.
MEMORY_HEADROOM = 0.85


def flops_per_update(obs: int = OBS, hidden=HIDDEN, n_actions: int = A, atoms: int = K, batch: int = B) -> float:
    """GEMM FLOPs of one agent-update: 3 forwards of batch B plus the backward of the online s pass
    (default: the reference workload)."""
    widths = [obs, *hidden, (1 + n_actions) * atoms]
    layers = list(zip(widths[:-1], widths[1:], strict=True))
    fwd = sum(2 * batch * i * o for i, o in layers)
    first = 2 * batch * layers[0][0] * layers[0][1]
    return 3 * fwd + fwd + (fwd - first)  # forwards, weight gradients, input gradients (not the first layer's)


def repeats_for(P: int, repeats: int) -> int:
    """Fewer timed replays for larger populations (each takes ~P times longer)."""
    return max(10, repeats * 8 // max(P, 8))


def _failed(rows, case: str, exc: BaseException) -> None:
    print(f"{case} failed: {type(exc).__name__}: {exc}")
    traceback.print_exc()
    rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))


def _free_device_bytes() -> int:
    """The device's free bytes once dead owners' memory is back: collected objects, the queued cuBLAS
    handles and workspaces of their streams (32 MiB each, nine a member; the TF32 probe read -18 GB at
    6fab362, the FP32 population's 576 workspaces released inside its window), CuPy's and PyTorch's
    cached blocks."""
    import cupy

    from cudarl import blas

    gc.collect()
    blas.release_queued()
    cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:
        pass
    return int(cupy.cuda.runtime.memGetInfo()[0])


def step_rows(
    case: str, P: int, us: float, peak_tflops: float | None, target: str = "", flops: float | None = None
) -> list[dict]:
    """Step time, agent-updates per second, us per agent and achieved FLOP rate of a P-agent step
    (``flops`` per agent-update; default the reference workload's)."""
    tflops = P * (flops or flops_per_update()) / (us * 1e-6) / 1e12
    frac = f"{tflops / peak_tflops:.1%} of FP32 peak" if peak_tflops else ""
    return [
        row(case, f"P={P}: step", us, "us", target),
        row(case, f"P={P}: agent-updates/s (summed)", P / (us * 1e-6), "1/s"),
        row(case, f"P={P}: us per agent-update", us / P, "us"),
        row(case, f"P={P}: achieved", tflops, "TFLOP/s", frac),
    ]


# --- cudarl ----------------------------------------------------------------------------------------------
def cudarl_arms(tf32: bool, sizes, args, rows, extra, peak) -> dict:
    """The population and the sequential arms at ``sizes``; ``{P: population us}``."""
    import cupy

    from cudarl.bench import reference_bars, reference_config, step_benchmark
    from cudarl.population import Population, branches

    prec = "TF32" if tf32 else "FP32"
    case, seq_case = f"cudarl population, {prec}", f"cudarl sequential single-agent graphs, {prec}"
    bars = reference_bars()
    net = {"tf32": tf32}
    out: dict = {}
    # the single agent alone (run.grid_barrier on, as a single run has it)
    single = step_benchmark(repeats=args.repeats, cfg=reference_config("gpu", net=net), bars=bars, phases=False)
    single_us = next(r["value"] for r in single if r["metric"] == "train step (graph replay)")
    rows.append(row(f"cudarl single agent, {prec}", "train step (its own graph, grid barrier on)", single_us, "us"))
    # a probe population of two: the allocator's bytes of its second member (what
    # cudarl.population.memory_per_member measures) and the device's free-memory drop per member (which
    # also counts the cuBLAS handles' own memory and the streams); sizes are fitted on the larger
    free = _free_device_bytes()
    probe = Population([reference_config("gpu", net=net)] * 2, bars=bars, run_dirs=[False] * 2, echo=lambda m: None)
    per, per_dev = probe.member_bytes[1], (free - int(cupy.cuda.runtime.memGetInfo()[0])) / 2
    probe.close()
    del probe
    rows.append(row(case, "memory per agent (allocator: one more member)", per / 2**20, "MiB"))
    rows.append(row(case, "memory per agent (device free-memory drop, 2 members / 2)", per_dev / 2**20, "MiB"))
    need = max(per, per_dev)
    free = _free_device_bytes()
    fits = [P for P in sizes if P * need <= MEMORY_HEADROOM * free]
    for P in sorted(set(sizes) - set(fits)):
        msg = f"needs ~{P * need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        print(f"{case}: skipping P={P}: {msg}")
        rows.append(row(case, f"P={P}: skipped", msg, ""))
    if not fits:
        return out
    Pmax = max(fits)
    configs = [reference_config("gpu", run={"seed": i}, net=net) for i in range(Pmax)]
    t0 = time.perf_counter()
    pop = Population(configs, bars=bars, run_dirs=[False] * Pmax, echo=lambda m: None)
    build_s = time.perf_counter() - t0
    pop.prime()  # captures the Pmax graphs, collects until a batch can be sampled
    pop.synchronize()
    used = free - int(cupy.cuda.runtime.memGetInfo()[0])
    rows.append(row(case, f"P={Pmax}: build (members, buffers)", build_s, "s"))
    rows.append(row(case, f"P={Pmax}: capture + first collections", time.perf_counter() - t0 - build_s, "s"))
    rows.append(row(case, f"P={Pmax}: device memory per agent (free-memory drop / P)", used / Pmax / 2**20, "MiB"))
    ext = extra.setdefault(
        f"cudarl_{prec.lower()}",
        {"single_agent_us": single_us, "memory_per_agent_bytes": per, "probe_device_bytes_per_agent": per_dev},
    )
    ext["device_bytes_per_agent"] = used / Pmax
    target = {TARGET_P: f"<= {TARGET_TF32_US if tf32 else TARGET_FP32_US:g} us"}
    for P in sorted(fits):
        try:
            members = pop.members[:P]
            graph = pop.train_graph
            if P != Pmax:
                phases = [m.train_graph.phases for m in members]
                graph = branches("train", phases, pop._branches[:P], pop.stream, pop.xp)
                graph.capture()
            us = cuda_time_us(graph.replay, pop.stream, repeats=repeats_for(P, args.repeats))
            del graph
            rows.extend(step_rows(case, P, us, peak, target.get(P, "")))
            rows.append(row(case, f"P={P}: speed-up over P x the single agent", P * single_us / us, "x"))
            out[P] = us
            for m in members:
                if not m.train_graph.captured:
                    m.train_graph.capture()

            def sequential(members=members):
                for m in members:
                    m.train_graph.replay()

            seq = cuda_time_us(sequential, pop.stream, repeats=repeats_for(P, args.repeats), warmup=2)
            rows.append(row(seq_case, f"P={P}: {P} graphs one after another", seq, "us"))
            rows.append(row(case, f"P={P}: speed-up over the sequential graphs", seq / us, "x"))
            ext.setdefault("population_us", {})[P] = us
            ext.setdefault("sequential_us", {})[P] = seq
        except Exception as exc:
            _failed(rows, f"{case}, P={P}", exc)
    losses = [float(m.agent.loss.get()[0]) for m in pop.members]
    rows.append(row(case, "every member's last loss finite", all(map(lambda v: v == v and abs(v) < 1e30, losses)), ""))
    pop.close()
    del pop
    return out


# --- cudarl joined: the agent axis ------------------------------------------------------------------------
#: The joined arm's workload on the NumPy backend (``--device cpu``, a smoke run): tiny sizes, same code.
CPU_WORKLOAD = {
    "features": 5,
    "bars": 80,
    "net": {"hidden": [24, 16], "atoms": 11},
    "agent": {"batch_size": 16, "learning_starts": 16},
    "replay": {"capacity": 512},
    "env": {"n_envs": 4},
}
CPU_SIZES = (1, 3)
#: Bars of the joined arm's random feature matrix on the GPU (reference_bars' count); its 64 features are
#: the reference observation's (OBS = 64 + 2 position columns).
GPU_BARS = 20_000


def joined_config(
    device: str,
    tf32: bool = False,
    grid_barrier: bool = True,
    dw_gemm: str = "split_k",
    batched_algo: str | None = None,
    **over,
):
    """The joined arm's config: the reference workload on the GPU, :data:`CPU_WORKLOAD` on the CPU, with
    ``net.tf32``, ``net.dw_gemm``, ``net.batched_algo`` (None: ``over``'s, else the default) and
    ``run.grid_barrier`` as given and ``over``'s sections on top (``tools/profile_step.py --graph joined``
    passes its ``--set`` overrides so)."""
    from cudarl.bench import reference_config

    run = {"grid_barrier": grid_barrier, **over.pop("run", {})}
    fixed = {"tf32": tf32, "dw_gemm": dw_gemm} | ({} if batched_algo is None else {"batched_algo": batched_algo})
    if device == "gpu":
        net = {**over.pop("net", {}), **fixed}
        return reference_config("gpu", net=net, run=run, **over)
    w = CPU_WORKLOAD
    sections = {k: {**w[k], **over.pop(k, {})} for k in ("net", "agent", "env")}
    sections["net"].update(fixed)
    return reference_config("cpu", capacity=w["replay"]["capacity"], run=run, **sections, **over)


def fill_stacked_replay(xp, replay, n_bars: int, n_actions: int, batch: int, seed: int = 0) -> None:
    """Every member's own rows, ``n_envs`` at a time, until 1.5 batches a member are ready to sample (the
    n-step lag filled first): state rows of random bars, rewards of a scale per member, an episode end
    here and there (as ``tests/unit/test_stacked_agent.py`` fills it)."""
    from cudarl.reference.window import STATE_DIM

    rng = np.random.default_rng(seed)
    P, E, n = replay.members, replay.spec.n_envs, replay.spec.n_step
    scale = rng.uniform(0.2, 3.0, (P, 1))
    for _ in range(n + -(-3 * batch // (2 * E))):
        rows = np.zeros((P, E, STATE_DIM), np.float32)
        rows[..., 0] = rng.integers(0, n_bars, (P, E))
        rows[..., 1] = rng.random((P, E)) < 0.3
        rows[..., 2] = rng.choice(np.array([-1, 0, 1], np.float32), (P, E))
        rows[..., 3] = rng.random((P, E))
        action = rng.integers(0, n_actions, (P, E)).astype(np.int32)
        reward = (rng.standard_normal((P, E)) * scale).astype(np.float32)
        discount = np.where(rng.random((P, E)) < 0.05, 0.0, GAMMA**n).astype(np.float32)
        replay.add(*(xp.asarray(a) for a in (rows, action, reward, discount)))
    ready = int(np.min(replay.ready()))
    if ready < batch:
        raise RuntimeError(f"fill_stacked_replay: {ready} rows ready, fewer than the batch of {batch}")


def _refusal(exc: BaseException) -> str | None:
    """cudarl's reason when ``exc`` (or the error a capture wrapped it in) is a ValueError: a size or
    config the learner or a launcher refuses."""
    while exc is not None:
        if isinstance(exc, ValueError):
            return str(exc)
        exc = exc.__cause__
    return None


class JoinedStep(NamedTuple):
    """The joined arm's train step of P members, built by :func:`build_joined`."""

    learner: object  #: :class:`cudarl.stacked_agent.StackedLearner`
    replay: object  #: its stacked replay (:func:`cudarl.stacked_agent.stacked_replay`), filled
    windows: object  #: :class:`cudarl.window.Windows` over the random feature matrix
    graph: object  #: :class:`cudarl.graph.StepGraph` of the train phases, captured


def build_joined(cfg, P: int, device: str, forms: str | None = None) -> JoinedStep:
    """The joined arm's train step of P members (seeds 0..P-1), ready to replay: a
    :class:`cudarl.stacked_agent.StackedLearner` of ``cfg``, its stacked replay filled with random rows
    (:func:`fill_stacked_replay`) over a random feature matrix (:data:`GPU_BARS` bars x the reference
    observation's 64 features on the GPU, :data:`CPU_WORKLOAD`'s on the CPU), and its train phases
    captured as one :class:`cudarl.graph.StepGraph`. What :func:`joined_size` times and
    ``tools/profile_step.py --graph joined`` profiles kernel by kernel. The learner's and launchers'
    refusals raise (ValueError). ``forms``: ``"one"`` or ``"two"`` forces the loss's and the optimiser's
    one launch (grid barrier, squeezed past the fit) or their two launches
    (:meth:`cudarl.stacked_agent.StackedLearner.force`); None: the launchers choose."""
    from cudarl.graph import StepGraph
    from cudarl.stacked_agent import StackedLearner, stacked_replay
    from cudarl.window import Windows

    gpu = device == "gpu"
    if gpu:
        import cupy as xp
    else:
        xp = np
    n_features, n_bars = (OBS - 2, GPU_BARS) if gpu else (CPU_WORKLOAD["features"], CPU_WORKLOAD["bars"])
    rng = np.random.default_rng(P)
    feats = rng.standard_normal((n_bars, n_features)).astype(np.float32)
    win = Windows(xp.asarray(feats), xp.ones(n_features, np.float32), cfg.net.window, xp)
    seeds, A_, Bsz = list(range(P)), cfg.env.n_actions, cfg.agent.batch_size
    learner = StackedLearner(cfg, win.width, A_, seeds, xp)
    if forms is not None:
        learner.force({"targets_loss": forms == "one", "adam": forms == "one"})
    replay = stacked_replay(cfg, cfg.env.n_envs, seeds, backend="cupy" if gpu else "numpy")
    fill_stacked_replay(xp, replay, n_bars, A_, Bsz, seed=P)
    graph = StepGraph("train", learner.train_phases(replay, win), xp=xp)
    if gpu:
        xp.cuda.Device().synchronize()  # the fill (default stream) done before the graph's stream reads it
    graph.capture()
    return JoinedStep(learner, replay, win, graph)


def joined_size(
    cfg,
    P: int,
    device: str,
    repeats: int,
    case: str,
    peak,
    target: str,
    rows,
    ext,
    profile: bool = False,
    forms: str | None = None,
) -> float:
    """One :class:`cudarl.stacked_agent.StackedLearner` of P members (seeds 0..P-1) and its stacked replay,
    filled; its train step captured as one graph (:func:`build_joined`, its memory counted here) and
    replayed (timed as the other arms); its rows. Returns the median us per replay. The learner's and
    launchers' refusals raise (ValueError). ``profile``: also each phase captured alone and timed
    (:meth:`cudarl.graph.StepGraph.profile`; a phase's side branches are joined at its end, so a phase's
    time includes the branches it forks), rows ``P=<P>: phase <name>``. ``forms``: :func:`build_joined`'s."""
    gpu = device == "gpu"
    if gpu:
        import cupy as xp

        from cudarl.bench import _pool_bytes_in_use

        free0, held0 = _free_device_bytes(), _pool_bytes_in_use()
    else:
        import tracemalloc

        tracing = tracemalloc.is_tracing()  # a caller's tracing goes on; its earlier bytes are not ours
        if not tracing:
            tracemalloc.start()
        held0 = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    try:
        learner, replay, win, graph = build_joined(cfg, P, device, forms)
    finally:
        if not gpu:
            held = tracemalloc.get_traced_memory()[0] - held0
            if not tracing:
                tracemalloc.stop()
    build_s = time.perf_counter() - t0
    if gpu:
        held = _pool_bytes_in_use() - held0
        dev = free0 - int(xp.cuda.runtime.memGetInfo()[0])
        us = cuda_time_us(graph.replay, graph.stream, repeats=repeats_for(P, repeats))
    else:
        us = host_time_us(graph.replay, repeats=repeats_for(P, repeats), warmup=2)
    A_, Bsz = cfg.env.n_actions, cfg.agent.batch_size
    flops = flops_per_update(win.width, cfg.net.hidden, A_, cfg.net.atoms, Bsz)
    rows.extend(step_rows(case, P, us, peak, target, flops=flops))
    rows.append(row(case, f"P={P}: build + fill + capture", build_s, "s"))
    pool = "CuPy pool" if gpu else "tracemalloc, NumPy backend"
    rows.append(row(case, f"P={P}: memory per agent ({pool})", held / P / 2**20, "MiB"))
    if gpu:
        rows.append(row(case, f"P={P}: device memory per agent (free-memory drop / P)", dev / P / 2**20, "MiB"))
    rows.append(row(case, f"P={P}: replay memory per agent", replay.nbytes() / P / 2**20, "MiB"))
    forms = learner.forms()  # which form of each grid-barrier operation this step ran
    rows.append(row(case, f"P={P}: loss", forms["targets_loss"], ""))
    rows.append(row(case, f"P={P}: optimiser", forms["adam"], ""))
    dw = "one batched GEMM a layer" if learner.online.dw_batched else "a GEMM per member a layer"
    rows.append(row(case, f"P={P}: weight gradients (net.dw_gemm)", f"{cfg.net.dw_gemm}: {dw}", ""))
    if cfg.net.batched_algo == "probe":
        rows.extend(probe_rows(case, P, cfg.net.tf32, ext))
    loss = np.asarray(learner.loss.get() if gpu else learner.loss)
    rows.append(row(case, f"P={P}: every member's loss finite", bool(np.all(np.isfinite(loss))), ""))
    ext.setdefault("step_us", {})[P] = us
    if profile:
        phases = {k: v * 1e3 for k, v in graph.profile(repeats=repeats_for(P, repeats)).items()}
        for name, p_us in phases.items():
            rows.append(row(case, f"P={P}: phase {name}" if name != "total" else f"P={P}: phases' graph", p_us, "us"))
        alone = sum(v for k, v in phases.items() if k != "total")
        rows.append(row(case, f"P={P}: sum of the phases alone", alone, "us"))
        ext.setdefault("phases_us", {})[P] = phases
    ext.setdefault("memory_per_agent_bytes", {})[P] = held / P
    ext.setdefault("grid_barrier", {})[P] = cfg.run.grid_barrier
    ext.setdefault("one_launch", {})[P] = dict(learner.one_launch)
    return us


def probe_rows(case: str, P: int, tf32: bool, ext: dict) -> list[dict]:
    """What the batched plans of P members chose under ``net.batched_algo = "probe"``
    (:func:`cudarl.blas.batched_plan_info`'s records of batch P and this precision; none on NumPy): a row
    counting those on another algorithm than the single plan's, one row per such plan, and the records in
    ``ext["batched_plans"][P]``."""
    from cudarl import blas

    records = [
        r for r in blas.batched_plan_info().values() if r["mode"] == "probe" and r["batch"] == P and r["tf32"] == tf32
    ]
    ext.setdefault("batched_plans", {})[P] = records
    changed = [r for r in records if r["changed"]]
    out = [row(case, f"P={P}: batched plans on another algorithm", f"{len(changed)} of {len(records)}", "")]
    for r in records:
        out.append(row(case, f"P={P}: batched plan {r['shape']} epilogue {r['epilogue']}", probe_summary(r), ""))
    print(f"{case}: P={P}: {len(changed)} of {len(records)} batched plans on another algorithm")
    return out


def probe_summary(r: dict) -> str:
    """One batched plan's probe in words: the single tile -> the chosen one, the candidates probed, and the
    times (us, median on the probe's buffers) of the single algorithm and of each bitwise-equal candidate
    (``!=``: a candidate whose bits differ, not timed; ``*``: the one adopted)."""
    s, c = r["single"], r["chosen"]
    what = f"{s['tile_name']} (algo {s['algo_id']}) -> {c['tile_name']} (algo {c['algo_id']})"
    what += f"{'' if r['changed'] else ': kept'}, {r['probed']} probed of {r['candidates']}"
    if r.get("single_us") is None:
        return what + ", none bitwise equal" if r["probed"] else what
    times = [f"single {r['single_us']:.1f}{'' if r['changed'] else '*'}"]
    for i, p in enumerate(r.get("probes", [])):
        mark = "*" if i == r.get("chosen_index") else ""
        times.append(f"{p['tile_name']} {p['us']:.1f}{mark}" if p["equal"] else f"{p['tile_name']} !=")
    return what + "; us: " + ", ".join(times)


#: The joined arms: ``--arms`` name -> (``net.dw_gemm``, ``net.batched_algo``, the label its cases carry).
JOINED_ARMS = {
    "joined": ("split_k", "single", ""),
    "joined-onekernel": ("one_kernel", "single", "one-kernel dW"),
    "joined-probe": ("one_kernel", "probe", "one-kernel dW, probed batched algorithms"),
}


def joined_arm(
    tf32: bool,
    sizes,
    args,
    rows,
    extra,
    peak,
    device: str = "gpu",
    dw_gemm: str = "split_k",
    batched_algo: str = "single",
) -> dict:
    """The joined population at ``sizes`` (:func:`joined_size`, a fresh learner per size); ``{P: us}``.
    ``dw_gemm`` and ``batched_algo``: its ``net.dw_gemm`` and ``net.batched_algo``, one of
    :data:`JOINED_ARMS` (``"one_kernel"``: cases ``cudarl joined (agent axis), one-kernel dW, <prec>``, JSON
    ``joined_onekernel_<prec>``; with ``"probe"``, ``..., one-kernel dW, probed batched algorithms, <prec>``
    and ``joined_probe_<prec>``).

    A size the learner refuses is a row ``refused: <reason>``; with ``run.grid_barrier`` on (the one-launch
    loss and optimiser where each member gets the single agent's blocks, the barrier-free forms otherwise)
    the size is tried again with it off (the barrier-free forms at every P, the same bits), as its own case.
    A size whose memory (per agent at the last size built, times P) does not fit is skipped."""
    prec = "TF32" if tf32 else "FP32"
    arms = {(d, b): (name, label) for name, (d, b, label) in JOINED_ARMS.items()}
    if (dw_gemm, batched_algo) not in arms:
        raise ValueError(f"joined_arm: no arm of dw_gemm {dw_gemm!r} and batched_algo {batched_algo!r}")
    arm, label = arms[dw_gemm, batched_algo]
    case = f"cudarl joined (agent axis){', ' + label if label else ''}, {prec}"
    target = {TARGET_P: f"<= {TARGET_TF32_US if tf32 else TARGET_FP32_US:g} us"}
    ext = extra.setdefault(f"{arm.replace('-', '_')}_{prec.lower()}", {})
    out: dict = {}
    need = 0.0
    for P in sorted(sizes):
        if device == "gpu" and need:
            free = _free_device_bytes()
            if P * need > MEMORY_HEADROOM * free:
                msg = f"needs ~{P * need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
                print(f"{case}: skipping P={P}: {msg}")
                rows.append(row(case, f"P={P}: skipped", msg, ""))
                continue
        for grid_barrier in (True, False):
            c = case if grid_barrier else f"{case}, run.grid_barrier = false"
            try:
                cfg = joined_config(device, tf32, grid_barrier, dw_gemm, batched_algo)
                prof = P in (args.profile or ())
                forms = getattr(args, "forms", None)
                out[P] = joined_size(cfg, P, device, args.repeats, c, peak, target.get(P, ""), rows, ext, prof, forms)
                need = ext["memory_per_agent_bytes"][P]  # the shared workspaces weigh less as P grows
                break
            except Exception as exc:
                why = _refusal(exc)
                if why is None:
                    _failed(rows, f"{c}, P={P}", exc)
                    break
                print(f"{c}: P={P} refused: {why}")
                rows.append(row(c, f"P={P}: step", f"refused: {why}", ""))
                ext.setdefault("refused", {})[f"{P}{'' if grid_barrier else ', grid barrier off'}"] = why
            finally:
                if device == "gpu":
                    _free_device_bytes()  # this size's learner, replay and graph go back before the next
    return out


def ratio_rows(
    prec: str, joined: dict, branches: dict, vmap: dict, single_us: float | None, label: str = ""
) -> list[dict]:
    """The joined step against the branches arm, the PyTorch vmap arm and P x the single agent, at each P
    both have (``{P: us}``); the vmap target at P = 64 in FP32. ``label`` names a joined variant in the
    cases (``"one-kernel dW"``: ``cudarl joined, one-kernel dW vs ...``)."""
    out = []
    name = f"cudarl joined, {label}" if label else "cudarl joined"
    for P, us in sorted(joined.items()):
        if P in branches:
            out.append(
                row(f"{name} vs branches, {prec}", f"P={P}: speed-up (branches / joined)", branches[P] / us, "x")
            )
        if P in vmap:
            target = f">= {TARGET_VS_TORCH:g}x" if P == TARGET_P and prec == "FP32" else ""
            out.append(
                row(
                    f"{name} vs PyTorch vmap, {prec}",
                    f"P={P}: speed-up (vmap / joined)",
                    vmap[P] / us,
                    "x",
                    target,
                )
            )
        if single_us:
            out.append(
                row(
                    f"{name} vs the single agent, {prec}",
                    f"P={P}: speed-up (P x single / joined)",
                    P * single_us / us,
                    "x",
                )
            )
    return out


def dw_rows(prec: str, split_k: dict, one_kernel: dict) -> list[dict]:
    """The joined step with one-kernel dW against the joined step with split-K dW, at each P both ran
    (``{P: us}``)."""
    return pair_rows(
        f"cudarl joined, one-kernel dW vs split-K dW, {prec}", "split-K dW / one-kernel dW", split_k, one_kernel
    )


def probe_vs_rows(prec: str, single: dict, probe: dict) -> list[dict]:
    """The joined step with probed batched algorithms against the ``joined-onekernel`` step (both one-kernel
    dW), at each P both ran (``{P: us}``)."""
    return pair_rows(
        f"cudarl joined, probed vs single batched algorithms, {prec}",
        "single / probed batched algorithms",
        single,
        probe,
    )


def pair_rows(case: str, ratio: str, base: dict, other: dict) -> list[dict]:
    """``base[P] / other[P]`` at each P both ran, rows ``P=<P>: speed-up (<ratio>)``."""
    return [row(case, f"P={P}: speed-up ({ratio})", base[P] / other[P], "x") for P in sorted(set(base) & set(other))]


# --- PyTorch vmap ----------------------------------------------------------------------------------------
class TorchPopulationStep:
    """P reference steps at once: ``TorchC51Step.loss`` under ``vmap(grad(...))`` over stacked weights,
    per-agent clipping and Adam on the stacked tensors, per-agent replays ``[P, capacity]``."""

    def __init__(self, P: int, device: str, capacity: int = CAPACITY, seed: int = 0):
        import torch
        from torch_c51 import dueling_c51

        self.torch, self.P, self.C = torch, int(P), int(capacity)
        self.dev = torch.device(device)
        self.single = TorchC51Step(device, capacity=16)  # its loss, support and constants (its replay unused)
        proto = dueling_c51(OBS, HIDDEN, A, K)  # one class (stack_module_state wants it), P initialisations
        models = []
        for i in range(P):
            torch.manual_seed(seed + i)
            m = copy.deepcopy(proto)
            for lin in [*m.enc, m.va]:
                lin.reset_parameters()
            models.append(m)
        params, _ = torch.func.stack_module_state(models)
        self.params = {k: v.detach().to(self.dev).contiguous() for k, v in params.items()}
        self.target = {k: v.clone() for k, v in self.params.items()}
        self.m = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.step_count = torch.zeros((), device=self.dev)
        self.base = copy.deepcopy(models[0]).to("meta")
        g = torch.Generator(device=self.dev).manual_seed(seed + 1)
        C, dev = self.C, self.dev
        self.obs = torch.randn(P, C, OBS, device=dev, generator=g)
        self.action = torch.randint(0, A, (P, C), device=dev, generator=g)
        self.ret = torch.randn(P, C, device=dev, generator=g)
        ended = torch.rand(P, C, device=dev, generator=g) < 0.01
        self.discount = torch.where(ended, 0.0, GAMMA**N_STEP).to(torch.float32)
        self.pa = (torch.rand(P, C, device=dev, generator=g) * 10 + 1e-3).pow(ALPHA)
        self.lag = N_STEP * N_ENVS
        self.strata = torch.arange(B, device=dev, dtype=torch.float32)
        self.beta = torch.full((), BETA0, device=dev)
        self.agents = torch.arange(P, device=dev).view(-1, 1)
        self.grad = torch.func.vmap(torch.func.grad(self._agent_loss, has_aux=True))

    @staticmethod
    def bytes_per_agent(capacity: int) -> int:
        """Replay bytes of one agent: observations, action, return, discount, p**alpha and its cumsum."""
        return capacity * (OBS * 4 + 8 + 4 + 4 + 4 + 4)

    def _agent_loss(self, p, tp, obs, next_obs, action, ret, discount, w):
        from torch.func import functional_call

        def net(q):
            return lambda x: functional_call(self.base, q, (x,))

        loss, priority = self.single.loss(obs, next_obs, action, ret, discount, w, online=net(p), target=net(tp))
        return loss, (loss.detach(), priority)

    def core(self, u):
        """One step of every agent from the uniforms ``u [P, B]``."""
        torch, C = self.torch, self.C
        cdf = torch.cumsum(self.pa, 1)
        total = cdf[:, -1:]
        idx = torch.searchsorted(cdf, (self.strata + u) * (total / B), right=True).clamp_(max=C - 1)
        w = (C * self.pa.gather(1, idx) / total).pow(-self.beta)
        w = w / w.amax(1, keepdim=True)
        self.beta.add_((BETA_FINAL - BETA0) / BETA_STEPS).clamp_(max=BETA_FINAL)
        nxt = (idx + self.lag) % C
        take = lambda x, i: x[self.agents, i]  # noqa: E731
        grads, (loss, priority) = self.grad(
            self.params,
            self.target,
            take(self.obs, idx),
            take(self.obs, nxt),
            take(self.action, idx),
            take(self.ret, idx),
            take(self.discount, idx),
            w,
        )
        # per-agent global-norm clipping, then Adam (betas 0.9, 0.999, eps 1e-8) on the stacked tensors
        norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
        coef = (CLIP / (norm + 1e-6)).clamp(max=1.0)
        self.step_count.add_(1)
        bc1, bc2 = 1 - 0.9**self.step_count, 1 - 0.999**self.step_count
        for k, g in grads.items():
            g = g * coef.view(-1, *([1] * (g.dim() - 1)))
            self.m[k].lerp_(g, 0.1)
            self.v[k].mul_(0.999).addcmul_(g, g, value=0.001)
            self.params[k].sub_(LR * (self.m[k] / bc1) / ((self.v[k] / bc2).sqrt() + 1e-8))
            self.target[k].lerp_(self.params[k], TAU)
        self.pa.scatter_(1, idx, (priority + PER_EPS).pow(ALPHA))
        return loss

    def step(self, core=None):
        u = self.torch.rand(self.P, B, device=self.dev)
        return (core or self.core)(u)


def vmap_check(device: str, P: int = 3, capacity: int = 4096, agent: int = 1) -> dict:
    """Agent ``agent`` of :class:`TorchPopulationStep`'s vmapped loss and gradient against
    ``TorchC51Step`` (plain autograd on modules holding that agent's weights), same batch: relative
    differences of the loss, the priorities and the gradient (float32; the arm computes what it claims)."""
    import torch

    ts = TorchPopulationStep(P, device, capacity=capacity)
    single = ts.single
    with torch.no_grad():
        for mod, stacked in ((single.online, ts.params), (single.target, ts.target)):
            for name, prm in mod.named_parameters():
                prm.copy_(stacked[name][agent])
    g = torch.Generator(device=ts.dev).manual_seed(5)
    idx = torch.randint(0, capacity, (P, B), device=ts.dev, generator=g)
    nxt = (idx + ts.lag) % capacity
    w = torch.rand(P, B, device=ts.dev, generator=g)
    take = lambda x, i: x[ts.agents, i]  # noqa: E731
    batch = (take(ts.obs, idx), take(ts.obs, nxt), take(ts.action, idx), take(ts.ret, idx), take(ts.discount, idx), w)
    grads, (loss, prio) = ts.grad(ts.params, ts.target, *batch)
    single.online.zero_grad(set_to_none=True)
    loss1, prio1 = single.loss(*(x[agent] for x in batch))
    loss1.backward()
    names = [n for n, _ in single.online.named_parameters()]
    g_ref = torch.cat([p.grad.reshape(-1) for _, p in single.online.named_parameters()])
    g_vmap = torch.cat([grads[n][agent].reshape(-1) for n in names])

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    return {
        "loss_rel_diff": abs(float(loss[agent].detach()) - float(loss1.detach())) / abs(float(loss1.detach())),
        "priority_rel_diff": rel(prio[agent], prio1.detach()),
        "grad_rel_diff": rel(g_vmap, g_ref),
    }


def torch_arms(tf32: bool, sizes, args, rows, extra, peak) -> dict:
    """The PyTorch vmap arm (and compiled with ``--torch-compile``) at ``sizes``; ``{P: us}``."""
    try:
        import torch
    except Exception as exc:
        rows.append(row("pytorch", "skipped", f"torch is not importable ({exc})"[:60], ""))
        return {}
    if not torch.cuda.is_available():
        rows.append(row("pytorch", "skipped", "torch sees no CUDA device", ""))
        return {}
    from torch_c51 import torch_time_us

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    prec = "TF32" if tf32 else "FP32"
    extra["torch"] = torch.__version__
    out: dict = {}
    try:
        diffs = vmap_check("cuda")
        for k, v in diffs.items():
            rows.append(
                row(f"check: PyTorch vmap agent vs its single step, {prec}", k, v, "", "<= 1e-4" if not tf32 else "")
            )
        extra.setdefault("vmap_check", {})[prec] = diffs
    except Exception as exc:
        _failed(rows, f"check: PyTorch vmap agent vs its single step, {prec}", exc)
    arms = [("vmap, one CUDA graph", False)] + (
        [("vmap, torch.compile, one CUDA graph", True)] if args.torch_compile else []
    )
    for P in sizes:
        free = _free_device_bytes()
        # the replays, with a quarter more for the step's temporaries and the graph's pool
        cap = min(CAPACITY, int(MEMORY_HEADROOM * free / 1.25 / P / TorchPopulationStep.bytes_per_agent(1)))
        for name, compiled in arms:
            case = f"PyTorch {torch.__version__} {name}, {prec}"
            if cap < 4 * B:
                rows.append(row(case, f"P={P}: skipped", f"{P} replays do not fit {free / 2**30:.1f} GiB", ""))
                continue
            ts = graph = core = None
            try:
                t0 = time.perf_counter()
                ts = TorchPopulationStep(P, "cuda", capacity=cap)
                core = torch.compile(ts.core, mode="max-autotune-no-cudagraphs") if compiled else None
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        ts.step(core)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    ts.step(core)
                us = torch_time_us(graph.replay, repeats_for(P, args.repeats))
                note = "" if cap == CAPACITY else f" (replay {cap:,} rows per agent: 1M x P do not fit)"
                rows.extend(step_rows(case + note, P, us, peak))
                rows.append(row(case, f"P={P}: build + capture", time.perf_counter() - t0, "s"))
                if not compiled:
                    out[P] = us
                extra.setdefault(f"torch_{prec.lower()}", {}).setdefault(name, {})[P] = us
            except Exception as exc:
                _failed(rows, f"{case}, P={P}", exc)
            finally:
                ts = graph = core = None  # the replays' memory goes back before the next size
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return out


def _sizes(text: str) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 1, got {text!r}")
    return out


ARMS = ("vmap", "branches", *JOINED_ARMS)
#: The arms a plain run takes: every one but the opt-in ``joined-probe``, so one run holds the ratio rows of
#: both dW settings.
DEFAULT_ARMS = tuple(a for a in ARMS if a != "joined-probe")


def _arms(text: str) -> tuple[str, ...]:
    got = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [a for a in got if a not in ARMS]
    if not got or bad:
        raise argparse.ArgumentTypeError(f"arms: comma-separated names of {', '.join(ARMS)}; got {text!r}")
    return got


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", type=_sizes, default=None, help="population sizes (default 1,8,64,256; CPU: 1,3)")
    ap.add_argument("--tf32-sizes", type=_sizes, default=TF32_SIZES, help="TF32 sizes (default 64)")
    ap.add_argument("--no-tf32", action="store_true", help="skip the TF32 arms")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch arms (as --arms without vmap)")
    ap.add_argument(
        "--arms",
        type=_arms,
        default=DEFAULT_ARMS,
        help="arms to run, comma-separated: vmap (PyTorch), branches (cudarl.population.Population, the "
        "sequential graphs and the single agent), joined (StackedLearner), joined-onekernel (StackedLearner "
        "with net.dw_gemm = one_kernel), joined-probe (joined-onekernel with net.batched_algo = probe); default "
        "vmap,branches,joined,joined-onekernel",
    )
    ap.add_argument(
        "--device",
        choices=("gpu", "cpu"),
        default="gpu",
        help="cpu: the joined arms alone on the NumPy backend at tiny sizes (a smoke run; host-clock times)",
    )
    ap.add_argument("--quick", action="store_true", help="sizes 1,8 (TF32: 8) and 20 repeats: a smoke run")
    ap.add_argument(
        "--profile",
        type=_sizes,
        default=None,
        help="joined arms: at these sizes also time each train phase captured alone (rows 'P=<P>: phase <name>')",
    )
    ap.add_argument(
        "--forms",
        choices=("one", "two"),
        default=None,
        help="joined arms: force the PopArt loss's and the optimiser's form at every size (one: the grid-barrier "
        "launch, squeezed where it does not fit; two: the launches without the barrier); default: the launchers "
        "choose (rows 'P=<P>: loss' and 'P=<P>: optimiser' say which ran)",
    )
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    arms = [a for a in args.arms if not (a == "vmap" and args.no_torch)]
    if args.quick:
        args.sizes, args.tf32_sizes, args.repeats = args.sizes or QUICK_SIZES, (8,), min(args.repeats, 20)
    args.sizes = args.sizes or (CPU_SIZES if cpu else SIZES)
    if not cpu and skipped_without_gpu("bench_population", "population", args.out):
        return 0
    t_start = time.perf_counter()
    peak = None if cpu else fp32_peak_tflops()
    rows = [row("device", "FP32 peak (SMs x 128 x 2 x clock)", peak, "TFLOP/s")] if peak else []
    if cpu:  # the committed default file keeps its GPU numbers
        args.out = args.out or Path(tempfile.gettempdir()) / "bench_population_cpu.json"
        for a in sorted(set(arms) - set(JOINED_ARMS)):
            rows.append(row(a, "skipped", "GPU only", ""))
        arms = [a for a in arms if a in JOINED_ARMS]
    extra: dict = {
        "workload": f"obs {OBS}, MLP {HIDDEN[0]}-{HIDDEN[1]}, dueling C51 {A}x{K}, batch {B}, replay {CAPACITY:,} "
        f"PER, n-step {N_STEP}, {N_ENVS} envs per agent",
        "device_kind": args.device,
        "arms": arms,
        "sizes": list(args.sizes),
        "tf32_sizes": [] if args.no_tf32 or cpu else list(args.tf32_sizes),
        "flops_per_update": flops_per_update(),
        "repeats": args.repeats,
    }
    if cpu:
        extra["workload"] = f"NumPy smoke: {CPU_WORKLOAD}"
    else:
        rows.append(row("workload", "GEMM FLOPs per agent-update", flops_per_update() / 1e9, "GFLOP"))
    plan = [(False, args.sizes)] + ([] if args.no_tf32 or cpu else [(True, args.tf32_sizes)])
    torch_us: dict = {}
    branches_us: dict = {}
    if "vmap" in arms:
        for tf32, sizes in plan:  # PyTorch first: its replays need the memory before cudarl's populations hold it
            torch_us[tf32] = torch_arms(tf32, sizes, args, rows, extra, peak)
    for tf32, sizes in plan:
        prec = "TF32" if tf32 else "FP32"
        if "branches" in arms:
            try:
                branches_us[tf32] = ours = cudarl_arms(tf32, sizes, args, rows, extra, peak)
            except Exception as exc:
                _failed(rows, f"cudarl, {prec}", exc)
                ours = {}
            for P, us in ours.items():
                theirs = torch_us.get(tf32, {}).get(P)
                if theirs:
                    target = f">= {TARGET_VS_TORCH:g}x" if P == TARGET_P and not tf32 else ""
                    rows.append(row(f"cudarl vs PyTorch vmap, {prec}", f"P={P}: speed-up", theirs / us, "x", target))
        single_us = extra.get(f"cudarl_{prec.lower()}", {}).get("single_agent_us")
        joined_us: dict = {}
        for arm, (dw_gemm, batched_algo, label) in JOINED_ARMS.items():
            if arm not in arms:
                continue
            try:
                joined_us[arm] = joined_arm(tf32, sizes, args, rows, extra, peak, args.device, dw_gemm, batched_algo)
            except Exception as exc:
                _failed(rows, f"cudarl joined{', ' + label if label else ''}, {prec}", exc)
                joined_us[arm] = {}
            others = (branches_us.get(tf32, {}), torch_us.get(tf32, {}), single_us)
            rows += ratio_rows(prec, joined_us[arm], *others, label)
        rows += dw_rows(prec, joined_us.get("joined", {}), joined_us.get("joined-onekernel", {}))
        rows += probe_vs_rows(prec, joined_us.get("joined-onekernel", {}), joined_us.get("joined-probe", {}))
        print(f"cudarl {prec} done at {time.perf_counter() - t_start:.0f} s")
    extra["wall_s"] = time.perf_counter() - t_start
    report("bench_population", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
