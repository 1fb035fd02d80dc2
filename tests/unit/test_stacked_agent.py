"""The joined train step (issue 23's agent axis, stage 6a: docs/perf-notes.md "The agent axis, in stages"):
a :class:`cudarl.stacked_agent.StackedLearner` of P members is P single :class:`cudarl.agent.Agent` s,
member ``i`` the agent of ``run.seed = seeds[i]`` fed the same replay rows, bit for bit over several
updates: parameters, gradients, target net, Adam's moments and scalars, tau, loss, per-sample loss,
priorities, sampled rows and weights, grad norm, PopArt's statistics, the Q statistics, the published
rings and the sum trees.

CPU (NumPy backend): P = 1 and 3, PopArt on and off, one launch and three for the optimiser and the
PopArt loss (``run.grid_barrier``), each operation in the other form than the agents', a clip that acts,
shrink-and-perturb, ``net.dw_gemm = "one_kernel"`` (read by the learner and the agents alike) and
``net.gemm = "chain"`` (the GPU's chain set, the launches' twins); which form the learner takes at which P
(``StackedLearner.one_launch_forms``, ``kernels.barrier_grid_fits``).
GPU (marked): the reference sizes (66 inputs, 256-256, 51 atoms, batch 512) at P = 1, 3, 64 (at 64,
three members against singles) in the forms the learner takes and in the one-launch forms at P = 3, 64,
under each ``net.dw_gemm`` at P = 3 and 64, under ``net.gemm = "chain"`` at P = 1, 3, 8, the forms it takes
on the device, and a captured step against the eager one, bit for bit (``chain`` at P = 1, 3, 8 too).
"""

from dataclasses import replace

import numpy as np
import pytest

from cudarl.agent import Agent
from cudarl.backend import to_numpy
from cudarl.config import from_dict
from cudarl.graph import StepGraph
from cudarl.kernels import barrier_grid_fits
from cudarl.replay import PrioritizedReplay
from cudarl.stacked_agent import StackedLearner, reference_config, stacked_replay
from cudarl.testing import assert_bitwise
from cudarl.window import Windows

T_N, F_N, E = 80, 5, 4  # bars and features of the shared feature matrix; interleaved columns of the replay


def _config(**over):
    d = {
        "run": {"device": "cpu", "eval_every": 0, "checkpoint_every": 0},
        "env": {"n_envs": E},
        "net": {"hidden": [24, 16], "atoms": 21},
        "replay": {"capacity": 512},
        "agent": {"batch_size": 16, "popart_warmup": 4},
        "optim": {"schedule": "cosine", "warmup": 2, "period": 40, "weight_decay": 0.01, "max_grad_norm": 0.1},
    }
    for sec, vals in over.items():
        d.setdefault(sec, {}).update(vals)
    return from_dict(d)


def _state_rows(rng, shape) -> np.ndarray:
    """State rows ``[*shape, 4]``: bar index, mirror flag, position, hold fraction."""
    rows = np.zeros((*shape, 4), np.float32)
    rows[..., 0] = rng.integers(0, T_N, shape)
    rows[..., 1] = rng.random(shape) < 0.3
    rows[..., 2] = rng.choice(np.array([-1, 0, 1], np.float32), shape)
    rows[..., 3] = rng.random(shape)
    return rows


def _windows(xp, rng, window: int, features: int = F_N) -> Windows:
    feats = rng.standard_normal((T_N, features)).astype(np.float32)
    sign = np.ones(features, np.float32)
    sign[1] = -1.0
    return Windows(xp.asarray(feats), xp.asarray(sign), window, xp)


def _fill(xp, rng, stacked, singles, rows: int, members) -> None:
    """Each member's own rows (rewards of its own scale, an episode end here and there), added in three
    rounds to the stacked replay and to member ``members[j]``'s single replay ``singles[j]``."""
    P = stacked.members
    for _ in range(3):
        d = np.full((P, rows), 0.97, np.float32)
        d[rng.random((P, rows)) < 0.05] = 0.0
        batch = (
            _state_rows(rng, (P, rows)),
            rng.integers(0, 3, (P, rows)).astype(np.int32),
            (rng.standard_normal((P, rows)) * rng.uniform(0.2, 3.0, (P, 1))).astype(np.float32),
            d,
        )
        stacked.add(*(xp.asarray(a) for a in batch))
        for j, i in enumerate(members):
            singles[j].add(*(xp.asarray(a[i]) for a in batch))


def _build(xp, cfg, P, seeds, members, rng, window=1, features=F_N, n_actions=3, one_launch=None):
    """The stacked learner and replay, and the single agents and replays of ``members``, all fed the
    same rows, and the windows (one feature matrix for all). ``one_launch``: the learner's forms of the
    loss and the optimiser forced (:meth:`StackedLearner.force`) in place of the launchers' choice."""
    backend = "numpy" if xp is np else "cupy"
    win = _windows(xp, rng, window, features)
    learner = StackedLearner(cfg, win.width, n_actions, seeds, xp)
    if one_launch is not None:
        learner.force(one_launch)
        assert learner.one_launch == one_launch
    replay = stacked_replay(cfg, E, seeds, backend=backend)
    singles, replays = [], []
    for i in members:
        c = replace(cfg, run=replace(cfg.run, seed=int(seeds[i])))
        singles.append(Agent(c, win.width, n_actions, E, xp))
        r = cfg.replay
        replays.append(
            PrioritizedReplay(
                r.capacity, 4, n_step=r.n_step, n_envs=E, alpha=r.alpha, eps=r.eps, beta0=r.beta0,
                beta_final=r.beta_final, beta_steps=r.beta_steps, seed=int(seeds[i]), backend=backend,
            )
        )  # fmt: skip
    _fill(xp, rng, replay, replays, max(48, -(-cfg.agent.batch_size // (2 * E)) * E), members)  # 1.5 B rows at least
    for r in replays:
        r.reserve(cfg.agent.batch_size)
    return learner, replay, singles, replays, win


def _assert_member_is_agent(learner, replay, i, agent, single_replay, what):
    """Member ``i`` of the learner and its replay against ``agent`` and its replay, bit for bit."""
    w = f"{what}, member {i}"
    L, a = learner, agent
    pairs = [
        ("sampled rows", L.idx[i], a.buffers.idx),
        ("weights", L.weights[i], a.buffers.weights),
        ("loss", L.loss[i : i + 1], a.loss),
        ("per-sample loss", L.out.loss_per[i], a.loss_per),
        ("priorities", L.priority[i], a.priority),
        ("gradients", L.online.grads[i], a.online.grads),
        ("parameters", L.online.params[i], a.online.params),
        ("target net", L.target.params[i], a.target.params),
        ("Adam m", L.adam.m[i], a.adam.m),
        ("Adam v", L.adam.v[i], a.adam.v),
        ("grad norm", L.grad_norm[i : i + 1], a.grad_norm),
        ("Q statistics", L.stats[i], a.stats.values),
        ("published loss and grad norm", L.ring[i], a.readback.device),
        ("sum tree", replay.bufs.tree[i], single_replay.bufs.tree),
    ]
    for name in a.adam.scalars.names:
        pairs.append((f"Adam {name}", L.adam.scalars.view(name)[i : i + 1], a.adam.scalars.view(name)))
    for name in a.soft.scalars.names:
        pairs.append((f"tau schedule {name}", L.soft.scalars.view(name)[i : i + 1], a.soft.scalars.view(name)))
    if a.popart is not None:
        pairs.append(("PopArt state", L.popart.state[i], a.popart.state))
        pairs.append(("PopArt beta", L.popart.scalars.view("beta")[i : i + 1], a.popart.scalars.view("beta")))
    for name, got, want in pairs:
        assert_bitwise(to_numpy(got), to_numpy(want), what=f"{w}: {name}")
    # whole rings, the slots no update has written yet included: zero on both sides (PinnedReadback zeroes
    # its memory), so a write into another member's or another slot's place shows here
    n = a.stats.n
    ring = to_numpy(L.stats_ring.device).reshape(-1, L.members, n)[:, i]
    assert_bitwise(ring.reshape(-1), to_numpy(a.stats.ring.device), what=f"{w}: published Q statistics")


def _run_and_compare(
    xp, cfg, P, seeds, members, rng, updates, window=1, features=F_N, sync=lambda: None, one_launch=None
):
    """``updates`` updates of the learner (one StepGraph) and of the single agents of ``members``; member
    ``i`` against its agent after each. ``one_launch``: the learner's forms (:func:`_build`)."""
    learner, replay, singles, replays, win = _build(
        xp, cfg, P, seeds, members, rng, window, features, one_launch=one_launch
    )
    graph = StepGraph("train_stacked", learner.train_phases(replay, win), xp=xp)
    alone = [
        StepGraph(f"train_{j}", a.train_phases(r, win), xp=xp)
        for j, (a, r) in enumerate(zip(singles, replays, strict=True))
    ]
    for g in (graph, *alone):  # on the GPU before any eager run; on NumPy the phases run in order
        g.capture()
    for step in range(1, updates + 1):
        graph.replay()
        learner.mark_published(step, graph.stream)
        learner.between_updates(step, graph.stream)
        for a, g in zip(singles, alone, strict=True):
            g.replay()
            a.between_updates(step, g.stream)
        sync()
        for j, i in enumerate(members):
            _assert_member_is_agent(learner, replay, i, singles[j], replays[j], f"update {step}")
        got = learner.published(step)
        assert_bitwise(got["loss"], to_numpy(learner.loss), what=f"update {step}: the host's read of the losses")
    return learner


def _seeds(rng, P):
    return [int(s) for s in rng.choice(1 << 30, P, replace=False)]


# --- CPU ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize(
    "over",
    [
        {},  # the defaults: PopArt (frozen after its warm-up), one launch for the loss and for the optimiser
        {"agent": {"popart": False, "priority": "ce"}, "optim": {"schedule": "constant"}},
        {"run": {"grid_barrier": False}, "optim": {"shrink_every": 3}},
    ],
    ids=["defaults", "no-popart", "three-launches-shrink"],
)
def test_members_are_single_agents_bitwise(rng, P, over):
    cfg = _config(**over)
    learner = _run_and_compare(np, cfg, P, _seeds(rng, P), list(range(P)), rng, updates=7)
    assert np.all(learner.grad_norm > cfg.optim.max_grad_norm), "the clip must act for the test to cover it"
    assert len(set(learner.loss.tolist())) == P, "members with their own seeds and rows have their own losses"
    if learner.popart is not None:
        assert learner.popart.frozen, "PopArt's warm-up ended inside the run: its freeze is covered"
        assert np.all(learner.popart.statistics()[0] != 0.0), "PopArt's statistics moved"


@pytest.mark.parametrize("P", [1, 3])
def test_members_are_single_agents_bitwise_with_one_kernel_weight_gradients(rng, monkeypatch, P):
    """net.dw_gemm = "one_kernel" is read by both: each update the learner runs each layer's weight
    gradients as one gemm_lt_batched(trans_a) over its members, each agent as one gemm_lt(trans_a,
    split_k=False) a layer; member i still equals agent i bit for bit (on NumPy both are the same product
    as the default's)."""
    from cudarl import blas

    calls = {"gemm_lt_batched": 0, "gemm_lt": 0}

    def spy(name, f):
        def counted(*args, **kw):
            if kw.get("trans_a"):
                assert kw.get("split_k", False) is False, "a weight gradient with split-K under one_kernel"
                calls[name] += 1
            return f(*args, **kw)

        return counted

    for name in calls:
        monkeypatch.setattr(blas, name, spy(name, getattr(blas, name)))
    cfg = _config(net={"dw_gemm": "one_kernel"})
    updates = 4
    learner = _run_and_compare(np, cfg, P, _seeds(rng, P), list(range(P)), rng, updates=updates)
    layers = len(learner.online.linears)
    assert calls == {"gemm_lt_batched": updates * layers, "gemm_lt": updates * layers * P}


@pytest.mark.parametrize("P", [1, 3])
def test_members_are_single_agents_bitwise_under_chain(rng, monkeypatch, P):
    """net.gemm = "chain" for the learner and the agents, run on NumPy as on the GPU: the networks' chain set
    the GPU's (cudarl.nn.network.chain_of with a device backend; NumPy's is ()), the launches the twins with
    their eligibility taken as given. Each update the learner's three forwards (target and online at s',
    online at s) are one gemm.chain each for every member and its backward's dx chain one
    gemm.chain_backward, as each agent's are for itself; member i still equals agent i bit for bit."""
    from cudarl.nn import network, stacked
    from cudarl.reference import gemm as twin

    def gpu_chain_of(encoder, head, net, xp, gated=False):
        return network_chain_of(encoder, head, net, "cupy", gated)  # any backend but NumPy's

    network_chain_of = network.chain_of
    monkeypatch.setattr(network, "chain_of", gpu_chain_of)
    monkeypatch.setattr(stacked, "chain_of", gpu_chain_of)
    monkeypatch.setattr(twin, "chain_eligible", lambda x, layers: True, raising=False)
    monkeypatch.setattr(twin, "chain_backward_eligible", lambda d, layers: True, raising=False)
    calls = []

    def spy(op, f):
        def counted(lead, *args, **kw):
            calls.append((op, lead.ndim))
            return f(lead, *args, **kw)

        return counted

    for op in ("chain", "chain_backward"):
        monkeypatch.setattr(twin, op, spy(op, getattr(twin, op)))
    updates = 4
    learner = _run_and_compare(np, _config(net={"gemm": "chain"}), P, _seeds(rng, P), list(range(P)), rng, updates)
    assert len(learner.online._chain) == len(learner.online.linears) and learner.ws.chained
    for ndim, times in ((3, 1), (2, P)):  # the learner's launches (a member axis), the agents'
        assert calls.count(("chain", ndim)) == 3 * updates * times
        assert calls.count(("chain_backward", ndim)) == updates * times


def test_batched_algo_is_validated_and_single_by_default():
    """net.batched_algo: "single" (the default, the batch-1 plan's algorithm) or "probe", named when wrong."""
    from cudarl.config import ConfigError, NetConfig

    assert NetConfig().batched_algo == "single" and _config().net.batched_algo == "single"
    assert _config(net={"batched_algo": "probe"}).net.batched_algo == "probe"
    with pytest.raises(ConfigError, match=r"net: batched_algo must be one of \['single', 'probe'\], got 'fast'"):
        _config(net={"batched_algo": "fast"})


@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_batched_algo_probe_reaches_every_batched_gemm_and_plan_and_numpy_is_unaffected(
    rng, monkeypatch, batched_algos, dw_gemm
):
    """net.batched_algo = "probe" through the learner: its stacked networks pass it to every batched GEMM
    (forwards, dx, and dW under one_kernel) and every batched plan they make (gemm_lt_prepare's options,
    so the plan key ends with it); on NumPy the members still equal the single agents bit for bit."""
    from cudarl import blas

    algos = batched_algos
    cfg = _config(net={"batched_algo": "probe", "dw_gemm": dw_gemm})
    learner = _run_and_compare(np, cfg, 3, _seeds(rng, 3), [0, 1, 2], rng, updates=3)
    assert learner.online.batched_algo == learner.target.batched_algo == "probe"
    layers = len(learner.online.linears)
    assert set(algos) == {"probe"} and len(algos) >= 3 * (2 * layers - 1), algos
    # the plans a GPU workspace makes (StackedQNetwork._prepare, called on the GPU only): recorded here
    made = []
    monkeypatch.setattr(blas, "gemm_lt_prepare", lambda m, n, k, **kw: made.append(((m, n, k), kw)))
    net = learner.online
    net._prepare(net.ws, 8)
    expect = 2 * layers - 1 + (layers if dw_gemm == "one_kernel" else 0)  # forwards, dx (not the input's), dW
    assert len(made) == expect + 1, made  # and the input's dx
    for (m, n, k), kw in made:
        assert kw["algo"] == "probe" and kw["batch"] == 3 and kw["split_k"] is False
        bias = kw.get("bias")
        key = blas.plan_key(
            m, n, k, bias_align=0 if bias is None else 256, act=kw.get("act", "identity"),
            trans_a=kw.get("trans_a", False), trans_b=kw.get("trans_b", False), tf32=kw["tf32"], split_k=False,
            batch=3, strides=(*kw["strides"], 0), algo=kw["algo"],
        )  # fmt: skip
        assert key[-1] == "probe"


def test_members_with_a_window_of_bars_and_n_step_one(rng):
    cfg = _config(replay={"n_step": 1}, net={"window": 3, "hidden": [16]})
    _run_and_compare(np, cfg, 3, _seeds(rng, 3), [0, 1, 2], rng, updates=4, window=3)


def test_barrier_grid_fits_gives_each_member_the_single_agents_grid():
    """The rule (cudarl.kernels.barrier_grid_fits): a grid-barrier launch over P members is taken only where
    each member's share of the resident grid, limit // P, is the grid the op gets alone, min(full, limit)."""
    limit = 132  # an H200's multiprocessors
    assert [P for P in range(1, 300) if barrier_grid_fits(P, 128, limit)] == [1]  # the reference loss: B = 512
    assert [P for P in range(1, 300) if barrier_grid_fits(P, 500, limit)] == [1]  # capped at the limit alone
    assert [P for P in range(1, 300) if barrier_grid_fits(P, 8, limit)] == list(range(1, 17))  # 132 // 16 = 8
    assert barrier_grid_fits(1, 1, 1) and not barrier_grid_fits(2, 1, 1)


def test_the_learner_takes_each_one_launch_only_where_every_member_gets_its_grid():
    """StackedLearner.one_launch_forms: the reference workload (batch 512: the loss's 128 blocks a member;
    the optimiser's blocks of 1024 over a member's parameters) against an H200's 132 resident blocks takes
    both one-launch forms at P = 1 only; the forms at P = 8, 64 and 256 follow from the same rule; off
    with run.grid_barrier = false; NumPy without a limit: the one launches (today's, no residency)."""
    from cudarl.bench import reference_config as bench_config
    from cudarl.reference.c51 import targets_loss_blocks
    from cudarl.reference.optim import clip_adam_soft_blocks

    cfg, limit = bench_config("cpu"), 132
    both = {"targets_loss": True, "adam": True}
    learners = {P: StackedLearner(cfg, 66, 3, list(range(P)), np) for P in (1, 2)}
    n = learners[1].adam.params.shape[-1]
    full = {"targets_loss": targets_loss_blocks(cfg.agent.batch_size), "adam": clip_adam_soft_blocks(n)}
    assert full["targets_loss"] == 128 and full["adam"] >= limit, "the reference grids this test reasons about"
    assert learners[1].one_launch == learners[2].one_launch == both  # NumPy: no limit asked
    assert learners[1].one_launch_forms(limit) == both, "a population of one keeps the single agent's launches"
    assert learners[2].one_launch_forms(limit) == {"targets_loss": False, "adam": False}  # 66 blocks a member
    assert learners[2].one_launch_forms(2 * max(full.values())) == both  # a device with room for two members
    for P in (8, 64, 256):
        assert not any(barrier_grid_fits(P, g, limit) for g in full.values()), P
    off = StackedLearner(_config(run={"grid_barrier": False}), 7, 3, [1], np)
    assert off.one_launch == off.one_launch_forms(limit) == {"targets_loss": False, "adam": False}
    assert learners[1].forms() == {"targets_loss": "one launch (grid barrier)", "adam": "one launch (grid barrier)"}
    learners[2].one_launch = learners[2].one_launch_forms(limit)
    assert learners[2].forms() == {
        "targets_loss": "two launches (no grid barrier)",
        "adam": "two launches (norm and publish; update)",
    }
    no_popart = StackedLearner(_config(agent={"popart": False}), 7, 3, [1, 2], np)
    assert no_popart.forms()["targets_loss"] == "one launch (no grid barrier)"


@pytest.mark.parametrize(
    "one_launch",
    [{"targets_loss": False, "adam": True}, {"targets_loss": True, "adam": False}],
    ids=["loss-two-launches", "adam-two-launches"],
)
def test_members_are_single_agents_bitwise_in_each_form(rng, monkeypatch, one_launch):
    """Each operation in the form the learner was given (the other form than the single agents' one
    launch for one of them): the launches it makes say so, and member i still equals agent i bit for bit
    (on NumPy the one-launch twins are the compositions of the others)."""
    from cudarl import losses
    from cudarl.optim import StackedAdam

    seen = {"grid_barrier": set(), "adam": set()}

    def spy(owner, name, record):
        f = getattr(owner, name)

        def called(*args, **kw):
            record(args, kw)
            return f(*args, **kw)

        monkeypatch.setattr(owner, name, called)

    def learners_loss(args, kw):  # the learner's loss ([P] members), not an agent's ([1])
        if kw["out"].loss.shape == (3,):
            seen["grid_barrier"].add(kw["grid_barrier"])

    spy(losses, "c51_targets_loss", learners_loss)
    spy(StackedAdam, "clip_update_publish", lambda args, kw: seen["adam"].add(args[-1]))
    cfg = _config()
    _run_and_compare(np, cfg, 3, _seeds(rng, 3), [0, 1, 2], rng, updates=5, one_launch=one_launch)
    told = {op: {"always" if v else False} for op, v in one_launch.items()}  # what the launchers were told
    assert seen["grid_barrier"] == told["targets_loss"]
    assert seen["adam"] == told["adam"]


@pytest.mark.parametrize(
    "over, bad",
    [
        ({"agent": {"cql_alpha": 0.1}}, "agent.cql_alpha"),
        ({"agent": {"aux": ["horizons"]}}, "agent.aux"),
        ({"net": {"head": "iqn"}}, "head"),
        ({"net": {"layernorm": True}}, "layernorm"),
        ({"net": {"spectral": ["enc.0"]}}, "spectral"),
        ({"net": {"gemm": "cublaslt"}}, "gemm"),
    ],
)
def test_only_the_reference_train_step_is_stacked(over, bad):
    cfg = _config(**over)
    with pytest.raises(ValueError, match=bad):
        reference_config(cfg)
    with pytest.raises(ValueError, match="reference"):
        StackedLearner(cfg, 7, 3, [1, 2], np)


def test_train_phases_refuse_a_single_replay(rng):
    cfg = _config()
    learner = StackedLearner(cfg, 7, 3, [1, 2], np)
    with pytest.raises(ValueError, match="stacked replay of 2 members"):
        learner.train_phases(stacked_replay(cfg, E, [1, 2, 3], backend="numpy"), _windows(np, rng, 1))


def test_published_reads_every_members_loss_and_statistics(rng):
    cfg = _config()
    learner, replay, _, _, win = _build(np, cfg, 2, _seeds(rng, 2), [], rng)
    g = StepGraph("train_stacked", learner.train_phases(replay, win), xp=np)
    g.capture()
    g.replay()
    learner.mark_published(1)
    got = learner.published(1)
    assert_bitwise(got["loss"], learner.loss, what="published loss")
    assert_bitwise(got["grad_norm"], learner.grad_norm, what="published grad norm")
    assert_bitwise(got["stats"], learner.stats, what="published statistics")


# --- GPU ------------------------------------------------------------------------------------------------
def _reference_cfg(net=None, **over):
    """The reference workload's learner (64 features + 2 of position, 256-256, 51 atoms, batch 512),
    its replay small; ``net`` overrides its net section."""
    return _config(
        net={"hidden": [256, 256], "atoms": 51, **(net or {})},
        agent={"batch_size": 512, "popart_warmup": 4},
        replay={"capacity": 4096},
        **over,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("P, members", [(1, [0]), (3, [0, 1, 2]), (64, [0, 37, 63])])
def test_gpu_members_are_single_agents_bitwise(cp, rng, P, members):
    """Every graph captured before any eager run; member ``i`` against its agent after each update."""
    sync = cp.cuda.Device().synchronize
    _run_and_compare(cp, _reference_cfg(), P, _seeds(rng, P), members, rng, 6, features=64, sync=sync)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 2, 64, 256])
def test_gpu_learner_takes_the_forms_of_the_rule(cp, P):
    """On the device's resident grid: a population of one takes both one-launch forms (the single
    agent's); any P takes what barrier_grid_fits says for the loss's and the optimiser's full grids."""
    from cudarl.kernels import resident_grid_limit

    learner = StackedLearner(_reference_cfg(), 66, 3, list(range(P)), cp)
    assert learner.one_launch == learner.one_launch_forms(resident_grid_limit())
    if P == 1:
        assert learner.one_launch == {"targets_loss": True, "adam": True}


@pytest.mark.gpu
@pytest.mark.parametrize("P, members", [(3, [0, 1, 2]), (64, [0, 37, 63])])
def test_gpu_members_are_single_agents_bitwise_in_the_one_launch_forms(cp, rng, P, members):
    """The one-launch forms at P > 1 (each member resident_grid_limit() // P blocks of the grid-barrier
    launches), which the learner does not take by itself in the reference configuration (the test above
    runs the forms it takes): member ``i`` against its agent after each update."""
    sync = cp.cuda.Device().synchronize
    one = {"targets_loss": True, "adam": True}
    _run_and_compare(cp, _reference_cfg(), P, _seeds(rng, P), members, rng, 6, features=64, sync=sync, one_launch=one)


@pytest.mark.gpu
@pytest.mark.parametrize("P, members", [(3, [0, 1, 2]), (64, [0, 37, 63])])
def test_gpu_members_are_single_agents_bitwise_with_one_kernel_weight_gradients(cp, rng, P, members):
    """net.dw_gemm = "one_kernel" for the learner and the agents: each layer's weight gradients one batched
    one-kernel cuBLASLt GEMM over the members against each agent's one-kernel GEMM; every graph captured
    before any eager run (the plans: StackedQNetwork.new_workspace and prepare_input(backward=True),
    Agent's prepare_backward); member ``i`` against its agent after each update."""
    sync = cp.cuda.Device().synchronize
    cfg = _reference_cfg(net={"dw_gemm": "one_kernel"})
    _run_and_compare(cp, cfg, P, _seeds(rng, P), members, rng, 6, features=64, sync=sync)


@pytest.mark.gpu
@pytest.mark.parametrize("P, members", [(1, [0]), (3, [0, 1, 2]), (8, [0, 5, 7])])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_members_are_single_agents_bitwise_under_chain(cp, rng, P, members, dw_gemm):
    """net.gemm = "chain" for the learner and the agents: the learner's forwards one gemm.chain launch each
    for every member (grid z) and its dx chain one gemm.chain_backward, each agent's its own; every graph
    captured before any eager run; member ``i`` against its agent after each update."""
    from cudarl import kernels

    sync = cp.cuda.Device().synchronize
    cfg = _reference_cfg(net={"gemm": "chain", "dw_gemm": dw_gemm})
    with kernels.tracing() as events:
        learner = _run_and_compare(cp, cfg, P, _seeds(rng, P), members, rng, 4, features=64, sync=sync)
    assert learner.online._chain and learner.ws.chained
    launched = [e["name"] for e in events if e.get("kind") == "kernel"]
    assert "cudarl_gemm_chain" in launched and "cudarl_gemm_chain_backward" in launched, sorted(set(launched))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "P, gemm", [(3, "cublaslt_nosplit"), (64, "cublaslt_nosplit"), (1, "chain"), (3, "chain"), (8, "chain")]
)
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_stacked_step_graphed_equals_eager(cp, P, gemm, dw_gemm):
    """Two learners of the same seeds and rows: one captured before any eager run and replayed, one run
    eagerly; every member buffer equal after each update, bit for bit."""
    cfg, seeds = _reference_cfg(net={"dw_gemm": dw_gemm, "gemm": gemm}), _seeds(np.random.default_rng(11), P)
    runs = []
    for _ in range(2):
        learner, replay, _, _, win = _build(cp, cfg, P, seeds, [], np.random.default_rng(5), features=64)
        graph = StepGraph(f"train_stacked_{P}_{gemm}_{dw_gemm}", learner.train_phases(replay, win), xp=cp)
        runs.append((learner, replay, graph))
    runs[0][2].capture()
    for step in range(1, 6):
        for k, (learner, _, g) in enumerate(runs):
            (g.replay if k == 0 else g.run_eager)()
            learner.between_updates(step, g.stream)
        cp.cuda.Device().synchronize()
        _assert_learners_bitwise(runs, f"update {step}", "graphed against eager")


def _assert_learners_bitwise(runs, when: str, what: str) -> None:
    """Two ``(learner, replay, graph)`` runs: every member buffer of both learners and replays, bit for bit."""
    (la, ra, _), (lb, rb, _) = runs
    for name, x, y in (
        ("parameters", la.online.params, lb.online.params),
        ("gradients", la.online.grads, lb.online.grads),
        ("target", la.target.params, lb.target.params),
        ("Adam m", la.adam.m, lb.adam.m),
        ("Adam v", la.adam.v, lb.adam.v),
        ("loss", la.loss, lb.loss),
        ("priorities", la.priority, lb.priority),
        ("PopArt", la.popart.state, lb.popart.state),
        ("statistics", la.stats, lb.stats),
        ("sum trees", ra.bufs.tree, rb.bufs.tree),
    ):
        assert_bitwise(x, y, what=f"{when}: {name}, {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [8, 64])
def test_gpu_batched_algo_probe_trains_bitwise_as_single(cp, P):
    """net.batched_algo = "probe" against "single" (net.dw_gemm = "one_kernel", so the forwards, dx and dW
    are all batched GEMMs): two learners of the same seeds and rows, both captured before any eager run;
    every member buffer equal after each update, bit for bit; batched_plan_info lists the probe plans,
    each choosing the fastest of its recorded times."""
    from cudarl import blas

    seeds = _seeds(np.random.default_rng(13), P)
    runs = []
    for algo in ("single", "probe"):
        cfg = _reference_cfg(net={"dw_gemm": "one_kernel", "batched_algo": algo})
        learner, replay, _, _, win = _build(cp, cfg, P, seeds, [], np.random.default_rng(7), features=64)
        graph = StepGraph(f"train_stacked_{P}_{algo}", learner.train_phases(replay, win), xp=cp)
        graph.capture()
        runs.append((learner, replay, graph))
    for step in range(1, 5):
        for learner, _, g in runs:
            g.replay()
            learner.between_updates(step, g.stream)
        cp.cuda.Device().synchronize()
        _assert_learners_bitwise(runs, f"update {step}", "batched_algo probe against single")
    records = [r for r in blas.batched_plan_info().values() if r["mode"] == "probe" and r["batch"] == P]
    assert records, "no probe plan was made"
    changed = sum(r["changed"] for r in records)
    print(f"P={P}: {changed} of {len(records)} batched plans took another algorithm than the single one")
    for r in records:  # the choice is the fastest of the recorded times (the single one on a tie)
        timed = {i: p["us"] for i, p in enumerate(r["probes"]) if p["equal"]}
        assert all(p["us"] is None for p in r["probes"] if not p["equal"]), r
        if not timed:
            assert r["chosen_index"] is None and not r["changed"], r
            continue
        best = min(timed, key=lambda i: (timed[i], i))
        want = best if timed[best] < r["single_us"] else None
        assert r["chosen_index"] == want and r["changed"] == (want is not None), r
        print(
            f"  {r['shape']} epilogue {r['epilogue']}: single {r['single_us']:.1f} us, chosen {r['chosen_index']}, "
            f"{[(p['tile_name'], p['us']) for p in r['probes']]}"
        )
