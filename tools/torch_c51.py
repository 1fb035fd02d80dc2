"""PyTorch twin of cudarl's Q-network for the benchmarks' PyTorch arms (``bench_nets``, ``bench_step``).

torch is optional: it is imported inside the functions, so importing this module never needs it.
"""

from __future__ import annotations

import statistics

import numpy as np


def dueling_c51(n_in: int, hidden=(256, 256), n_actions: int = 3, atoms: int = 51):
    """An MLP encoder (Linear + ReLU per width) and a dueling C51 head, as ``cudarl.nn.QNetwork``:
    ``va = psi W_va + b_va`` ``[B, (1 + A) atoms]``, ``logits = V + Adv - mean_a Adv`` ``[B, A, atoms]``.
    Parameters are ``enc.<i>`` and ``va`` (cudarl's ``enc.<i>`` and ``head.va``); float32, on the CPU."""
    import torch

    class DuelingC51(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [int(n_in)] + [int(h) for h in hidden]
            self.enc = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=False))
            self.va = torch.nn.Linear(widths[-1], (1 + n_actions) * atoms)

        def forward(self, x):
            for lin in self.enc:
                x = torch.relu(lin(x))
            return dueling(self.va(x), n_actions, atoms)

    return DuelingC51()


def dueling(va, n_actions: int, atoms: int):
    """The dueling combine of ``cudarl.nn.C51Head``: ``va = (V [atoms], Adv [A, atoms])`` a row,
    ``[B, (1 + A) atoms]`` -> ``logits = V + Adv - mean_a Adv`` ``[B, A, atoms]``."""
    v, adv = va[:, :atoms].unsqueeze(1), va[:, atoms:].reshape(-1, n_actions, atoms)
    return v + adv - adv.mean(1, keepdim=True)


def load_cudarl_params(model, P: dict) -> None:
    """Copy cudarl's named parameter views ``P`` (``QNetwork.P``, NumPy or CuPy; weights stored
    ``[in, out]``, see ``cudarl/nn/params.py``) into a :func:`dueling_c51` model."""
    import torch

    from cudarl.backend import to_numpy

    pairs = [(lin, f"enc.{i}") for i, lin in enumerate(model.enc)] + [(model.va, "head.va")]
    with torch.no_grad():
        for mod, name in pairs:
            w, b = to_numpy(P[f"{name}.weight"]), to_numpy(P[f"{name}.bias"])
            mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T, dtype=np.float32)))
            mod.bias.copy_(torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32)))


def cudarl_grads_like(model, G: dict) -> list:
    """cudarl's gradient views ``G`` as NumPy arrays in the order and layout of ``model.parameters()``."""
    from cudarl.backend import to_numpy

    out = []
    for name in [f"enc.{i}" for i in range(len(model.enc))] + ["head.va"]:
        out += [to_numpy(G[f"{name}.weight"]).T, to_numpy(G[f"{name}.bias"])]
    return out


def torch_time_us(fn, repeats: int = 200, warmup: int = 10, inner: int = 1) -> float:
    """Median microseconds per call of ``inner`` back-to-back ``fn()`` between two CUDA events
    recorded on the current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(repeats):
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / inner)
    return statistics.median(ts)
