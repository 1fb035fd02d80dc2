# Compare diag_ckpt.py's JSON files: python3 docs/bench/diag_ckpt_compare.py A.json B.json ...
# For each run, the leaves where member 2 (learner, stacked replay) and the single agent (agent, replay)
# differ; across runs, the leaves of each side whose hash is not the same in every run.
import json
import sys
from collections import defaultdict

runs = [json.load(open(p)) for p in sys.argv[1:]]
for p, r in zip(sys.argv[1:], runs, strict=True):
    bad = []
    for step in map(str, range(1, 7)):
        s = r[step]
        bad += [f"{step}:agent{k}" for k in s["agent"] if s["learner"].get(k) != s["agent"][k]]
        bad += [f"{step}:replay{k}" for k in s["single"] if s["replay"].get(k) != s["single"][k]]
    print(p, "member 2 != single at:", bad[:8] or "nowhere")
    if "mask" in r and any(n for _, n, _, _ in r["mask"]["seen"]):
        print(f"  Adam.mask at {r['mask']['ptr']:#x}: (when, bytes wrong, first, last)", r["mask"]["seen"])
    if "detail" in r:
        d = r["detail"]
        print(f"  first at update {d['step']}: online {d['online']}; target {d['target']}")
        for k, v in d["agent_small"].items():
            if d["learner_small"].get(k) != v:
                print(f"  {k}: member {d['learner_small'].get(k)} agent {v}")
moving = defaultdict(set)
for step in map(str, range(1, 7)):
    for side in runs[0][step]:
        for k in runs[0][step][side]:
            vals = {r[step][side].get(k) for r in runs}
            if len(vals) > 1:
                moving[(step, side)].add(f"{k} ({len(vals)} values)")
for (step, side), ks in sorted(moving.items()):
    print(f"update {step}, {side}: varies across runs in {sorted(ks)[:6]}")
print("runs:", len(runs), "| sides that vary:", len(moving) or "none")
