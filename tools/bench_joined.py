"""The joined arms of ``tools/bench_population.py`` (``joined``, ``joined-onekernel``, ``joined-probe``:
:class:`cudarl.stacked_agent.StackedLearner`, issue 23's agent axis) and the helpers both benchmarks share:
the joined arm's config and workload, :func:`build_joined` (also ``tools/profile_step.py --graph joined``'s
graph), the per-size measuring (:func:`joined_size`, ``--profile``'s per-phase rows, the rows saying which
forms ran), the probe rows and the speed-up rows. ``tools/bench_population.py``'s docstring describes the
arms; this module imports nothing of it."""

from __future__ import annotations

import gc
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_step import GAMMA, HIDDEN, OBS, A, B, K  # noqa: E402
from benchlib import cuda_time_us, host_time_us, row  # noqa: E402

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
    ``ext["batched_plans"][P]``; a row counting the verdicts recalled from disk (:mod:`cudarl.probe_cache`:
    the build then ran no probe, so its ``build + fill + capture`` row is the cached build's)."""
    from cudarl import blas

    records = [
        r for r in blas.batched_plan_info().values() if r["mode"] == "probe" and r["batch"] == P and r["tf32"] == tf32
    ]
    ext.setdefault("batched_plans", {})[P] = records
    changed = [r for r in records if r["changed"]]
    cached = [r for r in records if r["cached"]]
    out = [
        row(case, f"P={P}: batched plans on another algorithm", f"{len(changed)} of {len(records)}", ""),
        row(case, f"P={P}: probe verdicts recalled from disk", f"{len(cached)} of {len(records)}", ""),
    ]
    for r in records:
        out.append(row(case, f"P={P}: batched plan {r['shape']} epilogue {r['epilogue']}", probe_summary(r), ""))
    print(
        f"{case}: P={P}: {len(changed)} of {len(records)} batched plans on another algorithm, "
        f"{len(cached)} verdicts recalled from disk"
    )
    return out


def probe_summary(r: dict) -> str:
    """One batched plan's probe in words: the single tile -> the chosen one, the candidates probed, and the
    times (us, median on the probe's buffers) of the single algorithm and of each bitwise-equal candidate
    (``!=``: a candidate whose bits differ, not timed; ``*``: the one adopted), and the kept verdict's fate
    (``recall``: taken, or why not, with the entry's first 12 hex digits)."""
    s, c = r["single"], r["chosen"]
    what = f"{s['tile_name']} (algo {s['algo_id']}) -> {c['tile_name']} (algo {c['algo_id']})"
    if r.get("recall"):
        what = f"[verdict {r['recall']['entry'][:12]}: {r['recall']['outcome']}] " + what
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
