#!/usr/bin/env python3
"""Forward + backward + Adam of the reference model (DESIGN.md): cudarl eager and replayed, PyTorch eager and graphed.

Model: 64 features -> MLP 256-256 (ReLU) -> dueling C51 (3 actions x 51 atoms), batch 512.
A step is forward, backward from a fixed logit gradient, global-norm clipping and Adam.
Times are medians of CUDA-event intervals per step on one stream (``--repeats`` samples of
``--inner`` back-to-back steps). ``--torch-compile`` adds a ``torch.compile`` arm in a CUDA graph.
The cudarl arms run with the default forward GEMM (cuBLAS, then the bias/activation kernel) and
with ``gemm="cublaslt"`` (one cuBLASLt GEMM with the bias and ReLU in its epilogue), fp32 and TF32.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row  # noqa: E402

F, H, A, Z, B = 64, 256, 3, 51, 512
LR, CLIP = 1e-4, 10.0


def cudarl_arms(args, x_np, d_np, tf32: bool, gemm: str = "cublas"):
    """Rows of one cudarl arm, its network, its graph replay time and the logits of its first forward."""
    import cupy as cp

    from cudarl.graph import StepGraph
    from cudarl.nn import QNetwork
    from cudarl.optim import Adam, Schedule

    net = QNetwork(F, A, hidden=(H, H), head="c51", atoms=Z, xp=cp, max_batch=B, seed=0, tf32=tf32, gemm=gemm)
    opt = Adam(
        net.params,
        net.grads,
        schedule=Schedule("cosine", lr=LR, period=1_000_000),
        max_grad_norm=CLIP,
        decay_mask=net.layout.decay_mask(),
    )
    x = cp.asarray(x_np)
    logits0 = net.forward(x)["q"].get()  # sizes the workspace views once
    net.grad_outputs()["q"][...] = cp.asarray(d_np)  # the loss would write this; backward only reads it
    cp.cuda.Device().synchronize()
    lt = gemm == "cublaslt"
    g = StepGraph(
        "bench_nets" + ("_tf32" if tf32 else "") + ("_lt" if lt else ""),
        [
            ("forward", lambda: net.forward(x)),
            ("backward", lambda: net.backward(x)),
            ("adam", opt.step),
        ],
        xp=cp,
    )
    tag = "cudarl" + (" tf32" if tf32 else " fp32") + (" cublasLt epilogue" if lt else "")
    eager = cuda_time_us(g.run_eager, g.stream, args.repeats, inner=args.inner)
    g.capture()
    replay = cuda_time_us(g.replay, g.stream, args.repeats, inner=args.inner)
    phases = g.profile(args.repeats)
    rows = [row(tag, "eager", eager, "us"), row(tag, "graph replay", replay, "us", "")]
    rows += [row(tag, f"phase {k} (replay)", v * 1e3, "us") for k, v in phases.items() if k != "total"]
    return rows, net, replay, logits0


def torch_arms(args, x_np, d_np, net_params: dict, compile_: bool = False):
    import torch
    from torch_c51 import dueling_c51, load_cudarl_params, torch_time_us

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    model = dueling_c51(F, (H, H), A, Z)
    load_cudarl_params(model, net_params)  # the same weights as cudarl
    model = model.to(dev)
    fwd = torch.compile(model) if compile_ else model
    opt = torch.optim.Adam(model.parameters(), lr=LR, capturable=True, foreach=True)
    x, d = torch.from_numpy(x_np).to(dev), torch.from_numpy(d_np).to(dev)
    logits0 = model(x).detach().cpu().numpy()

    def step():
        out = fwd(x)
        out.backward(d)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=True)
        opt.step()

    tag = "pytorch" + (" compile" if compile_ else "") + " fp32"
    rows = []

    def eager_step():
        opt.zero_grad(set_to_none=True)
        step()

    if not compile_:
        rows.append(row(tag, "eager", torch_time_us(eager_step, args.repeats, inner=args.inner), "us"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    rows.append(row(tag, "CUDA graph replay", torch_time_us(graph.replay, args.repeats, inner=args.inner), "us"))
    return rows, logits0


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--inner", type=int, default=20, help="steps per timed interval")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch arms")
    args = ap.parse_args()
    import cupy as cp

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((B, F)).astype(np.float32)
    d_np = (rng.standard_normal((B, A, Z)) / B).astype(np.float32)
    rows, net, replay, logits_blas = cudarl_arms(args, x_np, d_np, tf32=False)
    # the weights before any step, for the PyTorch arms and the cross-check
    from cudarl.nn import QNetwork

    fresh = QNetwork(F, A, hidden=(H, H), head="c51", atoms=Z, max_batch=B, seed=0)
    logits_cudarl = fresh.forward(x_np)["q"].copy()
    rows += cudarl_arms(args, x_np, d_np, tf32=True)[0]
    # the same arms with the forward GEMMs through cuBLASLt's bias/ReLU epilogue
    lt_rows, _, replay_lt, logits_lt = cudarl_arms(args, x_np, d_np, tf32=False, gemm="cublaslt")
    rows += lt_rows + cudarl_arms(args, x_np, d_np, tf32=True, gemm="cublaslt")[0]
    err_lt = float(np.linalg.norm(logits_lt - logits_blas) / np.linalg.norm(logits_blas))
    rows.append(row("check", "cublasLt logits rel. error vs cuBLAS", err_lt, "", "<= 1e-5"))
    rows.append(row("cudarl fp32 cublasLt epilogue", "speed-up vs cudarl fp32 (graph replay)", replay / replay_lt, "x"))
    extra = {
        "model": f"{F} features, MLP {H}-{H}, dueling C51 {A}x{Z}, batch {B}",
        "inner": args.inner,
        "cublaslt_logits_rel_error_vs_cublas": err_lt,
    }
    if not args.no_torch:
        try:
            t_rows, logits_torch = torch_arms(args, x_np, d_np, fresh.P)
            rows += t_rows
            err = float(np.linalg.norm(logits_torch - logits_cudarl) / np.linalg.norm(logits_cudarl))
            extra["logits_rel_error_vs_torch"] = err
            rows.append(row("check", "logits rel. error vs torch", err, "", "<= 1e-5"))
            torch_graph = [r["value"] for r in t_rows if r["metric"] == "CUDA graph replay"][0]
            rows.append(row("cudarl fp32", "speed-up vs torch graph", torch_graph / replay, "x"))
            if args.torch_compile:
                try:
                    rows += torch_arms(args, x_np, d_np, fresh.P, compile_=True)[0]
                except Exception as exc:  # report, don't lose the other arms
                    rows.append(row("pytorch compile fp32", "failed", type(exc).__name__, ""))
        except ImportError as exc:
            rows.append(row("pytorch", "skipped", str(exc)[:40], ""))
    cp.cuda.Device().synchronize()
    report("bench_nets", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
