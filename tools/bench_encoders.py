#!/usr/bin/env python3
"""The windowed encoders' share of a train step and of a collect step: cudarl (graph replay) next to its
PyTorch twin (tools/torch_encoders.py) on the same GPU, in the same run.

Workload (issue 22): window 64, d_model 128, 2 layers, batch 512; ssm: expand 2, state 64, head dim 64
(4 heads), 1 group, conv 4, chunk ``--chunk`` (default net.ssm_chunk's); attention: 4 heads of 32, MLP 4
d_model. Input 66 features a bar.

* encoder step: what a train step asks of the encoder: forward and backward on s (the loss gradient
  dL/dpsi fixed), forward on s' with the online weights and with the target weights (three passes over
  three workspaces). cudarl: eager and graph replay, fp32 and TF32 GEMMs; PyTorch (fp32, TF32 off; and TF32
  on): eager, the whole step in one ``torch.cuda.CUDAGraph``, with ``--torch-compile`` also
  ``torch.compile`` in one graph.
* acting: 4096 environments, one bar. cudarl: the one-bar step over the recurrent state (SSM) or the key/value
  cache (attention), graph replay. PyTorch: the windowed forward of the last W bars (no gradient), eager and graph.
* check: psi and the gradients of the cudarl step against the twin's on the same weights (fp32, TF32 off; with a
  GPU). And the whole learner step (issue 22 point 5: "check the twin on the same weights: loss, priorities,
  gradients"): cudarl's agent with ``net.encoder`` at these shapes (batch B; on the GPU, else NumPy) against
  ``TorchC51Step.loss`` over the Q-network twins (``torch_encoders.q_network``; CUDA if torch sees it, else the
  CPU), tools/bench_step.py's ``step_check``: the relative differences of the loss, the KL priorities and the
  gradients (float32 on both sides).
* FLOPs: the forward's multiply-adds counted from the shapes (the GEMMs, the conv, the chunked scan as the
  kernels run it, the attention), x2; the step counts the backward as twice its forward (a convention,
  said in the row); TFLOP/s = FLOPs / measured time, and its fraction of the FP32 peak (SMs x 128 lanes x 2
  x the clock the device reports). The full stack's count (every bar of every layer: the issue's floor) and
  the count as run: the top block computes the last bar only (``cudarl.nn.encoders``; the PyTorch twin's
  too, ``tools/torch_encoders.py``, so both sides do the same work), and the achieved TFLOP/s divides it.

Every arm is timed with CUDA events (median of ``--repeats`` intervals); a failing arm prints its reason and
the others still run. ``--small`` runs tiny shapes (a smoke test, on the CPU too for the PyTorch arms).
Prints a table and writes JSON (``--out``, default ``docs/bench/bench_encoders.json``).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, fp32_peak_tflops, parser, report, row  # noqa: E402

from cudarl.config import Config  # noqa: E402

FULL = dict(F=66, W=64, d=128, L=2, B=512, envs=4096)
SMALL = dict(F=5, W=9, d=16, L=2, B=8, envs=16)


def shapes(kind: str, s: dict) -> dict:
    """Constructor arguments of the encoder ``kind`` at the sizes ``s``."""
    base = dict(window=s["W"], d_model=s["d"], layers=s["L"])
    if kind == "ssm":
        hd = 64 if s["d"] >= 64 else 8
        return dict(base, expand=2, d_state=64 if s["d"] >= 64 else 4, headdim=hd, groups=1, conv_kernel=4,
                    chunk=min(s["chunk"], s["W"]) if s["W"] >= 32 else 4)  # fmt: skip
    return dict(base, heads=4, mlp_ratio=4)


def make_encoder(kind: str, F: int, **kw):
    """The encoder ``kind`` over ``F`` features a bar, with constructor arguments ``kw``."""
    from cudarl.nn.encoders import AttentionEncoder, SSMEncoder

    return {"ssm": SSMEncoder, "attention": AttentionEncoder}[kind]("enc", F, **kw)


def forward_flops(kind: str, F: int, a: dict, as_run: bool = False) -> float:
    """Multiply-adds x 2 of one forward over one window, from the shapes (module docstring); ``as_run``: the
    top block at the last bar only, as cudarl runs it."""
    W, d, L = a["window"], a["d_model"], a["layers"]
    fl = 2 * W * F * d
    if kind == "ssm":
        E, N, P, G, K, Q = 2 * d, a["d_state"], a["headdim"], a["groups"], a["conv_kernel"], a["chunk"]
        H, Cc = E // P, E + 2 * G * N
        tri, nc = Q * (Q + 1) / 2, W / Q  # the pairs s <= t of a chunk; chunks
        # C.B and M x in every chunk; S_in C after the first (S_in = 0 there) and the state update before the
        # last (nothing reads the state after the window): the products the kernels run
        scan = H * (nc * tri * (N + P) + 2 * (nc - 1) * Q * P * N)
        layer = W * (d * (E + Cc + H) + E * d + K * Cc) + scan
        if as_run:  # the top block: in-projection and conv over the window; C_T.B_s and m x; one out-projection row
            top = W * (d * (E + Cc + H) + K * Cc) + E * d + H * W * (N + P)
            return fl + 2 * ((L - 1) * layer + top)
    else:
        ff = a["mlp_ratio"] * d
        layer = W * (d * 3 * d + d * d + 2 * d * ff) + d * W * (W + 1)  # projections, MLP, q.k and p.v
        if as_run:  # the top block: QKV over the window; the last query's q.k and p.v; one row of the rest
            top = W * d * 3 * d + 2 * d * W + d * d + 2 * d * ff
            return fl + 2 * ((L - 1) * layer + top)
    return fl + 2 * L * layer


#: The ``NetConfig`` field of each encoder constructor argument of :func:`shapes` (what
#: ``cudarl.nn.encoders.ENCODERS`` reads), so the agent of the step check has the encoder the bench times.
NET_FIELDS = {"window": "window", "d_model": "d_model", "layers": "layers", "expand": "ssm_expand",
              "d_state": "ssm_state", "headdim": "ssm_headdim", "groups": "ssm_groups", "conv_kernel": "ssm_conv",
              "chunk": "ssm_chunk", "heads": "attn_heads", "mlp_ratio": "attn_mlp_ratio"}  # fmt: skip


def _failed(rows, case: str, exc: BaseException) -> None:
    print(f"{case} failed: {type(exc).__name__}: {exc}")
    traceback.print_exc()
    rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))


# --- cudarl ----------------------------------------------------------------------------------------------
def cudarl_step(kind: str, s: dict, x_np, x1_np, dpsi_np, tf32: bool, args, algo: str = "heuristic"):
    """Rows of cudarl's encoder step and acting, the step's replay time, and (psi, grads) of one eager step;
    ``algo``: the linear layers' one-kernel GEMM choice (``net.gemm_algo``)."""
    import cupy as cp

    from cudarl.graph import StepGraph
    from cudarl.nn.encoders import Standalone
    from cudarl.nn.layers import GEMM_ALGOS

    a = shapes(kind, s)
    mk = lambda: make_encoder(kind, s["F"], tf32=tf32, **a)  # noqa: E731
    online = Standalone(mk(), cp, np.float32, seed=0)
    target = Standalone(mk(), cp, np.float32, params=online.params.get())
    enc, tenc = online.enc, target.enc
    for lin in (*enc.linears, *tenc.linears):  # before the workspaces make the plans
        lin.lt_algo = GEMM_ALGOS[algo]
    suffix = "" if algo == "heuristic" else f"_{algo}"
    ws, ws1, wt = online.workspace(s["B"]), online.workspace(s["B"]), target.workspace(s["B"])
    x, x1, dpsi = cp.asarray(x_np), cp.asarray(x1_np), cp.asarray(dpsi_np)

    def online_s():
        enc.forward(x, ws)
        cp.copyto(ws.rows(f"{enc.out_name}.dout"), dpsi)  # what the loss would write
        enc.backward(x, ws)

    g = StepGraph(
        f"bench_{kind}{'_tf32' if tf32 else ''}{suffix}",
        [
            ("online_s", online_s),
            ("online_s1", lambda: enc.forward(x1, ws1)),
            ("target_s1", lambda: tenc.forward(x1, wt)),
        ],
        xp=cp,
    )
    g.run_eager()
    g.synchronize()
    first = (ws.rows(f"{enc.out_name}.out").get(), online.grads.get())
    tag = f"cudarl {kind} {'tf32' if tf32 else 'fp32'}{suffix.replace('_', ' ')}"
    rows = [row(tag, "encoder step eager", cuda_time_us(g.run_eager, g.stream, args.repeats), "us")]
    g.capture()
    replay = cuda_time_us(g.replay, g.stream, args.repeats)
    rows.append(row(tag, "encoder step (graph replay)", replay, "us"))
    rows += [row(tag, f"phase {k} (replay)", v * 1e3, "us") for k, v in g.profile(args.repeats).items() if k != "total"]
    # acting: one bar for every environment over the recurrent state (not what the agent acts with: it
    # equals the windowed forward only for the first W bars after a reset), and the agent's acting, the
    # windowed forward of every environment's last W bars (docs/architecture.md)
    state = enc.new_state(s["envs"])
    gen = np.random.default_rng(1)
    bar = cp.asarray(gen.standard_normal((s["envs"], s["F"])).astype(np.float32))
    act = StepGraph(
        f"bench_{kind}_act{'_tf32' if tf32 else ''}{suffix}", [("act", lambda: enc.step(state, bar))], xp=cp
    )
    act.capture()
    one_bar = cuda_time_us(act.replay, act.stream, args.repeats)
    rows.append(row(tag, f"acting, {s['envs']} envs, one bar over the recurrent state (graph replay)", one_bar, "us"))
    ws_act = online.workspace(s["envs"])
    windows = cp.asarray(gen.standard_normal((s["envs"], s["W"] * s["F"])).astype(np.float32))
    act = StepGraph(
        f"bench_{kind}_window{'_tf32' if tf32 else ''}{suffix}",
        [("act", lambda: enc.forward(windows, ws_act))],
        xp=cp,
    )
    act.capture()
    reencode = cuda_time_us(act.replay, act.stream, args.repeats)
    rows.append(
        row(tag, f"acting, {s['envs']} envs, re-encoding the {s['W']}-bar window (graph replay)", reencode, "us")
    )
    return rows, replay, first, online


def probe_rows(kind: str, tf32: bool, by_algo: dict) -> list:
    """``net.gemm_algo = "probe"`` against ``"heuristic"``: the step's speed-up, whether psi and the gradients
    of the first eager step are the same bits, and how many probed plans run another algorithm."""
    from cudarl import blas

    (t_h, f_h), (t_p, f_p) = by_algo["heuristic"], by_algo["probe"]
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(f_h, f_p, strict=True))
    probed = [p for p in blas.batched_plan_info().values() if p["batch"] == 1 and p["tf32"] == tf32]
    tag = f"cudarl {kind} {'tf32' if tf32 else 'fp32'}, probe vs heuristic"
    return [
        row(tag, "encoder step (graph replay) speed-up", t_h / t_p, "x"),
        row(tag, "psi and gradients bitwise equal", int(same), "", "1"),
        row(
            tag,
            "probed plans (all kinds so far) / on another algorithm",
            len(probed),
            "",
            f"{sum(p['changed'] for p in probed)} changed",
        ),
    ]


# --- PyTorch -------------------------------------------------------------------------------------------
def torch_arms(kind: str, s: dict, x_np, x1_np, dpsi_np, P: dict, args, tf32: bool = False, compile_: bool = False):
    """Rows of the twin's encoder step and windowed acting, its graph replay time (None on the CPU), its eager
    step's (psi, grads in the twin's order), and the arm's name."""
    import torch
    import torch_encoders as te
    from torch_c51 import torch_time_us

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a = shapes(kind, s)
    build = te.ssm_encoder if kind == "ssm" else te.attention_encoder
    online, target = build(s["F"], **a), build(s["F"], **a)
    te.load_cudarl_params(online, P)
    te.load_cudarl_params(target, P)
    online, target = online.to(dev), target.to(dev)
    target.requires_grad_(False)
    fo, ft = (torch.compile(m) for m in (online, target)) if compile_ else (online, target)
    x, x1, dpsi = (torch.from_numpy(v).to(dev) for v in (x_np, x1_np, dpsi_np))
    out = {}

    def step():
        psi = fo(x)
        psi.backward(dpsi)
        with torch.no_grad():
            out["s1"] = fo(x1)
            out["t1"] = ft(x1)
        out["psi"] = psi.detach()

    tag = f"pytorch {kind}{' compile' if compile_ else ''} {'tf32' if tf32 else 'fp32'}"
    for p in online.parameters():
        p.grad = None
    step()
    first = (out["psi"].cpu().numpy(), [p.grad.detach().cpu().numpy().copy() for p in online.parameters()])
    rows = []
    if dev.type != "cuda":
        rows.append(row(tag, "first step (CPU smoke run)", "ok", ""))
        return rows, None, first, tag
    if not compile_:
        rows.append(row(tag, "encoder step eager", torch_time_us(step, args.repeats), "us"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replay = torch_time_us(graph.replay, args.repeats)
    rows.append(row(tag, "encoder step (CUDA graph replay)", replay, "us"))
    # windowed acting: the last W bars of every environment, no gradient
    xa = torch.from_numpy(np.random.default_rng(1).standard_normal((s["envs"], s["W"], s["F"])).astype(np.float32)).to(
        dev
    )

    def act():
        with torch.no_grad():
            out["act"] = fo(xa)

    if not compile_:
        rows.append(row(tag, f"acting, {s['envs']} envs, window forward eager", torch_time_us(act, args.repeats), "us"))
    ga = torch.cuda.CUDAGraph()
    act()
    torch.cuda.synchronize()
    with torch.cuda.graph(ga):
        act()
    rows.append(
        row(tag, f"acting, {s['envs']} envs, window forward (CUDA graph)", torch_time_us(ga.replay, args.repeats), "us")
    )
    return rows, replay, first, tag


# --- the whole step against the twin --------------------------------------------------------------------------
def step_check(kind: str, s: dict, xp) -> dict:
    """tools/bench_step.py's ``step_check`` of an agent with ``net.encoder = kind`` at :func:`shapes` of ``s``
    (batch ``s["B"]``, ``s["F"]`` columns a bar, the reference workload's C51 head, no PopArt) on ``xp``, against
    the PyTorch step over its Q-network twins on CUDA if torch sees it, else the CPU. Its result, with
    ``cudarl`` and ``torch`` (where each ran)."""
    import torch
    from bench_step import A
    from bench_step import step_check as check

    from cudarl.agent import Agent
    from cudarl.bench import reference_config

    net = {"encoder": kind, **{NET_FIELDS[k]: v for k, v in shapes(kind, s).items()}}
    gpu = xp.__name__ == "cupy"
    cfg = reference_config("gpu" if gpu else "cpu", net=net, agent={"popart": False, "batch_size": s["B"]})
    agent = Agent(cfg, s["W"] * s["F"], A, 1, xp)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {**check(agent, device), "cudarl": xp.__name__, "torch": device}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--kind", choices=["ssm", "attention", "both"], default="both")
    ap.add_argument("--small", action="store_true", help="tiny shapes: a smoke run")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch arms and the check")
    ap.add_argument("--chunk", type=int, default=Config().net.ssm_chunk, help="ssm: the training scan's chunk")
    ap.add_argument(
        "--gemm-algo",
        choices=["heuristic", "probe", "both"],
        default=Config().net.gemm_algo,
        help="net.gemm_algo of cudarl's arms; both: each, with the probe's speed-up and whether its bits are the same",
    )
    args = ap.parse_args()
    s = dict(SMALL if args.small else FULL, chunk=args.chunk)
    rng = np.random.default_rng(0)
    x_np, x1_np = (rng.standard_normal((s["B"], s["W"], s["F"])).astype(np.float32) for _ in range(2))
    dpsi_np = (rng.standard_normal((s["B"], s["d"])) / s["B"]).astype(np.float32)
    from cudarl.backend import cupy_unavailable_reason

    why = cupy_unavailable_reason()
    rows, extra = [], {"workload": s}
    peak = None
    if why:
        rows.append(row("cudarl", "skipped", why[:60], ""))
    else:
        peak = fp32_peak_tflops()
        rows.append(row("device", "FP32 peak (SMs x 128 x 2 x clock)", peak, "TFLOP/s"))
    for kind in ("ssm", "attention") if args.kind == "both" else (args.kind,):
        a = shapes(kind, s)
        fwd = forward_flops(kind, s["F"], a) * s["B"]
        step_flops = fwd * 5  # forward + backward (2 forwards' worth, the convention) + two more forwards
        rows.append(row(kind, "step FLOPs (forward from shapes, x5)", step_flops / 1e9, "GFLOP"))
        run_flops = forward_flops(kind, s["F"], a, as_run=True) * s["B"] * 5
        if run_flops != step_flops:
            rows.append(row(kind, "step FLOPs as run (top block: last bar)", run_flops / 1e9, "GFLOP"))
        ours, P, first = {}, None, None
        algos = ("heuristic", "probe") if args.gemm_algo == "both" else (args.gemm_algo,)
        for tf32 in (False, True) if not why else ():
            by_algo = {}
            for algo in algos:
                tag = f"cudarl {kind} {'tf32' if tf32 else 'fp32'}{'' if algo == 'heuristic' else ' ' + algo}"
                try:
                    r, replay, f, online = cudarl_step(kind, s, x_np, x1_np, dpsi_np, tf32, args, algo)
                    rows += r
                    by_algo[algo] = (replay, f)
                    tflops = run_flops / (replay * 1e-6) / 1e12
                    rows.append(row(tag, "achieved (step)", tflops, "TFLOP/s", f"{tflops / peak:.1%} of FP32 peak"))
                    if algo == algos[0]:
                        ours[tf32] = replay
                    if not tf32 and algo == algos[0]:
                        P, first = online.P, f
                        online_layout = online.layout
                except Exception as exc:
                    _failed(rows, tag, exc)
            if len(by_algo) == 2:
                rows += probe_rows(kind, tf32, by_algo)
        if args.no_torch:
            continue
        if P is None:  # no GPU: the twin on cudarl's initial weights (NumPy)
            from cudarl.nn.encoders import Standalone

            st = Standalone(make_encoder(kind, s["F"], **a), np, np.float32, seed=0)
            P, online_layout = st.P, st.layout
        for tf32, compile_ in ((False, False), (True, False)) + (((False, True),) if args.torch_compile else ()):
            try:
                r, t_replay, t_first, t_tag = torch_arms(kind, s, x_np, x1_np, dpsi_np, P, args, tf32, compile_)
                rows += r
                if t_replay and tf32 in ours:
                    rows.append(row(f"cudarl {kind}", f"speed-up vs {t_tag} graph", t_replay / ours[tf32], "x"))
                if first is not None and not tf32 and not compile_:
                    import torch_encoders as te

                    build = te.ssm_encoder if kind == "ssm" else te.attention_encoder
                    twin = build(s["F"], **a)
                    g = {e.name: first[1][e.offset : e.offset + e.size].reshape(e.shape) for e in online_layout.entries}
                    want = te.cudarl_grads_like(twin, g)
                    num = sum(float(np.sum((w - t) ** 2)) for w, t in zip(want, t_first[1], strict=True))
                    den = sum(float(np.sum(t**2)) for t in t_first[1])
                    e_psi = float(np.linalg.norm(first[0] - t_first[0]) / np.linalg.norm(t_first[0]))
                    rows.append(row(f"check {kind}", "psi rel. error vs torch", e_psi, "", "<= 1e-5"))
                    rows.append(row(f"check {kind}", "grads rel. error vs torch", (num / den) ** 0.5, "", "<= 1e-4"))
            except Exception as exc:
                _failed(rows, f"pytorch {kind}", exc)
        try:
            from bench_step import check_rows

            from cudarl.backend import select

            got = step_check(kind, s, select("numpy" if why else "cupy").xp)
            rows += check_rows(f"check {kind}", got)
            extra.setdefault("step_check", {})[kind] = got
        except Exception as exc:
            _failed(rows, f"check {kind}, whole step", exc)
    report("bench_encoders", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
