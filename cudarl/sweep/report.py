"""A sweep's results: per configuration, over its seeds (and folds), ranked by VALIDATION Sharpe.

Each configuration gets the mean, spread and Student-t interval of its trials' Sharpe ratios
(:func:`cudarl.evaluate.seed_summary`), a bootstrap percentile interval of their mean (trials resampled
with replacement), and the deflated Sharpe ratio of each trial's validation returns for the number of
configurations tried ``K`` (:func:`cudarl.evaluate.expected_max_sharpe` with the variance of the
configurations' mean per-bar validation Sharpe; averaged over the configuration's trials). The ranking
reads the validation split only; the test columns stand beside it and choose nothing.
"""

from __future__ import annotations

import csv
import math

import numpy as np

from ..atomic import atomic_open
from ..evaluate import expected_max_sharpe, probabilistic_sharpe_ratio, seed_summary, stationary_bootstrap

SPLIT_COLUMNS = ("sharpe", "psr", "total_return", "max_drawdown", "trades", "trading", "buy_and_hold_sharpe")


def bootstrap_mean_interval(values, level: float, resamples: int, seed: int = 0):
    """Percentile interval of the mean of ``values`` over ``resamples`` resamples with replacement
    (the stationary bootstrap with block length 1); None for fewer than 2 finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    if v.size < 2:
        return None
    means = v[stationary_bootstrap(v.size, 1.0, resamples, seed)].mean(axis=1)
    a = (1.0 - level) / 2.0
    return [float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))]


def _per_bar(rec: dict, split: str):
    s = rec[split]
    if s["sharpe"] is None or not s.get("bars"):
        return None
    return s["sharpe"] / math.sqrt(rec["periods_per_year"])


def trial_dsr(records: list[dict]) -> dict[str, float]:
    """Each trial's deflated validation Sharpe ratio for ``K`` = the configurations among ``records``."""
    by_cfg: dict[int, list] = {}
    for r in records:
        by_cfg.setdefault(r["config_id"], []).append(_per_bar(r, "val"))
    means = [np.mean([x for x in v if x is not None]) for v in by_cfg.values() if any(x is not None for x in v)]
    k = max(1, len(by_cfg))
    out = {}
    for r in records:
        sr, s = _per_bar(r, "val"), r["val"]
        if sr is None or s["skew"] is None or s["kurtosis"] is None:
            out[r["key"]] = math.nan
            continue
        var = float(np.var(means, ddof=1)) if len(means) > 1 else 1.0 / (s["bars"] - 1)
        sr0 = expected_max_sharpe(k, var)
        out[r["key"]] = probabilistic_sharpe_ratio(sr, s["bars"], s["skew"], s["kurtosis"], sr0)
    return out


def summarise(records: list[dict], level: float = 0.95, resamples: int = 1000) -> list[dict]:
    """One row per configuration, ranked by mean validation Sharpe (undefined last)."""
    dsr = trial_dsr(records)
    rows = []
    for cid in sorted({r["config_id"] for r in records}):
        mine = [r for r in records if r["config_id"] == cid]
        row = {"config_id": cid, "params": mine[0]["params"], "trials": len(mine)}
        for split in ("val", "test"):
            vals = [r[split]["sharpe"] for r in mine]
            row[split] = {
                "sharpe": seed_summary(vals, level),
                "sharpe_bootstrap_interval": bootstrap_mean_interval(vals, level, resamples, seed=cid),
                "psr_mean": _mean([r[split]["psr"] for r in mine]),
                "flat": sum(not r[split]["trading"] or r[split]["sharpe"] is None for r in mine),
            }
        row["val"]["dsr_mean"] = _mean([dsr[r["key"]] for r in mine])
        row["val"]["dsr_trials"] = len({r["config_id"] for r in records})
        rows.append(row)
    rows.sort(key=lambda x: -x["val"]["sharpe"]["mean"] if math.isfinite(x["val"]["sharpe"]["mean"]) else math.inf)
    for i, row in enumerate(rows, start=1):
        row["rank"] = i
    return rows


def _mean(xs) -> float:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _f(v, spec=".2f") -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, spec)


def _params(p: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in p.items()) or "(base)"


def table_lines(rows: list[dict]) -> list[str]:
    """The ranked table: validation columns (what ranks) and test beside them (never used to choose)."""
    out = [
        "rank  config  trials  VAL Sharpe mean ± sd  [bootstrap]      DSR   "
        "| test Sharpe mean ± sd  [bootstrap]    flat  | params"
    ]
    for r in rows:
        v, t = r["val"], r["test"]
        vb, tb = v["sharpe_bootstrap_interval"] or (None, None), t["sharpe_bootstrap_interval"] or (None, None)
        out.append(
            f"{r['rank']:>4}  c{r['config_id']:<5}  {r['trials']:>6}  "
            f"{_f(v['sharpe']['mean']):>8} ± {_f(v['sharpe']['sd']):<5} [{_f(vb[0])}, {_f(vb[1])}]  "
            f"{_f(v['dsr_mean']):>6}   | {_f(t['sharpe']['mean']):>8} ± {_f(t['sharpe']['sd']):<5} "
            f"[{_f(tb[0])}, {_f(tb[1])}]  {t['flat']:>4}  | {_params(r['params'])}"
        )
    out.append(
        "ranked by validation Sharpe; pick from the validation columns only (the test columns are the "
        f"held-out check); DSR: deflated for {rows[0]['val']['dsr_trials'] if rows else 0} configurations"
    )
    return out


def write_csv(records: list[dict], path, dsr: dict) -> None:
    """``sweep.csv``: one row per trial."""
    keys = sorted({k for r in records for k in r["params"]})
    head = ["key", "config_id", "fold", "seed", *keys]
    head += [f"val_{c}" for c in SPLIT_COLUMNS] + ["val_dsr"] + [f"test_{c}" for c in SPLIT_COLUMNS]
    head += ["step", "guard_stop", "population", "worker_host", "weights_sha256", "policy"]
    with atomic_open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in sorted(records, key=lambda x: (x["config_id"], x["fold"] or 0, x["seed"])):
            row = [r["key"], r["config_id"], "" if r["fold"] is None else r["fold"], r["seed"]]
            row += [json_cell(r["params"].get(k)) for k in keys]
            row += [json_cell(r["val"][c]) for c in SPLIT_COLUMNS] + [json_cell(dsr.get(r["key"]))]
            row += [json_cell(r["test"][c]) for c in SPLIT_COLUMNS]
            row += [r["step"], r.get("guard_stop") or "", r["population"], r["worker"]["host"]]
            row += [r["weights_sha256"], r["policy"]]
            w.writerow(row)


def json_cell(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


def plot(records: list[dict], rows: list[dict], path) -> bool:
    """``sweep.png``: each trial's validation Sharpe against its test Sharpe, coloured by configuration,
    with the line y = x; False (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from ..atomic import temporary_name

    fig, ax = plt.subplots(figsize=(6, 5))
    ranked = [r["config_id"] for r in rows]
    cmap = plt.get_cmap("viridis", max(2, len(ranked)))
    lim, flat = [], 0
    for i, cid in enumerate(ranked):
        pts = [(r["val"]["sharpe"], r["test"]["sharpe"]) for r in records if r["config_id"] == cid]
        flat += sum(a is None or b is None for a, b in pts)
        pts = [(a, b) for a, b in pts if a is not None and b is not None]
        if pts:
            x, y = zip(*pts, strict=True)
            ax.scatter(x, y, color=cmap(i), s=18, label=f"c{cid}" if i < 10 else None)
            lim += [*x, *y]
    if lim:
        lo, hi = min(lim), max(lim)
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel("validation Sharpe (what the ranking reads)")
    ax.set_ylabel("test Sharpe (held out)")
    ax.set_title("sweep: validation against test, one point a trial" + (f" ({flat} flat not shown)" if flat else ""))
    if lim:
        ax.legend(fontsize=7, title="rank order", loc="best")
    tmp = temporary_name(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return True
