#!/usr/bin/env python3
"""The reference train step's critical path with ``q_stats`` beside the backward (branch ``qstats-beside``), on
the CPU: the captured graph's launch trace at ``2664cc6`` (``docs/bench/gpu-2664cc6/profile/prof/``, H200) rewired
as the branch enqueues the same launches (the dueling combine and ``qstats_per_sample`` on a stream of their own,
forked where the phase starts, the reduction's branch forked from it, joined by publish), each launch weighed by
its own ncu time from that call, the longest path taken with ``tools/critical_path.py``'s functions, plus that
call's node cost. A prediction from measured parts, not a measurement.

    python3 docs/bench/sim-qstats/rewire.py   (from the repository root; prints and writes result.json)
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "docs/bench/sim-aux-mlp"))
from profile_step import read_csv  # noqa: E402
from rewire import path, weigh  # noqa: E402  (the same matching of launches to ncu rows, the same path)

REC = ROOT / "docs/bench/gpu-2664cc6/profile/prof"
QS = 1  # the new stream


def rewire(events: list) -> list:
    """Events 26-27 (the q_stats launches on the main stream) onto QS, forked before them; the reduction's
    fork (28) from QS; QS joined into the main stream at publish, before the publish kernel (54)."""
    main = events[26]["stream"]
    out = []
    for i, e in enumerate(events):
        e = dict(e, orig=i)
        if i == 26:
            out.append({"kind": "fork", "from": main, "to": QS})
        if i in (26, 27):
            e["stream"] = QS
        if i == 28:
            e["from"] = QS
        if i == 54:
            out.append({"kind": "join", "from": QS, "to": main})
        out.append(e)
    return out


def main() -> None:
    events = json.loads((REC / "trace_train.json").read_text())["events"]
    names = [events[i].get("name") for i in (26, 27, 28, 54)]
    assert names == ["cudarl_nn_dueling_forward", "cudarl_qstats_per_sample", None, "cudarl_agent_publish_row"], names
    us = weigh(events, read_csv(REC / "ncu_train.csv"))
    c = json.loads((REC / "critical_train.json").read_text())["floor_inputs"]["node_us"]
    res = {
        "as captured (2664cc6)": path([dict(e, orig=i) for i, e in enumerate(events)], us, c),
        "qstats-beside": path(rewire(events), us, c),
    }
    for k, r in res.items():
        print(f"{k}: {r['path_nodes']} nodes, {r['path_kernel_us']} us of kernels, {r['path_us_with_c']} us with c")
    (Path(__file__).parent / "result.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
