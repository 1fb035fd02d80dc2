#!/usr/bin/env python3
"""Is a market's signal learnable from the agent's observation window, and does the agent's MLP body
memorise the training bars? Supervised probes, no reinforcement learning (issue 22, point 6).

For each decision bar t of a split: the observation the env gathers there (:class:`cudarl.window.Windows`
on a flat state row, ``net.window`` bars of normalised features) and the return a long position taken at
t earns (the env's ``bar_returns``: filled at the next open). Then, fitted on the training split:

- ``ols``: least squares on every input; ``ridge``: with a penalty of one per training row on each
  (standardised) input, a unit prior chosen before looking at any result;
- ``mlp`` (PyTorch, optional): the agent's MLP body (``net.hidden``, ReLU) with one linear output, Adam
  (``optim.lr``, ``optim.weight_decay`` decoupled, on weights only), mean squared error on the return
  scaled to unit variance, ``agent.batch_size`` rows drawn uniformly per update, ``run.steps`` updates:
  the number of updates and the batch of the agent's learner, on the one target every action's value
  shares. Evaluated at every tenth of the budget.
- ``ssm`` and ``attention`` (PyTorch, ``--body``): the same fit with the temporal encoder's PyTorch twin
  (tools/torch_encoders.py; ``net.d_model``, ``net.layers`` and the encoder's ``ssm_*`` / ``attn_*`` fields,
  cudarl's initial parameters of the seed) reading the window as ``[window, F + 2]`` bars, psi -> one
  linear output: can the encoder extract the signal, or does it memorise, at the agent's budget?

Each fit reports the correlation of its forecast with the return on train (how much of the training
noise it has memorised: the best causal forecast's is about the signal's own, ``phi`` on ``builtin:lag``)
and on validation, and the test Sharpe of trading its sign (:func:`cudarl.evaluate.evaluate_positions`,
the env's costs and fills), beside the causal reference's on the same bars when the market has one.

    python3 tools/probe_window.py --source "builtin:lag?n=20000" --window 64            # GPU defaults
    python3 tools/probe_window.py --source "builtin:lag?n=20000" --window 64 --cpu      # CPU defaults
    python3 tools/probe_window.py ... --set optim.weight_decay=1.0 --seeds 2 --jsonl out.jsonl
    python3 tools/probe_window.py ... --body ssm --body attention --threads 1   # the temporal encoders
    python3 tools/probe_window.py ... --body ssm --device cuda --seeds 3        # the agent's whole budget, on a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import learning_check  # noqa: E402  (the references and the Sharpe of held positions, as the learning check scores them)


def split_windows(prepared, split, window: int):
    """The observations the env gathers at the decision bars ``split.start .. split.stop - 3`` (flat,
    held 0 bars) float32 [S, window * (F + 2)], and the return a long position earns there (fill at the
    next open) float64 [S]."""
    from cudarl.reference.env import bar_returns
    from cudarl.reference.window import BAR, STATE_DIM
    from cudarl.window import Windows

    t = np.arange(split.start, split.stop - 2)
    rows = np.zeros((t.size, STATE_DIM), np.float32)
    rows[:, BAR] = t
    sign = np.where(prepared.sign, -1, 1).astype(np.float32)
    bars = prepared.bars
    ret = bar_returns(np.asarray(bars.open, np.float32), np.asarray(bars.close, np.float32), "open")
    return Windows(prepared.x, sign, window, np).of(rows), ret[t].astype(np.float64)


def ridge_fit(x, y, penalty: float) -> np.ndarray:
    """float64 [D + 1]: ``argmin |[x, 1] b - y|^2 + penalty |b[:D]|^2`` (the intercept not shrunk)."""
    a = np.c_[x, np.ones(len(x))].astype(np.float64)
    reg = penalty * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    return np.linalg.lstsq(a.T @ a + reg, a.T @ y, rcond=None)[0]


def ridge_predict(beta, x) -> np.ndarray:
    return np.c_[x, np.ones(len(x))] @ beta


def sign_sharpe(prepared, split, forecast, env) -> float:
    """Test Sharpe (annualised) of holding ``sign(forecast)`` with the env's costs and fills."""
    s = learning_check.positions_sharpe(prepared.bars, np.sign(forecast), split, env, prepared.periods_per_year)
    return float(s) if s is not None else float("nan")


def reference_sharpe(prepared, split, env) -> float | None:
    """The causal reference's Sharpe on ``split`` (None for a market without one)."""
    refs = learning_check.references(prepared.bars, split, env, prepared.periods_per_year)
    return float(refs["causal"]["sharpe"]) if refs else None


def corr(a, b) -> float:
    return float(np.corrcoef(a, b)[0, 1]) if np.std(a) > 0 else float("nan")


#: The supervised bodies: the agent's MLP over the flat window, and the PyTorch twins of the temporal encoders.
BODIES = ("mlp", "ssm", "attention")


def body(cfg, bar: int, kind: str, seed: int):
    """``(net, decayed)``: ``kind``'s body over a window of ``cfg.net.window`` bars ``bar`` wide, flat rows
    in, one linear output, and the parameters weight decay applies to. ``mlp``: ``net.hidden`` with ReLU,
    PyTorch's initialisation (seeded); ``ssm`` and ``attention``: the encoder's PyTorch twin
    (tools/torch_encoders.py) of ``net.d_model``, ``net.layers`` and its own ``ssm_*`` / ``attn_*`` fields,
    initialised as cudarl initialises that encoder with ``seed`` (its decay flags too), reading the flat
    row as ``[window, bar]`` bars, oldest first, as cudarl's encoders do; psi -> the output."""
    import torch

    torch.manual_seed(seed)
    net, W = cfg.net, cfg.net.window
    if kind == "mlp":
        layers, width = [], W * bar
        for h in net.hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
        return model, [p for p in model.parameters() if p.ndim > 1]
    import torch_encoders as te

    from cudarl.nn.encoders import ENCODERS, Standalone

    enc = ENCODERS[kind]("enc", W * bar, net)
    own = (
        dict(expand=net.ssm_expand, d_state=net.ssm_state, headdim=net.ssm_headdim, groups=net.ssm_groups,
             conv_kernel=net.ssm_conv, chunk=net.ssm_chunk)
        if kind == "ssm" else dict(heads=net.attn_heads, mlp_ratio=net.attn_mlp_ratio)
    )  # fmt: skip
    make = te.ssm_encoder if kind == "ssm" else te.attention_encoder
    twin = make(bar, window=W, d_model=net.d_model, layers=net.layers, **own)
    s = Standalone(enc, np, np.float64, seed=seed)
    te.load_cudarl_params(twin, s.P)
    decays = {e.name for e in s.layout.entries if e.decay}
    decayed = [p for p, name, _ in te.param_pairs(twin) if name in decays]
    model = torch.nn.Sequential(torch.nn.Unflatten(1, (W, bar)), twin, torch.nn.Linear(net.d_model, 1))
    return model, decayed + [model[2].weight]


def forecast(net, x, rows: int = 256, device: str = "cpu") -> np.ndarray:
    """float64 [S]: the body's output on x [S, D], ``rows`` at a time (no gradient), on ``device``."""
    import torch

    with torch.no_grad():
        parts = [net(torch.from_numpy(x[i : i + rows]).to(device))[:, 0].cpu().numpy() for i in range(0, len(x), rows)]
    return np.concatenate(parts)


def corrupt(xb, gen, noise: float, dropout: float, bar: int, update: int = 0, seed: int = 0):
    """The training batch's inputs corrupted (float32 [B, W * bar]; the feature columns of each bar only, the
    two position columns kept). ``noise``: the agent's own input noise (``agent.input_noise``:
    :func:`cudarl.reference.window.noise`, zero-mean, that standard deviation, keyed by ``update`` and
    ``seed``); then ``dropout``: each feature kept with probability ``1 - dropout`` and scaled by
    ``1 / (1 - dropout)`` (inverted dropout; not a library mechanism). For a linear body on standardised
    inputs both are ridge in expectation: noise of variance s^2 adds ``N s^2 |b|^2`` (Bishop 1995), dropout
    ``N p / (1 - p) |b|^2`` (Wager et al. 2013), so ``noise = 1`` or ``dropout = 0.5`` is this tool's ridge
    penalty of one per row."""
    import torch

    from cudarl.reference import window

    if noise == 0 and dropout == 0:
        return xb
    b = xb.shape[0]
    if noise:
        x = xb.detach().cpu().numpy().copy()
        window.noise(x, np.array([update], np.int64), x.shape[1] // bar, bar - 2, window.noise_scale(noise), seed)
        xb = torch.from_numpy(x).to(xb.device)
    x = xb.reshape(b, -1, bar).clone()
    if dropout:
        f = x[:, :, : bar - 2]
        keep = (torch.rand(f.shape, generator=gen) >= dropout).to(x.device, x.dtype)
        f *= keep / (1.0 - dropout)
    return x.reshape(b, -1)


def fit_curve(
    cfg, data: dict, seed: int, kind: str = "mlp", points: int = 10, device: str = "cpu",
    noise: float = 0.0, dropout: float = 0.0,
) -> list[dict]:  # fmt: skip
    """The supervised twin of ``kind``'s body (module docstring; :func:`body`) trained on ``data["train"]``
    on ``device`` (torch's name: ``cpu``, ``cuda``; the batches' rows are drawn on the CPU either way, so a
    seed draws the same rows on both), its batches' inputs corrupted by :func:`corrupt`; a row at every
    ``1 / points`` of the budget: the update, the train and validation correlations, and the validation
    forecast."""
    import torch

    x, y = data["train"]
    X, Y = torch.tensor(x, device=device), torch.tensor(y / y.std(), dtype=torch.float32, device=device)
    bar = x.shape[1] // cfg.net.window
    net, decayed = body(cfg, bar, kind, seed)
    net.to(device)  # in place: decayed still names its parameters
    ids = {id(p) for p in decayed}
    opt = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": cfg.optim.weight_decay},
         {"params": [p for p in net.parameters() if id(p) not in ids], "weight_decay": 0.0}],
        lr=cfg.optim.lr,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    steps, batch = cfg.run.steps, cfg.agent.batch_size
    out, t0 = [], time.perf_counter()
    for k in range(1, steps + 1):
        i = torch.randint(0, len(X), (batch,), generator=gen).to(device)
        loss = ((net(corrupt(X[i], gen, noise, dropout, bar, k, seed))[:, 0] - Y[i]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if k % max(steps // points, 1) == 0 or k == steps:
            f = {s: forecast(net, v[0], device=device).astype(np.float64) for s, v in data.items()}
            out.append({"update": k, **{f"{s}_corr": corr(f[s], data[s][1]) for s in data}, "forecast": f})
            c = out[-1]
            print(f"{kind} seed {seed}: update {k}, corr train {c['train_corr']:.3f} val {c['val_corr']:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return out


#: The config fields (``net.*``) each body's row records.
WIDTHS = {
    "mlp": ("hidden",),
    "ssm": ("d_model", "layers", "ssm_expand", "ssm_state", "ssm_headdim", "ssm_groups", "ssm_conv", "ssm_chunk"),
    "attention": ("d_model", "layers", "attn_heads", "attn_mlp_ratio"),
}


def body_fields(cfg, kind: str) -> dict:
    """The row's record of a body's widths (:data:`WIDTHS`)."""
    return {f: list(v) if isinstance(v := getattr(cfg.net, f), tuple) else v for f in WIDTHS[kind]}


def probe(cfg, seeds, bodies=("mlp",), device: str = "cpu", noise: float = 0.0, dropout: float = 0.0) -> list[dict]:
    """The linear probes' rows, then one row per body in ``bodies`` (:data:`BODIES`) and seed, fitted on
    ``device`` with its training inputs corrupted (:func:`corrupt`)."""
    from cudarl.prepare import prepare_data

    p = prepare_data(cfg)
    w = cfg.net.window
    data = {s: split_windows(p, getattr(p.splits, s), w) for s in ("train", "val", "test")}
    test = p.splits.test
    base = {
        "source": p.bars.source,
        "window": w,
        "inputs": int(data["train"][0].shape[1]),
        "train_rows": len(data["train"][1]),
        "reference_test_sharpe": reference_sharpe(p, test, cfg.env),
    }
    rows = []
    for name, penalty in (("ols", 0.0), ("ridge", float(len(data["train"][1])))):
        beta = ridge_fit(*data["train"], penalty)
        f = {s: ridge_predict(beta, v[0]) for s, v in data.items()}
        rows.append(
            {**base, "fit": name, "penalty": penalty, **{f"{s}_corr": corr(f[s], data[s][1]) for s in data},
             "test_sign_sharpe": sign_sharpe(p, test, f["test"], cfg.env)}
        )  # fmt: skip
    for kind in bodies:
        for seed in seeds:
            t0 = time.perf_counter()
            curve = fit_curve(cfg, data, seed, kind, device=device, noise=noise, dropout=dropout)
            for r in curve:
                r["test_sign_sharpe"] = sign_sharpe(p, test, r.pop("forecast")["test"], cfg.env)
            rows.append(
                {**base, "fit": kind, "seed": seed, **body_fields(cfg, kind), "lr": cfg.optim.lr,
                 "batch": cfg.agent.batch_size, "updates": cfg.run.steps, "weight_decay": cfg.optim.weight_decay,
                 "input_noise": noise, "input_dropout": dropout, "device": device, "curve": curve,
                 "wall_s": time.perf_counter() - t0}
            )  # fmt: skip
    return rows


def _f(x, fmt=".3f") -> str:
    return "—" if x is None or not np.isfinite(x) else format(x, fmt)


def show(rows) -> None:
    ref = rows[0]["reference_test_sharpe"]
    print(f"{rows[0]['source']}, window {rows[0]['window']} ({rows[0]['inputs']} inputs, "
          f"{rows[0]['train_rows']} training rows); causal reference's test Sharpe {_f(ref, '.2f')}")  # fmt: skip
    for r in rows:
        if r["fit"] not in BODIES:
            print(f"  {r['fit']:5} corr train {_f(r['train_corr'])} val {_f(r['val_corr'])} "
                  f"test {_f(r['test_corr'])}; sign test Sharpe {_f(r['test_sign_sharpe'], '.2f')}")  # fmt: skip
            continue
        widths = " ".join(f"{f}={r[f]}" for f in WIDTHS[r["fit"]])
        print(f"  {r['fit']} {widths} lr {r['lr']:g} batch {r['batch']} wd {r['weight_decay']:g} "
              f"noise {r.get('input_noise', 0):g} dropout {r.get('input_dropout', 0):g} seed {r['seed']} "
              f"({r['wall_s']:.0f} s): update, corr train / val / test, sign test Sharpe")  # fmt: skip
        for c in r["curve"]:
            print(f"    {c['update']:6d}  {_f(c['train_corr'])} / {_f(c['val_corr'])} / {_f(c['test_corr'])}  "
                  f"{_f(c['test_sign_sharpe'], '.2f')}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="builtin:lag?n=20000")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--cpu", action="store_true", help="the CPU defaults (config.CPU_DEFAULTS), not the GPU ones")
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument(
        "--body",
        action="append",
        choices=BODIES,
        default=None,
        help="a supervised body to fit (repeat for several; default: mlp)",
    )
    ap.add_argument(
        "--linear-only",
        "--no-mlp",
        dest="linear_only",
        action="store_true",
        help="the linear probes only, no PyTorch body (--no-mlp: its former name); refused with --body",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: its default)")
    ap.add_argument("--device", default="cpu", help="where the bodies train: torch's device name (cpu, cuda)")
    ap.add_argument("--input-noise", type=float, default=0.0, help="agent.input_noise's std on training features")
    ap.add_argument("--input-dropout", type=float, default=0.0, help="share of the training batches' features zeroed")
    ap.add_argument("--jsonl", type=Path, default=None, help="append the rows here")
    a = ap.parse_args()
    if a.linear_only and a.body:
        ap.error("--linear-only (--no-mlp) fits no body: drop it, or drop --body")

    from cudarl.config import from_dict, parse_override, resolve_for_backend
    from cudarl.evaluate import json_safe

    over: dict = {"data": {"source": a.source}, "net": {"window": a.window}}
    for s in a.set:
        sec, field, value = parse_override(s)
        over.setdefault(sec, {})[field] = value
    cfg = resolve_for_backend(from_dict(over), not a.cpu, over)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    bodies = () if a.linear_only else (a.body or ["mlp"])
    if a.input_noise < 0 or not 0 <= a.input_dropout < 1:
        ap.error("--input-noise must be >= 0 and --input-dropout in [0, 1)")
    rows = probe(cfg, range(a.first_seed, a.first_seed + a.seeds), bodies, a.device, a.input_noise, a.input_dropout)
    show(rows)
    if a.jsonl is not None:
        with a.jsonl.open("a") as fh:
            for r in rows:
                fh.write(json.dumps(json_safe({**r, "sets": a.set, "cpu": a.cpu}), allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
