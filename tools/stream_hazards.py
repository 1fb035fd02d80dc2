"""Cross-stream hazards of the train and collect graphs of one configuration, on the CPU (no GPU needed).

    python3 tools/stream_hazards.py [--set section.field=value ...] [--members N --population MODE]
                                    [--updates N] [--chain]

Builds a NumPy-backend Trainer of the configuration (a small one by default: the unit tests' sizes), or
with ``--members`` a population of that many (``run.population`` MODE, seeds 0, 1, ...), trains
``--updates`` updates, then replays each graph's phases twice more with every kernel family op and GEMM
recorded (:func:`cudarl.hazards.find_hazards`) and prints each hazard: two unordered accesses from
different streams to overlapping memory, at least one a write. Exits 1 when it finds any. With ``--chain``
it also prints each graph's longest chain of ops (:func:`cudarl.hazards.longest_chain`): the nodes a
launch-bound step waits on one after another, phase by phase.
"""

from __future__ import annotations

import argparse
import sys

sys.path.insert(0, ".")

from cudarl.config import from_dict, parse_override, resolve_for_backend  # noqa: E402
from cudarl.hazards import find_hazards, longest_chain  # noqa: E402
from cudarl.trainer import Trainer  # noqa: E402

SMALL = {
    "run": {"device": "cpu", "eval_every": 0, "checkpoint_every": 0, "log_every": 1000},
    "data": {"source": "builtin:regime?n=1500"},
    "env": {"n_envs": 8, "episode_len": 128},
    "replay": {"capacity": 4096},
    "net": {"hidden": [32, 32]},
    "agent": {"batch_size": 32, "learning_starts": 200},
}


def print_chain(name: str, chain: list) -> None:
    """The longest chain of ops, one line an op, and its length per phase (where a shorter step must cut)."""
    print(f"{name}: longest chain {len(chain)} ops")
    per: dict = {}
    for k, n in enumerate(chain, 1):
        print(f"  {k:3d}  {n.phase:<22s} {n.op:<40s} {n.where}")
        per[n.phase] = per.get(n.phase, 0) + 1
    print("  per phase: " + ", ".join(f"{p} {c}" for p, c in per.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], help="section.field=value over the small defaults")
    ap.add_argument("--updates", type=int, default=3, help="updates trained before the recorded replay")
    ap.add_argument("--members", type=int, default=0, help="a population of this many members (seeds 0, 1, ...)")
    ap.add_argument("--population", default="joined", choices=("joined", "branches"), help="its run.population")
    ap.add_argument("--chain", action="store_true", help="also print each graph's longest chain of ops, op by op")
    args = ap.parse_args(argv)
    base = {sec: dict(vals) for sec, vals in SMALL.items()}
    for text in args.set:
        sec, field, value = parse_override(text)
        base.setdefault(sec, {})[field] = value
    cfg = from_dict(base, base=resolve_for_backend(from_dict({"run": {"device": "cpu"}}), False, {}))
    if args.members:
        from cudarl.population import Population

        configs = [
            from_dict({"run": {"seed": i, "population": args.population}, "env": {"seed": i}}, base=cfg)
            for i in range(args.members)
        ]
        t = Population(configs, run_dirs=[False] * args.members, echo=lambda m: None)
    else:
        t = Trainer(cfg, run_dir=False, echo=lambda m: None)
    t.run(args.updates)
    n = 0
    for g in (t.train_graph, t.collect_graph):
        found = find_hazards(g, replays=2)
        print(f"{g.name}: {len(g.phases)} phases, {len(found)} hazard(s)")
        for h in found:
            print("  " + h.message())
        if args.chain:
            print_chain(g.name, longest_chain(g))
        n += len(found)
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
