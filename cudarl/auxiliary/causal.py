"""``causal``: intervene on feature groups that should not matter and penalise the change in Q.

Equations, the interventions and the references: :mod:`cudarl.reference.causal`. One group a step, in
rotation (``agent.causal_groups``; a device counter picks it, so graph replays rotate too). A group
whose columns this run's features lack (``level`` is not a default feature group; ``calendar`` is absent
with ``features.time_features = false``) is left out of the rotation, and the signal refuses to run
when none is left. The clean expected Q is the step's ``q_s`` (the rule's ``q_stats`` phase), held fixed.

Over a sub-batch: ``agent.aux_rows`` of the batch's rows, spread evenly over it (``agent.aux_batch``,
:class:`cudarl.auxiliary.base.SubBatch`). The pass gathers the same rows of the observations, of ``q_s``
and (IQN) of the taus of the forward at ``s``, so row ``r`` of ``Q(do(x))`` is compared with the clean Q
of the same sample; the swap interventions draw the other sample from the sub-batch, and the penalty and
the sensitivity are means over its rows. Its workspace and GEMM plans are made for that many rows;
``aux_batch = 1`` reads the whole batch in place.

Phases (:class:`cudarl.auxiliary.base.OwnBackward`: the backward of its own, into a gradient buffer of
its own, on the branch beside the step's backward): with C51, ``aux_causal_do`` right after ``sample``
(:meth:`AuxSignal.early_phases`: it forks the branch - intervene, which reads the sub-batch's rows of the
observations itself - the online forward over the intervened batch in a workspace of its own - beside the
step's forward, the rule's learn phases and ``q_stats``: it reads only the batch's s and the online
parameters, which nothing moves before Adam) and ``aux_causal`` among the loss phases (the branch waits for
``q_stats``' branch there, as ``q_s`` is written, and for the sub-batch's ``q_s`` rows, gathered on a
branch of their own forked from ``q_stats``' beside the intervened forward: penalty - the backward, with
the reduce of the observables on a branch beside it);
with a quantile head the whole pass is ``aux_causal`` (its forward at s draws the taus the intervened
forward reads, and PopArt rescales ``head.out`` in that phase, so the pass cannot start before it).
After the backward, ``causal`` (join - add that gradient to the step's, one launch: the bits of adding
the step's to it, as when this backward ran after the step's on the flat gradient); where Gradient
Vaccine's grad phase comes right after (``vaccine`` listed after ``causal``), vaccine adds it inside its
own two kernels instead and this phase is not run (:meth:`grad_addend`; the same sums, one pass over the
flat gradient fewer; the extra heads' entries, which this pass leaves zero, are then not added: a zero's
sign may differ there, nothing else). Observables:
``aux.causal.loss``, ``aux.causal.group`` (the index of the step's group in :attr:`Causal.groups`) and
``aux.causal.sensitivity.<group>``, the mean absolute change of Q the last time that group was
intervened on (what ``docs/guide.md`` calls the measured sensitivity); each evaluation's
``summary.json`` lists them as ``causal_sensitivity`` (:func:`sensitivities`), and beside them
``causal_sensitivity_heldout``, the same interventions over the evaluated split
(:mod:`cudarl.auxiliary.causal_heldout`).
"""

from __future__ import annotations

import numpy as np

from ..backend import family, to_numpy
from ..graph import SideStream
from ..nn.heads import C51Head, IQNHead
from ..reference import causal as ref
from ..reference.window import N_POSITION_FEATURES
from ..rules.c51 import support
from .base import AuxBase, GradAddend, OwnBackward, SubBatch, read, sub_batch_net

#: The metric keys of the sensitivities: ``aux.causal.sensitivity.<group>``.
SENSITIVITY = "aux.causal.sensitivity."


def sensitivities(observables: dict) -> dict:
    """``{group: sensitivity}`` from a metrics row's causal observables (empty without ``causal``): each
    group's mean absolute change of Q the last time it was intervened on (0 before its first). The
    trainer's evaluation writes it into ``summary.json`` as ``causal_sensitivity``."""
    return {k[len(SENSITIVITY) :]: float(v) for k, v in observables.items() if k.startswith(SENSITIVITY)}


#: The groups an intervention can name: the feature-name test of their columns and the mode.
GROUPS = {
    "calendar": (lambda n: n.startswith(("dow_", "hod_")), ref.SWAP),
    "level": (lambda n: n.startswith("level_"), ref.SWAP),
    "offset": (lambda n: True, ref.OFFSET),
}


def group_masks(names, groups) -> tuple[list, np.ndarray, np.ndarray]:
    """``(kept group names, mask int32 [G, F + 2], mode int32 [G])`` for feature ``names`` (the position
    columns are never intervened on); groups without a column are left out."""
    F = len(names)
    kept, masks, modes = [], [], []
    for g in groups:
        test, mode = GROUPS[g]
        row = np.zeros(F + N_POSITION_FEATURES, np.int32)
        row[:F] = [int(test(n)) for n in names]
        if row.any():
            kept.append(g)
            masks.append(row)
            modes.append(mode)
    C = F + N_POSITION_FEATURES
    return kept, np.array(masks, np.int32).reshape(-1, C), np.array(modes, np.int32)


class Causal(AuxBase):
    name = "causal"
    # q_s, the clean expected Q its penalty holds fixed, is read on its branch forked from the q_stats branch
    # (buffers.after_q_stats), not on the main stream: q_stats_join need not wait for it
    reads_q_stats = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.need(cfg.net.head != "c51+iqn", "the two-head c51+iqn rule is not supported yet")
        a = cfg.agent
        self.weight, self.offset = a.causal_weight, a.causal_offset

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, online, cfg = self.xp, buffers.online, self.cfg
        # the pass's rows of IQN's taus, gathered when it forks, and of q_s, gathered on a branch of their own
        # from q_stats' as soon as q_s is written (the batch's s is read through the same rows by intervene)
        self.sub, self.sub_q = SubBatch(cfg, xp), SubBatch(cfg, xp)
        B, W = self.sub.rows, cfg.net.window  # the pass's rows (agent.aux_rows)
        self.need(online.n_in % W == 0, f"observation width {online.n_in} is not window {W} times a row")
        F = online.n_in // W - N_POSITION_FEATURES
        names = tuple(buffers.feature_names) or tuple(f"f{j}" for j in range(F))
        self.need(len(names) == F, f"{len(names)} feature names for {F} feature columns")
        self.groups, mask, mode = group_masks(names, cfg.agent.causal_groups)
        self.need(bool(self.groups), f"none of agent.causal_groups {list(cfg.agent.causal_groups)} has a column here")
        self.mask, self.mode = xp.asarray(mask), xp.asarray(mode)
        self.counter = xp.zeros(1, np.int64)
        self.state = xp.zeros(2 + len(self.groups), np.float32)
        self.x = xp.zeros((B, online.n_in), np.float32)
        self.d = xp.zeros((B, buffers.n_actions), np.float32)
        self.ws = buffers.step_workspace(online, B)
        online.prepare_backward(B)
        head = online.head
        self.c51 = isinstance(head, C51Head)
        self.support = xp.asarray(support(cfg.net)) if self.c51 else None
        # the same rows of the batch's s (intervene reads them through SubBatch's spread: no gather, one node
        # fewer on this pass's chain) and of the clean Q (and of the taus below): row r compares Q(do(x_r))
        # with Q(x_r)
        self.obs, self.q_s = buffers.batch.obs, self.sub_q.of(buffers.q_s)
        # IQN: the intervened forward uses the taus of the online forward at s (the same quantiles of Q)
        taus = buffers.ws.rows(f"{head.name}.tau", buffers.batch_size) if isinstance(head, IQNHead) else None
        self.taus = None if taus is None else self.sub.of(taus)
        #: the intervened forward in its early phase (C51); a quantile head's forward phase draws the taus
        #: and rescales head.out (PopArt), so there the whole pass is the loss phase
        self.early = self.c51
        self.out = None  # the intervened forward's "q" (set by the pass, read by its penalty)
        self.extra = OwnBackward(online, xp, B, net=sub_batch_net(cfg))  # its GEMMs: agent.aux_gemm
        self.side = SideStream(xp)
        #: two branches off the pass's chain (each one node fewer on it): the gather of q_s's rows, forked
        #: from q_stats' branch beside the intervened forward, and the reduce, beside the pass's backward
        #: (it writes only the observables and the group counter, which nothing reads until the next step)
        self.side_q, self.side_reduce = SideStream(xp, gemms=False), SideStream(xp, gemms=False)
        self.ops, self.util = family("causal", xp), family("util", xp)

    def early_phases(self) -> list:
        return [("aux_causal_do", self._fork_intervened)] if self.early else []

    def phases(self) -> list:
        return [("aux_causal", self._penalty)]

    def grad_phases(self) -> list:
        return [("causal", self._grad)]

    def _intervened(self) -> None:
        """(IQN: the sub-batch's rows of the taus) - intervene on the sub-batch's rows of s - the online forward
        of the intervened batch (on the branch: the caller forked it)."""
        W, obs = self.cfg.net.window, self.obs
        self.sub.gather()
        kw = {} if self.taus is None else {"tau": self.taus}
        if self.numpy:
            self.x[...] = ref.intervene(obs, self.mask, self.mode, self.counter, self.offset, W, rows=self.sub.rows)
        else:
            self.ops.intervene(obs, self.x, self.mask, self.mode, self.counter, self.offset, W)
        # no extra head: only "q" is read, and its own backward then runs only the Q head's (the extra heads'
        # ran from zero gradient rows, two GEMMs on this branch's chain adding zeros to dL/dpsi and zero
        # weight gradients: the same values, a zero's sign aside; docs/perf-notes.md, thirty-second session)
        self.out = self.buf.online.forward(self.x, self.ws, heads="none", **kw)["q"]

    def _fork_intervened(self) -> None:
        # C51, right after sample: the branch reads the batch's s (sample wrote it) and the online
        # parameters (nothing moves them before Adam, which comes after the grad phase joins it) and
        # writes only its own buffers and workspace; the group counter it reads moves in its reduce
        with self.side.fork():
            self._intervened()

    def _penalty(self) -> None:
        buf, q_s = self.buf, self.q_s
        # the branch (forked again, from the q_stats branch: it now also waits for q_s, not for the rule's
        # learn phases on the main stream) beside the rule's and the other loss phases and the step's
        # backward; it writes only its own buffers, workspace and gradient buffer
        if not self.sub_q.whole:
            with buf.after_q_stats(), self.side_q.fork():
                self.sub_q.gather()
        with buf.after_q_stats(), self.side.fork():
            if not self.early:
                self._intervened()
            self.side_q.join()  # q_s's rows (nothing pending with the whole batch)
            out = self.out
            grad = buf.online.grad_outputs(self.ws)["q"]
            if self.numpy:
                if self.c51:
                    self.d[...], grad[...] = ref.penalty_c51(out, q_s, self.support, self.weight)
                else:
                    self.d[...], grad[...] = ref.penalty_quantile(out, q_s, self.weight)
            else:
                if self.c51:
                    self.ops.penalty_c51(out, q_s, self.support, self.weight, self.d, grad)
                else:
                    self.ops.penalty_quantile(out, q_s, self.weight, self.d, grad)
            with self.side_reduce.fork():
                if self.numpy:
                    ref.reduce(self.d, self.state, self.counter, self.weight)
                else:
                    self.ops.reduce(self.d, self.state, self.counter, self.weight)
            self.extra.run(self.x, self.ws, self.sub.rows)
            self.side_reduce.join()  # into the pass's branch, which the grad phase (or vaccine's) joins

    def grad_addend(self) -> GradAddend:
        # its own gradient, zero from the extra heads' first entry on (its forward runs none of them, so its
        # backward never writes their gradients); the layout puts them last (nn.network._in_order)
        online = self.buf.online
        mine = {f"{h.name}." for h in online.extras.values()}
        tail = [e.offset for e in online.layout.entries if e.name.startswith(tuple(mine))]
        stop = min(tail) if tail else online.grads.size
        self.need(
            all(e.name.startswith(tuple(mine)) for e in online.layout.entries if e.offset >= stop),
            "the extra heads' parameters are not the layout's last",
        )
        return GradAddend(self.extra.grads, self.side, stop)

    def _grad(self) -> None:
        # the penalty's gradient onto the step's (and whatever a grad phase before this one left there)
        self.side.join()
        self.extra.add_into(self.buf.online.grads)

    def observable(self) -> dict:
        s = read(self.state)
        out = {"aux.causal.loss": s[0], "aux.causal.group": s[1]}
        out.update({f"{SENSITIVITY}{g}": s[2 + i] for i, g in enumerate(self.groups)})
        return out

    def state_dict(self) -> dict:
        return {"state": read(self.state).astype(np.float32), "counter": to_numpy(self.counter).copy()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.state[...] = self.xp.asarray(np.asarray(state["state"], np.float32))
            self.counter[...] = self.xp.asarray(np.asarray(state["counter"], np.int64))
