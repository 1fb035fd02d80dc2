#!/usr/bin/env python3
"""The auxiliary signals' cost in the train step (issue 19): the reference workload's train-graph replay
with no signal, with each of the seven signals alone and with all of them together, each one's added
microseconds and share of the step without signals. Target (issue 19): all signals together add at most
40% to the encoder's train step on the H200. ``--encoder ssm`` (or ``attention``) times the temporal
encoders' workload (:data:`cudarl.bench.ENCODER_WORKLOAD`) instead of the MLP.

Gradient Vaccine needs a signal with a head: its arm is ``horizons + vaccine`` and its added cost is
measured against the ``horizons`` arm (vaccine's own phase), beside its cost against no signal. Causal
intervenes on ``calendar`` and ``offset`` here (the reference bars have no level columns; ``offset``
always has one), in every arm that has it.

The two choices that cut the cost (docs/guide.md, "Auxiliary signals"): the arms run with
``agent.aux_batch`` (the share of the batch the denoise and causal passes read) and
``agent.vaccine_scope`` at ``--aux-batch`` and ``--vaccine-scope``, and ``agent.aux_gemm`` (the denoise and
causal passes' GEMMs) at ``--aux-gemm`` (default: the configuration's defaults); ``--arms all,causal`` runs
those arms (and ``none``) only. The arms marked ``(whole)`` run denoise, causal, vaccine and all seven as
they ran before those fields (``aux_batch = 1``, ``vaccine_scope = "encoder"``), so one run shows each
signal's cost both ways; ``--no-whole`` leaves them out.

``--rounds N`` runs the arms N times, interleaved (every arm once a round, in the same order), and reports each
arm's median over the rounds; for each arm measured against none, the share of the step in every round (that
round's arm against that round's none) and their least and greatest: the none arm's own replay time moved by
3.5 us between runs on one warm H100 (``docs/perf-notes.md``, thirty-third session), which is what a share
read off one run carries.

Each arm is :func:`cudarl.bench.step_benchmark` (CUDA events, median of ``--repeats`` replays; replay
capacity 100k, which the train step does not depend on), with the device memory each arm's trainer holds
in CuPy's pool and what each signal adds to it (its buffers and its streams' cuBLAS workspaces, 32 MiB
each: the signals on branches of their own have streams of their own; a trainer built first and not
counted takes what the process keeps after its first one, so every arm's row holds only its own).
Prints a table and writes JSON (``--out``, default ``docs/bench/bench_aux.json``); ``tools/bench_step.py --aux``
runs the same arms (:func:`run_arms`) into its own table and JSON::

    python3 tools/bench_aux.py --encoder mlp --out $OUT/bench_aux_mlp.json
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import parser, report, row, skipped_without_gpu  # noqa: E402

from cudarl.config import AUX_GEMMS, VACCINE_SCOPES, AgentConfig  # noqa: E402

AGENT = AgentConfig()

HEADS = ["horizons", "risk", "denoise"]
REGULARISERS = ["homeostatic", "causal", "selectivity"]
#: the settings before agent.aux_batch and agent.vaccine_scope: the whole batch, the whole encoder
WHOLE = {"aux_batch": 1.0, "vaccine_scope": "encoder"}
#: arm -> (its signals, the arm its added cost is measured against, whether it runs with WHOLE)
ARMS = {"none": ([], None, False)}
ARMS.update({s: ([s], "none", False) for s in HEADS + REGULARISERS})
ARMS["vaccine"] = (["horizons", "vaccine"], "horizons", False)
ARMS["all"] = ([*HEADS, *REGULARISERS, "vaccine"], "none", False)
#: the signals whose cost the two fields change, as they ran before them
ARMS.update({f"{a} (whole)": (ARMS[a][0], ARMS[a][1], True) for a in ("denoise", "causal", "vaccine", "all")})
#: "all but <s>": all seven less one (not run unless named in ``--arms``, or ``--arms ablation`` for every one):
#: what ``s`` costs inside all seven (``all`` minus the arm), where the signals' branches overlap
ABLATION = {f"all but {s}": ([a for a in ARMS["all"][0] if a != s], None, False) for s in ARMS["all"][0]}
TRAIN = "train step (graph replay)"


def arms(whole: bool) -> dict:
    """The arms to run (``whole``: with the ``(whole)`` ones)."""
    return {a: v for a, v in ARMS.items() if whole or not v[2]}


def run_arms(
    encoder: str = "mlp",
    device: str = "gpu",
    repeats: int = 200,
    aux_batch: float = AGENT.aux_batch,
    vaccine_scope: str = AGENT.vaccine_scope,
    whole: bool = True,
    aux_gemm: str = AGENT.aux_gemm,
    only: tuple = (),
    rounds: int = 1,
) -> tuple[list, dict]:
    """``(rows, meta)`` for :func:`benchlib.report`: every arm's train step and device memory, each
    signal's added us and share of the step (``whole``: with the ``(whole)`` arms; ``only``: those arms
    alone, and ``none``; ``rounds``: the arms that many times, interleaved, each arm's row the median over
    them, with each share's least and greatest over the rounds). What :func:`main` runs from its flags, and
    ``tools/bench_step.py --aux`` at these defaults."""
    from cudarl.bench import DEVICE_MEMORY, ENCODER_WORKLOAD, reference_config, step_benchmark

    net = {} if encoder == "mlp" else {"encoder": encoder, **ENCODER_WORKLOAD}
    mine = {"aux_batch": aux_batch, "vaccine_scope": vaccine_scope, "aux_gemm": aux_gemm}
    if "ablation" in only:
        only = (*only, "all", *ABLATION)
    runs = {a: v for a, v in {**arms(whole), **ABLATION}.items() if a in (*only, "none") or (not only and a in ARMS)}
    first = ("none", "all", "denoise", "causal", "vaccine")  # the costly signals first: a run cut short has them

    def rank(arm: str) -> int:
        base = arm.split(" ")[0]
        return first.index(base) if base in first else len(first)

    runs = dict(sorted(runs.items(), key=lambda kv: rank(kv[0])))
    if rounds < 1:
        raise ValueError(f"bench_aux: rounds must be at least 1, got {rounds}")
    rows, us, mib, seen = [], {}, {}, {a: [] for a in runs}
    if device == "gpu":  # not counted: what the process keeps after its first trainer (at 156104e about
        # 31 MiB, which the first arm's memory row held and the later arms' did not) is held before the arms
        step_benchmark(2, device, cfg=reference_config(device, capacity=100_000, net=net), phases=False)
    failed = set()
    for r in range(rounds):
        for arm, (signals, _, whole) in runs.items():
            case = f"{encoder}, aux {arm}"
            if arm in failed:
                continue
            try:
                agent = {"aux": signals, "causal_groups": ["calendar", "offset"], **(WHOLE if whole else mine)}
                cfg = reference_config(device, capacity=100_000, net=net, agent=agent)
                got = step_benchmark(repeats, device, cfg=cfg, phases=False, label=f" aux {arm}")
                seen[arm].append(next(g["value"] for g in got if g["metric"] == TRAIN))
                held = next((g["value"] for g in got if g["metric"] == DEVICE_MEMORY), None)
                if held is not None and r == 0:
                    mib[arm] = held
                # a run cut short still shows its arms
                print(f"{case}: {seen[arm][-1]:.1f} us" + (f" (round {r + 1})" if rounds > 1 else ""), flush=True)
            except Exception as exc:  # one failing arm says why; the others still run
                traceback.print_exc()
                failed.add(arm)
                rows.append(row(case, "failed", f"{type(exc).__name__}: {exc}"[:60], ""))
    for arm in runs:
        if seen[arm] and arm not in failed:
            us[arm] = float(np.median(seen[arm]))
            rows.append(row(f"{encoder}, aux {arm}", TRAIN, us[arm], "us"))
            if arm in mib:
                rows.append(row(f"{encoder}, aux {arm}", DEVICE_MEMORY, mib[arm], "MiB"))
    for arm, (_, against, _) in runs.items():
        if against is None or arm not in us or "none" not in us or against not in us:
            continue
        case = f"{encoder}, aux {arm}"
        bases = [("none", "")] if against == "none" else [("none", " (with horizons)"), (against, f" over {against}")]
        for base, what in bases:
            added = us[arm] - us[base]
            rows.append(row(case, f"added to the train step{what}", added, "us"))
            target = "<= 40%" if arm.startswith("all") else ""
            rows.append(row(case, f"added, share of the step{what}", 100 * added / us["none"], "%", target))
        if against == "none" and rounds > 1:  # each round's arm against that round's none
            shares = [100 * (a - n) / n for a, n in zip(seen[arm], seen["none"], strict=True)]
            rows.append(row(case, "added, share of the step, least over the rounds", min(shares), "%"))
            rows.append(row(case, "added, share of the step, greatest over the rounds", max(shares), "%"))
        if against == "none" and arm in mib and "none" in mib:
            rows.append(row(case, "added device memory", mib[arm] - mib["none"], "MiB"))
    for arm in runs:
        if arm in ABLATION and arm in us and "all" in us:
            rows.append(row(f"{encoder}, aux {arm}", "removed from all seven", us["all"] - us[arm], "us"))
    meta = {"encoder": encoder, "target": "all signals <= +40% of the step", **mine, "whole": WHOLE, "rounds": rounds}
    return rows, meta


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--encoder", default="mlp", choices=["mlp", "ssm", "attention"])
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"], help="cpu: a smoke run of the arms only")
    ap.add_argument("--aux-batch", type=float, default=AGENT.aux_batch, help="agent.aux_batch of the arms")
    ap.add_argument("--vaccine-scope", default=AGENT.vaccine_scope, choices=VACCINE_SCOPES)
    ap.add_argument("--no-whole", action="store_true", help="leave out the (whole) arms (aux_batch 1, encoder)")
    ap.add_argument("--aux-gemm", default=AGENT.aux_gemm, choices=AUX_GEMMS, help="agent.aux_gemm of the arms")
    ap.add_argument(
        "--arms", default="", help="comma-separated arms to run (with none; 'ablation': all and each 'all but <s>')"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="run the arms this many times, interleaved: medians, the shares' range"
    )
    args = ap.parse_args()
    if args.device == "gpu" and skipped_without_gpu("bench_aux", "aux signals", args.out):
        return 0
    rows, meta = run_arms(
        args.encoder, args.device, args.repeats, args.aux_batch, args.vaccine_scope, whole=not args.no_whole,
        aux_gemm=args.aux_gemm, only=tuple(a for a in args.arms.split(",") if a), rounds=args.rounds,
    )  # fmt: skip
    report("bench_aux", rows, args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
