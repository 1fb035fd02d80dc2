"""Evaluation outputs: summary.json, equity.csv, trades.csv and, with matplotlib, equity.png."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np

from cudarl.data.bars import iso
from cudarl.data.validate import write_json_atomic

from ._metrics import drawdown


def json_safe(obj):
    """Strict JSON: NaN and infinities become ``null`` (JSON has neither), recursively, each with a
    reason in its dict's ``null_reasons`` (kept when the producer gave one, else what the value was)."""
    if isinstance(obj, dict):
        out, reasons = {}, dict(obj.get("null_reasons") or {})
        for k, v in obj.items():
            if k == "null_reasons":
                continue
            if isinstance(v, (float, np.floating)) and not math.isfinite(v):
                reasons.setdefault(k, "undefined (not a number)" if v != v else f"{'+' if v > 0 else '-'}infinite")
            out[k] = json_safe(v)
        if reasons:
            out["null_reasons"] = {k: reasons[k] for k in reasons if out.get(k, 0) is None}
            if not out["null_reasons"]:
                del out["null_reasons"]
        return out
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _write_csv_atomic(path: Path, header, rows) -> None:
    from cudarl.atomic import atomic_open

    with atomic_open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def write_outputs(ev, out_dir, plot: bool = True) -> list[Path]:
    """Write an :class:`Evaluation`'s files into ``out_dir``; return the paths written.

    summary.json: ``ev.summary`` with NaN/inf as null. equity.csv: one row per bar (time,
    position, bar_return, gross, cost, net, equity, buy_and_hold_equity, drawdown).
    trades.csv: one row per trade (entry and exit are bar closes; an open trade's exit is the
    last bar). equity.png: equity against buy-and-hold, drawdown and
    position, when matplotlib is installed and ``plot``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    write_json_atomic(json_safe(ev.summary), out / "summary.json")
    written.append(out / "summary.json")
    eq, bh, dd = ev.equity, np.cumprod(1.0 + ev.buy_and_hold), drawdown(ev.net)
    rows = (
        [
            iso(t),
            f"{p:g}",
            repr(float(r)),
            repr(float(g)),
            repr(float(c)),
            repr(float(n)),
            repr(float(e)),
            repr(float(b)),
            repr(float(d)),
        ]
        for t, p, r, g, c, n, e, b, d in zip(
            ev.time, ev.position, ev.bar_return, ev.gross, ev.costs, ev.net, eq, bh, dd, strict=True
        )
    )
    _write_csv_atomic(
        out / "equity.csv",
        ["time", "position", "bar_return", "gross", "cost", "net", "equity", "buy_and_hold_equity", "drawdown"],
        rows,
    )
    written.append(out / "equity.csv")
    # entered at the close that chose the position; left at the close that chose the next one
    trows = (
        [
            iso(ev.decision_time[t["start"]]),
            iso(ev.time[t["stop"] - 1]),
            "long" if t["side"] > 0 else "short",
            t["bars"],
            repr(t["return"]),
            t["open"],
        ]
        for t in ev.trades
    )
    _write_csv_atomic(out / "trades.csv", ["entry_time", "exit_time", "side", "bars", "return", "open"], trows)
    written.append(out / "trades.csv")
    if plot:
        png = plot_equity(ev, out / "equity.png")
        if png is not None:
            written.append(png)
    return written


def plot_equity(ev, path) -> Path | None:
    """Three panels (equity vs buy-and-hold, drawdown, position); ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    t = ev.time.astype("datetime64[ns]")
    fig, ax = plt.subplots(3, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 1]})
    ax[0].plot(t, ev.equity, label="policy (net of costs)")
    ax[0].plot(t, np.cumprod(1.0 + ev.buy_and_hold), label="buy and hold", alpha=0.8)
    ax[0].set_yscale("log")  # compounding: equal returns look equal at any level
    ax[0].set_ylabel("equity (log)")
    ax[0].legend(loc="upper left")
    s = ev.summary.get("policy", {})
    ax[0].set_title(
        f"{ev.summary.get('split', {}).get('name', '')}: Sharpe {s.get('sharpe', float('nan')):.2f}, "
        f"max drawdown {s.get('max_drawdown', float('nan')):.1%}"
    )
    ax[1].fill_between(t, drawdown(ev.net), 0.0, color="tab:red", alpha=0.5)
    ax[1].set_ylabel("drawdown")
    ax[2].step(t, ev.position, where="post", color="tab:gray")
    ax[2].set_ylabel("position")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
