"""The results page of ``tools/learning_check.py``: targets, known-answer markets, deployment rules on
and off, real series and every run, from the rows of one call (docs/results.md)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudarl.evaluate import seed_summary  # noqa: E402


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _f(x, spec=".2f") -> str:
    return format(x, spec) if _finite(x) else "—"


def _pct(x) -> str:
    return f"{100 * x:.0f}%" if _finite(x) else "—"


def noise_ok(r: dict) -> bool:
    """The noise target: |test Sharpe| within 2 standard errors of 0 (a flat policy has no Sharpe and
    meets it) and position changes on at most 1% of the test bars."""
    sh, se = r["test_sharpe"], r.get("test_sharpe_se")
    within = not _finite(sh) or (_finite(se) and abs(sh) <= 2 * se)
    return within and r["test_trade_bars_pct"] <= 1.0


#: kind -> (target text, per-run value shown, per-run pass test) of issue 17's targets.
TARGETS = {
    "observed": (
        ">= 90% of the cost-aware optimum (the causal reference), every seed",
        lambda r: _pct(r.get("fraction_of_causal")),
        lambda r: _finite(r.get("fraction_of_causal")) and r["fraction_of_causal"] >= 0.90,
    ),
    "hidden": (
        ">= 95% of the causal filter's policy, every seed",
        lambda r: _pct(r.get("fraction_of_causal")),
        lambda r: _finite(r.get("fraction_of_causal")) and r["fraction_of_causal"] >= 0.95,
    ),
    "noise": (
        "abs(Sharpe) <= 2 SE and trades on <= 1% of test bars, every seed",
        lambda r: f"{_f(r['test_sharpe'])}/{_f(r.get('test_sharpe_se'))} SE, {_f(r['test_trade_bars_pct'], '.1f')}%",
        noise_ok,
    ),
    "decay": (
        "final validation Sharpe >= 90% of the best over the budget, every seed",
        lambda r: _pct(r.get("decay_ratio")),
        lambda r: _finite(r.get("decay_ratio")) and r["decay_ratio"] >= 0.90,
    ),
    "canary": (
        "held-out Sharpe > 5 (GPU budget; > 2 with --quick)",
        lambda r: _f(r["test_sharpe"]),
        lambda r: _finite(r["test_sharpe"]) and r["test_sharpe"] > (2 if r.get("quick") else 5),
    ),
}


def has_reference(r: dict) -> bool:
    """True when the run's market has a causal reference with an edge (Sharpe > 0) to compare with."""
    ref = (r.get("references") or {}).get("causal") or {}
    return _finite(ref.get("sharpe")) and ref["sharpe"] > 0


def _groups(rows):
    for task in dict.fromkeys(r["task"] for r in rows):
        for head in dict.fromkeys(r["head"] for r in rows if r["task"] == task):
            yield task, head, [r for r in rows if (r["task"], r["head"]) == (task, head)]


def _stat(values, pct=False) -> str:
    s = seed_summary(values)
    if s["n"] == 0:
        return f"— ({s['undefined']} undefined)"
    k = 100.0 if pct else 1.0
    spec = ".0f" if pct else ".2f"
    unit = "%" if pct else ""
    iv = s["interval"]
    text = f"{format(k * s['mean'], spec)}{unit}"
    if s["n"] > 1:
        text += f" ± {format(k * s['sd'], spec)} [{format(k * iv[0], spec)}, {format(k * iv[1], spec)}]"
    if s["undefined"]:
        text += f" ({s['undefined']} flat)"
    return text


def target_lines(rows) -> list[str]:
    out = ["| target | task | head | per seed | met? |", "|---|---|---|---|---|"]
    for task, head, rs in _groups(rows):
        kind = rs[0].get("kind")
        if kind not in TARGETS:
            continue
        what, show, ok = TARGETS[kind]
        met = all(ok(r) for r in rs)
        out.append(
            f"| {what} | {task} | {head} | {', '.join(show(r) for r in rs)} | "
            f"{'met' if met else f'NOT met ({sum(not ok(r) for r in rs)} of {len(rs)} seeds short)'} |"
        )
    return out


def market_lines(rows) -> list[str]:
    out = [
        "| task | head | test Sharpe | % of full information | % of causal | full-info / causal Sharpe | "
        "trades, % of bars | val final / best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task, head, rs in _groups(rows):
        ref = rs[0].get("references") or {}
        edge = has_reference(rs[0])
        refs = f"{_f(ref['full_information']['sharpe'])} / {_f(ref['causal']['sharpe'])}" if "causal" in ref else "—"
        out.append(
            f"| {task} | {head} | {_stat([r['test_sharpe'] for r in rs])} | "
            f"{_stat([r.get('fraction_of_full_information') for r in rs], True) if edge else '—'} | "
            f"{_stat([r.get('fraction_of_causal') for r in rs], True) if edge else '—'} | {refs} | "
            f"{_stat([r['test_trade_bars_pct'] / 100 for r in rs], True)} | "
            f"{_stat([r.get('decay_ratio') for r in rs], True)} |"
        )
    return out


def view_lines(rows) -> list[str]:
    names = list(dict.fromkeys(k for r in rows for k in r.get("views", {})))
    out = [
        "| task | head | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for task, head, rs in _groups(rows):
        cells = []
        for n in names:
            vs = [r["views"][n] for r in rs if n in r.get("views", {})]
            trades = seed_summary([v["trade_bars_pct"] for v in vs])["mean"]
            if has_reference(rs[0]):
                main = f"{_stat([v['fraction_of_causal'] for v in vs], True).split(' ±')[0]} of causal"
                low = min((v["fraction_of_causal"] for v in vs if _finite(v["fraction_of_causal"])), default=math.nan)
                main += f" (min {_pct(low)})"
            else:
                main = f"Sharpe {_f(seed_summary([v['sharpe'] for v in vs])['mean'])}"
            cells.append(f"{main}, trades {_f(trades, '.1f')}%")
        out.append(f"| {task} | {head} | " + " | ".join(cells) + " |")
    return out


def real_lines(rows) -> list[str]:
    out = [
        "| task | head | seed | test Sharpe [interval] | PSR | DSR | buy-and-hold | Sharpe − buy-and-hold [interval], "
        "p(not better) | trades, % of bars | at 3x costs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("kind") != "real":
            continue
        iv = r.get("test_sharpe_interval") or [None, None]
        vb = r.get("test_versus_buy_and_hold") or {}
        div = vb.get("sharpe_difference_interval") or [None, None]
        out.append(
            f"| {r['task']} | {r['head']} | {r['seed']} | {_f(r['test_sharpe'])} [{_f(iv[0])}, {_f(iv[1])}] | "
            f"{_f(r.get('test_psr'))} | {_f(r.get('test_dsr'))} | {_f(r['buy_and_hold_sharpe'])} | "
            f"{_f(vb.get('sharpe_difference'))} [{_f(div[0])}, {_f(div[1])}], {_f(vb.get('p_not_better'))} | "
            f"{_f(r['test_trade_bars_pct'], '.1f')} | {_f(r['test_cost_sweep'].get('3x'))} |"
        )
    return out


def run_lines(rows) -> list[str]:
    out = [
        "| task | head | seed | test Sharpe | SE | PSR | % full info | % causal | trades, % bars | "
        "val Sharpe over training | deployed | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hist = " ".join(_f(s, ".1f") for _, s in r.get("val_history", []))
        dep = r.get("deployment", {})
        out.append(
            f"| {r['task']} | {r['head']} | {r['seed']} | {_f(r['test_sharpe'])} | {_f(r.get('test_sharpe_se'))} | "
            f"{_f(r.get('test_psr'))} | {_pct(r.get('fraction_of_full_information'))} | "
            f"{_pct(r.get('fraction_of_causal'))} | {_f(r['test_trade_bars_pct'], '.1f')} | {hist} | "
            f"{'trading' if dep.get('trading', True) else 'flat (gate)'} | {r['wall_s']:.0f} |"
        )
    return out


def summary_text(rows) -> str:
    lines = ["summary (mean ± sd [95% interval] over seeds):"]
    for task, head, rs in _groups(rows):
        extra = ""
        if has_reference(rs[0]):
            extra = f", {_stat([r['fraction_of_causal'] for r in rs], True)} of causal"
        lines.append(
            f"  {task:10s} {head:4s} test Sharpe {_stat([r['test_sharpe'] for r in rs])}{extra}, "
            f"trades on {_stat([r['test_trade_bars_pct'] / 100 for r in rs], True)} of bars"
        )
    return "\n".join(lines)


def _key_metric(rs: list[dict]) -> str:
    """One cell of the training-mechanism table: the task's target measure over the seeds."""
    ok = [r for r in rs if not r.get("error")]
    if not ok:
        return f"{len(rs)} failed"
    kind = ok[0].get("kind")
    target = TARGETS.get(kind)
    met = f"; target met {sum(target[2](r) for r in ok)}/{len(ok)}" if target else ""
    if kind == "decay":
        vals = [r.get("decay_ratio") for r in ok]
        low = min((v for v in vals if _finite(v)), default=math.nan)
        return f"val final/best {_stat(vals, True).split(' ±')[0]} (min {_pct(low)}){met}"
    if has_reference(ok[0]):
        vals = [r.get("fraction_of_causal") for r in ok]
        low = min((v for v in vals if _finite(v)), default=math.nan)
        return f"{_stat(vals, True).split(' ±')[0]} of causal (min {_pct(low)}){met}"
    trades = seed_summary([r["test_trade_bars_pct"] for r in ok])["mean"]
    return f"Sharpe {_f(seed_summary([r['test_sharpe'] for r in ok])['mean'])}, trades {_f(trades, '.1f')}%{met}"


def screen_lines(rows: list[dict], screen: list[dict]) -> list[str]:
    """Training-side mechanisms on and off: the variants of a tools/sweep.py screen against this check's
    runs of the same tasks (``base``), per task and head."""
    for r in screen:  # a base run of the screen itself is a variant like the others
        r["variant"] = "base (screen)" if r["variant"] == "base" else r["variant"]
    variants = ["base"] + list(dict.fromkeys(r["variant"] for r in screen))
    sets = {r["variant"]: r.get("sets", []) for r in screen}
    tasks = list(dict.fromkeys(r["task"] for r in screen))
    out = [
        "| variant | overrides |",
        "|---|---|",
        "| base | (this page's runs) |",
        *[f"| {v} | {', '.join(f'`{x}`' for x in sets[v] if not x.startswith('eval.trials'))} |" for v in variants[1:]],
        "",
        "| task | head | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for task in tasks:
        for head in dict.fromkeys(r["head"] for r in screen if r["task"] == task):
            cells = []
            for v in variants:
                src = rows if v == "base" else [r for r in screen if r["variant"] == v]
                rs = [r for r in src if (r["task"], r["head"]) == (task, head)]
                cells.append(_key_metric(rs) if rs else "not run")
            out.append(f"| {task} | {head} | " + " | ".join(cells) + " |")
    return out


def read_rows(path) -> list[dict]:
    """Rows of a JSON-lines file (one run a line) or of a learning-check JSON file (its ``rows``)."""
    import json

    text = Path(path).read_text()
    if str(path).endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)["rows"]


def results_markdown(meta: dict, rows: list[dict], failed: list[dict], screen=None) -> str:
    """The results page: method, targets, markets, deployment rules, real series, every run; with
    ``screen`` (tools/sweep.py JSON-lines files: a path or a list) also the training mechanisms' on/off table."""
    from learning_check import BEST_VIEW  # tools/ is on the path of every caller

    budgets = sorted({(r["updates"], r["envs"]) for r in rows})
    for r in rows:
        r["quick"] = meta.get("quick", False)
    out = [
        "# Learning results",
        "",
        f"Written by `tools/learning_check.py --results-md` on {meta['gpu']} (device `{meta['device']}`), commit "
        f"`{meta['commit']}`, {meta['date']}; seeds 0-{meta['seeds'] - 1}, {meta['workers']} worker process(es), "
        f"{_f(meta['wall_s'], '.0f')} s of wall time in all.",
        "Configuration: the defaults (`docs/config.md`) plus each task's settings in `tools/learning_check.py` "
        f"(`TASKS`); overrides: {', '.join(f'`{x}`' for x in meta['sets']) or 'none'}. Budget per run: "
        + "; ".join(f"{u:,} learner updates with {e} environments" for u, e in budgets)
        + ".",
        "Held-out = the chronological test split (the last 15% of bars), greedy policy, costs on, filled at the "
        "next bar's open. Sharpe ratios are annualised; a policy that stayed flat has none (—). Over seeds: "
        "mean ± standard deviation [95% Student-t interval of the mean]. References (`docs/data.md`): the "
        "full-information and best causal policies of each synthetic market, realised on the same test bars "
        "with the same fills and costs; % = the run's test Sharpe over the reference's.",
        "",
        "## Targets (issue 17)",
        "",
        *target_lines(rows),
        "",
        "## Known-answer markets",
        "",
        *market_lines(rows),
        "",
        "## Deployment rules on and off (the same final weights of every run)",
        "",
        f"`margin=m`: the no-trade margin `eval.margin = m` (`margin=0` is the plain greedy policy); "
        f"`gate={meta.get('view_gate', 0.95):g}`: flat unless the validation PSR reaches it "
        f"(`eval.gate_psr`), with the margin of the run's configuration. Mean over seeds (lowest seed)."
        + (
            f" `{BEST_VIEW}` (early stopping; not the final weights): the weights of the run's best validation "
            "evaluation (`checkpoints/best.safetensors`, chosen on the validation split only), gate off, with "
            "the margin of the run's configuration."
            if any(BEST_VIEW in r.get("views", {}) for r in rows)
            else ""
        ),
        "",
        *view_lines(rows),
        "",
        "## Real series",
        "",
        "No edge is claimed where the interval of the difference with buy-and-hold contains 0. The DSR deflates "
        "by the configurations this check tried (`eval.trials`).",
        "",
        *real_lines(rows),
        "",
    ]
    screens = [screen] if isinstance(screen, (str, Path)) else list(screen or [])
    screen_rows = [r for p in screens if Path(p).is_file() for r in read_rows(p)]
    if screen_rows:
        out += [
            "## Training mechanisms on and off",
            "",
            "Each variant trains again with its overrides (`tools/sweep.py`, same tasks, heads, seeds and "
            "budget); `base` is this page's runs. Cells: the task's target measure over the seeds (mean, lowest "
            "seed) and how many seeds meet the target of the table above.",
            "",
            *screen_lines(rows, screen_rows),
            "",
        ]
    out += [
        "## Every run",
        "",
        *run_lines(rows),
    ]
    if failed:
        out += ["", "Runs that failed:", ""] + [
            f"- {r['task']} {r['head']} seed {r['seed']}: {r['error']}" for r in failed
        ]
    return "\n".join(out) + "\n"


def main() -> int:
    import argparse
    import os

    ap = argparse.ArgumentParser(description="Write the results page from a learning check's rows.")
    ap.add_argument("check", type=Path, help="learning_check.json, or the JSON-lines file of a check cut short")
    ap.add_argument(
        "--screen", type=Path, action="append", default=[], help="tools/sweep.py JSON lines of variants (repeatable)"
    )
    ap.add_argument("--md", type=Path, required=True)
    args = ap.parse_args()
    if str(args.check).endswith(".jsonl"):
        rows = read_rows(args.check)
        meta = {
            "gpu": "(not recorded: rows of a check cut short)",
            "device": rows[0].get("device", "?"),
            "commit": os.environ.get("CUDARL_COMMIT", "unknown"),
            "date": "(see the run's log)",
            "seeds": 1 + max(r["seed"] for r in rows),
            "workers": "?",
            "wall_s": float("nan"),
            "sets": rows[0].get("sets", []),
        }
    else:
        import json

        meta = json.loads(args.check.read_text())
        rows = meta.pop("rows")
    failed = [r for r in rows if r.get("error")] + meta.pop("failed", [])
    rows = [r for r in rows if not r.get("error")]
    args.md.write_text(results_markdown(meta, rows, failed, args.screen))
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
