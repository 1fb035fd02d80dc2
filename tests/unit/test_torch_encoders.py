"""The PyTorch twins of the encoders (tools/torch_encoders.py, the benchmarks' PyTorch arms) against the NumPy
encoders on the same weights, in float64: psi, and every parameter's and the input's gradient of
``L = sum(psi R)``. And the whole learner step (tools/bench_step.py's ``step_check``): cudarl's NumPy agent
with a windowed encoder against ``TorchC51Step.loss`` over the Q-network twins (``torch_encoders.q_network``),
in float32 (the agent is float32 only). Skipped without torch (it is not a test dependency; the GPU host has it)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

SSM = dict(window=9, d_model=8, layers=2, expand=2, d_state=3, headdim=4, groups=2, conv_kernel=4, chunk=4)
ATT = dict(window=9, d_model=8, layers=2, heads=2, mlp_ratio=2)
#: The same shapes as NetConfig fields (the agent's network)
NET = {
    "ssm": dict(window=9, d_model=8, layers=2, ssm_expand=2, ssm_state=3, ssm_headdim=4, ssm_groups=2, ssm_conv=4,
                ssm_chunk=4),
    "attention": dict(window=9, d_model=8, layers=2, attn_heads=2, attn_mlp_ratio=2),
}  # fmt: skip


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_torch_twin_matches_the_numpy_encoder(kind, rng):
    torch = pytest.importorskip("torch")
    import torch_encoders as te

    from cudarl.nn.encoders import AttentionEncoder, SSMEncoder, Standalone

    F, B = 3, 4
    enc = SSMEncoder("enc", F, **SSM) if kind == "ssm" else AttentionEncoder("enc", F, **ATT)
    s = Standalone(enc, np, np.float64, seed=2, noise=0.1)
    twin = (te.ssm_encoder(F, **SSM) if kind == "ssm" else te.attention_encoder(F, **ATT)).double()
    te.load_cudarl_params(twin, s.P)
    x = rng.standard_normal((B, enc.W, F))
    R = rng.standard_normal((B, enc.d))
    ws = s.workspace(B)
    psi = enc.forward(x, ws).copy()
    ws.rows(f"{enc.out_name}.dout")[...] = R
    dx = np.empty_like(x)
    enc.backward(x, ws, dx)
    xt = torch.from_numpy(x).requires_grad_(True)
    out = twin(xt)
    (out * torch.from_numpy(R)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), psi, rtol=1e-12, atol=1e-13)
    want = te.cudarl_grads_like(twin, s.G)
    names = [n for n, _ in twin.named_parameters()]
    assert len(want) == len(names) == len(s.layout.entries)
    for name, p, g in zip(names, twin.parameters(), want, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(xt.grad.numpy(), dx, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_whole_step_twin_matches_the_numpy_agent(kind):
    """Loss, KL priorities and every parameter's gradient of cudarl's learner pass (forward, double-DQN C51
    targets, projection, weighted cross-entropy, backward) with ``net.encoder = kind``, against the PyTorch step
    on the twins of its online and (perturbed) target networks: float32 on both sides, so bench_step's check
    tolerances (loss 1e-5, priorities and gradients 1e-4; measured about 1e-7 and 1e-6)."""
    pytest.importorskip("torch", reason="the PyTorch twin needs torch (not a test dependency; the GPU host has it)")
    import bench_step as bs
    import torch_encoders as te

    from cudarl.agent import Agent
    from cudarl.bench import reference_config

    F = 3
    cfg = reference_config("cpu", net={"encoder": kind, **NET[kind]}, agent={"popart": False, "batch_size": 16})
    agent = Agent(cfg, NET[kind]["window"] * F, bs.A, 1, np)
    twin = te.q_network(agent.online)
    shapes = SSM if kind == "ssm" else ATT  # the twin is built at the agent's encoder's shapes
    want = (te.ssm_encoder if kind == "ssm" else te.attention_encoder)(F, **shapes)
    assert [p.shape for p in twin.enc.parameters()] == [p.shape for p in want.parameters()]
    assert len(list(twin.parameters())) == len(agent.online.layout.entries)  # every parameter is compared
    for seed in range(3):
        d = bs.step_check(agent, "cpu", seed)
        assert d["loss_rel_diff"] <= 1e-5, d
        assert d["priority_rel_diff"] <= 1e-4, d
        assert d["grad_rel_diff"] <= 1e-4, d
        by_param = d["grad_rel_diff_by_param"]
        assert len(by_param) == len(agent.online.layout.entries)
        assert max(by_param.values()) <= 1e-4, by_param
