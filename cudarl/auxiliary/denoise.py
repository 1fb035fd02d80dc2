"""``denoise``: a denoising objective on the encoder, with its own optimiser step.

Published method: the denoising autoencoder (Vincent et al. 2008; :mod:`cudarl.reference.denoise` has
the equations). Each update the batch's observation windows ``s`` are corrupted by masking noise (each
input zeroed with probability ``agent.aux_denoise_mask``, Philox draws keyed by a device counter), the
encoder reads the corrupted windows and a linear decoder ``aux.denoise`` (``psi -> window``) reconstructs
the clean ones; squared error.

What we chose:

* Its own optimiser step (as the issue asks): the encoder pass runs over the *online network's own
  parameters* (the same tensors: an encoder module bound to ``online.P``) with a gradient buffer of its
  own, and plain SGD (rate ``agent.aux_denoise_lr``, :mod:`cudarl.reference.auxsgd`) steps the encoder
  and the decoder after the main backward, before the shared Adam. The Q loss's gradient and Adam's
  moments never see the reconstruction's; the encoder is shaped by both.
* The decoder is the signal's own parameters (checkpointed in its state), not a head of the Q-networks:
  acting and policy files do not carry it.
* Not with ``net.spectral`` (its encoder pass would read ``W`` where the network reads ``W_sn``): a
  clear error at start-up.
* Over a sub-batch: ``agent.aux_rows`` of the batch's rows, spread evenly over it (``agent.aux_batch``,
  :class:`cudarl.auxiliary.base.SubBatch`); the loss is the mean over those rows and the window's
  inputs, and the workspace and the GEMM plans are made for that many rows. ``aux_batch = 1``: the whole
  batch, read in place.

Train graph: ``aux_denoise``, an early phase right after ``sample``, forks its whole pass (the sub-batch's
rows, corrupt, encoder and decoder forward, loss, backward) onto a branch of its own beside the main chain
(it reads the batch and the parameters, writes only its own buffers); the agent's ``aux_sgd`` after the
backward joins it and takes the steps (two spans of its one launch, :meth:`sgd_spans`). Observable:
``aux.denoise.loss`` (the reconstruction's mean squared error on the corrupted sub-batch).
"""

from __future__ import annotations

import numpy as np

from ..backend import family, to_numpy
from ..graph import SideStream
from ..nn.encoders import ENCODERS
from ..nn.layers import Linear
from ..nn.network import _walk, configure_linear
from ..nn.params import ParamLayout, Workspace
from .base import AuxBase, SgdSpan, SubBatch, sub_batch_net
from .future import host_values, param_span

#: Philox stream id of the masking draws.
STREAM = 0xDE


class Denoise(AuxBase):
    """No head of the Q-networks (:meth:`AuxBase.make_head`'s None): the decoder is this signal's own."""

    name = "denoise"
    head_name = "aux.denoise"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.p, self.lr, self.seed = float(cfg.agent.aux_denoise_mask), float(cfg.agent.aux_denoise_lr), cfg.run.seed

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        net, cfg, xp = buffers.online, sub_batch_net(self.cfg), buffers.xp  # its GEMMs: agent.aux_gemm
        self.sub = SubBatch(self.cfg, xp)
        B = self.sub.rows  # the pass's rows (agent.aux_rows)
        if cfg.spectral:
            raise ValueError("agent.aux 'denoise' does not run with net.spectral (its encoder pass reads W, not W_sn)")
        m = net.n_in
        self.enc = ENCODERS[cfg.encoder]("enc", m, cfg)
        self.dec = Linear(self.head_name, self.enc.n_out, m, act="identity", tf32=cfg.tf32, gemm=cfg.gemm)
        enc_layout, dec_layout, spec = ParamLayout(), ParamLayout(), []
        self.enc.declare(enc_layout, spec)
        self.dec.declare(dec_layout, spec)
        mine = [(e.name, e.shape) for e in enc_layout.entries]
        theirs = [(e.name, e.shape) for e in net.layout.entries if e.name.startswith("enc.")]
        if mine != theirs:
            raise ValueError("aux denoise: its encoder's parameters do not match the network's")
        # the online network's parameters, a gradient buffer of its own
        self.grads = xp.zeros(net.layout.padded_size, np.float32)
        self.enc.bind(net.P, net.layout.views(self.grads), xp)
        self.dec_params = xp.asarray(dec_layout.init_host(self.seed, np.float32))
        self.dec_grads = xp.zeros_like(self.dec_params)
        self.dec.bind(dec_layout.views(self.dec_params), dec_layout.views(self.dec_grads), xp)
        self.ws = Workspace(xp, np.float32, B)
        for name, row, merge in spec:
            self.ws.add(name, row, merge=merge)
        for lin in _walk([self.enc, self.dec]):
            if isinstance(lin, Linear):
                configure_linear(lin, cfg)  # as the network's layers
                lin.prepare(B)
                lin.prepare_backward(B)
        lo, hi = param_span(net, "enc.")
        self.enc_params, self.enc_grads = net.params[lo:hi], self.grads[lo:hi]
        self.clean = self.sub.of(buffers.batch.obs)
        self.corrupted = xp.zeros((B, m), np.float32)
        self.loss_per, self.out = xp.zeros(B, np.float32), xp.zeros(1, np.float32)
        self.counter = xp.zeros(1, np.int64)
        self.scale = float(np.float32(1.0 / (B * m)))
        self.side = SideStream(xp)
        self.ops = family("denoise", xp)

    def early_phases(self) -> list:
        # right after sample (and input noise): the pass reads only the batch's s and the encoder's
        # parameters, which nothing moves before the aux_sgd and Adam phases that join it, so it forks
        # there, beside the step's forward, loss and backward, and not after the rule's loss phases, where
        # its dozen nodes outlasted the step's backward (docs/perf-notes.md, thirty-second session)
        return [("aux_denoise", self._pass)]

    def sgd_spans(self) -> list:
        # the encoder (the online net's parameters) and the decoder, from the gradients its branch wrote
        return [
            SgdSpan(self.enc_params, self.enc_grads, self.lr, after=self.side),
            SgdSpan(self.dec_params, self.dec_grads, self.lr, after=self.side),
        ]

    def _pass(self) -> None:
        ws, B, clean = self.ws, self.sub.rows, self.clean
        with self.side.fork():
            self.sub.gather()
            self.ops.corrupt(clean, self.corrupted, self.counter, self.p, self.seed, STREAM)
            ws.set_batch(B)
            psi = self.enc.forward(self.corrupted, ws)
            recon = self.dec.forward(psi, ws)
            self.ops.loss(recon, clean, ws.rows(self.dec.grad_name, B), self.loss_per, self.counter, self.scale)
            self.ops.total(self.loss_per, self.out, 1.0)
            self.dec.backward(psi, ws, ws.rows(f"{self.enc.out_name}.dout", B))
            self.enc.backward(self.corrupted, ws)

    def observable(self) -> dict:
        return {"aux.denoise.loss": float(host_values(self.out)[0])}

    def state_dict(self) -> dict:
        return {"decoder": to_numpy(self.dec_params).copy(), "counter": to_numpy(self.counter).copy()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"decoder", "counter"}:
            raise ValueError(f"aux.denoise: expected its decoder and counter, got {sorted(state)}")
        self.dec_params[...] = self.buf.xp.asarray(np.asarray(state["decoder"], np.float32))
        self.counter[...] = self.buf.xp.asarray(np.asarray(state["counter"], np.int64))
