#!/usr/bin/env python3
"""Populations (issue 23): P agents of the reference workload trained in one graph, against P
single-agent graphs one after another and against PyTorch vectorised over the agents.

Reference workload per agent (DESIGN.md): observation 66 floats, MLP 256-256, dueling C51 51 atoms x 3
actions, batch 512, replay 1M rows with PER, n-step 3, 4,096 environments. Agent ``i`` has seed ``i``.

Arms (``--arms``, default every one but ``joined-probe`` and ``sweep-scaling``:
``vmap,branches,joined,joined-onekernel``), at each P of
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

* sweep scaling (``sweep-scaling``, opt-in; issue 21, point 2; ``tools/sweep_scaling.py``): one sweep
  spec (``--sweep-spec``, else a tiny one: ``--sweep-trials`` learning rates, default 4 x G, of
  ``--sweep-steps`` updates, default 30, GPU 300) run twice through :func:`cudarl.sweep.run_sweep` with
  :class:`cudarl.sweep.cluster.RayExecutor` on a fresh local Ray instance: with 1 worker, then with
  ``--workers`` G (default the GPUs of this host, one actor a GPU; ``--device cpu``: 2 CPU actors on the
  NumPy backend). Each run timed from submit to the last trial recorded: trials, wall, trials per hour, and
  at the end the speed-up, the scaling efficiency (speed-up / G) and the speed-up counting Ray's start, the
  actors' start and the data load; where the time went per run (Ray start, actors start, the driver before
  the first hand-out, the bars put into the object store, time inside populations against the workers'
  hand-out window, Ray round trips, the driver recording, the workers' idle tail from uneven packing,
  members per population and populations per worker); and whether both runs' ``sweep.csv`` hold the same
  numbers per trial (row ``per-trial numbers identical``). The populations are packed as the sweep packs
  them for that many workers (``--sweep-population`` caps them); ``--sweep-dir`` keeps both sweep
  directories. On a host with G GPUs::

      python3 tools/bench_population.py --arms sweep-scaling --out /tmp/scaling.json        # G = every GPU
      python3 tools/bench_population.py --arms sweep-scaling --device cpu --workers 2 --out /tmp/s.json

Precisions: FP32 at every size; TF32 (``net.tf32``; ``allow_tf32`` for PyTorch) at ``--tf32-sizes``
(default 64, the size of the target; building a second population of 256 costs minutes).

FLOPs per agent-update: the GEMMs of three forwards (online s and s', target s') and one backward
(weight gradients of every layer, input gradients of all but the first): about 0.69 GFLOP.

Targets (issue 23, H200): P = 64 in <= 1.2 ms FP32 and >= 2.5x the PyTorch vmap arm; <= 0.4 ms TF32.
Prints a table and writes JSON (``--out``, default ``docs/bench/bench_population.json``).

``--device cpu``: the joined arms alone on the NumPy backend at tiny sizes (:data:`CPU_WORKLOAD`, P = 1, 3;
host-clock times, memory by ``tracemalloc``), and ``sweep-scaling`` on CPU actors, a smoke run; its JSON goes
to ``--out`` or the temporary directory, never over the GPU numbers.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_joined import (  # noqa: E402
    CPU_SIZES,
    CPU_WORKLOAD,
    JOINED_ARMS,
    MEMORY_HEADROOM,
    TARGET_FP32_US,
    TARGET_P,
    TARGET_TF32_US,
    TARGET_VS_TORCH,
    _failed,
    _free_device_bytes,
    dw_rows,
    flops_per_update,
    joined_arm,
    probe_vs_rows,
    ratio_rows,
    repeats_for,
    step_rows,
)
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
    parser,
    report,
    row,
    skipped_without_gpu,
)

SIZES, TF32_SIZES, QUICK_SIZES = (1, 8, 64, 256), (64,), (1, 8)


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


ARMS = ("vmap", "branches", *JOINED_ARMS, "sweep-scaling")
#: Arms a plain run leaves out: ``joined-probe`` and ``sweep-scaling`` run only when named.
OPT_IN_ARMS = ("joined-probe", "sweep-scaling")
#: The arms a plain run takes: every one but the opt-in ones, so one run holds the ratio rows of both dW
#: settings.
DEFAULT_ARMS = tuple(a for a in ARMS if a not in OPT_IN_ARMS)


def _arms(text: str) -> tuple[str, ...]:
    got = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [a for a in got if a not in ARMS]
    if not got or bad:
        raise argparse.ArgumentTypeError(f"arms: comma-separated names of {', '.join(ARMS)}; got {text!r}")
    return got


def sweep_scaling(args, cpu: bool, rows, extra) -> dict:
    """The ``sweep-scaling`` arm (:func:`sweep_scaling.sweep_scaling_arm`) at ``--workers`` G: the GPUs
    of this host, or 2 CPU workers with ``--device cpu``."""
    from sweep_scaling import sweep_scaling_arm

    workers = args.workers
    if workers is None:
        if cpu:
            workers = 2
        else:
            import cupy

            workers = cupy.cuda.runtime.getDeviceCount()
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    kw = {"trials": args.sweep_trials, "steps": args.sweep_steps, "population": args.sweep_population}
    kw |= {"spec": args.sweep_spec, "out_dir": args.sweep_dir}
    return sweep_scaling_arm(workers, not cpu, rows, extra, **kw)


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
        "with net.dw_gemm = one_kernel), joined-probe (joined-onekernel with net.batched_algo = probe), "
        "sweep-scaling (one sweep spec on a local Ray at 1 and at --workers workers); default "
        "vmap,branches,joined,joined-onekernel",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="sweep-scaling: G, the workers of the second run (default: the GPUs of this host; --device cpu: 2 CPU "
        "workers)",
    )
    ap.add_argument("--sweep-trials", type=int, default=None, help="sweep-scaling: trials of its spec (default 4 x G)")
    ap.add_argument(
        "--sweep-steps", type=int, default=None, help="sweep-scaling: updates a trial (default 30; GPU: 300)"
    )
    ap.add_argument(
        "--sweep-population",
        type=int,
        default=0,
        help="sweep-scaling: most members a population (default 0: the sweep packs as it would, by the workers)",
    )
    ap.add_argument(
        "--sweep-spec",
        type=Path,
        default=None,
        help="sweep-scaling: run this SPEC.toml instead of the arm's tiny one (its out is not used)",
    )
    ap.add_argument(
        "--sweep-dir",
        type=Path,
        default=None,
        help="sweep-scaling: keep the two sweep directories here (default: a temporary directory, removed)",
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
        for a in sorted(set(arms) - set(JOINED_ARMS) - {"sweep-scaling"}):
            rows.append(row(a, "skipped", "GPU only", ""))
        arms = [a for a in arms if a in JOINED_ARMS or a == "sweep-scaling"]
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
    if "sweep-scaling" in arms:
        try:
            sweep_scaling(args, cpu, rows, extra)
        except Exception as exc:
            _failed(rows, "sweep scaling (Ray)", exc)
    extra["wall_s"] = time.perf_counter() - t_start
    report("bench_population", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
