"""``net.gemm_algo``: the linear layers' one-kernel cuBLASLt GEMMs under ``probe`` take the fastest algorithm whose
output a probe finds bitwise the heuristic's (``cudarl.blas.gemm_lt(algo="probe")``, a batch of one under the
batched probe). CPU: the field, its reach (every linear layer, an auxiliary signal's too, and the plan keys the
warm-up and the workspaces make), the refusal of split-K; GPU: each probed GEMM and a trainer bit for bit the
heuristic's."""

import numpy as np
import pytest
from test_trainer import gpu_small, small

from cudarl import blas
from cudarl.config import Config, ConfigError, from_dict
from cudarl.nn.layers import GEMM_ALGOS, Linear
from cudarl.nn.network import forward_plan_keys
from cudarl.testing import assert_bitwise


def test_gemm_algo_defaults_to_the_heuristic_and_refuses_other_names():
    assert Config().net.gemm_algo == "heuristic" and set(GEMM_ALGOS) == {"heuristic", "probe"}
    assert set(GEMM_ALGOS.values()) == set(blas.BATCHED_ALGOS)
    with pytest.raises(ConfigError, match="gemm_algo must be one of"):
        from_dict({"net": {"gemm_algo": "fastest"}})


def test_gemm_algo_reaches_every_linear_layer_and_its_one_kernel_plans():
    """Under ``probe`` every layer of the online and target networks (an auxiliary head's and denoise's own
    encoder and decoder too) takes it; a one-kernel forward's plan (``gemm = cublaslt_nosplit``) carries it
    into its key, where the warm-up makes it; a split-K forward (``gemm = cublaslt``) keeps the heuristic."""
    from cudarl.trainer import Trainer

    over = {"net": {"gemm_algo": "probe"}, "agent": {"aux": ["horizons", "denoise"]}}
    a = Trainer(small(**over), run_dir=False).agent
    denoise = next(s for s in a.aux if s.name == "denoise")
    layers = [*a.online.linears.values(), *a.target.linears.values(), denoise.dec, *denoise.enc.children]
    assert {lin.lt_algo for lin in layers if isinstance(lin, Linear)} == {"probe"}
    net = from_dict({"net": {"gemm_algo": "probe", "encoder": "ssm", "window": 8}}).net
    keys = forward_plan_keys(8 * 66, 3, net, 64)
    assert keys and all(k[-1] == "probe" and k[-6] == 1 for k in keys), keys
    split = from_dict({"net": {"gemm_algo": "probe", "gemm": "cublaslt"}}).net
    assert all(len(k) == len(blas.plan_key(8, 8, 8, bias_align=0)) for k in forward_plan_keys(66, 3, split, 64))
    lin = Linear("x", 4, 8)
    lin.lt_algo = "probe"
    assert lin._algo(split_k=False) == "probe" and lin._algo(split_k=True) == "single"


def test_a_probe_compares_one_kernel_algorithms_only_and_numpy_ignores_it(rng):
    a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    out, want = np.zeros((7, 3), np.float32), np.zeros((7, 3), np.float32)
    with pytest.raises(blas.BlasError, match="algo='probe' compares one-kernel algorithms: pass split_k=False"):
        blas.gemm_lt(a, b, out, algo="probe")
    blas.gemm_lt(a, b, want, split_k=False)
    blas.gemm_lt(a, b, out, split_k=False, algo="probe")
    assert_bitwise(out, want, what="NumPy under algo='probe'")


#: one-kernel GEMMs of the SSM encoder's step at issue 22's sizes (32,768 rows: batch 512 x window 64) and the
#: reference MLP's (512 rows): (name, m, n, k, trans_a, trans_b, act, bias)
SINGLE_GEMMS = [
    ("ssm in_proj fwd", 32768, 644, 128, False, False, "identity", True),
    ("ssm in_proj dx", 32768, 128, 644, False, True, "identity", False),
    ("ssm out_proj fwd", 32768, 128, 256, False, False, "identity", True),
    ("mlp hidden fwd", 512, 256, 256, False, False, "relu", True),
    ("mlp dW", 256, 256, 512, True, False, "identity", False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("name,m,n,k,ta,tb,act,with_bias", SINGLE_GEMMS, ids=[g[0] for g in SINGLE_GEMMS])
def test_gpu_a_probed_single_gemm_is_bitwise_the_heuristics(cp, rng, name, m, n, k, ta, tb, act, with_bias, tf32):
    """gemm_lt(algo="probe") on other random operands than its probe's gives the bits of the heuristic's
    one-kernel algorithm; batched_plan_info records the plan (batch 1), its choice the fastest of its times."""
    from test_blas import _assert_probe_chose_the_fastest

    a = cp.asarray(rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32))
    b = cp.asarray((rng.standard_normal((n, k) if tb else (k, n)) / np.sqrt(k)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    out = cp.empty((m, n), np.float32)
    got = {}
    for algo in ("single", "probe"):
        out.fill(np.nan)
        blas.gemm_lt(a, b, out, bias=bias, act=act, trans_a=ta, trans_b=tb, tf32=tf32, split_k=False, algo=algo)
        got[algo] = out.get()
    assert_bitwise(got["probe"], got["single"], what=f"{name}: probe vs heuristic")
    mine = [
        r
        for r in blas.batched_plan_info().values()
        if r["batch"] == 1 and (r["m"], r["n"], r["k"], r["tf32"]) == (m, n, k, tf32)
    ]
    assert mine, f"{name}: no batched_plan_info record of the probed plan"
    for r in mine:
        _assert_probe_chose_the_fastest(r)
        print(f"{name} tf32={tf32}: {r['probed']} probed, equal {r['equal']}, changed {r['changed']}")


@pytest.mark.gpu
@pytest.mark.parametrize("encoder", ["mlp", "ssm"])
def test_gpu_gemm_algo_probe_trains_bitwise_as_the_heuristic(encoder):
    """Two trainers of one seed, ``net.gemm_algo`` heuristic and probe (``dw_gemm = one_kernel``: every
    GEMM of the step a one-kernel cuBLASLt one): the same losses and weights after 40 updates, bit for bit."""
    net = {"dw_gemm": "one_kernel", **({"encoder": "ssm", "window": 8} if encoder == "ssm" else {})}
    runs = []
    for algo in ("heuristic", "probe"):
        from cudarl.trainer import Trainer

        t = Trainer(gpu_small(net={**net, "gemm_algo": algo}), run_dir=False, echo=lambda m: None)
        t.run(40)
        runs.append(t)
    h, p = runs
    assert len(h.losses) == 40 and h.losses == p.losses
    assert_bitwise(p.agent.online.params.get(), h.agent.online.params.get(), what="online weights")
    assert_bitwise(p.agent.target.params.get(), h.agent.target.params.get(), what="target weights")
