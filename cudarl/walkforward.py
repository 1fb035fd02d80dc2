"""Walk-forward evaluation: train and test on K rolling-origin folds, report each fold and the aggregate.

    cudarl-train train builtin:sp500 --walk-forward 4

The folds are :func:`cudarl.splits.walk_forward`'s: the test windows tile the end of the series; fold
``i`` validates on the bars just before its test window and trains on everything before that (an
expanding window from the feature warm-up). Each fold is an ordinary run (its own run directory
``fold-<i>/``, normaliser fitted on its own training bars, checkpoints, evaluations) whose final
policy is evaluated on its test window with the deployment rules of ``[eval]``. The aggregate joins
the folds' test returns, which are adjacent and do not overlap, into one out-of-sample series and
gives its metrics and statistics against buy-and-hold over the same bars; the folds' Sharpe ratios are
summarised by mean, spread and interval. ``walk_forward.json`` holds all of it (strict JSON).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .config import Config
from .data import load as load_bars
from .evaluate import metrics, return_statistics, seed_summary
from .splits import walk_forward


def run_walk_forward(cfg: Config, folds: int, run_dir=None, echo=print, bars=None) -> dict:
    """Train and test ``folds`` folds; returns the report written to ``<run_dir>/walk_forward.json``.

    ``run_dir``: the parent of the folds' run directories (default: a new one,
    ``<run.out_dir>/<name>-wf<K>-<time>-<seed>``; ``False``: write nothing). ``bars``: already loaded
    bars (default: ``cfg.data.source`` with its data options).
    """
    from . import rundir
    from .config import data_options
    from .data.validate import write_json_atomic
    from .evaluate import json_safe
    from .trainer import Trainer

    if bars is None:
        bars = load_bars(cfg.data.source, min_bars=cfg.env.episode_len + 3, **data_options(cfg.data))
    parts = walk_forward(len(bars), folds=folds, warmup=cfg.features.warmup)
    r = cfg.run
    if run_dir is None:
        root = rundir.create(r.out_dir, f"{r.name}-wf{folds}", r.seed)
    else:
        root = None if run_dir is False else rundir.claim(run_dir)
    if root is not None:
        echo(f"walk-forward run directory {root}")
    rows, net, bh = [], [], []
    t0 = time.perf_counter()
    for i, sp in enumerate(parts):
        fold_cfg, note = fold_config(cfg, sp)
        if note:
            echo(f"fold {i}: {note}")
        echo(
            f"fold {i}/{folds}: train [{sp.train.start}, {sp.train.stop}), val [{sp.val.start}, {sp.val.stop}), "
            f"test [{sp.test.start}, {sp.test.stop})"
        )
        tr = Trainer(fold_cfg, run_dir=False if root is None else root / f"fold-{i}", bars=bars, splits=sp, echo=echo)
        tr.run()
        summary = tr.evaluate("test")
        ev = tr.last_evaluation
        net.append(ev.net)
        bh.append(ev.buy_and_hold)
        pol, st = summary["policy"], summary["statistics"]
        rows.append(
            {
                "fold": i,
                "splits": sp.as_dict(),
                "first": summary["split"]["first"],
                "last": summary["split"]["last"],
                "episode_len": fold_cfg.env.episode_len,
                "sharpe": pol["sharpe"],
                "total_return": pol["total_return"],
                "max_drawdown": pol["max_drawdown"],
                "trades": pol.get("trades"),
                "buy_and_hold_sharpe": summary["buy_and_hold"]["sharpe"],
                "sharpe_interval": st.get("sharpe_interval"),
                "psr": st.get("psr"),
                "deployment": summary["deployment"],
                "run_dir": None if tr.run_dir is None else str(tr.run_dir),
            }
        )
    r, b = np.concatenate(net), np.concatenate(bh)
    ppy = tr.data.periods_per_year
    e = cfg.eval
    report = {
        "source": bars.source,
        "folds": rows,
        "aggregate": {
            "bars": int(r.size),
            "policy": metrics(r, ppy),
            "buy_and_hold": metrics(b, ppy),
            "statistics": return_statistics(
                r, ppy, benchmark=b, trials=e.trials, level=e.level, resamples=e.resamples, seed=0
            ),
            "fold_sharpe": seed_summary([row["sharpe"] for row in rows], e.level),
        },
        "wall_s": time.perf_counter() - t0,
    }
    if root is not None:
        write_json_atomic(json_safe(report), root / "walk_forward.json")
    for line in report_lines(report):
        echo(line)
    return report


def fold_config(cfg: Config, sp) -> tuple[Config, str]:
    """``(config, note)``: ``cfg`` for a fold with splits ``sp``, its episodes shortened to fit the fold's
    training bars when they are longer (``note`` says so; empty otherwise)."""
    room = len(sp.train) - 2
    if cfg.env.episode_len <= room:
        return cfg, ""
    note = f"episode_len {cfg.env.episode_len} -> {room} (the fold trains on {len(sp.train)} bars)"
    return replace(cfg, env=replace(cfg.env, episode_len=room)), note


def _f(v, spec=".2f") -> str:
    return "n/a" if v is None or not np.isfinite(v) else format(v, spec)


def report_lines(report: dict) -> list[str]:
    """The printed table: one line per fold, then the aggregate."""
    out = ["fold  test bars                              Sharpe  [interval]        PSR   buy-and-hold  deployed"]
    for row in report["folds"]:
        lo, hi = row["sharpe_interval"] or (None, None)
        out.append(
            f"{row['fold']:>4}  {row['first'][:10]} .. {row['last'][:10]}  {_f(row['sharpe']):>12}  "
            f"[{_f(lo)}, {_f(hi)}]  {_f(row['psr']):>8}  {_f(row['buy_and_hold_sharpe']):>12}  "
            f"{'trading' if row['deployment']['trading'] else 'flat (gate)'}"
        )
    agg = report["aggregate"]
    st, fs = agg["statistics"], agg["fold_sharpe"]
    lo, hi = st.get("sharpe_interval") or (None, None)
    vb = st.get("versus_benchmark") or {}
    div = vb.get("sharpe_difference_interval") or (None, None)
    out.append(
        f"all folds, {agg['bars']} test bars: Sharpe {_f(agg['policy']['sharpe'])} [{_f(lo)}, {_f(hi)}], "
        f"PSR {_f(st.get('psr'))}, DSR {_f(st.get('dsr'))}; buy-and-hold {_f(agg['buy_and_hold']['sharpe'])}, "
        f"difference {_f(vb.get('sharpe_difference'))} [{_f(div[0])}, {_f(div[1])}]"
    )
    iv = fs.get("interval") or (None, None)
    out.append(
        f"fold Sharpe: mean {_f(fs['mean'])}, sd {_f(fs['sd'])}, interval [{_f(iv[0])}, {_f(iv[1])}] "
        f"over {fs['n']} folds" + (f" ({fs['undefined']} flat)" if fs["undefined"] else "")
    )
    return out
