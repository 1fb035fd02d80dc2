#!/usr/bin/env python3
"""The full train step of the reference workload (DESIGN.md): cudarl's graph replay next to the
same step in PyTorch, on the same GPU in the same run; and one epoch over 4M synthetic bars.

Reference workload: observation 66 floats (64 features + 2 position features), MLP 256-256 ReLU,
dueling C51 (51 atoms on [-10, 10], 3 actions), batch 512, replay capacity 1M with proportional
PER (alpha 0.6), n-step 3 returns stored in the buffer, double DQN, Adam 1e-4 with the global
gradient norm clipped to 10, KL priorities, soft target update tau 0.005.

Arms:
* cudarl: ``cudarl.bench.step_benchmark`` (train-graph replay, collect-graph replay of 4096
  environments, per-phase profile). Targets (issue 20): train step <= 50 us, collect step <= 30 us. With
  ``--net-variants`` (default) also the step under each other ``net.gemm`` and TF32; with
  ``--dw-variants`` (default) under each other ``net.dw_gemm`` (``one_kernel``: the weight gradients
  as one-kernel cuBLASLt GEMMs, what a joined population batches), each a case of its own
  (``reference step (gpu), net.dw_gemm=one_kernel``).
* check: the cudarl agent's forward/targets/loss/backward and the PyTorch step's loss on the
  same weights (target net perturbed, so double DQN matters) and the same batch; relative
  differences of the loss, the priorities and the gradients.
* PyTorch (float32, TF32 off), the same step: PER sample (cumsum + searchsorted over stored
  ``p**alpha``, stratified; IS weights over the batch max, beta annealed on the device), gather,
  online(s), online(s'), target(s'), double-DQN next distribution, projection, weighted
  cross-entropy, autograd backward, ``clip_grad_norm_(10)``, ``Adam(1e-4)``, KL priorities
  scattered back, ``torch._foreach_lerp_`` soft update. Arms: eager; the whole step in one
  ``torch.cuda.CUDAGraph`` (``capturable=True``); with ``--torch-compile`` only,
  ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the step in one CUDA graph (minutes
  of compiling). Skipped with a printed reason when torch or CUDA is missing.
  Target: cudarl >= 2.5x faster than the fastest PyTorch arm that ran (DESIGN.md names the
  compiled-in-one-graph arm, so the ratio meets its definition only with ``--torch-compile``).
* aux (``--aux``, issue 19): the train step with all the auxiliary signals on and with each alone, and
  each signal's cost in us and as a share of the step (:func:`aux_arms`: ``tools/bench_aux.py``'s arms,
  which that tool also runs alone, for the temporal encoders too). Target: all signals together add at
  most 40% to the step.
* epoch (``--epoch``; ``tools/bench_epoch.py`` runs it in a process of its own): a ``Trainer`` on
  ``--epoch-bars`` regime bars (64 features), reference config; after graph capture and warm-up
  collection, wall time of
  as many collect steps as make env-steps >= training bars, each with
  ``agent.updates_per_collect`` learner updates. Target <= 30 s. Also the train step timed again
  with the replay full (1M rows).

Every arm is timed with CUDA events, median us per step; one failing arm prints its reason and
the others still run. Prints a table and writes JSON (``--out``, default ``docs/bench/bench_step.json``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row  # noqa: E402

N_FEATURES, POS_FEATURES, HIDDEN, A, K, B = 64, 2, (256, 256), 3, 51, 512
OBS = N_FEATURES + POS_FEATURES
V_MIN, V_MAX = -10.0, 10.0
CAPACITY, ALPHA, BETA0, BETA_FINAL, BETA_STEPS, PER_EPS = 1_000_000, 0.6, 0.4, 1.0, 100_000, 1e-6
GAMMA, N_STEP, N_ENVS = 0.99, 3, 4096
LR, CLIP, TAU = 1e-4, 10.0, 0.005
SPEEDUP_TARGET, EPOCH_TARGET_S = 5.5, 30.0  # issue 20: >= 5.5x the fastest PyTorch arm (compiled, in one graph)


def _failed(rows, case: str, exc: BaseException) -> None:
    print(f"{case} failed: {type(exc).__name__}: {exc}")
    traceback.print_exc()
    rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))


# --- the PyTorch step ------------------------------------------------------------------------------
class TorchC51Step:
    """The reference train step in plain PyTorch over its own 1M-row replay (all rows ready).

    :meth:`step` draws the stratified uniforms and runs :meth:`core`, everything on the device
    with no host synchronisation, so one call can be captured in a CUDA graph.
    """

    def __init__(self, device, online_P=None, target_P=None, seed: int = 0, capacity: int = CAPACITY):
        import torch
        from torch_c51 import dueling_c51, load_cudarl_params

        self.torch, self.dev, self.C = torch, torch.device(device), int(capacity)
        torch.manual_seed(seed)
        self.online, self.target = dueling_c51(OBS, HIDDEN, A, K), dueling_c51(OBS, HIDDEN, A, K)
        if online_P is not None:
            load_cudarl_params(self.online, online_P)
        self.target.load_state_dict(self.online.state_dict())
        if target_P is not None:
            load_cudarl_params(self.target, target_P)
        self.online.to(self.dev)
        self.target.to(self.dev).requires_grad_(False)
        self.params = list(self.online.parameters())
        self.target_params = list(self.target.parameters())
        self.capturable = self.dev.type == "cuda"
        self.opt = torch.optim.Adam(self.params, lr=LR, foreach=True, capturable=self.capturable)
        self.support = torch.linspace(V_MIN, V_MAX, K, device=self.dev)
        self.dz = (V_MAX - V_MIN) / (K - 1)
        # the replay: observations, actions, stored n-step returns and bootstrap discounts, p**alpha
        g = torch.Generator(device=self.dev).manual_seed(seed + 1)
        C = self.C
        self.obs = torch.randn(C, OBS, device=self.dev, generator=g)
        self.action = torch.randint(0, A, (C,), device=self.dev, generator=g)
        self.ret = torch.randn(C, device=self.dev, generator=g)
        ended = torch.rand(C, device=self.dev, generator=g) < 0.01
        self.discount = torch.where(ended, 0.0, GAMMA**N_STEP).to(torch.float32)
        self.pa = (torch.rand(C, device=self.dev, generator=g) * 10 + 1e-3).pow(ALPHA)
        self.lag = N_STEP * N_ENVS  # s' of row i is row i + n * n_envs of the time-major ring
        self.strata = torch.arange(B, device=self.dev, dtype=torch.float32)
        self.beta = torch.full((), BETA0, device=self.dev)

    def loss(self, obs, next_obs, action, ret, discount, w, online=None, target=None):
        """``(loss, priority)``: weighted C51 cross-entropy (differentiable) and detached KL priorities.
        ``online``, ``target``: the networks as callables (default the step's own modules;
        ``tools/bench_population.py`` passes functional calls of one agent's slice of stacked weights)."""
        torch = self.torch
        online, target = online or self.online, target or self.target
        logits = online(obs)
        with torch.no_grad():
            q_next = (torch.softmax(online(next_obs), -1) * self.support).sum(-1)
            a_star = q_next.argmax(1)
            p = torch.softmax(target(next_obs).gather(1, a_star.view(-1, 1, 1).expand(-1, 1, K)).squeeze(1), -1)
            tz = (ret[:, None] + discount[:, None] * self.support).clamp(V_MIN, V_MAX)
            gpos = ((tz - V_MIN) / self.dz).clamp(0, K - 1)
            lo = gpos.floor()
            frac = gpos - lo
            lo = lo.long()
            up = (lo + 1).clamp(max=K - 1)  # lo == K - 1 has frac == 0
            m = torch.zeros_like(p).scatter_add_(1, lo, p * (1 - frac)).scatter_add_(1, up, p * frac)
        chosen = logits.gather(1, action.view(-1, 1, 1).expand(-1, 1, K)).squeeze(1)
        ce = -(m * torch.log_softmax(chosen, -1)).sum(-1)
        loss = (w * ce).mean()
        with torch.no_grad():
            priority = (ce.detach() + torch.xlogy(m, m).sum(-1)).clamp_min(0)
        return loss, priority

    def core(self, u):
        """One train step from the uniforms ``u [B]`` (gradients must be ``None`` or zero on entry)."""
        torch = self.torch
        cdf = torch.cumsum(self.pa, 0)
        total = cdf[-1]
        idx = torch.searchsorted(cdf, (self.strata + u) * (total / B), right=True).clamp_(max=self.C - 1)
        w = (self.C * self.pa[idx] / total).pow(-self.beta)
        w = w / w.max()
        self.beta.add_((BETA_FINAL - BETA0) / BETA_STEPS).clamp_(max=BETA_FINAL)
        nxt = (idx + self.lag) % self.C
        loss, priority = self.loss(self.obs[idx], self.obs[nxt], self.action[idx], self.ret[idx], self.discount[idx], w)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP, foreach=True)
        self.opt.step()
        self.pa.index_put_((idx,), (priority + PER_EPS).pow(ALPHA))
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.params, TAU)  # target += tau (online - target)
        return loss

    def step(self, core=None):
        u = self.torch.rand(B, device=self.dev)
        return (core or self.core)(u)


def torch_twins(agent):
    """``(online, target, grads)``: PyTorch twins (float32, CPU) of the agent's online and target networks on
    their weights, and the agent's online gradients now (NumPy) laid out as ``online.parameters()``. The MLP's twin is
    ``torch_c51.dueling_c51``; a windowed encoder's (``net.encoder`` ssm or attention),
    ``torch_encoders.q_network``."""
    if agent.cfg.net.encoder == "mlp":
        import torch_c51 as tw

        net = agent.cfg.net
        build = lambda: tw.dueling_c51(agent.online.n_in, net.hidden, agent.online.n_actions, net.atoms)  # noqa: E731
    else:
        import torch_encoders as tw

        build = lambda: tw.q_network(agent.online)  # noqa: E731
    online, target = build(), build()
    tw.load_cudarl_params(online, agent.online.P)
    tw.load_cudarl_params(target, agent.target.P)
    return online, target, tw.cudarl_grads_like(online, agent.online.G)


def step_check(agent, device, seed: int = 0) -> dict:
    """cudarl's learner pass on ``agent`` (forward, C51 targets with double DQN, projection, weighted
    cross-entropy, KL priorities, backward; on its backend) against :meth:`TorchC51Step.loss` with the
    agent's networks' PyTorch twins (:func:`torch_twins`) as ``online`` and ``target``, on ``device``: the same
    weights (the target's perturbed first, so double DQN matters) and the same random batch. The agent's
    config must be the plain C51 step the PyTorch one computes: ``net.head`` c51 at ``K`` atoms on
    ``[V_MIN, V_MAX]``, no PopArt. Returns the losses and the relative differences of the loss, the priorities
    and the gradients (the norm of the difference over cudarl's), overall and by parameter. Perturbs the
    agent's target weights and turns PyTorch's TF32 off."""
    import torch

    from cudarl.backend import to_numpy

    cfg, xp = agent.cfg, agent.xp
    net = cfg.net
    if (net.head, net.atoms, net.v_min, net.v_max, cfg.agent.popart) != ("c51", K, V_MIN, V_MAX, False):
        raise ValueError(f"step_check: the plain C51 step ({K} atoms on [{V_MIN}, {V_MAX}], no PopArt) only")
    torch.backends.cuda.matmul.allow_tf32 = False  # the PyTorch arms may have left TF32 on
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(seed)
    p = to_numpy(agent.online.params)
    agent.target.params[...] = xp.asarray(
        (p + 0.1 * np.abs(p).mean() * rng.standard_normal(p.shape)).astype(np.float32)
    )
    Bn, obs, n_actions = agent.batch_size, agent.online.n_in, agent.online.n_actions
    host = dict(
        obs=rng.standard_normal((Bn, obs)).astype(np.float32),
        next_obs=rng.standard_normal((Bn, obs)).astype(np.float32),
        action=rng.integers(0, n_actions, Bn).astype(np.int32),
        ret=rng.uniform(-3, 3, Bn).astype(np.float32),
        discount=np.where(rng.random(Bn) < 0.1, 0.0, GAMMA**N_STEP).astype(np.float32),
    )
    w = rng.uniform(0.1, 1.0, Bn).astype(np.float32)
    w /= w.max()
    batch = agent.batch
    for k, v in host.items():
        getattr(batch, k)[...] = xp.asarray(v)
    agent.buffers.weights = xp.asarray(w)
    agent.rule.forward(batch)
    for _, phase in agent.rule.learn_phases():  # C51: the targets and the loss in one launch
        phase()
    agent.backward()
    loss_c, prio_c = float(to_numpy(agent.loss)[0]), to_numpy(agent.priority)

    online, target, grads_c = torch_twins(agent)
    dev = torch.device(device)
    online.to(dev)
    target.to(dev).requires_grad_(False)
    ts = TorchC51Step(device, capacity=16)  # its loss and constants (its own networks and replay unused)
    T = {k: torch.from_numpy(v).to(dev) for k, v in host.items()}
    T["action"] = T["action"].long()
    w_t = torch.from_numpy(w).to(dev)
    loss_t, prio_t = ts.loss(
        T["obs"], T["next_obs"], T["action"], T["ret"], T["discount"], w_t, online=online, target=target
    )
    loss_t.backward()
    named = [
        (n, q.grad.detach().cpu().numpy().ravel(), g.ravel())
        for (n, q), g in zip(online.named_parameters(), grads_c, strict=True)
    ]
    g_t = np.concatenate([t for _, t, _ in named])
    g_c = np.concatenate([c for _, _, c in named])
    prio_t = prio_t.cpu().numpy()
    loss_t = float(loss_t.detach())
    return {
        "loss_cudarl": loss_c,
        "loss_torch": loss_t,
        "loss_rel_diff": abs(loss_t - loss_c) / abs(loss_c),
        "priority_rel_diff": float(np.linalg.norm(prio_t - prio_c) / max(np.linalg.norm(prio_c), 1e-30)),
        "grad_rel_diff": float(np.linalg.norm(g_t - g_c) / max(np.linalg.norm(g_c), 1e-30)),
        # each parameter's gradient: the norm of the difference over cudarl's, by the twin's parameter name
        "grad_rel_diff_by_param": {
            n: float(np.linalg.norm(t - c) / max(np.linalg.norm(c), 1e-30)) for n, t, c in named
        },
    }


#: The check's rows (metric, key of :func:`step_check`'s result, target): float32 on both sides.
CHECK_ROWS = (
    ("loss rel. diff", "loss_rel_diff", "<= 1e-5"),
    ("KL priority rel. diff", "priority_rel_diff", "<= 1e-4"),
    ("gradient rel. diff", "grad_rel_diff", "<= 1e-4"),
)


def check_rows(case: str, diffs: dict) -> list:
    """The rows of :func:`step_check`'s differences (:data:`CHECK_ROWS`) under ``case``."""
    return [row(case, metric, diffs[key], "", target) for metric, key, target in CHECK_ROWS]


def loss_check(xp, device, rows, extra, seed: int = 0) -> None:
    """:func:`step_check` of the reference agent (MLP; ``xp`` numpy or cupy) against the PyTorch step on
    ``device``: rows and ``extra["check"]``."""
    from cudarl.agent import Agent
    from cudarl.bench import reference_config

    # the plain C51 target (no PopArt reward normalisation): the equations of the PyTorch step
    cfg = reference_config("gpu" if xp.__name__ == "cupy" else "cpu", agent={"popart": False})
    diffs = step_check(Agent(cfg, OBS, A, 1, xp), device, seed)
    rows += check_rows(f"check (cudarl {xp.__name__} vs torch {device}, batch {B})", diffs)
    extra["check"] = diffs


def torch_arms(args, rows, extra) -> dict:
    """Median us per step of each PyTorch arm that ran: ``{arm name: us}``."""
    try:
        import torch
    except Exception as exc:
        why = f"torch is not importable ({type(exc).__name__}: {exc})"
        print(f"skipping the PyTorch arms: {why}")
        rows.append(row("pytorch", "skipped", why[:60], ""))
        return {}
    if not torch.cuda.is_available():
        print("skipping the PyTorch arms: torch sees no CUDA device")
        rows.append(row("pytorch", "skipped", "no CUDA device", ""))
        return {}
    from torch_c51 import torch_time_us

    from cudarl.bench import BACK_TO_BACK

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    extra["torch"] = torch.__version__
    case = f"PyTorch {torch.__version__} fp32"
    out: dict = {}

    def graphed(ts, core):
        """Warm up on a side stream (as the CUDA-graph docs require), then capture one whole step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                ts.opt.zero_grad(set_to_none=True)
                ts.step(core)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        ts.opt.zero_grad(set_to_none=True)  # backward allocates the gradients in the graph's pool
        with torch.cuda.graph(graph):
            ts.step(core)
        return graph

    arms = [("eager", False), ("whole step in one CUDA graph", False)]
    if args.torch_compile:
        arms.append(("torch.compile max-autotune-no-cudagraphs, whole step in one CUDA graph", True))
    else:
        print("the torch.compile arm runs only with --torch-compile (minutes of compiling)")
    for name, compiled in arms:
        try:
            t0 = time.perf_counter()
            ts = TorchC51Step("cuda")
            graph = None
            if name == "eager":

                def eager(ts=ts):
                    ts.opt.zero_grad(set_to_none=True)
                    ts.step()

                us = torch_time_us(eager, max(20, args.repeats // 2))
                del eager  # it holds ts, which `del ts` below frees
            else:
                core = torch.compile(ts.core, mode="max-autotune-no-cudagraphs") if compiled else None
                graph = graphed(ts, core)
                us = torch_time_us(graph.replay, args.repeats)
            torch.cuda.synchronize()
            rows.append(row(case, f"train step, {name}", us, "us"))
            out[name] = us
            if graph is not None:  # after the arm's own row and number: a failure here loses neither
                try:
                    b2b = torch_time_us(graph.replay, args.repeats, inner=BACK_TO_BACK)
                    rows.append(row(case, f"train step, {name}, {BACK_TO_BACK} replays back to back", b2b, "us"))
                    extra.setdefault("torch_arms_back_to_back_us", {})[name] = b2b
                except Exception as exc:
                    _failed(rows, f"{case}, {name}, back to back", exc)
            if compiled:
                rows.append(row(case, "torch.compile + capture wall time", time.perf_counter() - t0, "s"))
            del ts
        except Exception as exc:
            _failed(rows, f"{case}, {name}", exc)
    return out


def encoder_arms(args, rows, extra) -> None:
    """The whole train and collect steps (acting re-encodes each env's window) with the ssm and attention
    encoders at issue 22's workload, fp32 and TF32; the encoder's share against its PyTorch twin is
    tools/bench_encoders.py. Targets (docs/perf-notes.md): train step <= 2.5 ms fp32, <= 0.6 ms TF32."""
    from cudarl.bench import ENCODER_WORKLOAD, encoder_config, step_benchmark

    extra["encoder_workload"] = ENCODER_WORKLOAD
    algos = ("heuristic", "probe") if args.gemm_algo_arms else ("heuristic",)
    for encoder, tf32, algo in ((e, t, a) for e in ("ssm", "attention") for t in (False, True) for a in algos):
        label = f", net.encoder={encoder}{', net.tf32' if tf32 else ''}{', net.gemm_algo=probe' * (algo == 'probe')}"
        try:
            got = step_benchmark(
                repeats=max(20, args.repeats // 4),
                cfg=encoder_config(encoder, tf32=tf32, gemm_algo=algo),
                phases=not tf32 and algo == "heuristic",  # the phase profile once per encoder
                label=label,
            )
            for r in got:
                if r["metric"] == "train step (graph replay)":
                    r["target"] = "<= 600 us" if tf32 else "<= 2500 us"
                if r["metric"].startswith("collect step"):
                    r["target"] = ""
            rows += got
            extra.setdefault("encoder_steps_us", {})[label.lstrip(", ")] = {
                r["metric"]: r["value"] for r in got if r["unit"] == "us"
            }
        except Exception as exc:
            _failed(rows, "cudarl step_benchmark" + label, exc)


def aux_arms(args, rows, extra, device: str = "gpu") -> None:
    """Issue 19's auxiliary signals on this workload: the train step with no signal, each alone and all
    together, and each one's added us and share of the step (``tools/bench_aux.py``'s arms,
    :func:`bench_aux.run_arms`, at its defaults on the MLP; ``tools/bench_aux.py`` itself takes the
    temporal encoders and the ``agent.aux_batch`` and ``agent.vaccine_scope`` it times).
    ``device = "cpu"``: a smoke run."""
    from bench_aux import run_arms

    try:
        got, extra["aux"] = run_arms(device=device, repeats=args.repeats)
        rows += got
    except Exception as exc:
        _failed(rows, "aux signals", exc)


def epoch_arm(args, rows, extra) -> None:
    """One epoch over ``args.epoch_bars`` bars: collect + train, wall clock after capture and warm-up."""
    from cudarl.bench import TRAIN_TARGET_US, reference_bars, reference_config
    from cudarl.trainer import Trainer

    case = f"epoch, {args.epoch_bars:,} regime bars"
    t0 = time.perf_counter()
    bars = reference_bars(args.epoch_bars, n_features=N_FEATURES, bar_minutes=1)  # minute bars: 4M dates fit
    bars_s = time.perf_counter() - t0
    cfg = reference_config("gpu")
    tr = Trainer(cfg, run_dir=False, bars=bars, echo=lambda m: None)
    tr.prime()  # capture both graphs, collect until a batch can be sampled
    t_first = time.perf_counter()
    tr.advance(2)  # first launches of both graphs (upload), not timed
    tr.synchronize()
    setup_s = time.perf_counter() - t0
    # where the set-up goes: the bars, then the trainer's stages (cudarl.timing), then the first replays
    breakdown = {"bars": bars_s, **tr.timings, "first_replays": time.perf_counter() - t_first}
    train = tr.data.splits.train
    n_train = train.stop - train.start
    envs_per_collect = tr.env.n_envs
    n_collect = math.ceil(n_train / envs_per_collect)
    step0 = tr.step
    t1 = time.perf_counter()
    tr.advance(n_collect)
    tr.synchronize()
    wall = time.perf_counter() - t1
    updates = tr.step - step0
    env_steps = n_collect * envs_per_collect
    rows.append(row(case, f"setup (bars, features, env, replay, capture), {tr.env.obs_dim}-float obs", setup_s, "s"))
    for stage, seconds in breakdown.items():
        rows.append(row(case, f"  setup: {stage}", seconds, "s"))
    rows.append(
        row(
            case,
            f"epoch: {n_collect} collect steps x {envs_per_collect} envs + {updates} updates",
            wall,
            "s",
            f"<= {EPOCH_TARGET_S:g} s",
        )
    )
    rows.append(row(case, "env-steps per second", env_steps / wall, "1/s"))
    rows.append(row(case, "updates per second", updates / wall, "1/s"))
    loss = float(tr.agent.loss.get()[0])
    rows.append(row(case, "loss of the last update", loss, "", "finite"))
    status = tr.replay.status()
    if status:
        print(f"warning: replay status bits set during the epoch: {status}")
    full = cuda_time_us(tr.train_graph.replay, tr.stream, repeats=args.repeats)
    rows.append(
        row(
            case,
            f"train step (graph replay), replay holds {tr.replay.ready():,} rows",
            full,
            "us",
            f"<= {TRAIN_TARGET_US:g} us",
        )
    )
    extra["epoch"] = {
        "bars": args.epoch_bars,
        "train_bars": n_train,
        "collect_steps": n_collect,
        "updates": updates,
        "env_steps": env_steps,
        "wall_s": wall,
        "setup_s": setup_s,
        "setup_breakdown_s": breakdown,
        "target_s": EPOCH_TARGET_S,
        "target_met": bool(wall <= EPOCH_TARGET_S),
        "train_step_full_replay_us": full,
        "replay_status": list(status),
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--epoch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the epoch arm in this process (tools/bench_epoch.py runs it alone)",
    )
    ap.add_argument("--epoch-bars", type=int, default=4_000_000)
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch arms and the check")
    ap.add_argument(
        "--aux",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also time the step with each auxiliary signal alone and all together (tools/bench_aux.py's arms)",
    )
    ap.add_argument(
        "--encoders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the step with the temporal encoders (issue 22's workload; fp32 and TF32)",
    )
    ap.add_argument(
        "--net-variants",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the step with the other GEMM options (net.gemm, net.tf32)",
    )
    ap.add_argument(
        "--gemm-algo-arms",
        action="store_true",
        help="also time the encoder arms under net.gemm_algo = probe (the MLP's is among --net-variants)",
    )
    ap.add_argument(
        "--dw-variants",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the step with the other weight-gradient GEMM algorithms (net.dw_gemm)",
    )
    args = ap.parse_args()
    t_start = time.perf_counter()
    rows: list = []
    extra: dict = {
        "workload": f"obs {OBS}, MLP {HIDDEN[0]}-{HIDDEN[1]}, dueling C51 {A}x{K}, batch {B}, "
        f"replay {CAPACITY:,} PER alpha {ALPHA}, n-step {N_STEP}",
        "repeats": args.repeats,
    }
    from cudarl.backend import cupy_unavailable_reason
    from cudarl.bench import BACK_TO_BACK, reference_config

    extra["cudarl_popart"] = popart = bool(getattr(reference_config().agent, "popart", False))
    if popart:
        print(
            "note: the reference config has agent.popart on, so cudarl's step also maps returns through PopArt "
            "statistics (more work than the PyTorch step); the check turns it off"
        )
    why = cupy_unavailable_reason()
    if why:
        print(f"skipping the cudarl GPU arms and the epoch: {why}")
        rows.append(row("cudarl", "skipped", why[:60], ""))
    ours = None
    if not why:
        try:
            from cudarl.bench import step_benchmark

            step_rows = step_benchmark(repeats=args.repeats)
            rows += step_rows
            ours = next(r["value"] for r in step_rows if r["metric"] == "train step (graph replay)")
            extra["cudarl_train_step_us"] = ours
            b2b_metric = f"train step, {BACK_TO_BACK} replays back to back"  # the name step_benchmark gives it
            extra["cudarl_train_step_back_to_back_us"] = next(
                (r["value"] for r in step_rows if r["metric"] == b2b_metric), None
            )
        except Exception as exc:
            _failed(rows, "cudarl step_benchmark", exc)
        variants = []
        if args.net_variants:
            from cudarl.nn.layers import GEMMS  # every net.gemm option, so a new one is timed too

            default_gemm = reference_config().net.gemm
            from cudarl.nn.layers import GEMM_ALGOS  # and every net.gemm_algo option

            variants += [{"gemm": g} for g in GEMMS if g != default_gemm] + [{"tf32": True}]
            variants += [{"gemm_algo": a} for a in GEMM_ALGOS if a != reference_config().net.gemm_algo]
        if args.dw_variants:
            from cudarl.nn.layers import DW_GEMMS  # every net.dw_gemm option

            variants += [{"dw_gemm": d} for d in DW_GEMMS if d != reference_config().net.dw_gemm]
        for net in variants:
            label = ", " + ", ".join(f"net.{k}={v}" for k, v in net.items())
            try:
                rows += step_benchmark(
                    repeats=args.repeats, cfg=reference_config("gpu", net=net), phases=False, label=label
                )
            except Exception as exc:
                _failed(rows, "cudarl step_benchmark" + label, exc)
    if args.encoders and not why:
        encoder_arms(args, rows, extra)
    if args.aux:
        if why:
            rows.append(row("aux signals", "skipped", why[:60], ""))
        else:
            aux_arms(args, rows, extra)
    torch_us: dict = {}
    if not args.no_torch:
        if not why:
            try:
                import cupy

                loss_check(cupy, "cuda", rows, extra)
            except ImportError as exc:
                print(f"skipping the check: {exc}")
                rows.append(row("check", "skipped", str(exc)[:60], ""))
            except Exception as exc:
                _failed(rows, "check", exc)
        torch_us = torch_arms(args, rows, extra)
    extra["torch_arms_us"] = torch_us
    if ours and torch_us:
        ran = ", ".join(torch_us)
        best = min(torch_us, key=torch_us.get)
        for name, us in torch_us.items():
            rows.append(
                row(
                    "cudarl vs PyTorch",
                    f"speed-up vs {name}",
                    us / ours,
                    "x",
                    f">= {SPEEDUP_TARGET:g} x" if name == best else "",
                )
            )
        extra["speedup_vs_fastest_torch"] = {
            "arm": best,
            "x": torch_us[best] / ours,
            "arms_ran": list(torch_us),
            "target_x": SPEEDUP_TARGET,
            "compile_arm_ran": bool(args.torch_compile),
        }
        ours_b2b, torch_b2b = (
            extra.get("cudarl_train_step_back_to_back_us"),
            extra.get("torch_arms_back_to_back_us", {}),
        )
        for name, us in torch_b2b.items():  # the same ratio with replays queued back to back on both sides
            if ours_b2b:
                rows.append(row("cudarl vs PyTorch", f"speed-up vs {name}, back to back", us / ours_b2b, "x"))
        print(f"PyTorch arms that ran: {ran}; fastest: {best}")
    run_epoch = bool(args.epoch)
    if run_epoch:
        if why:
            rows.append(row("epoch", "skipped", why[:60], ""))
        else:
            try:
                epoch_arm(args, rows, extra)
            except Exception as exc:
                _failed(rows, "epoch", exc)
    extra["wall_s"] = time.perf_counter() - t_start
    report("bench_step", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
