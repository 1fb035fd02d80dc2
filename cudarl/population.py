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
input noise, guard, evaluation and logging intervals: :data:`MAY_DIFFER`), not the replay's n-step, which sets the
update the shared loop starts learning at (:data:`cudarl.stacked_agent.NOT_MEMBER_SETTINGS`);
:func:`can_share` says whether two configs may be members of one population. They share the bars, the
prepared features and the device feature matrix (one copy, not P).

On the NumPy backend the same graphs run their phases in order: the members one after another.

That is ``run.population = "branches"`` (the default): parallel branches of per-member kernels.
``run.population = "joined"`` runs the members through issue 23's agent axis instead (docs/perf-notes.md,
"The agent axis, in stages", 6b): one :class:`cudarl.stacked_agent.StackedLearner` train step and its
collect step (:meth:`~cudarl.stacked_agent.StackedLearner.collect_phases`) over a
:class:`cudarl.stacked_env.StackedTradingEnv` and a stacked replay, one launch per operation for every
member. The members are still :class:`Trainer` s: they evaluate, log and report as in the branches mode
(their guards read the learner's per-member loss, gradient norm and Q statistics, snapshot member ``i``'s
learner state and roll back that member alone, as a single run's guard; their networks get the
learner's weights before an evaluation, a moving-average update, a policy file and at the end), but they build
no graphs, replays or transition buffers of their own (``Trainer(learner_state="external")``), and their
optimisers do not run. Each writes its run directory and resume checkpoint as a
:class:`JoinedMember`: the checkpoint a ``Trainer`` alone would write at that update, its agent, replay and env
states the stacked objects' member ``i``; :meth:`Population.resume` continues a population (either mode) from
its members' checkpoints. What it takes and refuses: :func:`check_joined`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import backend as _backend
from . import checkpoint as ckpt
from . import experience, interrupt
from .agent import PUBLISH_SLOTS
from .config import Config, from_dict
from .graph import SideStream, StepGraph
from .guard import GuardStop
from .prepare import prepare_data
from .stacked_agent import MEMBER_SETTINGS, why_not_member_settings
from .trainer import AVERAGE_EVERY, Trainer, _Rate, check_finite_state

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
        "resume_checkpoint",
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
        "input_noise",
    },
    "replay": {"alpha", "beta0", "beta_final", "beta_steps", "eps"},
    "env": {"cost_bps", "slippage_bps", "hold_cap", "seed", "fill", "levels"},
    "guard": {"*"},
    "eval": {"*"},
}


#: Config fields members of a ``run.population = "joined"`` population may set differently: their seeds
#: (the learner's, the replay's and the envs' Philox keys are ``[P]`` device arrays), what the host
#: alone reads, and the settings the stacked kernels read per member from ``[P]`` device arrays
#: (:data:`cudarl.stacked_agent.MEMBER_SETTINGS`: the learning-rate schedule, Adam's betas, eps, weight
#: decay and clip norm, gamma, the tau and epsilon schedules, PER alpha, eps and beta schedule, the costs,
#: the reward options hold cap, fill and levels, PopArt's beta and warm-up, shrink-and-perturb). What stays one
#: for every member of issue 23's list, and why (the n-step: it sets the shared loop's first update; kappa,
#: cql_alpha, plan_hurdle: the joined step does not read them):
#: :data:`cudarl.stacked_agent.NOT_MEMBER_SETTINGS`, whose reasons the refusals name.
JOINED_MAY_DIFFER = {
    "run": {"name", "seed", "out_dir", "eval_every", "checkpoint_every", "resume_checkpoint", "keep_best",
            "log_every", "tensorboard", "grid_barrier"},
    "env": {"seed"},
    "guard": {"*"},
    "eval": {"*"},
}  # fmt: skip
for _sec, _fields in MEMBER_SETTINGS.items():
    JOINED_MAY_DIFFER.setdefault(_sec, set()).update(_fields)

#: run.device -> the backend request (as :class:`Trainer` resolves it)
_BACKEND = {"auto": None, "gpu": "cupy", "cpu": "numpy"}


def _shared_part(cfg: Config, may: dict = MAY_DIFFER) -> dict:
    """``cfg`` as a dict without the fields of ``may`` (:data:`MAY_DIFFER`)."""
    d = cfg.to_dict()
    for sec, fields in may.items():
        if "*" in fields:
            d.pop(sec, None)
            continue
        for f in fields:
            d.get(sec, {}).pop(f, None)
    return d


def _may_differ(cfg: Config) -> tuple[dict, str]:
    """The fields members of ``cfg``'s population may set differently, and their name: :data:`MAY_DIFFER`,
    or :data:`JOINED_MAY_DIFFER` with ``run.population = "joined"``."""
    if cfg.run.population == "joined":
        return JOINED_MAY_DIFFER, "JOINED_MAY_DIFFER"
    return MAY_DIFFER, "MAY_DIFFER"


def can_share(a: Config, b: Config) -> bool:
    """True when ``a`` and ``b`` may be members of one population: equal in every field outside
    :data:`MAY_DIFFER` (the same shapes, the same data and features, the same loop), or with
    ``run.population = "joined"`` outside :data:`JOINED_MAY_DIFFER` (so a sweep packs joined trials that
    differ in seeds only)."""
    may = _may_differ(a)[0]
    return _shared_part(a, may) == _shared_part(b, may)


def _differences(a: Config, b: Config, may: dict = MAY_DIFFER) -> list[str]:
    """The ``section.field`` names where ``a`` and ``b`` differ outside ``may`` (:data:`MAY_DIFFER`)."""
    da, db = _shared_part(a, may), _shared_part(b, may)
    out = []
    for sec in sorted(set(da) | set(db)):
        sa, sb = da.get(sec, {}), db.get(sec, {})
        out += [f"{sec}.{k}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    return out


def check_joined(configs: list[Config]) -> None:
    """Refuse what a ``run.population = "joined"`` population does not build, naming the field: a train or
    collect step other than the reference one (:func:`cudarl.stacked_agent.reference_collect_config`),
    offline training and ``run.record``."""
    from .stacked_agent import reference_collect_config

    why = 'run.population = "joined"'
    try:
        reference_collect_config(configs[0])
    except ValueError as exc:
        raise ValueError(f'{why}: {exc}; use run.population = "branches" for this configuration') from None
    c = configs[0]
    for field, bad in (("run.offline", c.run.offline), ("run.record", c.run.record)):
        if bad:
            raise ValueError(f'{why}: {field} is not built for joined members (use run.population = "branches")')


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
            it is tracing, else None), after the shared feature matrix replaced its own copy. A joined
            member builds no replay, graphs or transition buffers (``Trainer(learner_state="external")``):
            its learning state is in the stacked objects, counted in ``stacked_bytes``.
        stacked_bytes: joined mode, device bytes of the stacked learner, env, replay and the population's
            graphs (measured as ``member_bytes``); None in the branches mode or where not measured.
        stopped: ``{member index: guard message}`` of members the guard stopped (their branches leave
            the graphs, the others go on; joined: they stay in the graph, masking them is not built, and
            only their host-side work stops). A member's guard rolls back that member alone, in either mode
            (joined: its slices of the stacked learner and its entries of the learning-rate table).
        mode: ``run.population`` of the first config, ``"branches"`` or ``"joined"``.
        learner, env, replay: joined mode, the :class:`cudarl.stacked_agent.StackedLearner`, the
            :class:`cudarl.stacked_env.StackedTradingEnv` and the stacked replay (member ``i`` at index
            ``i``); None in the branches mode.

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
        may, may_name = _may_differ(configs[0])
        for i, c in enumerate(configs[1:], 1):
            if not can_share(configs[0], c):
                diff = _differences(configs[0], c, may)
                raise ValueError(
                    f"configs[{i}] cannot share a population with configs[0]: they differ in "
                    f"{', '.join(diff)} (only the fields of cudarl.population.{may_name} may differ"
                    f"{why_not_member_settings(diff)})"
                )
        if run_dirs is None:
            run_dirs = [None] * len(configs)
        if len(run_dirs) != len(configs):
            raise ValueError(f"run_dirs: {len(run_dirs)} entries for {len(configs)} configs")
        P = len(configs)
        self.mode = configs[0].run.population
        self.learner = self.env = self.replay = None
        if self.mode == "joined":
            check_joined(configs)
        elif P > 1:  # branches: no launch may wait for blocks another member's branch holds (joined has none)
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
            member = JoinedMember if self.mode == "joined" else Trainer
            m = member(cfg, run_dir=rd, echo=say, stream=stream, prepared=prepared)
            if P > 1:  # its guard's and rollbacks' rows in metrics.jsonl name the member, as its echo does
                m.monitor.on_event = lambda row, log=m._event, i=i: log({**row, "member": i})
            if stream is None:
                stream = m.stream
            # one device copy of the feature matrix, for training and evaluation
            m.features_of = self.members[0].env if self.members else m.env
            if self.members:
                m.env.share_features(m.features_of)
            if self.mode == "branches":  # the member's branch: a stream of its own (its cuBLAS handle: now)
                self._branches.append(SideStream(m.xp))
            after = _allocated(gpu)
            self.member_bytes.append(None if before is None or after is None else after - before)
            self.members.append(m)
        self.xp, self.stream = self.members[0].xp, stream
        self.stopped: dict[int, str] = {}
        self.stacked_bytes: int | None = None
        if self.mode == "joined":
            before = _allocated(gpu)
            self._build_joined()
            after = _allocated(gpu)
            self.stacked_bytes = None if before is None or after is None else after - before
        else:
            self._build_graphs()

    @classmethod
    def resume(
        cls, paths, *, run_dirs=None, overrides: dict | None = None, bars=None, splits=None, echo=print
    ) -> Population:
        """A population in the state of its members' resume checkpoints ``paths`` (member ``i``'s
        ``checkpoints/latest.npz`` at ``paths[i]``, all at one update), with their configs (``overrides``
        applied to each); either mode. A joined member's checkpoint goes into the stacked objects' member
        ``i`` (:class:`JoinedMember`), so the population continues as if never stopped, bit for bit.

        ``run_dirs``: per member, as :meth:`Trainer.resume`'s ``run_dir`` (None: its checkpoint's own run
        directory when that is the run's newest state, else a new one; a path), or False: none. Nothing
        is written before every checkpoint loads. ``bars``, ``splits``, ``echo``: as :class:`Population`'s."""
        paths = list(paths)
        run_dirs = [None] * len(paths) if run_dirs is None else list(run_dirs)
        if len(run_dirs) != len(paths):
            raise ValueError(f"run_dirs: {len(run_dirs)} entries for {len(paths)} checkpoints")
        loaded = [ckpt.load(p) for p in paths]
        steps = [int(state["trainer"]["step"]) for state, _ in loaded]
        if len(set(steps)) > 1:
            raise ValueError(f"Population.resume: the checkpoints are at updates {steps}; members resume at one")
        configs = []
        for p, (state, info) in zip(paths, loaded, strict=True):
            check_finite_state(state["agent"], p)
            cfg = from_dict(info["config"])
            configs.append(from_dict(overrides, base=cfg) if overrides else cfg)
        pop = cls(configs, bars=bars, splits=splits, run_dirs=[False] * len(configs), echo=echo)
        for m, (state, _) in zip(pop.members, loaded, strict=True):
            m.load_state_dict(state)
        pop.synchronize()
        for m, p, rd in zip(pop.members, paths, run_dirs, strict=True):
            if rd is not False:
                m._attach_resumed(p, rd)
        return pop

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

    def _build_joined(self) -> None:
        """Joined mode: the stacked env, replay and learner of every member, and the population's two graphs
        made of the learner's collect and train phases (one launch per operation for all members). Member
        ``i``'s seeds: ``run.seed`` (network, replay) and its training env's key (``stream_seed`` of its
        ``run.seed`` and ``env.seed``, as its Trainer made it); the market, features and
        splits are the first member's (they share them), its one device feature matrix too."""
        from .stacked_agent import StackedLearner, stacked_replay
        from .stacked_env import StackedTradingEnv

        lead, P, xp = self.members[0], len(self.members), self.xp
        cfg, e, data = lead.cfg, lead.env, lead.data
        env_seeds = [m.env.config.seed for m in self.members]
        env_configs = [m.env.config for m in self.members]  # the training envs' (their slippage: + train_cost_bps)
        env = StackedTradingEnv(
            P, data.bars.open, data.bars.close, data.x, data.sign, e.config, seeds=env_seeds, configs=env_configs,
            t_begin=e.t_begin, t_end=e.t_end, window=data.window, backend=lead.be.name,
        )  # fmt: skip
        env.share_features(e)
        seeds = [m.cfg.run.seed for m in self.members]
        rows = env.rows_per_step * env.n_envs
        configs = [m.cfg for m in self.members]
        self.env, self.replay = env, stacked_replay(cfg, rows, seeds, backend=lead.be.name, configs=configs)
        self.learner = StackedLearner(cfg, env.obs_dim, env.n_actions, seeds, xp, configs)
        self._transitions, self._discount = env.make_transitions(), xp.zeros((P, rows), np.float32)
        if self.stream is not None:  # the envs' reset ran on the current stream; the graphs' is another
            xp.cuda.get_current_stream().synchronize()
        collect = self.learner.collect_phases(env, self.replay, self._transitions, self._discount)
        self.collect_graph = StepGraph("collect", collect, stream=self.stream, xp=xp)
        self.train_graph = StepGraph(
            "train", self.learner.train_phases(self.replay, env.windows), stream=self.stream, xp=xp
        )
        for i, m in enumerate(self.members):  # the guard reads, snapshots and rolls back member i of the learner
            m.stacked = (self.learner, self.replay, self.env, i)
            m.monitor.agent = _MemberAgent(self.learner, i, m.agent.stats)
            m.monitor.train_graph = self.train_graph
            m.train_graph = m.collect_graph = None  # never captured: the population's graphs run instead

    def _sync_member(self, i: int) -> None:
        """Joined mode: member ``i``'s networks and Adam moments := the learner's member ``i`` (on the
        population's stream), so its evaluation, moving average and summary read the trained weights."""
        L, a = self.learner, self.members[i].agent
        with self.stream if self.stream is not None else nullcontext():
            L.online.store_member(i, a.online)
            L.target.store_member(i, a.target)
            a.adam.m[...] = L.adam.m[i]
            a.adam.v[...] = L.adam.v[i]

    def _reads_weights(self, m) -> bool:
        """Whether member ``m``'s host work after its update reads its network (an evaluation, a policy file
        or a moving average update is due)."""
        r, s = m.cfg.run, m.step
        due = any(every and s % every == 0 for every in (r.eval_every, r.checkpoint_every))
        return due or (m.average is not None and s % AVERAGE_EVERY == 0)

    def capture(self) -> None:
        """Capture the population's graphs (those not captured yet), after starting the compiles of the
        kernels the first member's graphs launch (:meth:`StepGraph.prefetch`; the members' phases are
        the same program, so one discovery pass serves all, not one over P members; a kernel only
        another member launches compiles at its first launch). Joined: the population's own graphs."""
        todo = [g for g in (self.collect_graph, self.train_graph) if not g.captured]
        if todo:
            lead = self.members[self.active()[0]]
            for g in (lead.collect_graph, lead.train_graph) if self.mode == "branches" else todo:
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
        if self.mode == "joined":
            step = lead.step + 1
            self.learner.mark_published(step, self.stream)
            self.learner.between_updates(step, self.stream)
        for i in self.active():
            m = self.members[i]
            m.step += 1
            if self.mode == "branches":
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
                if self.mode == "joined" and self._reads_weights(self.members[i]):
                    self._sync_member(i)
                try:
                    self.members[i]._after_update(rates[i], prog[i])
                except GuardStop as exc:
                    self._stop_member(i, str(exc))
        for i in self.active():
            self.members[i].monitor.settle()
            if self.mode == "joined":
                self._sync_member(i)
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
        if self.mode == "joined":  # it stays in the joined graph (no mask yet): only its host work stops
            self._sync_member(i)  # the weights it stopped with, for its summary and policy file
            return
        if self.active():
            self._build_graphs()
            self.capture()

    def _interrupted(self, stop) -> None:
        msgs = [self.members[i]._save_interrupted(stop) for i in self.active()]
        raise interrupt.Interrupted(stop.signum, "; ".join(msgs))

    def evaluate(self, split_name: str = "val") -> list[dict]:
        """:meth:`Trainer.evaluate` of every member on ``split_name``: one summary per member."""
        if self.mode == "joined":
            for i in self.active():
                self._sync_member(i)
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
        self.learner = self.env = self.replay = None
        _drop_graphs(self.members)  # in a function: a loop variable here would keep the last member alive
        self.members, self._branches = [], []
        _release_dead_streams(self.stream is not None)


class _Ring:
    """A readback ring's face to :class:`cudarl.monitor.StepMonitor`: ``read`` as given, ``mark_written`` a
    no-op (:meth:`Population.update` marks the learner's rings once for every member)."""

    def __init__(self, read, ring=None):
        self.read, self.ring = read, ring

    def mark_written(self, stream=None, slot: int = 0) -> None:
        pass


class JoinedMember(Trainer):
    """A joined population's member ``i``: a :class:`Trainer` whose agent, replay and env states (its
    checkpoint's ``agent``, ``replay`` and ``env``) are the stacked objects' member ``i``
    (``member_state_dict(i)``, bit for bit the single objects' states), so it writes and loads the
    checkpoint ``Trainer(configs[i])`` alone would, and that checkpoint resumes as a single Trainer. Its
    own agent and env stay idle but for evaluation (the population copies the learner's weights
    into its agent before it reads them; a load writes them there too).

    It is a ``Trainer(learner_state="external")``: no replay, no graphs and no transition buffers of its own
    are built (the stacked objects hold them); its agent and env are.

    Attributes:
        stacked: ``(learner, replay, env, i)``, set by the population once it has built them.
    """

    stacked: tuple

    def __init__(self, cfg: Config, **kw):
        super().__init__(cfg, learner_state="external", **kw)

    def _learning_state(self) -> dict:
        learner, replay, env, i = self.stacked
        return {
            "agent": learner.member_state_dict(i),
            "replay": replay.member_state_dict(i),
            "env": env.member_state_dict(i),
        }

    def _load_learning_state(self, s: dict) -> None:
        learner, replay, env, i = self.stacked
        learner.load_member_state_dict(i, s["agent"])
        replay.load_member_state_dict(i, s["replay"])
        env.load_member_state_dict(i, s["env"])
        self.agent.load_state_dict(s["agent"])  # what its evaluation and moving average read


class _MemberAgent:
    """Member ``i`` of a joined population's learner in the form an agent has for its
    :class:`cudarl.monitor.StepMonitor`: ``readback.read(slot)`` (loss and grad norm of the learner's member
    ``i``), ``stats.read(step)`` (its Q statistics, decoded by the member's own
    :class:`cudarl.stats.StepStats`), ``state_dict()`` and ``load_state_dict()`` (the learner's
    ``member_state_dict(i)`` and its load: the guard's snapshot and rollback, the single agent's state bit
    for bit) and ``adam.schedule`` (member ``i``'s learning-rate schedule, which a rollback lowers). A
    rollback touches member ``i``'s slices only; the others train on."""

    def __init__(self, learner, i: int, stats):
        P = learner.members

        def loss_and_norm(slot):
            return learner.readback.read().reshape(P, -1)[i, 2 * slot : 2 * slot + 2]

        def statistics(step):
            return stats.decode(learner.stats_ring.read(step % PUBLISH_SLOTS).reshape(P, -1)[i])

        self.learner, self.i = learner, i
        self.readback = _Ring(loss_and_norm)
        self.stats = _Ring(statistics, ring=_Ring(None))
        self.adam = _MemberSchedule(learner.adam, i)

    def state_dict(self) -> dict:
        return self.learner.member_state_dict(self.i)

    def load_state_dict(self, s: dict) -> None:
        self.learner.load_member_state_dict(self.i, s)


class _MemberSchedule:
    """``schedule``: member ``i``'s learning-rate schedule of a :class:`cudarl.optim.StackedAdam`."""

    def __init__(self, adam, i: int):
        self._adam, self._i = adam, i

    @property
    def schedule(self):
        return self._adam.member_schedule(self._i)

    @schedule.setter
    def schedule(self, s) -> None:
        self._adam.set_member_schedule(self._i, s)


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
    feature matrix is shared, so it is not in them); with ``run.population = "joined"`` plus half the
    stacked objects' bytes (:attr:`Population.stacked_bytes`: the learning state of both members, which
    their own trainers do not hold). On the NumPy backend host bytes, by tracemalloc.

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
        if got is not None and pop.stacked_bytes is not None:  # joined: its share of the stacked objects
            got += pop.stacked_bytes // len(pop.members)
        pop.close()
    finally:
        if started:
            tracemalloc.stop()
    if got is None or got <= 0:
        raise RuntimeError(f"memory_per_member: measured {got} bytes for one more member; expected a positive count")
    return int(got)
