#!/usr/bin/env python3
"""The critical path of the MLP train graph with all seven signals after branch ``aux-mlp``'s moves, on the
CPU: the captured graph's launch trace at ``a75a02b`` (``docs/bench/gpu-a75a02b/profile_aux_mlp/``) rewired
as the new code enqueues the same launches (the streams, forks and joins read from the code), each launch
weighed by its own ncu time from that call, and the longest path taken with ``tools/critical_path.py``'s
functions, plus c = 0.544 us a node (the floor model). A prediction from measured parts, not a measurement.

    python3 docs/bench/sim-aux-mlp/rewire.py   (from the repository root; prints and writes result.json)
"""

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
import critical_path as cp  # noqa: E402
from profile_step import read_csv  # noqa: E402

REC = ROOT / "docs/bench/gpu-a75a02b/profile_aux_mlp"
C = 0.544
MAIN, SIDE_AUX, CAUSAL = 873211632, 743873696, 745223456
HOMEO, VAC, TWIN = 1, 2, 3  # the new streams: homeostatic's branch, vaccine's branch, its weight gradients
DW_SIDES = {873330512, 873330576, 873342336, 873171664}  # the step's layers' dW streams (vaccine used them)


def weigh(events, rows):
    """{original event index: us} from the trace as captured (critical_path's own matching)."""
    nodes = cp.build_graph(events)
    cp.attach_profile(nodes, rows)
    launches = [i for i, e in enumerate(events) if e["kind"] in ("kernel", "library")]
    return {i: n["us"] for i, n in zip(launches, nodes, strict=True)}


def rewire(events, causal_early: bool):
    ev = [dict(e, orig=i) for i, e in enumerate(events)]
    at = {i: e for i, e in enumerate(ev)}
    on = lambda i, s: dict(at[i], stream=s)  # noqa: E731
    fork = lambda a, b: {"kind": "fork", "from": a, "to": b}  # noqa: E731
    join = lambda a, b: {"kind": "join", "from": a, "to": b}  # noqa: E731
    out = []
    for i, e in enumerate(ev):
        if causal_early and i == 26:  # before targets_loss: causal's rows of s, intervention and forward
            out += [at[71], at[72], *[at[j] for j in range(74, 83)]]
        if causal_early and (71 <= i <= 82 and i != 73):
            continue
        if causal_early and i == 73:  # aux_causal: the branch forked again, the rows of q_s, penalty, ...
            out += [fork(MAIN, CAUSAL), at[73]]
            continue
        if 65 <= i <= 69:  # homeostatic on a branch joined into side_aux
            if i == 65:
                out.append(fork(MAIN, HOMEO))
            out.append(on(i, HOMEO))
            if i == 69:
                out += [fork(MAIN, SIDE_AUX), join(HOMEO, SIDE_AUX)]
            continue
        if i == 119:  # backward: after joining side_aux, vaccine's branch (two fills, its backward)
            out.append(e)
            out += [fork(MAIN, VAC), on(153, VAC), dict(on(153, VAC), orig=153)]
            for j in range(154, 174):
                x = at[j]
                if x["kind"] in ("kernel", "library"):
                    out.append(on(j, TWIN if x["stream"] in DW_SIDES else VAC))
                elif x["kind"] == "fork":
                    out.append(fork(VAC, TWIN))
            out.append(join(TWIN, VAC))
            continue
        if 152 <= i <= 173:  # the old grad phase: the copy and the backward are gone from here
            if i == 152:
                out.append(join(VAC, MAIN))
            continue
        out.append(e)
    return out


def path(events, us, c: float = C):
    nodes = cp.build_graph(events)
    for n in nodes:
        n["us"] = us[n["orig"]]
    kern, p = cp.longest_path(nodes, lambda n: n["us"] + c)
    return {
        "path_nodes": len(p),
        "path_us_with_c": round(kern, 2),
        "path_kernel_us": round(sum(nodes[i]["us"] for i in p), 2),
        "nodes": len(nodes),
        "path": [f"{nodes[i]['phase']}: {nodes[i]['name']} {nodes[i]['us']:.2f}" for i in p],
    }


def main():
    events = json.loads((REC / "trace_train.json").read_text())["events"]
    rows = read_csv(REC / "ncu_train.csv")
    us = weigh(events, rows)
    # kernel launches keep their original index; build_graph copies the event fields into the node
    res = {
        "before (a75a02b)": path([dict(e, orig=i) for i, e in enumerate(events)], us),
        "aux-mlp (homeostatic, vaccine)": path(rewire(copy.deepcopy(events), False), us),
        "aux-mlp-causal (and causal's forward early)": path(rewire(copy.deepcopy(events), True), us),
    }
    for k, r in res.items():
        print(
            f"{k}: {r['path_nodes']} nodes on the path of {r['nodes']}, {r['path_kernel_us']} us of kernels, "
            f"{r['path_us_with_c']} us with c"
        )
    (Path(__file__).parent / "result.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
