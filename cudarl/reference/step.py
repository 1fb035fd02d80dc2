"""One C51 learner update, top to bottom, in NumPy: read this before the agent.

The train graph runs this update as phases of kernels (:mod:`cudarl.agent`, :mod:`cudarl.rules.c51`):
flat buffers, side branches, the targets and the loss fused into one launch. Here it is one function
with the same arithmetic in the same order, written plainly where the math is plain and calling the
family twins where the order of a sum is the point (the sum-tree search, the projection, the loss).
``tests/parity/test_step.py`` holds the agent's NumPy phases to it bit for bit.

Scope: the MLP encoder with ReLU (no LayerNorm, no spectral norm), the dueling C51 head, no PopArt.
"""

from __future__ import annotations

import numpy as np

from . import c51_chain, nn, optim, replay, window
from .optim import SCHEDULES


def c51_update(net: dict, opt: dict, rb: dict, cfg) -> dict:
    """One update, in place. ``net``: ``P``, ``G``, ``T`` (the online net's parameter and gradient views and
    the target's, by layout name) and the flat ``params``, ``grads``, ``target`` they view, ``mask`` (weight
    decay). ``opt``: Adam's flat ``m``, ``v`` and its device scalars ``step``, ``lr``, ``m_scale``, ``bc1``,
    ``bc2``, the soft update's ``count``, ``tau`` (``[1]`` arrays). ``rb``: the replay's ``spec``, ``bufs``
    and the env's feature matrix ``features`` and its mirror ``sign``. ``cfg``: the run's Config. Returns
    ``{"loss", "grad_norm", "idx", "priority"}``."""
    a, o, B, L = cfg.agent, cfg.optim, cfg.agent.batch_size, len(cfg.net.hidden)
    P, G, T = net["P"], net["G"], net["T"]

    # schedules: the learning rate, Adam's bias corrections and tau advance one step on the device
    sched = (SCHEDULES[o.schedule], o.lr, o.lr_min, o.warmup, o.period, int(o.mult), o.restart_m_scale)
    optim.lr_schedule(opt["step"], opt["lr"], opt["m_scale"], opt["bc1"], opt["bc2"], *sched, o.beta1, o.beta2)
    optim.tau_schedule(opt["count"], opt["tau"], a.tau_start, a.tau_end, a.tau_period)

    # sample B rows in proportion to priority**alpha (stratified search of the sum tree, Philox), with
    # their n-step return and bootstrap discount, and the importance weights (min_k q_k / q_j)**beta;
    # the rows are state rows (a bar index and the position features)
    spec, bufs, W = rb["spec"], rb["bufs"], rb["spec"].obs_dim
    idx, qsel, w = np.zeros(B, np.int32), np.zeros(B, np.int64), np.zeros(B, np.float32)
    rows, rows_next = np.zeros((B, W), np.float32), np.zeros((B, W), np.float32)
    act, ret, disc = np.zeros(B, np.int32), np.zeros(B, np.float32), np.zeros(B, np.float32)
    replay.sample_search_gather(spec, bufs, idx, qsel, rows, rows_next, act, ret, disc)
    replay.sample_weights(spec, bufs, qsel, w)

    # the observations: the last net.window bars of features up to each row's bar, from the feature matrix
    features, n_in = rb["features"], window.width(rb["features"].shape[1], cfg.net.window)
    s, s_next = np.zeros((B, n_in), np.float32), np.zeros((B, n_in), np.float32)
    window.gather(rows, features, rb["sign"], s, cfg.net.window)
    window.gather(rows_next, features, rb["sign"], s_next, cfg.net.window)

    # forward: the ReLU MLP, then the dueling head's raw output va = [V, Adv] [B, (1 + A) K]
    def forward(Q, x):
        h = [x]
        for i in range(L):
            h.append(np.maximum(h[-1] @ Q[f"enc.{i}.weight"] + Q[f"enc.{i}.bias"], 0))
        return h, h[-1] @ Q["head.va.weight"] + Q["head.va.bias"]

    def logits(va):  # V + Adv - mean_a Adv, per atom
        K = cfg.net.atoms
        out = np.empty((B, va.shape[1] // K - 1, K), np.float32)
        nn.dueling_forward(va, out)
        return out

    h, va = forward(P, s)
    _, va_online_next = forward(P, s_next)
    _, va_target_next = forward(T, s_next)

    # the target: a* by the online net at s' (double DQN), the target net's distribution there, its
    # atoms r + d z projected back onto the support
    z = np.linspace(cfg.net.v_min, cfg.net.v_max, cfg.net.atoms, dtype=np.float32)
    m = c51_chain.targets(logits(va_online_next), logits(va_target_next), z, ret, disc)[0]

    # the loss: importance-weighted cross-entropy, its gradient wrt the logits, the KL priorities
    _, loss, dlogits, priority = c51_chain.loss(logits(va), act, m, w, priority=a.priority)

    # backward: through the dueling combine, the head, then each layer (dW = x^T dz, db = sum dz, dx = dz W^T)
    d = np.empty_like(va)
    nn.dueling_backward(dlogits, d)
    G["head.va.weight"][...], G["head.va.bias"][...] = h[L].T @ d, d.sum(axis=0)
    d = d @ P["head.va.weight"].T
    for i in reversed(range(L)):
        d = np.where(h[i + 1] > 0, d, 0)
        G[f"enc.{i}.weight"][...], G[f"enc.{i}.bias"][...] = h[i].T @ d, d.sum(axis=0)
        d = d @ P[f"enc.{i}.weight"].T if i else None

    # clip the global gradient norm, Adam(W) (decoupled decay), then theta' = tau theta + (1 - tau) theta'
    norm, clip, partial = np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(optim.GN_BLOCKS, np.float64)
    optim.grad_norm(net["grads"], partial, norm, clip, o.max_grad_norm)
    adam = (opt["lr"], opt["m_scale"], opt["bc1"], opt["bc2"], clip, o.beta1, o.beta2, o.eps, o.weight_decay)
    optim.adam_update(net["params"], net["grads"], opt["m"], opt["v"], net["mask"], *adam)
    optim.soft_update(net["target"], net["params"], opt["tau"])

    # priorities: (|KL| + eps)**alpha into the sampled leaves (fixed point), and their ancestors
    replay.update_priorities(spec, bufs, idx, priority)
    return {"loss": np.float32(loss), "grad_norm": norm[0], "idx": idx, "priority": priority}
