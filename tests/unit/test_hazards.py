"""cudarl.hazards: cross-stream hazards of a step graph, found on the NumPy backend.

The checker must see a side branch that writes what the main stream reads before the join (by an op or by a
NumPy expression), a main write of what a side reads after the fork, and two branches sharing a ticket; must
not see them once a join orders them or the bytes differ (a member's rows from another's in an interleaved
view); and finds none in the train and collect graphs of the configurations with the most branches.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from cudarl import blas
from cudarl.graph import SideStream, StepGraph
from cudarl.hazards import find_hazards, longest_chain

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

RNG = np.random.default_rng(0)


def _graph(phases):
    g = StepGraph("toy", phases, xp=np)
    g.capture()
    return g


def _mats(n=3):
    return [RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("join", [False, True])
def test_a_side_write_read_on_main_before_the_join_is_a_hazard(join):
    a, b, mid, out = _mats(4)
    side = SideStream(np)

    def phase():
        with side.fork():
            blas.gemm(a, b, mid)  # writes mid on the side
        if join:
            side.join()
        blas.gemm(mid, b, out)  # reads mid on the main stream

    found = find_hazards(_graph([("p", phase)]))
    if join:
        assert found == []
    else:
        assert [h.kind() for h in found] == ["write-read"]
        assert found[0].first.stream != "main" and found[0].second.stream == "main"
        assert "blas.gemm" in found[0].message()


def test_a_write_by_a_numpy_expression_on_a_side_is_seen():
    """A twin that returns its output leaves the write to its caller (``buf[...] = twin(...)``): the bytes
    changed between two boundaries are the writes of the stream they ran on."""
    a, b, mid, out = _mats(4)
    side = SideStream(np)

    def phase():
        with side.fork():
            mid[...] = a @ b  # no op: a NumPy expression in the phase
        blas.gemm(mid, b, out)

    found = find_hazards(_graph([("p", phase)]))
    assert [h.kind() for h in found] == ["write-read"]
    assert found[0].first.op == "writes"


@pytest.mark.parametrize("reads", ["the side's output", "the main stream's"])
def test_a_branch_forked_from_a_resumed_side_waits_for_that_side_only(reads):
    """``SideStream.resume``: a branch forked there is ordered after the resumed side's work (what it wrote is
    safe to read), not after what the main stream did since that side forked (reading that is a hazard), as
    buffers.after_extras and after_q_stats fork the heads' losses and causal's penalty."""
    a, b, mid, late, out = _mats(5)
    first, branch = SideStream(np), SideStream(np)

    def phase():
        with first.fork():
            blas.gemm(a, b, mid)  # the side's output
        blas.gemm(a, a, late)  # the main stream's, after the fork
        with first.resume(), branch.fork():
            blas.gemm(mid if reads == "the side's output" else late, b, out)
        branch.join()
        first.join()

    found = find_hazards(_graph([("p", phase)]))
    if reads == "the side's output":
        assert found == []
    else:
        assert [h.kind() for h in found] == ["write-read"] and found[0].first.stream == "main"


@pytest.mark.parametrize("how", ["join", "wait"])
def test_a_side_joined_elsewhere_first_orders_nothing_at_its_owners_join(how):
    """``SideStream.join`` clears the side's pending state wherever it joins: joined into another branch first,
    its owner's later join is a no-op, so the main stream is not ordered after it (a hazard, as the GPU
    would race). ``SideStream.wait`` orders the other branch and leaves it pending for its owner."""
    a, b, mid, out, other = _mats(5)
    side, third = SideStream(np), SideStream(np)

    def phase():
        with side.fork():
            blas.gemm(a, b, mid)  # the side's output
        with third.fork():
            side.join() if how == "join" else side.wait()
            blas.gemm(a, a, other)
        side.join()  # the owner's join
        blas.gemm(mid, b, out)  # reads the side's output on the main stream
        third.join()

    found = find_hazards(_graph([("p", phase)]))
    if how == "wait":
        assert found == []
    else:
        assert [h.kind() for h in found] == ["write-read"]


def test_a_main_write_of_what_a_side_reads_after_the_fork_is_a_hazard():
    """The fork orders the side after the main stream's work so far, not after what follows it."""
    a, b, c, out = _mats(4)
    side = SideStream(np)

    def phase():
        blas.gemm(a, b, c)  # before the fork: ordered
        with side.fork():
            blas.gemm(c, b, out)  # reads c
        blas.gemm(a, a, c)  # rewrites c while the side may still read it

    found = find_hazards(_graph([("p", phase)]))
    assert [h.kind() for h in found] == ["read-write"]


def test_interleaved_rows_of_two_views_are_told_apart():
    """Two views of one buffer whose byte bounds overlap but whose runs do not (two layers' rows of a
    population's ``[P, n_params]`` gradients) are no hazard; views sharing bytes are."""
    a = RNG.standard_normal((3, 8, 8)).astype(np.float32)
    s1, s2 = SideStream(np), SideStream(np)

    def hazards(lo):
        # a fresh buffer each time: a write of the values already there is not seen (module docstring)
        flat = np.zeros((3, 200), np.float32)
        view = lambda at: flat[:, at : at + 64].reshape(3, 8, 8)  # noqa: E731  member i's rows at..at+63

        def phase():
            with s1.fork():
                blas.gemm_lt_batched(a, a, view(0))
            with s2.fork():
                blas.gemm_lt_batched(a, a, view(lo))

        return [h.kind() for h in find_hazards(_graph([("p", phase)]))]

    assert hazards(100) == []
    assert hazards(32) == ["write-write"]


@pytest.mark.parametrize("shared", [True, False])
def test_two_branches_sharing_a_ticket_counter_are_a_hazard(shared):
    """A ticketed launch's counter is left 0, so its bytes never change; it counts as written all the same:
    two unordered launches sharing one would mix their blocks' tickets on the GPU."""
    from cudarl.reference import optim
    from cudarl.reference.optim import GN_BLOCKS

    sides = SideStream(np), SideStream(np)
    tickets = [np.zeros(1, np.uint32) for _ in range(2)]
    z = lambda n: np.zeros(n, np.float32)  # noqa: E731
    bufs = [(RNG.standard_normal(1000).astype(np.float32), z(GN_BLOCKS), z(1), z(1)) for _ in range(2)]

    def phase():
        for k, side in enumerate(sides):
            g, partial, norm, scale = bufs[k]
            with side.fork():
                optim.grad_norm(g, partial, norm, scale, 1.0, tickets[0 if shared else k])

    kinds = [h.kind() for h in find_hazards(_graph([("p", phase)]))]
    assert kinds == (["write-write"] if shared else [])


def test_the_checker_leaves_the_ops_and_side_streams_as_they_were():
    before = (blas.gemm, SideStream.fork, SideStream.join)
    find_hazards(_graph([("p", lambda: None)]))
    assert (blas.gemm, SideStream.fork, SideStream.join) == before


AUX = "agent.aux=[horizons,risk,denoise,selectivity,vaccine,causal,homeostatic]"
GRAPHS = {
    "trainer": [],
    "joined-population": ["--members", "3"],
    "every-signal": ["--set", AUX],
    # causal's gradient folded into vaccine's kernels, vaccine's sums forked from the last layer's dW branch
    "every-signal-bench-order": ["--set", "agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]"],
    "ssm-every-signal": ["--set", "net.encoder=ssm", "--set", "net.window=8", "--set", AUX],
    "attention-c51+iqn": ["--set", "net.encoder=attention", "--set", "net.window=8", "--set", "net.head=c51+iqn"],
    "c51+iqn-heads": ["--set", "net.head=c51+iqn", "--set", "agent.aux=[horizons,risk,denoise,selectivity]"],
    "iqn": ["--set", "net.head=iqn"],  # q_stats beside the backward (the quantile rule's)
    "qrdqn": ["--set", "net.head=qrdqn"],
    # q_stats' readers before the backward join its branch after the learn phases (Agent.q_stats_read)
    "cql": ["--set", "agent.cql_alpha=1.0"],
    "plan": ["--set", "net.plan=true"],
    "causal": ["--set", "agent.aux=[causal]"],
    "homeostatic": ["--set", "agent.aux=[homeostatic]"],
    # PopArt's learn phases move its statistics beside q_stats' branch
    "popart-cql": ["--set", "agent.popart=true", "--set", "agent.cql_alpha=1.0"],
    "iqn-popart-cql": ["--set", "net.head=iqn", "--set", "agent.popart=true", "--set", "agent.cql_alpha=1.0"],
}


@pytest.mark.parametrize("argv", GRAPHS.values(), ids=GRAPHS.keys())
def test_the_step_graphs_have_no_hazard(argv, capsys):
    """The train and collect graphs of the reference step and of the configurations with the most side
    branches: a new branch that breaks the fork/join rule fails here, on the CPU."""
    import stream_hazards

    assert stream_hazards.main(["--updates", "2", *argv]) == 0
    out = capsys.readouterr().out
    assert "train:" in out and "collect:" in out


def test_the_longest_chain_goes_through_the_longer_branch_and_its_join():
    """Two ops on a side beside one on the main stream, then one after the join: the chain is the side's two
    ops then the one after the join (3), not the main's (2); without the join the side is no predecessor."""
    a, b, c, d, e = _mats(5)
    side = SideStream(np)

    def phase(join):
        def run():
            with side.fork():
                blas.gemm(a, b, c)
                blas.gemm(c, b, d)
            blas.gemm(a, a, e)
            if join:
                side.join()
            blas.gemm(e, a, b)

        return run

    chain = longest_chain(_graph([("p", phase(True))]))
    assert [n.length for n in chain] == [1, 2, 3]
    assert all(n.op == "blas.gemm" and n.phase == "p" for n in chain)
    unjoined = longest_chain(_graph([("p", phase(False))]))
    assert len(unjoined) == 2


def test_the_tool_prints_the_reference_train_graphs_chain(capsys):
    import stream_hazards

    assert stream_hazards.main(["--updates", "2", "--chain"]) == 0
    out = capsys.readouterr().out
    length = int(out.split("train: longest chain ", 1)[1].split()[0])
    assert length > 10 and "per phase: " in out
