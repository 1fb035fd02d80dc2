"""The PyTorch twins of the encoders (tools/torch_encoders.py, the benchmarks' PyTorch arms) against the NumPy
encoders on the same weights, in float64: psi, and every parameter's and the input's gradient of
``L = sum(psi R)``. Skipped without torch (it is not a test dependency; the GPU host has it)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

SSM = dict(window=9, d_model=8, layers=2, expand=2, d_state=3, headdim=4, groups=2, conv_kernel=4, chunk=4)
ATT = dict(window=9, d_model=8, layers=2, heads=2, mlp_ratio=2)


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
