"""``StackedQNetwork``: P members of the reference network with a leading member axis (issue 23, stage 2).

Member ``i`` of a stacked forward and backward is the single ``QNetwork`` with member ``i``'s parameters,
bit for bit: on the CPU at P = 1 and 3 (the twins loop over members), on the GPU at P = 1, 3 and 64
(batched cuBLASLt GEMMs and the member-axis kernels against P single networks), and a captured stacked
forward + backward replays the eager run's bits; under each ``net.dw_gemm`` (the weight gradients per
member with split-K, or one batched one-kernel GEMM a layer), against single networks of the same. Under
``net.gemm = "chain"`` the stacked forward and the backward's dx chain are one launch each for every member
(``gemm.chain``, ``gemm.chain_backward``), where the single network's are: on the CPU with the twins as the
launches (P = 1, 3), on the GPU at P = 1, 3 and 8, captured too.
"""

import numpy as np
import pytest

from cudarl.nn import QNetwork, StackedQNetwork, StackedWorkspace
from cudarl.nn.params import ALIGN, stacked_zeros
from cudarl.testing import assert_bitwise, poison

SMALL = {"hidden": (32, 16), "atoms": 11}  # the CPU's members: a small reference network
REFERENCE = {"hidden": (256, 256), "atoms": 51}  # the reference workload's network
N_ACTIONS = 3


def _stacked_and_singles(xp, P: int, n_in: int, max_batch: int, net_kw: dict, seeds=None):
    """A stacked network of P members and the P single networks of the same seeds."""
    seeds = list(range(11, 11 + P)) if seeds is None else seeds
    stacked = StackedQNetwork(n_in, N_ACTIONS, members=P, xp=xp, max_batch=max_batch, seeds=seeds, **net_kw)
    singles = [QNetwork(n_in, N_ACTIONS, xp=xp, max_batch=max_batch, seed=s, **net_kw) for s in seeds]
    return stacked, singles


def _assert_members_are_singles(
    xp, rng, stacked, singles, B: int, raw_head: bool = False, with_dx: bool = True, sides=()
):
    """One forward and backward of ``stacked`` on random inputs and output gradients, the same of each
    single network on its member's; member i's output, parameter gradients and dx equal network i's.
    ``sides``: the stacked network's side streams, joined after its backward."""
    P, n_in = stacked.members, stacked.n_in
    x = stacked.input(B=B)
    x[...] = xp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    poison(stacked.grads)
    out = stacked.forward(x, raw_head=raw_head)
    g = stacked.grad_output(raw_head=raw_head)
    g[...] = xp.asarray(rng.standard_normal(g.shape).astype(np.float32))
    want = []
    for i, net in enumerate(singles):  # before the stacked backward, which consumes the gradient rows
        q = net.forward(x[i].copy(), raw_head=raw_head)["q"]
        net.grad_outputs(raw_head=raw_head)["q"][...] = g[i]
        poison(net.grads)
        d = xp.full((B, n_in), np.nan, dtype=np.float32) if with_dx else None
        net.backward(dx=d)
        for lin in net.linears.values():  # the single network's branches (set_side_stream), if any
            if lin.side is not None:
                lin.side.join()
        want.append((q, net.grads, d))
    dx = None
    if with_dx:
        dx = stacked_zeros(xp, P, (B, n_in))
        poison(dx)
    stacked.backward(dx=dx)
    for side in sides:
        side.join()
    for i, (q, grads, d) in enumerate(want):
        assert_bitwise(out[i], q, what=f"member {i} of {P}: {'va' if raw_head else 'logits'}")
        assert_bitwise(stacked.grads[i], grads, what=f"member {i} of {P}: gradients")
        if with_dx:
            assert_bitwise(dx[i], d, what=f"member {i} of {P}: dx")


# --- CPU -------------------------------------------------------------------------------------------------
def test_member_rows_are_single_network_buffers():
    """Row i of the stacked parameters is QNetwork(seed=seeds[i])'s flat buffer; rows are 256 bytes apart
    (a multiple); the named views are views; a member copies to and from a single network bit for bit."""
    stacked, singles = _stacked_and_singles(np, 3, 10, 8, SMALL, seeds=[5, 9, 2])
    assert stacked.layout.entries == singles[0].layout.entries
    assert stacked.params.shape == (3, singles[0].layout.padded_size)
    assert stacked.params.strides[0] % (ALIGN * 4) == 0 and stacked.grads.strides[0] % (ALIGN * 4) == 0
    for i, net in enumerate(singles):
        assert_bitwise(stacked.params[i], net.params, what=f"member {i}'s initial parameters")
        for name, view in stacked.P.items():
            assert view.shape == (3, *net.P[name].shape) and np.shares_memory(view, stacked.params)
            assert_bitwise(view[i], net.P[name], what=f"member {i}'s {name}")
    stacked.P["enc.1.bias"][1, 0] = 7.0  # a write through a view lands in member 1's row at the layout's offset
    assert stacked.params[1, stacked.layout["enc.1.bias"].offset] == 7.0
    stacked.store_member(1, singles[0])
    assert_bitwise(singles[0].params, stacked.params[1], what="stored member")
    stacked.load_member(2, singles[0])
    assert_bitwise(stacked.params[2], stacked.params[1], what="loaded member")
    with pytest.raises(ValueError, match="another layout"):
        stacked.load_member(0, QNetwork(10, N_ACTIONS, hidden=(32,), atoms=11))


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("raw_head", [False, True])
@pytest.mark.parametrize("with_dx", [False, True])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_members_equal_single_networks(rng, P, raw_head, with_dx, dw_gemm):
    stacked, singles = _stacked_and_singles(np, P, 10, 9, {**SMALL, "dw_gemm": dw_gemm})
    _assert_members_are_singles(np, rng, stacked, singles, B=7, raw_head=raw_head, with_dx=with_dx)


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("with_dx", [False, True])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_weight_gradients_on_branches_keep_the_bits(rng, P, with_dx, dw_gemm):
    """With a side stream per layer (the train step's: dW and the bias sums beside the dx chain), member
    i still equals the single network on one stream, and the one with its layers' branches."""
    from cudarl.graph import SideStream

    stacked, singles = _stacked_and_singles(np, P, 10, 9, {**SMALL, "dw_gemm": dw_gemm})
    sides = [SideStream(np) for _ in stacked.linears]
    stacked.set_side_stream(sides)
    _assert_members_are_singles(np, rng, stacked, singles, B=7, raw_head=True, with_dx=with_dx, sides=sides)
    for net in singles:
        net.set_side_stream([SideStream(np) for _ in net.linears])
    _assert_members_are_singles(np, rng, stacked, singles, B=7, raw_head=True, with_dx=with_dx, sides=sides)
    with pytest.raises(ValueError, match="2 side streams for 3 layers"):
        stacked.set_side_stream([SideStream(np)] * 2)


@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_dw_gemm_picks_one_batched_gemm_a_layer_or_one_per_member(rng, monkeypatch, dw_gemm):
    """The stacked backward reads net.dw_gemm as the single network does: "one_kernel", each layer's weight
    gradients one gemm_lt_batched(trans_a) over every member and no per-member GEMM; "split_k", P
    cuBLAS GEMMs a layer (the single network's matmul) and no batched one."""
    from cudarl import blas
    from cudarl.nn import stacked as stacked_mod

    calls = {"batched": [], "per member": []}
    batched, matmul = blas.gemm_lt_batched, stacked_mod.matmul

    def spy_batched(a, b, out, **kw):
        if kw.get("trans_a"):
            calls["batched"].append(tuple(out.shape))
        return batched(a, b, out, **kw)

    def spy_matmul(a, b, out, **kw):
        calls["per member"].append(tuple(out.shape))
        return matmul(a, b, out, **kw)

    monkeypatch.setattr(blas, "gemm_lt_batched", spy_batched)
    monkeypatch.setattr(stacked_mod, "matmul", spy_matmul)
    P = 3
    stacked, singles = _stacked_and_singles(np, P, 10, 9, {**SMALL, "dw_gemm": dw_gemm})
    assert stacked.dw_batched == (dw_gemm == "one_kernel")
    _assert_members_are_singles(np, rng, stacked, singles, B=7)
    shapes = [(lin.n_in, lin.n_out) for lin in reversed(stacked.linears)]  # the backward's order
    if dw_gemm == "one_kernel":
        assert calls == {"batched": [(P, *s) for s in shapes], "per member": []}
    else:
        assert calls == {"batched": [], "per member": [s for s in shapes for _ in range(P)]}


def test_members_stay_single_networks_over_a_second_batch(rng):
    """A second forward and backward on other rows (and a smaller batch) over the same workspace."""
    stacked, singles = _stacked_and_singles(np, 3, 10, 9, SMALL)
    _assert_members_are_singles(np, rng, stacked, singles, B=9)
    _assert_members_are_singles(np, rng, stacked, singles, B=1)


@pytest.mark.parametrize(
    "fields",
    [
        {"layernorm": True},
        {"head": "iqn"},
        {"spectral": ("enc.0",)},
        {"plan": True},
        {"gemm": "cublas"},
        {"gemm": "cublaslt"},
        {"gemm": "cudarl"},
    ],
)
def test_only_the_reference_network_is_stacked(fields):
    with pytest.raises(ValueError, match="reference network only"):
        StackedQNetwork(10, N_ACTIONS, members=2, **SMALL, **fields)


def _chained_on_numpy(monkeypatch, P: int, net_kw: dict):
    """A stacked network and its P single networks under net.gemm = "chain", run on NumPy as on the GPU: the
    chain set the GPU's (NumPy's is ()), the launches their twins (gemm.chain, gemm.chain_backward) with their
    eligibility taken as given, as tests/parity/test_nn.py's chained single network. Returns the networks and
    the launches seen: ``(op, x's or d's shape, [weight shapes], accumulate)``."""
    from cudarl.reference import gemm as twin

    monkeypatch.setattr(twin, "chain_eligible", lambda x, layers: True, raising=False)
    monkeypatch.setattr(twin, "chain_backward_eligible", lambda d, layers: True, raising=False)
    calls, chain, chain_backward = [], twin.chain, twin.chain_backward

    def spy_chain(x, layers):
        calls.append(("chain", x.shape, [tuple(w.shape) for w, *_ in layers], False))
        chain(x, layers)

    def spy_chain_backward(d, layers, accumulate=False):
        calls.append(("chain_backward", d.shape, [tuple(w.shape) for w, *_ in layers], accumulate))
        chain_backward(d, layers, accumulate)

    monkeypatch.setattr(twin, "chain", spy_chain)
    monkeypatch.setattr(twin, "chain_backward", spy_chain_backward)
    stacked, singles = _stacked_and_singles(np, P, 10, 9, {**SMALL, **net_kw, "gemm": "chain"})
    assert stacked._chain == () and all(net._chain == () for net in singles)  # NumPy's: the layers one by one
    for net in (stacked, *singles):
        net._chain = (*net.encoder.chain_linears(), net.head.chain_linear)  # the GPU's
    return stacked, singles, calls


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("raw_head", [False, True])
@pytest.mark.parametrize("with_dx", [False, True])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_chained_members_equal_chained_single_networks(rng, monkeypatch, P, raw_head, with_dx, dw_gemm):
    """net.gemm = "chain" (the GPU's path, on NumPy with the twins as launches): the stacked forward is one
    gemm.chain over every member ([P, B, n_in], each layer's weight [P, K, N]) where each single network
    runs its own; the backward's dx chain one gemm.chain_backward from dL/dva down to enc.0's dz, or, with
    an input gradient asked, none in either (both fall back layer by layer). Member i's output, gradients and
    dx bit for bit single network i's."""
    stacked, singles, calls = _chained_on_numpy(monkeypatch, P, {"dw_gemm": dw_gemm})
    B, (h0, h1), va = 7, SMALL["hidden"], (1 + N_ACTIONS) * SMALL["atoms"]
    _assert_members_are_singles(np, rng, stacked, singles, B=B, raw_head=raw_head, with_dx=with_dx)
    assert stacked.ws.chained and all(net.ws.chained for net in singles)
    fwd = [(10, h0), (h0, h1), (h1, va)]
    bwd = [(h1, va), (h0, h1)]  # va's weight, then enc.1's: dL/dva down to enc.0's dz
    one = [("chain", (B, 10), fwd, False)] + ([] if with_dx else [("chain_backward", (B, va), bwd, False)])
    stacked_bwd = [] if with_dx else [("chain_backward", (P, B, va), [(P, *s) for s in bwd], False)]
    # the stacked forward, each single network's forward and backward, then the stacked backward
    assert calls == [("chain", (P, B, 10), [(P, *s) for s in fwd], False), *one * P, *stacked_bwd]


@pytest.mark.parametrize("P", [1, 3])
def test_chained_members_keep_the_bits_with_weight_gradients_on_branches(rng, monkeypatch, P):
    """The chained backward with a side stream per layer (the train step's: dW and the bias sums beside the dx
    chain, as QNetwork's chained backward puts them): member i still the chained single network, on one
    stream and on its layers' branches; over a second, smaller batch too."""
    from cudarl.graph import SideStream

    stacked, singles, calls = _chained_on_numpy(monkeypatch, P, {})
    sides = [SideStream(np) for _ in stacked.linears]
    stacked.set_side_stream(sides)
    _assert_members_are_singles(np, rng, stacked, singles, B=7, with_dx=False, sides=sides)
    for net in singles:
        net.set_side_stream([SideStream(np) for _ in net.linears])
    _assert_members_are_singles(np, rng, stacked, singles, B=2, raw_head=True, with_dx=False, sides=sides)
    assert sum(op == "chain_backward" and len(shape) == 3 for op, shape, *_ in calls) == 2


def test_chained_stacked_network_falls_back_where_the_launch_refuses(rng, monkeypatch):
    """Where chain_eligible (chain_backward_eligible) refuses, the stacked network runs its layers one by one
    (its dx as batched GEMMs), as the single network does, and members still equal single networks."""
    from cudarl.reference import gemm as twin

    stacked, singles, calls = _chained_on_numpy(monkeypatch, 3, {})
    monkeypatch.setattr(twin, "chain_backward_eligible", lambda d, layers: False, raising=False)
    _assert_members_are_singles(np, rng, stacked, singles, B=5, with_dx=False)
    assert stacked.ws.chained and [op for op, *_ in calls] == ["chain"] * 4  # three singles', the stack's
    monkeypatch.setattr(twin, "chain_eligible", lambda x, layers: False, raising=False)
    calls.clear()
    _assert_members_are_singles(np, rng, stacked, singles, B=5, with_dx=False)
    assert not stacked.ws.chained and calls == []


def test_workspace_rows_are_members_of_single_rows():
    ws = StackedWorkspace(np, np.float32, 3, 5)
    ws.add("a", (7,))
    ws.set_batch(4)
    rows = ws.rows("a")
    assert rows.shape == (3, 4, 7) and rows.strides[0] % (ALIGN * 4) == 0
    assert all(rows[i].flags.c_contiguous for i in range(3))
    with pytest.raises(ValueError, match="no merged rows"):
        ws.add("b", (2, 3), merge=True)


# --- GPU -------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "P,B,tf32,dw_gemm",
    [
        (1, 512, False, "split_k"),
        (3, 7, False, "split_k"),
        (3, 512, False, "split_k"),
        (3, 512, True, "split_k"),
        (64, 512, False, "split_k"),
        (1, 512, False, "one_kernel"),
        (3, 7, False, "one_kernel"),
        (3, 512, True, "one_kernel"),
        (64, 512, False, "one_kernel"),
    ],
)
def test_gpu_members_equal_single_networks_bitwise(cp, rng, P, B, tf32, dw_gemm):
    """The reference network (66 inputs: 64 features + 2 of position; 256-256; 51 atoms): batched
    cuBLASLt forwards and dx, dW per member (cuBLAS split-K) or batched (one-kernel cuBLASLt), the
    member-axis kernels, against P single networks of the same dw_gemm."""
    stacked, singles = _stacked_and_singles(cp, P, 66, 512, {**REFERENCE, "tf32": tf32, "dw_gemm": dw_gemm})
    _assert_members_are_singles(cp, rng, stacked, singles, B=B)
    if P == 3 and B == 512 and not tf32:
        _assert_members_are_singles(cp, rng, stacked, singles, B=B, raw_head=True, with_dx=False)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_weight_gradients_on_branches_keep_the_bits(cp, rng, P, dw_gemm):
    """The weight gradients of every layer on a branch of its own (the train step's), eager: member i
    equals the single network of the same dw_gemm on one stream ("one_kernel": one batched GEMM a layer
    against each single network's one-kernel cuBLASLt GEMM)."""
    from cudarl.graph import SideStream

    stacked, singles = _stacked_and_singles(cp, P, 66, 512, {**REFERENCE, "dw_gemm": dw_gemm})
    sides = [SideStream(cp) for _ in stacked.linears]
    stacked.set_side_stream(sides)
    _assert_members_are_singles(cp, rng, stacked, singles, B=512, raw_head=True, with_dx=True, sides=sides)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 8])
@pytest.mark.parametrize("B", [7, 512])
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_chained_members_equal_chained_single_networks_bitwise(cp, rng, P, B, dw_gemm):
    """net.gemm = "chain" on the reference network: the stacked forward is one gemm.chain launch (grid z the
    member) and its backward's dx chain one gemm.chain_backward, where each single network runs its own;
    member i's logits (va), gradients and dx against single network i's, bit for bit. With an input gradient
    asked, both run the dx layer by layer (no chain_backward)."""
    from cudarl import kernels

    stacked, singles = _stacked_and_singles(cp, P, 66, 512, {**REFERENCE, "gemm": "chain", "dw_gemm": dw_gemm})
    want = ("enc.0", "enc.1", "head.va")
    assert tuple(lin.name for lin in stacked._chain) == want
    assert all(tuple(lin.name for lin in net._chain) == want for net in singles)
    for raw_head, with_dx in ((False, False), (True, False), (False, True)):
        with kernels.tracing() as events:
            _assert_members_are_singles(cp, rng, stacked, singles, B=B, raw_head=raw_head, with_dx=with_dx)
        launched = [e["name"] for e in events if e.get("kind") == "kernel"]
        assert launched.count("cudarl_gemm_chain") == P + 1, launched  # each single's, the stack's
        assert launched.count("cudarl_gemm_chain_backward") == (0 if with_dx else P + 1), launched
        assert stacked.ws.chained


@pytest.mark.gpu
@pytest.mark.parametrize(
    "P, gemm", [(3, "cublaslt_nosplit"), (64, "cublaslt_nosplit"), (1, "chain"), (3, "chain"), (8, "chain")]
)
@pytest.mark.parametrize("dw_gemm", ["split_k", "one_kernel"])
def test_gpu_stacked_graphed_equals_eager_bitwise(cp, rng, P, gemm, dw_gemm):
    """One stacked forward + backward captured before any eager run (the plans come from new_workspace,
    the batched dW's under "one_kernel" too): the replay and a later eager run give the same logits,
    gradients and dx, bit for bit; under net.gemm = "chain" the backward without dx (its dx chain one
    launch), then with dx (layer by layer), both captured."""
    from cudarl.graph import StepGraph

    B = 512
    net = {**REFERENCE, "dw_gemm": dw_gemm, "gemm": gemm}
    stacked = StackedQNetwork(66, N_ACTIONS, members=P, xp=cp, max_batch=B, **net)
    x = stacked.input()
    x[...] = cp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    g = cp.asarray(rng.standard_normal((P, B, N_ACTIONS, REFERENCE["atoms"])).astype(np.float32))
    dx = stacked_zeros(cp, P, (B, 66))
    outs = {}

    def step():
        outs["logits"] = stacked.forward(x)
        cp.copyto(stacked.grad_output(), g)  # a device-to-device copy, no allocation
        if gemm == "chain":
            stacked.backward()  # the dx chain in one launch
            cp.copyto(stacked.grad_output(), g)
        stacked.backward(dx=dx)

    graph = StepGraph(f"stacked_net_{P}_{gemm}_{dw_gemm}", [("fwd_bwd", step)], xp=cp)
    graph.capture()
    results = {}
    for what, run in (("graphed", graph.replay), ("eager", graph.run_eager)):
        for buf in (stacked.grads, dx, stacked.ws.bufs["head.logits"]):
            poison(buf)
        cp.cuda.Device().synchronize()
        run()
        cp.cuda.Device().synchronize()
        results[what] = {"logits": outs["logits"].get(), "grads": stacked.grads.get(), "dx": dx.get()}
    for k, v in results["graphed"].items():
        assert_bitwise(v, results["eager"][k], what=f"P = {P}, {gemm}: graphed vs eager {k}")
    # every gradient the layout names is written (the padding between entries and members is not)
    grads = cp.asarray(results["graphed"]["grads"])
    assert all(bool(cp.isfinite(v).all()) for v in stacked.views(grads).values())
