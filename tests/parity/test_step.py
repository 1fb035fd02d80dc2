"""The whole-step oracle: the agent's NumPy train phases equal ``cudarl.reference.step.c51_update``, bit for bit.

The agent runs the update as graph phases over objects (workspaces, side branches, the fused
targets-and-loss twin, flat Adam); the oracle writes it top to bottom. Same sample, same parameters,
same moments, same target net, same tree after each of several updates, or a stage is out of order.
"""

import numpy as np
import pytest

from cudarl.config import from_dict, resolve_for_backend
from cudarl.reference.step import c51_update
from cudarl.testing import assert_bitwise
from cudarl.trainer import Trainer


def _config(**over):
    base = resolve_for_backend(from_dict({"run": {"device": "cpu"}}), False, {})
    d = {
        "run": {"eval_every": 0, "checkpoint_every": 0, "log_every": 10},
        "data": {"source": "builtin:regime?n=1500"},
        "env": {"n_envs": 8, "episode_len": 128},
        "replay": {"capacity": 4096},
        "net": {"hidden": [24, 16], "atoms": 21},
        "agent": {"batch_size": 32, "learning_starts": 200, "popart": False},
        "optim": {"schedule": "cosine", "warmup": 3, "period": 50, "weight_decay": 0.01, "max_grad_norm": 0.1},
        "guard": {"snapshot_every": 1000},
    }
    for sec, vals in over.items():
        d.setdefault(sec, {}).update(vals)
    return from_dict(d, base=base)


def _scalar_views(ds) -> dict:
    """Copies of a DeviceScalars' slots as ``[1]`` arrays (the oracle advances them in place)."""
    buf = ds.buffer.copy()
    return {name: buf[i : i + 1].view(ds.view(name).dtype)[:1] for i, name in enumerate(ds.names)}


def _oracle_state(t: Trainer):
    """The oracle's inputs: copies of everything one update reads and writes."""
    ag = t.agent
    params, grads, target = ag.online.params.copy(), np.zeros_like(ag.online.grads), ag.target.params.copy()
    layout = ag.online.layout
    net = dict(
        params=params,
        grads=grads,
        target=target,
        P=layout.views(params),
        G=layout.views(grads),
        T=layout.views(target),
        mask=ag.adam.mask.copy(),
    )
    opt = dict(
        m=ag.adam.m.copy(), v=ag.adam.v.copy(), **_scalar_views(ag.adam.scalars), **_scalar_views(ag.soft.scalars)
    )
    bufs = type(t.replay.bufs)(**{k: None if v is None else v.copy() for k, v in vars(t.replay.bufs).items()})
    return net, opt, {"spec": t.replay.spec, "bufs": bufs, "features": t.env.data.features, "sign": t.env.data.sign}


@pytest.mark.parametrize(
    "over", [{}, {"agent": {"priority": "ce"}, "optim": {"schedule": "constant"}}, {"net": {"window": 5}}]
)
def test_the_agents_numpy_phases_are_the_oracle_bit_for_bit(over):
    t = Trainer(_config(**over), run_dir=False, echo=lambda m: None)
    t.run(20)  # a replay with rows, moments and a target net that have moved
    net, opt, rb = _oracle_state(t)
    for k in range(3):
        want = c51_update(net, opt, rb, t.cfg)
        t.train_graph.replay()  # the NumPy backend runs the phases in order
        ag = t.agent
        assert_bitwise(ag.buffers.idx, want["idx"], what=f"update {k}: sampled rows")
        assert_bitwise(ag.loss, np.float32([want["loss"]]), what=f"update {k}: loss")
        assert_bitwise(ag.priority, want["priority"], what=f"update {k}: priorities")
        assert_bitwise(ag.grad_norm, np.float32([want["grad_norm"]]), what=f"update {k}: grad norm")
        assert_bitwise(ag.online.grads, net["grads"], what=f"update {k}: gradients")
        assert_bitwise(ag.online.params, net["params"], what=f"update {k}: parameters")
        assert_bitwise(ag.adam.m, opt["m"], what=f"update {k}: Adam m")
        assert_bitwise(ag.adam.v, opt["v"], what=f"update {k}: Adam v")
        assert_bitwise(ag.target.params, net["target"], what=f"update {k}: target net")
        assert_bitwise(t.replay.bufs.tree, rb["bufs"].tree, what=f"update {k}: sum tree")
    assert want["grad_norm"] > 0.1, "the clip must act for the test to cover it"
