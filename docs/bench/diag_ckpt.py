# test_gpu_members_are_single_agents_checkpoints's body (tests/unit/test_stacked_checkpoint.py) with its
# asserts replaced by records: after each update, a SHA-1 of every leaf of member 2's state (learner, stacked
# replay) and of the single agent's (updates 1-3: the agent built with member 2's seed; 4-6: the agent loaded
# from member 2's file). Many copies run side by side (each the others' GPU load, as in gpu_check's parallel
# processes); comparing their JSON says which side's bits move from run to run. From the repository root:
#   python3 docs/bench/diag_ckpt.py OUT.json [--poison | --cpu]
# Where member 2 and the agent differ after an update, OUT.json.npz keeps both sides' online and target
# parameters of the first such update, and the JSON the differing layout entries with their largest
# difference, and both sides' small leaves (scalars, PopArt's state) as values.
import hashlib
import json
import os
import sys
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "tests/unit")
from test_stacked_agent import E, _build, _reference_cfg, _seeds  # noqa: E402
from test_stacked_checkpoint import _graph, _through_file, _update, _update_single  # noqa: E402

from cudarl.agent import Agent  # noqa: E402
from cudarl.optim import Adam  # noqa: E402
from cudarl.replay import PrioritizedReplay  # noqa: E402
from cudarl.testing import poison_pool  # noqa: E402

NODE = "tests/unit/test_stacked_checkpoint.py::test_gpu_members_are_single_agents_checkpoints"


def flat(tree, leaf, pre=""):
    """``{path: leaf(value)}`` over a state tree's leaves (``leaf`` None: the leaf is left out)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flat(v, leaf, f"{pre}/{k}"))
        return out
    v = leaf(tree)
    return {} if v is None else {pre: v}


def digest(v):
    """An array's SHA-1 (12 hex digits), anything else's repr."""
    if isinstance(v, (np.ndarray, np.generic)):
        return hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()[:12]
    return repr(v)


def few(v):
    """A leaf of at most 16 values as a list of floats (scalars, PopArt's state), else None."""
    if isinstance(v, (np.ndarray, np.generic)) and np.size(v) <= 16:
        return np.asarray(v, np.float64).ravel().tolist()
    return None


def leaves(tree):
    return flat(tree, digest)


if "--cpu" in sys.argv:
    xp, backend, sync = np, "numpy", lambda: None
else:
    import cupy as xp

    backend, sync = "cupy", xp.cuda.Device().synchronize
if "--poison" in sys.argv:
    poison_pool(xp)
rng = np.random.default_rng(zlib.crc32(NODE.encode()))
P = 3
cfg, seeds = _reference_cfg(), _seeds(rng, P)
learner, replay, singles, replays, win = _build(xp, cfg, P, seeds, [2], rng, features=64)
g, ga = _graph(xp, "stacked", learner, replay, win), _graph(xp, "alone_2", singles[0], replays[0], win)
rec = {}


def where_differ(a, b, layout):
    """The layout entries of two flat parameter vectors that differ: {name: (count, largest |a - b|)}."""
    out = {}
    for name, off, shape in layout:
        n = int(np.prod(shape))
        x, y = a[int(off) : int(off) + n], b[int(off) : int(off) + n]
        if x.tobytes() != y.tobytes():
            d = np.abs(x.astype(np.float64) - y)
            out[name] = (int(np.count_nonzero(x != y)), float(d.max()))
    return out


def note(step, agent, single):
    mine, theirs = learner.member_state_dict(2), agent.state_dict()
    rec[step] = {
        "learner": leaves(mine),
        "agent": leaves(theirs),
        "replay": leaves(replay.member_state_dict(2)),
        "single": leaves(single.state_dict()),
    }
    if "detail" not in rec and rec[step]["learner"] != rec[step]["agent"]:
        layout = theirs["online"]["layout"]
        rec["detail"] = {
            "step": step,
            "online": where_differ(mine["online"]["params"], theirs["online"]["params"], layout),
            "target": where_differ(mine["target"]["params"], theirs["target"]["params"], layout),
            "learner_small": flat(mine, few),
            "agent_small": flat(theirs, few),
        }
        np.savez(
            sys.argv[1] + ".npz",
            learner_online=mine["online"]["params"], agent_online=theirs["online"]["params"],
            learner_target=mine["target"]["params"], agent_target=theirs["target"]["params"],
        )  # fmt: skip


for step in range(1, 4):
    _update(learner, g, step, sync)
    _update_single(singles[0], ga, step)
    sync()
    note(step, singles[0], replays[0])
with tempfile.TemporaryDirectory() as tmp:
    exported = _through_file(
        Path(tmp), "member2", {"agent": learner.member_state_dict(2), "replay": replay.member_state_dict(2)}
    )
rec["mask"] = {"seen": []}
adams = []  # the Adams made from here on: the agent's is the first


def mask_seen(when, adam=None):
    """Where the agent's weight-decay mask (Adam.mask) differs from its layout's, when (synchronised first)."""
    sync()
    adam = adam or adams[0]
    got = np.asarray(xp.asnumpy(adam.mask) if backend == "cupy" else adam.mask, np.uint8).ravel()
    bad = np.nonzero(got != adam.want_mask)[0]
    rec["mask"]["seen"].append([when, int(bad.size), int(bad[0]) if bad.size else -1, int(bad[-1]) if bad.size else -1])


_adam_init = Adam.__init__


def adam_init(self, params, *args, decay_mask=None, **kw):
    """Adam.__init__, then (optionally synchronised first: the fill's own bits) the mask checked."""
    _adam_init(self, params, *args, decay_mask=decay_mask, **kw)
    self.want_mask = np.asarray(decay_mask, np.uint8).ravel()
    adams.append(self)
    if backend == "cupy":
        rec["mask"]["ptr"] = int(self.mask.data.ptr)
        rec["mask"]["stream"] = int(xp.cuda.get_current_stream().ptr)
    if os.environ.get("DIAG_SYNC_AT_ADAM") == "1":
        mask_seen("Adam made", self)


Adam.__init__ = adam_init
r = cfg.replay
agent = Agent(replace(cfg, run=replace(cfg.run, seed=int(seeds[2]))), win.width, 3, E, xp)
mask_seen("Agent made")
single = PrioritizedReplay(
    r.capacity, 4, n_step=r.n_step, n_envs=E, alpha=r.alpha, eps=r.eps, beta0=r.beta0,
    beta_final=r.beta_final, beta_steps=r.beta_steps, seed=int(seeds[2]), backend=backend,
)  # fmt: skip
mask_seen("replay made")
single.reserve(cfg.agent.batch_size)
mask_seen("built")
agent.load_state_dict(exported["agent"])
single.load_state_dict(exported["replay"])
mask_seen("loaded")
rec["loaded"] = {"agent": leaves(agent.state_dict()), "single": leaves(single.state_dict())}
ge = _graph(xp, "exported", agent, single, win)
mask_seen("captured")
for step in range(4, 7):
    _update(learner, g, step, sync)
    mask_seen(f"member update {step}")
    _update_single(agent, ge, step)
    sync()
    mask_seen(f"agent update {step}")
    note(step, agent, single)
Path(sys.argv[1]).write_text(json.dumps(rec))
