"""The trainer: data, environments, replay and agent composed into two graphs, and the loop.

Reads top to bottom like a CleanRL script::

    trainer = Trainer(config)            # data, env, replay, agent, graphs, run directory
    trainer.run()                        # collect, learn, guard, log, evaluate, checkpoint

One learner update is one replay of the ``train`` graph; every ``agent.updates_per_collect``
updates, the ``collect`` graph steps every environment once. Both graphs run on one stream, so
they are ordered without host synchronisation. The host reads the loss and gradient norm of
update ``t - 1`` from pinned memory after launching update ``t`` (one step late, after the
event), feeds them to the guard and the metrics. On the NumPy backend the same phases run in
the same order without graphs.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import __version__, experience, interrupt, metrics_log, rundir
from . import backend as _backend
from . import checkpoint as ckpt
from .agent import Agent
from .atomic import atomic_open
from .auxiliary.causal import sensitivities
from .auxiliary.causal_heldout import split_sensitivity
from .auxiliary.selectivity import features_used
from .config import Config, from_dict
from .data import report as data_report
from .env import TradingEnv, stream_seed
from .evaluate import json_safe, write_outputs
from .features import Normaliser
from .graph import StepGraph, capture_all, follow_caller
from .monitor import StepMonitor
from .policy import EVAL_ENVS, PolicyState, deployment, eval_env, evaluate_split, greedy_walk, is_policy_file
from .prepare import Prepared, prepare_data
from .replay import PrioritizedReplay
from .timing import Stopwatch

#: Learner updates between updates of the moving average of the weights (eval.average_halflife).
AVERAGE_EVERY = 10


def versions() -> dict:
    v = {"cudarl": __version__, "python": platform.python_version(), "numpy": np.__version__}
    try:
        import cupy

        v["cupy"] = cupy.__version__
    except Exception:
        pass
    return v


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class Trainer:
    """One training run.

    Args:
        cfg: the resolved :class:`Config` (``cudarl.config.resolve_for_backend`` already applied).
        run_dir: where outputs go (default ``<run.out_dir>/<name>-<time>-<seed>``, made exclusively:
            :mod:`cudarl.rundir`); a path: a new or empty folder (never one in use); ``False`` for none.
        bars: optional already-loaded :class:`cudarl.data.Bars` (tests, the learning checks).
        normaliser: a trained model's feature normaliser (evaluation on other bars).
        splits: train / val / test :class:`cudarl.splits.Splits` (default: chronological from ``data``).
        echo: a function printing one line (progress when not on a TTY, guard events, evaluations).
        stream: the CuPy stream both graphs run on (default: a new one; :class:`cudarl.population.Population`
            gives its members its own, so their host-driven work is ordered with the population's graphs).
        prepared: the :class:`Prepared` data to use instead of preparing it (a population's members share one).
        learner_state: ``"own"`` (default): the trainer trains its agent, with a replay of its own, the
            collect and train graphs and their transition buffers. ``"external"``: something else trains
            it (a joined population's :class:`cudarl.population.JoinedMember`, whose stacked learner,
            replay and env hold its learning state): no replay, no graphs and no transition buffers are
            built, :attr:`replay`, :attr:`transitions`, :attr:`discount`, :attr:`collect_graph` and
            :attr:`train_graph` are None, and its agent's acting workspace has the evaluation envs' rows
            (:data:`cudarl.policy.EVAL_ENVS`), not the training envs'; its agent (networks for evaluation,
            policy files and the moving average), env (the features, the env config), guard, normaliser
            and run directory are kept.
            The subclass supplies :meth:`_learning_state` and :meth:`_load_learning_state`.
    """

    #: the values of ``learner_state``
    LEARNER_STATES = ("own", "external")

    def __init__(
        self,
        cfg: Config,
        *,
        run_dir=None,
        bars=None,
        normaliser=None,
        splits=None,
        echo=print,
        stream=None,
        prepared: Prepared | None = None,
        learner_state: str = "own",
    ):
        if learner_state not in self.LEARNER_STATES:
            raise ValueError(f"learner_state: {learner_state!r} is not one of {self.LEARNER_STATES}")
        if learner_state == "external" and cfg.run.offline:
            raise ValueError('learner_state = "external": run.offline fills a replay of its own, which it has none of')
        self.learner_state = learner_state
        own = learner_state == "own"
        self.timings: dict[str, float] = {}  # start-up seconds by stage (cudarl.timing; tools/bench_startup.py)
        sw = Stopwatch(self.timings)
        self.cfg, self.echo = cfg, echo
        self.be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy"}[cfg.run.device])
        xp = self.xp = self.be.xp
        sw.lap("backend")
        self.data = (
            prepared if prepared is not None else prepare_data(cfg, bars, normaliser, stopwatch=sw, splits=splits)
        )
        tr = self.data.splits.train
        b = self.data.bars
        # environments over the training split (their reward may carry the turnover penalty, evaluation
        # never); their observations are net.window bars gathered from the features; their episode starts
        # and exploration drawn from run.seed's stream as well as env.seed's (stream_seed)
        train_env = replace(cfg.env, seed=stream_seed(cfg.run.seed, cfg.env.seed))
        if cfg.agent.train_cost_bps:
            train_env = replace(train_env, slippage_bps=cfg.env.slippage_bps + cfg.agent.train_cost_bps)
        self.env = TradingEnv(
            b.open,
            b.close,
            self.data.x,
            self.data.sign,
            train_env,
            t_begin=tr.start,
            t_end=tr.stop,
            window=self.data.window,
            backend=self.be.name,
        )
        rows = self.env.rows_per_step * self.env.n_envs
        # learner_state "external": the transition buffers and the replay are the stacked objects'
        self.transitions = self.env.make_transitions() if own else None
        self.discount = xp.zeros(rows, np.float32) if own else None
        # offline (run.offline): the replay's columns are the recording's rows of a step, filled from it
        self.experience = None
        if cfg.run.offline:
            self.experience = experience.read(cfg.run.offline)
            experience.check_fits(
                self.experience, cfg.run.offline, self.data, cfg.env.position_levels(), cfg.replay.n_step
            )
        columns = rows if self.experience is None else self.experience.rows_per_step
        # replay: every row group of a step is one interleaved "env" column of the ring; its rows are
        # state rows (bar indices and position features), whatever the window
        self.replay = (
            None
            if not own
            else PrioritizedReplay(
                cfg.replay.capacity,
                self.env.windows.state_dim,
                n_step=cfg.replay.n_step,
                n_envs=columns,
                alpha=cfg.replay.alpha,
                eps=cfg.replay.eps,
                beta0=cfg.replay.beta0,
                beta_final=cfg.replay.beta_final,
                beta_steps=cfg.replay.beta_steps,
                seed=cfg.run.seed,
                backend=self.be.name,
                store_next_obs=cfg.env.counterfactual
                if self.experience is None
                else self.experience.next_state is not None,
            )
        )
        if self.experience is not None:
            n = experience.load_into(self.experience, self.replay, cfg.agent.gamma)
            echo(f"offline: {n:,} recorded transitions from {cfg.run.offline} ({self.experience.steps} steps)")
        # learner_state "external": the agent acts in evaluation only, over EVAL_ENVS rows (its acting
        # workspace sized so, not for the training envs)
        self.agent = Agent(
            cfg,
            self.env.obs_dim,
            self.env.n_actions,
            self.env.n_envs if own else EVAL_ENVS,
            xp,
            market=self.env,
            feature_names=self.data.names,
        )
        self.batch = self.agent.batch
        if own:
            self.replay.reserve(cfg.agent.batch_size)
        if self.be.is_gpu and stream is None:
            import cupy

            from . import blas

            stream = cupy.cuda.Stream(non_blocking=True)
            # its cuBLAS handle goes with the agent: every graph that captures on this stream (the two
            # below, a population's) runs the agent's phases, so none can replay once the agent is gone
            blas.release_with(self.agent, stream)
        self.collect_graph = self.train_graph = None  # learner_state "external": whoever trains it has graphs
        if own:
            self.collect_graph = StepGraph(
                "collect",
                self.agent.collect_phases(self.env, self.replay, self.transitions, self.discount),
                stream=stream,
                xp=xp,
            )
            self.train_graph = StepGraph(
                "train", self.agent.train_phases(self.replay, self.env.windows), stream=stream, xp=xp
            )
        self.stream = self.train_graph.stream if own else stream
        sw.lap("allocation")
        self.best = None  # {"step", "sharpe"} of the best validation evaluation (run.keep_best)
        #: the one-step-late readback, the guard and the rollback (cudarl.monitor)
        self.monitor = StepMonitor(
            self.agent,
            self.train_graph,
            cfg.guard,
            stream=self.stream,
            on_event=self._event,
            on_stop=lambda: self.save(name="guard-stop"),
        )
        self.guard = self.monitor.guard
        self.losses = self.monitor.losses  # loss of every update, in order (tests, bitwise comparisons)
        self.step = 0  # learner updates done
        self.collect_steps = 0
        self.rows_per_collect = rows
        self.events: list[dict] = []
        self._last_row: dict | None = None  # the latest metrics row (the progress display's last line)
        #: bytes of the last checkpoint :meth:`save` wrote (None before one): its cost on disk
        self.checkpoint_bytes: int | None = None
        self._eval_envs: dict = {}
        #: an env whose device feature matrix this run's evaluation envs read (cudarl.population), or None
        self.features_of: TradingEnv | None = None
        self.last_eval: dict | None = None
        self.last_evaluation = None
        self.history: list[dict] = []  # every evaluation row, in order (the validation Sharpe over training)
        self._val_psr: tuple | None = None  # (step, validation PSR) for the deployment gate
        # eval.average_halflife: the moving average of the online weights that evaluation deploys
        self.average = xp.array(self.agent.online.params) if cfg.eval.average_halflife else None
        self.run_dir = None
        self.log = None
        self._said_no_plot = False
        #: draw ``equity.png`` with each evaluation written to the run directory (about half a second of
        #: CPU each; the learning check's runs, which read only the numbers, turn it off)
        self.plot_evaluations = True
        for w in self.data.bars.warnings:
            echo(f"data: warning: {w}")
        if self.data.bars.repairs:
            echo(f"data: repaired {self.data.bars.repairs}")
        if cfg.run.tensorboard:
            metrics_log.require_tensorboard()  # before any run directory is made
        if run_dir is not False:
            r = cfg.run
            made = rundir.claim(run_dir) if run_dir else rundir.create(r.out_dir, r.name, r.seed)
            self._attach_run_dir(made)
        sw.lap("run_dir")

    # --- run directory ---------------------------------------------------------------------------
    def _attach_run_dir(self, d: Path, fresh: bool = True, resumed_from=None) -> None:
        """Write into run directory ``d`` (made by :mod:`cudarl.rundir`) from now on: its config,
        environment and data report when ``fresh``, and the metric log."""
        self.run_dir = Path(d)
        (d / "checkpoints").mkdir(exist_ok=True)
        (d / "eval").mkdir(exist_ok=True)
        _write_text(d / "config.toml", self.cfg.to_toml())
        self.log = metrics_log.MetricsLog(d, tensorboard=self.cfg.run.tensorboard)
        if not fresh:
            return
        env = {
            "versions": versions(),
            "backend": self.be.name,
            "device": self.be.device,
            "compute_capability": self.be.compute_capability,
            "git_commit": _git_commit(),
            "argv": sys.argv,
            "platform": platform.platform(),
        }
        if resumed_from is not None:
            env["resumed_from"] = {"checkpoint": str(resumed_from), "step": self.step}
        _write_text(d / "env.json", json.dumps(env, indent=1))
        rep = data_report(self.data.bars)
        rep["splits"] = self.data.splits.as_dict()
        rep["features"] = list(self.data.names)
        rep["normaliser_fitted_on"] = list(self.data.normaliser.fitted_on)
        rep["periods_per_year"] = self.data.periods_per_year
        _write_text(d / "data_report.json", json.dumps(rep, indent=1, default=str))

    def _log_row(self, row: dict) -> None:
        if self.log is not None:
            self.log.append(json_safe(row))  # strict JSON: null with a reason, never NaN

    # --- the loop ----------------------------------------------------------------------------------
    def _ready_rows(self) -> int:
        if self.experience is not None:
            return self.replay.ready()  # offline: what the recording filled (a device read, before training)
        lag = 0 if self.cfg.env.counterfactual else self.cfg.replay.n_step * self.rows_per_collect
        return max(0, min(self.collect_steps * self.rows_per_collect, self.cfg.replay.capacity) - lag)

    def _capture(self) -> None:
        capture_all([g for g in (self.collect_graph, self.train_graph) if not g.captured])

    def prime(self, stop=()) -> None:
        """Capture both graphs and collect until the replay holds enough rows to learn from
        (``max(agent.learning_starts, agent.batch_size)``); :meth:`run` starts with this. Returns
        early when ``stop`` (:class:`cudarl.interrupt.StopFlag`) is set."""
        a = self.cfg.agent
        need = max(a.learning_starts, a.batch_size)
        sw = Stopwatch(self.timings)
        self._capture()
        sw.lap("capture")
        if self.experience is not None and self._ready_rows() < need:
            raise experience.ExperienceError(
                f"{self.cfg.run.offline}: {self._ready_rows()} recorded transitions are ready to sample; "
                f"training needs max(agent.learning_starts, agent.batch_size) = {need}"
            )
        while self._ready_rows() < need and not stop:
            self.collect_graph.replay()
            self.collect_steps += 1
            self.agent.collected()
        sw.lap("prime_collect")

    def advance(self, collect_steps: int) -> None:
        """Launch ``collect_steps`` collection steps, each followed by ``agent.updates_per_collect``
        learner updates, back to back on the stream (call :meth:`prime` first): :meth:`run`'s own
        update (:meth:`_update`) without the readback, guard, logging, evaluation or checkpoint (the
        epoch benchmark). Returns without synchronising."""
        for _ in range(int(collect_steps) * self.cfg.agent.updates_per_collect):
            self._update()

    def _update(self) -> None:
        """One learner update as the run loop makes it: a collection step first every
        ``agent.updates_per_collect`` updates, the train graph, then the agent's host-driven work
        between updates (:meth:`cudarl.agent.Agent.between_updates`)."""
        # collect (never offline: the replay holds the recording)
        if self.experience is None and self.step % self.cfg.agent.updates_per_collect == 0:
            self.collect_graph.replay()
            self.collect_steps += 1
            self.agent.collected()
        # learn
        self.train_graph.replay()
        self.step += 1
        self.agent.between_updates(self.step, self.stream)

    def run(self, steps: int | None = None, progress=None) -> dict:
        """Train until ``steps`` learner updates in total (default ``run.steps``); returns the last evaluation.

        Ctrl-C or SIGTERM stops it between updates: a final ``checkpoints/latest.npz`` (none with
        ``run.resume_checkpoint = "never"``), then
        :class:`cudarl.interrupt.Interrupted` (exit code 130 or 143 from the command line)."""
        with interrupt.deferred() as stop:
            return self._run(steps, progress, stop)

    def _run(self, steps, progress, stop) -> dict:
        target = int(steps if steps is not None else self.cfg.run.steps)
        self.prime(stop)
        t0, rate = time.perf_counter(), _Rate(self.step)
        while self.step < target:
            if stop:
                self._interrupted(stop)
            # collect and learn
            self._update()
            self._after_update(rate, progress)
        self.monitor.settle()
        if stop:
            self._interrupted(stop)
        return self._finish(t0, progress)

    def _after_update(self, rate, progress) -> None:
        """The host's work after update :attr:`step` was launched: the guard's readback of the update
        before it (a rollback skips the rest), the moving average, the metrics row, the validation
        evaluation, the policy checkpoint and the guard's snapshot, each at its interval."""
        cfg = self.cfg
        # guard: read the update before this one (GPU) or this one (CPU); a rollback skips the rest
        if self.monitor.launched(self.step):
            return
        if self.average is not None and self.step % AVERAGE_EVERY == 0:
            self._update_average()
        # log
        if self.step % cfg.run.log_every == 0:
            self._log_step(rate(self.step), progress)
        # evaluate
        if cfg.run.eval_every and self.step % cfg.run.eval_every == 0:
            self.monitor.settle()
            self.evaluate("val")
            self._save_evaluated()
        # checkpoint
        if cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0:
            self.monitor.settle()
            self.save_policy(f"step-{self.step:08d}")
        if self.step % cfg.guard.snapshot_every == 0:
            self.monitor.take_snapshot(self.step)

    def _finish(self, t0: float, progress) -> dict:
        """The end of :meth:`run`: a validation evaluation at the last update (unless one was just
        made), ``latest`` saved (unless ``run.resume_checkpoint = "never"``), the final line."""
        evaluated = (
            self.last_eval is not None
            and self.last_eval.get("step") == self.step
            and self.last_eval.get("split") == "val"
            and self.last_evaluation is not None
        )
        if not evaluated:  # a run resumed at its last update evaluates it again: drop the restored row
            self.history = [r for r in self.history if (r.get("split"), r.get("step")) != ("val", self.step)]
        result = self.last_evaluation.summary if evaluated else self.evaluate("val")
        if not evaluated:
            self._save_evaluated(end=True)
        elif self.cfg.run.resume_checkpoint == "end":  # "eval" wrote it with that evaluation
            self.save()
        if self.cfg.run.record:
            path = experience.record(self, self.cfg.run.record)
            self.echo(f"recorded the replay's transitions to {path} (cudarl-train train --offline {path})")
        if progress is not None and self._last_row is not None:
            progress(self.step, self._last_row, self.last_eval)  # show the final validation Sharpe
        best = (
            f"; best validation Sharpe {_fmt(self.best['sharpe'])} at update {self.best['step']} "
            "(checkpoints/best.safetensors)"
            if self.best is not None and self.run_dir is not None
            else ""
        )
        self.echo(f"done: {self.step} updates in {time.perf_counter() - t0:.1f} s; run directory {self.run_dir}{best}")
        return result

    def _interrupted(self, stop) -> None:
        """Settle the update in flight, write ``latest.npz`` (``run.resume_checkpoint`` not ``never``), log
        and say so, raise ``Interrupted``."""
        raise interrupt.Interrupted(stop.signum, self._save_interrupted(stop))

    def _save_interrupted(self, stop) -> str:
        """:meth:`_interrupted` but the raise: settle, write ``latest.npz``, log and say so; the message."""
        self.monitor.settle()
        never = self.cfg.run.resume_checkpoint == "never"
        path = None if never else self.save()
        self._log_row({"event": "interrupted", "step": self.step, "signal": stop.name})
        msg = f"interrupted by {stop.name} at update {self.step}"
        if path is not None:
            msg += f"; wrote {path}; continue with: cudarl-train train --resume {path}"
        elif never and self.run_dir is not None:
            msg += "; no checkpoint written (run.resume_checkpoint = never)"
        self.echo(msg)
        return msg

    def _update_average(self) -> None:
        """``average += (1 - 2^(-AVERAGE_EVERY / halflife)) (online - average)``, on the training stream."""
        rate = 1.0 - 0.5 ** (AVERAGE_EVERY / self.cfg.eval.average_halflife)
        with self.stream if self.stream is not None else nullcontext():
            self.average += np.float32(rate) * (self.agent.online.params - self.average)

    @contextmanager
    def _weights(self, averaged: bool):
        """The online network holds the moving average of its weights inside this block (when there is one
        and ``averaged``), its own weights again after it; both swaps on the training stream."""
        if self.average is None or not averaged:
            yield
            return
        online = self.agent.online
        params = online.params
        with self.stream if self.stream is not None else nullcontext():  # ordered with the graphs' work
            own = params.copy()
            params[...] = self.average
            online.spectral_step(iterate=False)  # net.spectral: W_sn of the weights that act
        try:
            yield
        finally:
            with self.stream if self.stream is not None else nullcontext():
                params[...] = own
                online.spectral_step(iterate=False)
            self.synchronize()

    def _save_evaluated(self, end: bool = False) -> None:
        """After a validation evaluation (``end``: the run's last): write ``latest.npz`` as
        ``run.resume_checkpoint`` says, and if its Sharpe is the best so far (``run.keep_best``), the
        policy file ``best.safetensors``."""
        sharpe = (self.last_eval or {}).get("sharpe")
        improved = (
            self.cfg.run.keep_best
            and sharpe is not None
            and math.isfinite(sharpe)
            and (self.best is None or sharpe > self.best["sharpe"])
        )
        if improved:  # before the save, so the checkpoint carries its own best record
            self.best = {"step": self.step, "sharpe": float(sharpe)}
        when = self.cfg.run.resume_checkpoint
        if when == "eval" or (end and when == "end"):
            self.save()
        if improved and self.run_dir is not None:
            self.save_policy("best")
            self._log_row({"event": "best", "split": "val", **self.best})

    def _event(self, row: dict) -> None:
        self.events.append(row)
        self._log_row(row)
        self.echo(row.get("message", json.dumps(row)))

    def _log_step(self, sps: float, progress) -> None:
        loss, gn = self.monitor.last
        with self.stream if self.stream is not None else nullcontext():  # reads after the graphs' work
            observed = {**self.agent.observables(), **self.agent.acting_observables()}
        row = {
            "step": self.step,
            "collect_steps": self.collect_steps,
            "loss": loss,
            "grad_norm": gn,
            "updates_per_s": sps,
            "env_steps": self.collect_steps * self.env.n_envs,
            **self.monitor.last_stats,  # the step's observables: Q statistics, plan head, regularisers
            **observed,  # the auxiliary signals' (agent.aux) and the collect step's act (agent.act_by)
        }
        self._log_row(row)
        self._last_row = row
        if progress is not None:
            progress(self.step, row, self.last_eval)

    def synchronize(self) -> None:
        """Wait for the work launched on the training stream (a no-op on the NumPy backend)."""
        if self.stream is not None:
            self.stream.synchronize()

    # --- evaluation ----------------------------------------------------------------------------------
    def _eval_env(self, split) -> TradingEnv:
        key = (split.start, split.stop)
        if key not in self._eval_envs:
            env = self._eval_envs[key] = eval_env(self.data, split, self.cfg.env, self.be.name)
            if self.features_of is not None:  # a population's member: one device copy of the features
                env.share_features(self.features_of)
        return self._eval_envs[key]

    def _plan_scale(self):
        """The plan head's gate for the greedy walk (net.plan), or None."""
        return self.agent.plan_scale if self.cfg.net.plan else None

    def greedy_positions(self, split, margin: float | None = None, averaged: bool = True) -> np.ndarray:
        """The online network's greedy positions at the decision bars of ``split`` (float64 ``[len - 2]``;
        with net.plan sized by the plan head's gate).

        ``margin`` (default ``eval.margin``): the held position is kept unless another action's expected
        value exceeds its own by more than this (:func:`cudarl.policy.greedy_actions`). ``averaged``:
        with ``eval.average_halflife``, the moving average of the weights acts (False: the last weights)."""
        env = self._eval_env(split)
        margin = self.cfg.eval.margin if margin is None else float(margin)
        self.synchronize()
        with self._weights(averaged):
            acts, scales = greedy_walk(
                env,
                self.agent.q_values,
                self.stream,
                margin=margin,
                q_rows=self.agent.eval_rows(),
                scale=self._plan_scale(),
            )
        return (self.cfg.env.position_levels()[acts] * scales).astype(np.float64)

    def validation_psr(self) -> float:
        """The probabilistic Sharpe ratio (against 0) of the validation split at the current weights."""
        if self._val_psr is None or self._val_psr[0] != self.step:
            ev = self._evaluation("val", gate=False)
            self._val_psr = (self.step, ev.summary["statistics"]["psr"])
        return self._val_psr[1]

    def _evaluation(
        self,
        split_name: str,
        gate: bool = True,
        margin: float | None = None,
        averaged: bool = True,
        heldout: bool = False,
    ):
        """The deployed positions on a split evaluated with the env's fill and costs and the statistics of
        ``eval`` (:func:`cudarl.policy.evaluate_split`); ``gate`` False: the trained policy's own, whatever
        the validation gate says; ``margin``, ``averaged``: see :meth:`greedy_positions`. ``heldout`` (with
        ``agent.aux = ["causal"]``): the summary's ``causal_sensitivity_heldout`` too, of the same weights
        (:func:`cudarl.auxiliary.causal_heldout.split_sensitivity`; a forward per group over the split, which
        the validation PSR and other views of the same weights have no use for)."""
        split = getattr(self.data.splits, split_name)
        margin = self.cfg.eval.margin if margin is None else float(margin)
        dep = deployment(self.cfg.eval, split_name, self.validation_psr) if gate else {"gate": "not applied"}
        dep = {"trading": True, **dep}
        self.synchronize()
        env = self._eval_env(split)
        with self._weights(averaged):
            ev = evaluate_split(
                self.data,
                split_name,
                self.cfg.env,
                self.agent.q_values,
                self.be.name,
                env,
                self.stream,
                margin=margin,
                eval_cfg=self.cfg.eval,
                trading=dep["trading"],
                q_rows=self.agent.eval_rows(),
                scale=self._plan_scale(),
            )
            used, sens = [], None
            if "selectivity" in self.cfg.agent.aux:  # its gates, of the weights that act (after the swap)
                with self.stream if self.stream is not None else nullcontext():
                    used = features_used(self.agent.observables())
            if heldout and "causal" in self.cfg.agent.aux:  # each group's sensitivity over this split, likewise
                with self.stream if self.stream is not None else nullcontext():
                    q_into, n_actions = self.agent.eval_q_into, self.cfg.env.n_actions
                    sens = split_sensitivity(q_into, self.xp, n_actions, self.data, split_name, self.cfg)
        if used:  # agent.aux = ["selectivity"]: the gates, largest first
            ev.summary["features_used"] = used
        if sens is not None:
            ev.summary["causal_sensitivity_heldout"] = sens
        ev.summary["step"] = self.step
        ev.summary["deployment"] = {
            **dep,
            "margin": margin,
            "weights": "moving average" if self.average is not None and averaged else "last",
        }
        if split_name == "val" and dep["trading"]:
            self._val_psr = (self.step, ev.summary["statistics"]["psr"])
        return ev

    def evaluate(self, split_name: str = "val", write: bool = True) -> dict:
        """Greedy evaluation over a split with the env's fill and costs, the statistics and the deployment
        rules of ``eval`` (gate, margin, moving average); writes ``eval/<split>-<step>/``."""
        ev = self._evaluation(split_name, heldout=True)
        observed = self.agent.observables()
        sensitivity = sensitivities(observed)  # agent.aux = ["causal"]: each group's measured sensitivity
        if sensitivity:
            ev.summary["causal_sensitivity"] = sensitivity
        self.last_evaluation = ev
        if write and self.run_dir is not None:
            plot = self.plot_evaluations
            written = write_outputs(ev, self.run_dir / "eval" / f"{split_name}-{self.step:08d}", plot=plot)
            if plot and not self._said_no_plot and not any(p.name == "equity.png" for p in written):
                self._said_no_plot = True
                self.echo(NO_PLOT)
        p, st = ev.summary["policy"], ev.summary["statistics"]
        row = {
            "event": "eval",
            "split": split_name,
            "step": self.step,
            "sharpe": p.get("sharpe"),
            "total_return": p.get("total_return"),
            "max_drawdown": p.get("max_drawdown"),
            "buy_and_hold_sharpe": ev.summary["buy_and_hold"].get("sharpe"),
            "trades": p.get("trades"),
            "psr": st.get("psr"),
            "sharpe_interval": st.get("sharpe_interval"),
            "trading": ev.summary["deployment"]["trading"],
        }
        self._log_row(row)
        self.last_eval = row
        self.history.append(row)
        lo, hi = row["sharpe_interval"] or (None, None)
        dep = ev.summary["deployment"]
        gate = "" if row["trading"] else f"; flat: validation PSR {_fmt(dep.get('validation_psr'))} < gate"
        self.echo(
            f"eval {split_name} @ {self.step}: Sharpe {_fmt(row['sharpe'])} "
            f"({100 * self.cfg.eval.level:.0f}% interval {_fmt(lo)} to {_fmt(hi)}, PSR {_fmt(row['psr'])}; "
            f"buy-and-hold {_fmt(row['buy_and_hold_sharpe'])}), "
            f"total return {_fmt(row['total_return'])}, max drawdown {_fmt(row['max_drawdown'])}{gate}"
        )
        return ev.summary

    # --- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host copies of everything a resume needs: agent, replay, environments, guard, normaliser, counters."""
        self.synchronize()
        return {
            **self._learning_state(),
            "guard": self.guard.state_dict(),
            "normaliser": self.data.normaliser.state_dict(),
            "trainer": {
                "step": self.step,
                "collect_steps": self.collect_steps,
                "best_step": -1 if self.best is None else self.best["step"],
                "best_sharpe": float("nan") if self.best is None else self.best["sharpe"],
            },
            **({} if self.average is None else {"average": {"params": _backend.to_numpy(self.average).copy()}}),
        }

    def load_state_dict(self, s: dict) -> None:
        """Restore :meth:`state_dict` into the existing buffers (captured graphs stay valid)."""
        self.synchronize()
        self._load_learning_state(s)
        self.guard.load_state_dict(s["guard"])
        norm = Normaliser.from_state_dict(s["normaliser"])
        if not (
            np.array_equal(norm.mean, self.data.normaliser.mean) and np.array_equal(norm.std, self.data.normaliser.std)
        ):
            raise ValueError(
                "the checkpoint's feature normaliser differs from this data's: was it trained on other bars?"
            )
        self.step = int(s["trainer"]["step"])
        self.collect_steps = int(s["trainer"]["collect_steps"])
        best_step = int(s["trainer"].get("best_step", -1))  # absent in checkpoints written before keep_best
        self.best = None if best_step < 0 else {"step": best_step, "sharpe": float(s["trainer"]["best_sharpe"])}
        if self.average is not None:  # a checkpoint without one (written before) starts it from the weights
            src = s["average"]["params"] if "average" in s else _backend.to_numpy(self.agent.online.params)
            self.average[...] = self.xp.asarray(src)
        # the writes above ran on the caller's stream; the graphs follow it at their next replay, an
        # evaluation straight after a load (a run resumed at its end) would not without this
        follow_caller(self.stream)

    def _learning_state(self) -> dict:
        """``{"agent", "replay", "env"}``: the states of what the graphs train (a joined population's member
        reads its stacked objects' member instead: :class:`cudarl.population.JoinedMember`)."""
        return {"agent": self.agent.state_dict(), "replay": self.replay.state_dict(), "env": self.env.state_dict()}

    def _load_learning_state(self, s: dict) -> None:
        """Restore :meth:`_learning_state`'s three entries of ``s``."""
        self.agent.load_state_dict(s["agent"])
        self.replay.load_state_dict(s["replay"])
        self.env.load_state_dict(s["env"])

    def save(self, name: str = "latest") -> Path | None:
        """Write the resume checkpoint ``checkpoints/<name>.npz`` (everything, the replay too) atomically."""
        if self.run_dir is None:
            return None
        path = self.run_dir / "checkpoints" / f"{name}.npz"
        from .policy import data_fingerprint

        info = {
            "config": self.cfg.to_dict(),
            "versions": versions(),
            "step": self.step,
            "backend": self.be.name,
            "data": data_fingerprint(self.data.bars),
        }
        path = ckpt.save(path, self.state_dict(), info)
        self.checkpoint_bytes = path.stat().st_size
        return path

    def save_policy(self, name: str) -> Path | None:
        """Write the policy file ``checkpoints/<name>.safetensors`` (weights, normaliser, config,
        data fingerprint; no replay): :mod:`cudarl.policy`."""
        if self.run_dir is None:
            return None
        return PolicyState.of_trainer(self).save(self.run_dir / "checkpoints" / f"{name}.safetensors")

    @classmethod
    def resume(cls, path, *, run_dir=None, overrides: dict | None = None, echo=print) -> Trainer:
        """A trainer in the state of resume checkpoint ``path`` (its config, with ``overrides`` applied).

        It continues in the checkpoint's own run directory when the checkpoint is that run's newest
        state (its metrics are cut back to the checkpoint's update; a better ``best`` stays);
        otherwise (an older checkpoint, or a folder cudarl did not make) in a new run directory under
        ``run.out_dir``, or in ``run_dir`` when given. Nothing is written before the checkpoint loads.
        Its :attr:`history` holds the run's evaluations up to that update (read from its metric log), so
        the validation Sharpe over training reads as if the run had never stopped.
        """
        if is_policy_file(path):
            raise ckpt.CheckpointError(
                f"{path} is a policy file (weights only: no replay buffer or optimiser state), which cannot be "
                "resumed; resume from the run's checkpoints/latest.npz, or evaluate it with cudarl-train evaluate"
            )
        state, info = ckpt.load(path)
        cfg = from_dict(info["config"])
        if overrides:
            cfg = from_dict(overrides, base=cfg)
        check_finite_state(state["agent"], path)
        t = cls(cfg, run_dir=False, echo=echo)
        t.load_state_dict(state)
        t._attach_resumed(path, run_dir)
        return t

    def _attach_resumed(self, path, run_dir=None) -> None:
        """After :meth:`load_state_dict` of resume checkpoint ``path``: continue in its own run directory
        when it is that run's newest state, else in ``run_dir`` or a new one (:meth:`resume`)."""
        echo = self.echo
        here, why = (None, "") if run_dir is not None else rundir.resume_in_place(path, self.step, ckpt.trainer_step)
        if here is not None:
            rundir.sweep(here, echo)
            dropped = metrics_log.truncate(here, self.step, echo)
            self.history = _eval_history(metrics_log.read_rows(here / metrics_log.JSONL, echo))
            self._keep_better_best(here / "checkpoints" / "best.safetensors")
            self._attach_run_dir(here, fresh=False)
            self.echo(
                f"resumed from {path} at update {self.step} in its run directory {here}"
                + (f" ({dropped} metric row(s) after update {self.step} dropped)" if dropped else "")
            )
            return
        source = rundir.run_dir_of(path)
        if source is not None:
            rundir.sweep(source, echo)
        r = self.cfg.run
        made = rundir.claim(run_dir) if run_dir is not None else rundir.create(r.out_dir, r.name, r.seed)
        if source is not None:
            old = [x for x in metrics_log.read_rows(source / metrics_log.JSONL, echo) if x.get("step", 0) <= self.step]
            metrics_log.write_rows(made, old)
            self.history = _eval_history(old)
        self._attach_run_dir(made, resumed_from=Path(path).resolve())
        self.echo(
            f"resumed from {path} at update {self.step}; continuing in a new run directory {made}"
            + (f": {why}" if why else "")
        )

    def _keep_better_best(self, best_file: Path) -> None:
        """Take the best record of an existing ``best`` policy file if it is better than the checkpoint's."""
        if not best_file.is_file():
            return
        from .policy import read_policy_info

        rec = read_policy_info(best_file).get("best")
        if rec and (self.best is None or rec["sharpe"] > self.best["sharpe"]):
            self.best = {"step": int(rec["step"]), "sharpe": float(rec["sharpe"])}


class _Rate:
    """Updates per second since the last call (the metrics rows' ``updates_per_s``)."""

    def __init__(self, step: int):
        self.t, self.step = time.perf_counter(), step

    def __call__(self, step: int) -> float:
        now = time.perf_counter()
        rate = (step - self.step) / max(now - self.t, 1e-9)
        self.t, self.step = now, step
        return rate


#: Said once a run when an evaluation could not draw equity.png.
NO_PLOT = "equity.png not written: matplotlib is not installed (pip install 'cudarl[plot]')"


def _write_text(path: Path, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def _eval_history(rows: list[dict]) -> list[dict]:
    """The evaluation rows of a metric log (:attr:`Trainer.history` of a resumed run), their nulls
    NaN again (``json_safe`` wrote NaN as null with a reason)."""
    out = []
    for r in rows:
        if r.get("event") != "eval":
            continue
        nan = r.get("null_reasons") or {}
        out.append({k: math.nan if k in nan else v for k, v in r.items() if k != "null_reasons"})
    return out


def check_finite_state(tree, source, prefix: str = "agent/") -> None:
    """Refuse a checkpoint whose agent holds NaN or infinite numbers, naming the array (and for a
    network's flat parameters, the layer)."""
    for k, v in tree.items():
        if isinstance(v, dict):
            check_finite_state(v, source, f"{prefix}{k}/")
            continue
        a = np.asarray(v) if not isinstance(v, (str, list, type(None), bool)) else None
        if a is None or a.dtype.kind != "f" or np.isfinite(a).all():
            continue
        first = int(np.flatnonzero(~np.isfinite(a.reshape(-1)))[0])
        where = ""
        if k == "params" and "layout" in tree:
            for name, off, shape in tree["layout"]:
                if int(off) <= first < int(off) + int(np.prod(shape)):
                    where = f" (layer {name!r}, element {list(np.unravel_index(first - int(off), shape))})"
        raise ckpt.CheckpointError(
            f"{source}: array {prefix + k!r} has {int((~np.isfinite(a)).sum())} value(s) that are not finite "
            f"(NaN or inf), the first at {first}{where}; this checkpoint cannot be used"
        )


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3g}"
