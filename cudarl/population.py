"""Populations: P agents trained together, one train graph and one collect graph for all of them.

Each member is a :class:`cudarl.trainer.Trainer` that owns its buffers (networks, optimiser state,
replay and PER tree, environments, RNG counters, schedules, PopArt statistics) exactly as it would
alone. The population captures every member's train phases into ONE :class:`cudarl.graph.StepGraph`,
each member's phases on a parallel branch of its own (:meth:`cudarl.graph.SideStream.branch`), and
likewise one collect graph; a replay launches all P updates at once. Member ``i`` runs the same
kernels on the same buffers with the same launch shapes as ``Trainer(configs[i])`` alone, so it is
bitwise equal to it by construction (the tests check it, P = 1 and P = 3, on the CPU and the GPU).

What members may differ in: everything that does not change the loop they share (seed, learning
rate and its schedule, gamma, tau, the epsilon schedule, PER alpha and beta, costs, reward options,
guard, evaluation and logging intervals: :data:`MAY_DIFFER`); :func:`can_share` says whether two
configs may be members of one population. They share the bars, the prepared features and the
device feature matrix (one copy, not P).

On the NumPy backend the same graphs run their phases in order: the members one after another.

This is parallel branches of per-member kernels, not the agent axis of issue 23 (every kernel with a
leading agent dimension and strided-batched GEMMs); docs/guide.md ("Populations") says what that
would add.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from . import backend as _backend
from . import experience, interrupt
from .config import Config
from .graph import SideStream, StepGraph
from .guard import GuardStop
from .prepare import prepare_data
from .trainer import Trainer, _Rate

#: Config fields members of one population may set differently (section -> fields; ``"*"``: all of
#: the section). Anything else must be equal (:func:`can_share`): it shapes buffers, the shared data or
#: the loop all members run in step (updates per collection, learning starts, steps, device).
MAY_DIFFER = {
    "run": {
        "name",
        "seed",
        "out_dir",
        "eval_every",
        "checkpoint_every",
        "keep_best",
        "log_every",
        "tensorboard",
        "record",
        "grid_barrier",
    },
    "optim": {"*"},
    "agent": {
        "gamma",
        "eps_start",
        "eps_end",
        "eps_steps",
        "tau_start",
        "tau_end",
        "tau_period",
        "kappa",
        "popart_beta",
        "popart_warmup",
        "cql_alpha",
        "plan_hurdle",
        "train_cost_bps",
    },
    "replay": {"alpha", "beta0", "beta_final", "beta_steps", "eps"},
    "env": {"cost_bps", "slippage_bps", "hold_cap", "seed", "fill", "levels"},
    "guard": {"*"},
    "eval": {"*"},
}


#: run.device -> the backend request (as :class:`Trainer` resolves it)
_BACKEND = {"auto": None, "gpu": "cupy", "cpu": "numpy"}


def _shared_part(cfg: Config) -> dict:
    """``cfg`` as a dict without the fields of :data:`MAY_DIFFER`."""
    d = cfg.to_dict()
    for sec, fields in MAY_DIFFER.items():
        if "*" in fields:
            d.pop(sec, None)
            continue
        for f in fields:
            d.get(sec, {}).pop(f, None)
    return d


def can_share(a: Config, b: Config) -> bool:
    """True when ``a`` and ``b`` may be members of one population: equal in every field outside
    :data:`MAY_DIFFER` (the same shapes, the same data and features, the same loop)."""
    return _shared_part(a) == _shared_part(b)


def _differences(a: Config, b: Config) -> list[str]:
    """The ``section.field`` names where ``a`` and ``b`` differ outside :data:`MAY_DIFFER`."""
    da, db = _shared_part(a), _shared_part(b)
    out = []
    for sec in sorted(set(da) | set(db)):
        sa, sb = da.get(sec, {}), db.get(sec, {})
        out += [f"{sec}.{k}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    return out


class Population:
    """P agents trained together: one train graph and one collect graph for all members.

    Args:
        configs: one :class:`Config` per member, each resolved for the backend; all must pass
            :func:`can_share` with the first (a :class:`ValueError` names the fields that differ).
        bars: already-loaded :class:`cudarl.data.Bars` for every member (default: loaded once from
            ``configs[0].data``).
        splits: the train / val / test :class:`cudarl.splits.Splits` of every member (a walk-forward fold).
        run_dirs: per member, the ``run_dir`` argument of :class:`Trainer` (None: a new run directory
            under ``run.out_dir``; a path; False: none). Default: None for every member.
        echo: a function printing one line; member ``i``'s lines are prefixed ``[i]`` when P > 1.

    Attributes:
        members: ``list[Trainer]``; member ``i`` behaves exactly as ``Trainer(configs[i])`` alone.
        train_graph, collect_graph: the population's :class:`cudarl.graph.StepGraph`\\ s.
        member_bytes: device bytes each member allocated (GPU: CuPy's pool; NumPy: ``tracemalloc`` when
            it is tracing, else None), after the shared feature matrix replaced its own copy.
        stopped: ``{member index: guard message}`` of members the guard stopped (their branches leave
            the graphs, the others go on).

    With P > 1 on the GPU every member runs with ``run.grid_barrier = false``: a launch whose blocks wait
    for each other may never finish while other branches hold the SMs it waits for (the config field
    says so for processes sharing a GPU); the split launches give the same bits.
    """

    def __init__(
        self,
        configs: list[Config],
        *,
        bars=None,
        splits=None,
        run_dirs: list[Path | None] | None = None,
        echo=print,
    ):
        configs = list(configs)
        if not configs:
            raise ValueError("configs: a population needs at least one member")
        for i, c in enumerate(configs[1:], 1):
            if not can_share(configs[0], c):
                raise ValueError(
                    f"configs[{i}] cannot share a population with configs[0]: they differ in "
                    f"{', '.join(_differences(configs[0], c))} (only the fields of "
                    "cudarl.population.MAY_DIFFER may differ)"
                )
        if run_dirs is None:
            run_dirs = [None] * len(configs)
        if len(run_dirs) != len(configs):
            raise ValueError(f"run_dirs: {len(run_dirs)} entries for {len(configs)} configs")
        P = len(configs)
        if P > 1:
            configs = [replace(c, run=replace(c.run, grid_barrier=False)) for c in configs]
        self.configs, self.echo = configs, echo
        gpu = _backend.get(_BACKEND[configs[0].run.device]).is_gpu
        # earlier owners' streams released now, not inside member_bytes (it read negative bytes)
        _release_dead_streams(gpu)
        self.members: list[Trainer] = []
        self._branches: list[SideStream] = []
        self.member_bytes: list[int | None] = []
        prepared, stream = None, None
        for i, (cfg, rd) in enumerate(zip(configs, run_dirs, strict=True)):
            say = echo if P == 1 else (lambda m, i=i: echo(f"[{i}] {m}"))
            before = _allocated(gpu)
            if prepared is None:
                prepared = prepare_data(cfg, bars, splits=splits)
            m = Trainer(cfg, run_dir=rd, echo=say, stream=stream, prepared=prepared)
            if stream is None:
                stream = m.stream
            # one device copy of the feature matrix, for training and evaluation
            m.features_of = self.members[0].env if self.members else m.env
            if self.members:
                m.env.share_features(m.features_of)
            # the member's branch: a stream of its own (with its cuBLAS handle, before any capture)
            self._branches.append(SideStream(m.xp))
            after = _allocated(gpu)
            self.member_bytes.append(None if before is None or after is None else after - before)
            self.members.append(m)
        self.xp, self.stream = self.members[0].xp, stream
        self.stopped: dict[int, str] = {}
        self._build_graphs()

    # --- graphs ------------------------------------------------------------------------------------
    def active(self) -> list[int]:
        """Indices of the members still training (not stopped by their guard)."""
        return [i for i in range(len(self.members)) if i not in self.stopped]

    def _build_graphs(self) -> None:
        live = self.active()
        self.train_graph = branches("train", [self.members[i].train_graph.phases for i in live],
                                    [self._branches[i] for i in live], self.stream, self.xp)  # fmt: skip
        self.collect_graph = branches("collect", [self.members[i].collect_graph.phases for i in live],
                                      [self._branches[i] for i in live], self.stream, self.xp)  # fmt: skip
        for i in live:  # a member's rollback recaptures the graph that holds its schedule's constants
            self.members[i].monitor.train_graph = self.train_graph

    def capture(self) -> None:
        """Capture the population's graphs (those not captured yet), after starting the compiles of the
        kernels the first member's graphs launch (:meth:`StepGraph.prefetch`; the members' phases are
        the same program, so one discovery pass serves all, not one over P members; a kernel only
        another member launches compiles at its first launch)."""
        todo = [g for g in (self.collect_graph, self.train_graph) if not g.captured]
        if todo:
            lead = self.members[self.active()[0]]
            for g in (lead.collect_graph, lead.train_graph):
                g.prefetch()
        for g in todo:
            g.capture()

    # --- the loop ----------------------------------------------------------------------------------
    def prime(self, stop=()) -> None:
        """Capture both graphs and collect until every member's replay holds enough rows to learn from
        (each member collects exactly as :meth:`Trainer.prime` would alone: they share the count)."""
        if not self.active():
            return
        self.capture()
        a = self.configs[0].agent
        need = max(a.learning_starts, a.batch_size)
        lead = self.members[self.active()[0]]
        if lead.experience is not None:  # offline: nothing to collect (the replays hold the recording)
            if lead._ready_rows() < need:
                raise experience.ExperienceError(
                    f"{lead.cfg.run.offline}: {lead._ready_rows()} recorded transitions are ready to sample; "
                    f"training needs max(agent.learning_starts, agent.batch_size) = {need}"
                )
            return
        while lead._ready_rows() < need and not stop:
            self._collect()

    def _collect(self) -> None:
        self.collect_graph.replay()
        for i in self.active():
            self.members[i].collect_steps += 1

    def update(self) -> None:
        """One learner update of every active member (a collection step first when it is due), as
        :meth:`Trainer._update` makes it alone; then each member's host-driven work between updates."""
        lead = self.members[self.active()[0]]
        if lead.experience is None and lead.step % lead.cfg.agent.updates_per_collect == 0:
            self._collect()
        self.train_graph.replay()
        for i in self.active():
            m = self.members[i]
            m.step += 1
            m.agent.between_updates(m.step, m.stream)

    def run(self, steps: int | None = None, progress=None) -> list[dict]:
        """Train every member until ``steps`` learner updates (default ``run.steps`` of the first config);
        returns one summary per member, like :meth:`Trainer.run` (a member the guard stopped:
        ``{"guard_stop": message, "step": update}``).

        ``progress(i, step, row, last_eval)``: called as :meth:`Trainer.run` calls its ``progress``, with
        the member's index first. Ctrl-C or SIGTERM: every member writes ``latest.npz``, then
        :class:`cudarl.interrupt.Interrupted`."""
        with interrupt.deferred() as stop:
            return self._run(steps, progress, stop)

    def _run(self, steps, progress, stop) -> list[dict]:
        target = int(steps if steps is not None else self.configs[0].run.steps)
        self.prime(stop)
        t0 = time.perf_counter()
        rates = [_Rate(m.step) for m in self.members]
        prog = [None if progress is None else (lambda *a, i=i: progress(i, *a)) for i in range(len(self.members))]
        while self.active() and self.members[self.active()[0]].step < target:
            if stop:
                self._interrupted(stop)
            self.update()
            for i in self.active():
                try:
                    self.members[i]._after_update(rates[i], prog[i])
                except GuardStop as exc:
                    self._stop_member(i, str(exc))
        for i in self.active():
            self.members[i].monitor.settle()
        if stop:
            self._interrupted(stop)
        out = []
        for i, m in enumerate(self.members):
            if i in self.stopped:
                out.append({"guard_stop": self.stopped[i], "step": m.step})
            else:
                out.append(m._finish(t0, prog[i]))
        return out

    def _stop_member(self, i: int, message: str) -> None:
        """Member ``i``'s guard stopped it (it saved ``guard-stop`` already): its branches leave the graphs,
        which are recaptured for the others."""
        self.stopped[i] = message
        self.members[i].synchronize()
        if self.active():
            self._build_graphs()
            self.capture()

    def _interrupted(self, stop) -> None:
        msgs = [self.members[i]._save_interrupted(stop) for i in self.active()]
        raise interrupt.Interrupted(stop.signum, "; ".join(msgs))

    def evaluate(self, split_name: str = "val") -> list[dict]:
        """:meth:`Trainer.evaluate` of every member on ``split_name``: one summary per member."""
        return [m.evaluate(split_name) for m in self.members]

    def synchronize(self) -> None:
        """Wait for the population's stream (a no-op on the NumPy backend)."""
        if self.stream is not None:
            self.stream.synchronize()

    def close(self) -> None:
        """Free what the population holds outside its arrays: its graphs, its members and their streams,
        and with them the cuBLAS handles and workspaces of those streams (32 MiB each, about nine a
        member), released now rather than at the next ``blas.prepare`` (:func:`cudarl.blas.release_with`).
        A member the caller still holds keeps its streams until it is dropped. The population cannot
        train or evaluate after (:attr:`members` is empty)."""
        self.synchronize()
        self.train_graph = self.collect_graph = None
        _drop_graphs(self.members)  # in a function: a loop variable here would keep the last member alive
        self.members, self._branches = [], []
        _release_dead_streams(self.stream is not None)


def branches(name: str, member_phases: list, sides: list, stream, xp) -> StepGraph:
    """One :class:`StepGraph` named ``name`` whose phase ``member<i>`` runs ``member_phases[i]`` (a
    member's phase list, in order) on the parallel branch ``sides[i]``; the last phase joins every
    branch. On the NumPy backend the members' phases simply run one member after another."""

    def member(phases, side):
        def run():
            with side.branch():
                for _, fn in phases:
                    fn()

        return run

    def join():
        for side in sides:
            side.join()

    phases = [(f"member{i}", member(p, s)) for i, (p, s) in enumerate(zip(member_phases, sides, strict=True))]
    return StepGraph(name, [*phases, ("join", join)], stream=stream, xp=xp)


def _drop_graphs(members: list) -> None:
    """Drop every member's graphs (the population's branches replay their phases)."""
    for m in members:
        m.train_graph = m.collect_graph = m.monitor.train_graph = None


def _release_dead_streams(gpu: bool) -> None:
    """Release the cuBLAS handles and workspaces of streams whose owners are gone (collected first: a
    trainer sits in reference cycles); nothing inside a capture (:func:`cudarl.blas.release_queued`)."""
    if gpu:
        import gc

        from . import blas

        gc.collect()
        blas.release_queued()


def _allocated(gpu: bool) -> int | None:
    """Bytes allocated now: CuPy's default pool (``gpu``), or tracemalloc's traced total when it is
    tracing (NumPy arrays report to it), else None."""
    if gpu:
        import cupy

        return int(cupy.get_default_memory_pool().used_bytes())
    import tracemalloc

    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None


def memory_per_member(cfg: Config, *, bars=None, splits=None) -> int:
    """Device bytes one more member of ``cfg`` takes in a population, measured: a population of two is
    built (no run directories, nothing captured) and the second member's allocations are counted (the
    feature matrix is shared, so it is not in them). On the NumPy backend host bytes, by tracemalloc.

    Counted: every array of the member and the cuBLAS workspace of each of its streams (32 MiB each,
    about nine a member). Not counted: what the driver holds for the graphs and streams themselves."""
    import tracemalloc

    gpu = _backend.get(_BACKEND[cfg.run.device]).is_gpu
    started = not gpu and not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        pop = Population([cfg, cfg], bars=bars, splits=splits, run_dirs=[False, False], echo=lambda m: None)
        got = pop.member_bytes[1]
        pop.close()
    finally:
        if started:
            tracemalloc.stop()
    if got is None or got <= 0:
        raise RuntimeError(f"memory_per_member: measured {got} bytes for one more member; expected a positive count")
    return int(got)
