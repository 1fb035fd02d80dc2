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

import csv
import json
import math
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import __version__
from . import backend as _backend
from . import checkpoint as ckpt
from .agent import PUBLISH_SLOTS, Agent
from .atomic import atomic_link
from .config import Config, from_dict
from .data import load as load_bars
from .data import report as data_report
from .env import TradingEnv
from .evaluate import evaluate_positions, json_safe, write_outputs
from .features import Normaliser, compute, return_sign
from .graph import StepGraph
from .guard import Guard, GuardStop
from .replay import PrioritizedReplay
from .splits import chronological

#: Learner updates between updates of the moving average of the weights (eval.average_halflife).
AVERAGE_EVERY = 10


@dataclass
class Prepared:
    """Bars, normalised causal features and the chronological splits of a run."""

    bars: object
    x: np.ndarray  # float32 [T, F], normalised with train-split statistics
    names: tuple
    sign: np.ndarray  # bool [F], the columns the mirror negates
    splits: object
    normaliser: Normaliser
    periods_per_year: float


def prepare_data(cfg: Config, bars=None, normaliser: Normaliser | None = None, splits=None) -> Prepared:
    """Load (or take) the bars, compute causal features, split (or take ``splits``, e.g. a walk-forward
    fold), and fit the normaliser on train (or use ``normaliser``, a trained model's, when evaluating
    on other data)."""
    bars = bars if bars is not None else load_bars(cfg.data.source, min_bars=cfg.env.episode_len + 3)
    feats = compute(bars, cfg.features)
    if splits is None:
        splits = chronological(len(bars), cfg.data.train_frac, cfg.data.val_frac, warmup=feats.warmup)
    sign = return_sign(feats.names, cfg.features)
    if normaliser is not None and tuple(normaliser.names) != tuple(feats.names):
        raise ValueError(
            f"the model was trained on features {list(normaliser.names)}; these bars give {list(feats.names)}"
        )
    norm = normaliser or Normaliser.fit(feats, splits.train, center=~sign)
    ppy = cfg.data.periods_per_year or bars.infer_periods_per_year()[0]
    return Prepared(bars, norm.transform(feats.values), feats.names, sign, splits, norm, float(ppy))


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
        run_dir: where outputs go (default ``<run.out_dir>/<name>-<time>-<seed>``); ``False`` for none.
        bars: optional already-loaded :class:`cudarl.data.Bars` (tests, the learning checks).
        normaliser: a trained model's feature normaliser (evaluation on other bars).
        splits: train / val / test :class:`cudarl.splits.Splits` (default: chronological from ``data``).
        echo: a function printing one line (progress when not on a TTY, guard events, evaluations).
    """

    def __init__(self, cfg: Config, *, run_dir=None, bars=None, normaliser=None, splits=None, echo=print):
        self.cfg, self.echo = cfg, echo
        self.be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy"}[cfg.run.device])
        xp = self.xp = self.be.xp
        self.data = prepare_data(cfg, bars, normaliser, splits)
        tr = self.data.splits.train
        b = self.data.bars
        # environments over the training split (their reward may carry the turnover penalty, evaluation never)
        train_env = cfg.env
        if cfg.agent.train_cost_bps:
            train_env = replace(cfg.env, slippage_bps=cfg.env.slippage_bps + cfg.agent.train_cost_bps)
        self.env = TradingEnv(
            b.open,
            b.close,
            self.data.x,
            self.data.sign,
            train_env,
            t_begin=tr.start,
            t_end=tr.stop,
            backend=self.be.name,
        )
        rows = self.env.rows_per_step * self.env.n_envs
        self.transitions = self.env.make_transitions()
        self.discount = xp.zeros(rows, np.float32)
        # replay: every row group of a step is one interleaved "env" column of the ring
        self.replay = PrioritizedReplay(
            cfg.replay.capacity,
            self.env.obs_dim,
            n_step=cfg.replay.n_step,
            n_envs=rows,
            alpha=cfg.replay.alpha,
            eps=cfg.replay.eps,
            beta0=cfg.replay.beta0,
            beta_final=cfg.replay.beta_final,
            beta_steps=cfg.replay.beta_steps,
            seed=cfg.run.seed,
            backend=self.be.name,
            store_next_obs=cfg.env.counterfactual,
        )
        self.agent = Agent(cfg, self.env.obs_dim, self.env.n_actions, self.env.n_envs, xp)
        if self.replay.row_width != self.env.obs_dim:
            raise ValueError("padded replay rows are not supported by the trainer (the network reads obs_dim columns)")
        self.batch = self.agent.batch
        self.replay.reserve(cfg.agent.batch_size)
        stream = None
        if self.be.is_gpu:
            import cupy

            stream = cupy.cuda.Stream(non_blocking=True)
        self.collect_graph = StepGraph(
            "collect",
            self.agent.collect_phases(self.env, self.replay, self.transitions, self.discount),
            stream=stream,
            xp=xp,
        )
        self.train_graph = StepGraph("train", self.agent.train_phases(self.replay), stream=stream, xp=xp)
        self.stream = self.train_graph.stream
        self.best = None  # {"step", "sharpe"} of the best validation evaluation (run.keep_best)
        g = cfg.guard
        self.guard = Guard(g.action, g.window, g.spike_factor, g.max_rollbacks)
        self.step = 0  # learner updates done
        self.collect_steps = 0
        self.rows_per_collect = rows
        self.events: list[dict] = []
        self.losses: list[float] = []  # loss of every update, in order (tests, bitwise comparisons)
        self._snapshot = None
        self._eval_envs: dict = {}
        self.last_eval: dict | None = None
        self.last_evaluation = None
        self.history: list[dict] = []  # every evaluation row, in order (the validation Sharpe over training)
        # eval.average_halflife: the moving average of the online weights that evaluation deploys
        self.average = xp.array(self.agent.online.params) if cfg.eval.average_halflife else None
        self._val_psr: tuple | None = None  # (step, validation PSR) for the deployment gate
        self.run_dir = None
        if run_dir is not False:
            self.run_dir = (
                Path(run_dir)
                if run_dir
                else Path(cfg.run.out_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{cfg.run.seed}"
            )
            self._init_run_dir()

    # --- run directory ---------------------------------------------------------------------------
    def _init_run_dir(self) -> None:
        d = self.run_dir
        (d / "checkpoints").mkdir(parents=True, exist_ok=True)
        (d / "eval").mkdir(exist_ok=True)
        (d / "config.toml").write_text(self.cfg.to_toml())
        env = {
            "versions": versions(),
            "backend": self.be.name,
            "device": self.be.device,
            "compute_capability": self.be.compute_capability,
            "git_commit": _git_commit(),
            "argv": sys.argv,
            "platform": platform.platform(),
        }
        (d / "env.json").write_text(json.dumps(env, indent=1))
        rep = data_report(self.data.bars)
        rep["splits"] = self.data.splits.as_dict()
        rep["features"] = list(self.data.names)
        rep["normaliser_fitted_on"] = list(self.data.normaliser.fitted_on)
        rep["periods_per_year"] = self.data.periods_per_year
        (d / "data_report.json").write_text(json.dumps(rep, indent=1, default=str))

    def _log_row(self, row: dict) -> None:
        if self.run_dir is None:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(json_safe(row), allow_nan=False) + "\n")  # strict JSON: null, not NaN

    def _write_csv(self) -> None:
        if self.run_dir is None or not (self.run_dir / "metrics.jsonl").exists():
            return
        rows = [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "loss" in r]
        if not rows:
            return
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(self.run_dir / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)

    # --- the loop ----------------------------------------------------------------------------------
    def _ready_rows(self) -> int:
        lag = 0 if self.cfg.env.counterfactual else self.cfg.replay.n_step * self.rows_per_collect
        return max(0, min(self.collect_steps * self.rows_per_collect, self.cfg.replay.capacity) - lag)

    def _capture(self) -> None:
        for g in (self.collect_graph, self.train_graph):
            if not g.captured:
                g.capture()

    def _read(self, step: int) -> tuple[float, float]:
        v = self.agent.readback.read(step % PUBLISH_SLOTS)
        return float(v[0]), float(v[1])

    def prime(self) -> None:
        """Capture both graphs and collect until the replay holds enough rows to learn from
        (``max(agent.learning_starts, agent.batch_size)``); :meth:`run` starts with this."""
        a = self.cfg.agent
        need = max(a.learning_starts, a.batch_size)
        self._capture()
        while self._ready_rows() < need:
            self.collect_graph.replay()
            self.collect_steps += 1

    def advance(self, collect_steps: int) -> None:
        """Launch ``collect_steps`` collection steps, each followed by ``agent.updates_per_collect``
        learner updates, back to back on the stream (call :meth:`prime` first).

        Only graph replays: no loss readback, guard, logging, evaluation or checkpoint (for
        benchmarks; :meth:`run` is the training loop). Returns without synchronising.
        """
        k = self.cfg.agent.updates_per_collect
        for _ in range(int(collect_steps)):
            self.collect_graph.replay()
            self.collect_steps += 1
            for _ in range(k):
                self.train_graph.replay()
                self.step += 1

    def run(self, steps: int | None = None, progress=None) -> dict:
        """Train until ``steps`` learner updates in total (default ``run.steps``); returns the last evaluation."""
        cfg, target = self.cfg, int(steps if steps is not None else self.cfg.run.steps)
        a = cfg.agent
        self.prime()
        t0, last_t, last_step = time.perf_counter(), time.perf_counter(), self.step
        pending = None  # the update whose loss has not been read yet
        while self.step < target:
            # collect
            if self.step % a.updates_per_collect == 0:
                self.collect_graph.replay()
                self.collect_steps += 1
            # learn
            self.train_graph.replay()
            self.step += 1
            self.agent.readback.mark_written(self.stream, slot=self.step % PUBLISH_SLOTS)
            if pending is not None and self._check(pending):
                pending = None
                continue  # rolled back
            pending = self.step
            if not self.be.is_gpu:  # no graph in flight: read now
                if self._check(pending):
                    pending = None
                    continue
                pending = None
            if self.average is not None and self.step % AVERAGE_EVERY == 0:
                self._update_average()
            # log
            if self.step % cfg.run.log_every == 0:
                now = time.perf_counter()
                sps = (self.step - last_step) / max(now - last_t, 1e-9)
                last_t, last_step = now, self.step
                self._log_step(sps, progress)
            # evaluate and checkpoint
            if cfg.run.eval_every and self.step % cfg.run.eval_every == 0:
                self._settle(pending)
                pending = None
                self.evaluate("val")
                self._save_evaluated()
            if cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0:
                self._settle(pending)
                pending = None
                self.save(numbered=True)
            if self.step % cfg.guard.snapshot_every == 0:
                self._settle(pending)
                pending = None
                self._snapshot = (self.step, self.agent.state_dict())
        self._settle(pending)
        evaluated = (
            self.last_eval is not None
            and self.last_eval.get("step") == self.step
            and self.last_eval.get("split") == "val"
            and self.last_evaluation is not None
        )
        result = self.last_evaluation.summary if evaluated else self.evaluate("val")
        if not evaluated:
            self._save_evaluated()
        self._write_csv()
        if progress is not None and getattr(self, "_last_row", None) is not None:
            progress(self.step, self._last_row, self.last_eval)  # show the final validation Sharpe
        best = (
            f"; best validation Sharpe {_fmt(self.best['sharpe'])} at update {self.best['step']} (checkpoints/best.npz)"
            if self.best is not None and self.run_dir is not None
            else ""
        )
        self.echo(f"done: {self.step} updates in {time.perf_counter() - t0:.1f} s; run directory {self.run_dir}{best}")
        return result

    def _update_average(self) -> None:
        """``average += (1 - 2^(-AVERAGE_EVERY / halflife)) (online - average)``, on the training stream."""
        rate = 1.0 - 0.5 ** (AVERAGE_EVERY / self.cfg.eval.average_halflife)
        with self.stream if self.stream is not None else _Null():
            self.average += np.float32(rate) * (self.agent.online.params - self.average)

    @contextmanager
    def _weights(self, averaged: bool):
        """The online network holds the moving average of its weights inside this block (when there is one
        and ``averaged``), its own weights again after it."""
        if self.average is None or not averaged:
            yield
            return
        params = self.agent.online.params
        with self.stream if self.stream is not None else _Null():  # ordered with the graphs' work
            own = params.copy()
            params[...] = self.average
        try:
            yield
        finally:
            with self.stream if self.stream is not None else _Null():
                params[...] = own
            self.synchronize()

    def _save_evaluated(self) -> None:
        """After a validation evaluation: write ``latest``, and if its Sharpe is the best so far
        (``run.keep_best``), make ``best.npz`` the same file (a link, not a second serialisation)."""
        sharpe = (self.last_eval or {}).get("sharpe")
        improved = (
            self.cfg.run.keep_best
            and sharpe is not None
            and math.isfinite(sharpe)
            and (self.best is None or sharpe > self.best["sharpe"])
        )
        if improved:  # before the save, so the checkpoint carries its own best record
            self.best = {"step": self.step, "sharpe": float(sharpe)}
        latest = self.save()
        if improved and latest is not None:
            atomic_link(latest, latest.with_name("best.npz"))
            self._log_row({"event": "best", "split": "val", **self.best})

    def _settle(self, pending) -> None:
        if pending is not None:
            self._check(pending)

    def _check(self, step: int) -> bool:
        """Read update ``step``'s loss and grad norm, record them, run the guard. True if rolled back."""
        loss, gn = self._read(step)
        self.losses.append(loss)
        self._last = (loss, gn)
        try:
            ev = self.guard.check(step, loss, gn)
        except GuardStop as exc:
            self._event({"event": "guard", "step": step, "action": "stop", "message": str(exc)})
            self.save(name="guard-stop")
            raise
        if ev is None:
            return False
        self._event({**ev.as_dict(), "message": ev.message()})
        self._rollback(ev)
        return True

    def _event(self, row: dict) -> None:
        self.events.append(row)
        self._log_row(row)
        self.echo(row.get("message", json.dumps(row)))

    def _rollback(self, ev) -> None:
        """Restore the last good snapshot (or the initial weights) and lower the learning rate."""
        if self._snapshot is None:
            raise GuardStop(ev.message() + " (no snapshot to roll back to yet)")
        step, state = self._snapshot
        self.synchronize()
        self.agent.load_state_dict(state)
        sch = self.agent.adam.schedule
        f = self.cfg.guard.lr_factor
        self.agent.adam.schedule = replace(sch, lr=sch.lr * f, lr_min=sch.lr_min * f)
        self.train_graph.capture()  # the schedule's constants are kernel arguments
        self._event(
            {
                "event": "rollback",
                "step": self.step,
                "restored": step,
                "lr": sch.lr * f,
                "message": f"guard: rolled back to the snapshot of update {step}; learning rate now {sch.lr * f:.3g}",
            }
        )

    def _log_step(self, sps: float, progress) -> None:
        loss, gn = getattr(self, "_last", (float("nan"), float("nan")))
        row = {
            "step": self.step,
            "collect_steps": self.collect_steps,
            "loss": loss,
            "grad_norm": gn,
            "updates_per_s": sps,
            "env_steps": self.collect_steps * self.env.n_envs,
        }
        self._log_row(row)
        self._last_row = row
        if progress is not None:
            progress(self.step, row, self.last_eval)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    # --- evaluation ----------------------------------------------------------------------------------
    def _eval_env(self, split) -> TradingEnv:
        key = (split.start, split.stop)
        if key not in self._eval_envs:
            n = split.stop - split.start - 2
            cfg = replace(self.cfg.env, n_envs=1, episode_len=n, stagger=False, counterfactual=False, mirror=False)
            b = self.data.bars
            self._eval_envs[key] = TradingEnv(
                b.open,
                b.close,
                self.data.x,
                self.data.sign,
                cfg,
                t_begin=split.start,
                t_end=split.stop,
                backend=self.be.name,
            )
        return self._eval_envs[key]

    def greedy_positions(self, split, margin: float | None = None, averaged: bool = True) -> np.ndarray:
        """The online network's greedy positions at the decision bars of ``split`` (float64 ``[len - 2]``).

        ``margin`` (default ``eval.margin``): the held position is kept unless another action's expected
        value exceeds its own by more than this (the env's argmax then sees the held action's value
        raised by ``margin``; ties go to the lowest action, as the env's act does). ``averaged``: with
        ``eval.average_halflife``, the moving average of the weights acts (False: the last weights)."""
        env = self._eval_env(split)
        xp = self.xp
        margin = self.cfg.eval.margin if margin is None else float(margin)
        self.synchronize()
        levels = self.cfg.env.position_levels().astype(np.float64)
        with self._weights(averaged), self.stream if self.stream is not None else _Null():
            env.reset()
            q = xp.zeros((1, env.n_actions), np.float32)
            eps = xp.zeros(1, np.float32)
            acts = np.empty(env.config.episode_len, np.int64)
            held = int(np.argmin(np.abs(levels)))  # flat after the reset
            for k in range(env.config.episode_len):
                self.agent.q_values(env.obs, q)
                if margin > 0:
                    q[0, held] += np.float32(margin)
                env.act(q, eps)
                env.step()
                acts[k] = held = int(_backend.to_numpy(env.actions)[0])
        return levels[acts]

    def validation_psr(self) -> float:
        """The probabilistic Sharpe ratio (against 0) of the validation split at the current weights."""
        if self._val_psr is None or self._val_psr[0] != self.step:
            ev = self._evaluation("val", gate=False)
            self._val_psr = (self.step, ev.summary["statistics"]["psr"])
        return self._val_psr[1]

    def deployment(self, split_name: str) -> dict:
        """Whether the policy trades on ``split_name``: always on the validation split (its evidence is what
        the gate reads) and with ``eval.gate_psr = 0``; otherwise only when :meth:`validation_psr` is at
        least ``eval.gate_psr`` (an undefined PSR, e.g. a flat validation policy, keeps the gate closed)."""
        g = self.cfg.eval.gate_psr
        if g == 0 or split_name == "val":
            return {"gate": "off" if g == 0 else "not applied to the validation split", "trading": True}
        psr = self.validation_psr()
        ok = psr is not None and math.isfinite(psr) and psr >= g
        return {"gate": "open" if ok else "closed", "trading": bool(ok), "validation_psr": psr, "threshold": g}

    def _evaluation(self, split_name: str, gate: bool = True, margin: float | None = None, averaged: bool = True):
        """:func:`cudarl.evaluate.evaluate_positions` of the deployed positions on a split (``gate`` False:
        the trained policy's own, whatever the gate says; ``margin``, ``averaged``: see
        :meth:`greedy_positions`)."""
        split = getattr(self.data.splits, split_name)
        pos = self.greedy_positions(split, margin, averaged)
        dep = self.deployment(split_name) if gate else {"gate": "not applied", "trading": True}
        if not dep["trading"]:
            pos = np.zeros_like(pos)
        e, ev_cfg = self.cfg.env, self.cfg.eval
        ev = evaluate_positions(
            self.data.bars,
            pos,
            split,
            cost_bps=e.cost_bps,
            slippage_bps=e.slippage_bps,
            periods_per_year=self.data.periods_per_year,
            fill=e.fill,
            trials=ev_cfg.trials,
            level=ev_cfg.level,
            resamples=ev_cfg.resamples,
        )
        ev.summary["step"] = self.step
        ev.summary["deployment"] = {
            **dep,
            "margin": self.cfg.eval.margin if margin is None else float(margin),
            "weights": "moving average" if self.average is not None and averaged else "last",
        }
        if split_name == "val" and dep["trading"]:
            self._val_psr = (self.step, ev.summary["statistics"]["psr"])
        return ev

    def evaluate(self, split_name: str = "val", write: bool = True) -> dict:
        """Greedy evaluation over a split with the env's fill and costs, and the deployment rules of
        ``eval`` (gate, margin); writes ``eval/<split>-<step>/``."""
        ev = self._evaluation(split_name)
        self.last_evaluation = ev
        if write and self.run_dir is not None:
            write_outputs(ev, self.run_dir / "eval" / f"{split_name}-{self.step:08d}", plot=True)
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
        gate = (
            ""
            if row["trading"]
            else f"; flat: validation PSR {_fmt(ev.summary['deployment']['validation_psr'])} < gate"
        )
        self.echo(
            f"eval {split_name} @ {self.step}: Sharpe {_fmt(row['sharpe'])} "
            f"({100 * self.cfg.eval.level:.0f}% interval {_fmt(lo)} to {_fmt(hi)}, PSR {_fmt(row['psr'])}; "
            f"buy-and-hold {_fmt(row['buy_and_hold_sharpe'])}), "
            f"total return {_fmt(row['total_return'])}, max drawdown {_fmt(row['max_drawdown'])}{gate}"
        )
        return ev.summary

    # --- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        self.synchronize()
        return {
            "agent": self.agent.state_dict(),
            "replay": self.replay.state_dict(),
            "env": self.env.state_dict(),
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
        self.synchronize()
        self.agent.load_state_dict(s["agent"])
        self.replay.load_state_dict(s["replay"])
        self.env.load_state_dict(s["env"])
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

    def save(self, numbered: bool = False, name: str = "latest") -> Path | None:
        """Write ``checkpoints/latest.npz`` (or ``step-<N>.npz``) atomically."""
        if self.run_dir is None:
            return None
        path = self.run_dir / "checkpoints" / (f"step-{self.step:08d}.npz" if numbered else f"{name}.npz")
        info = {"config": self.cfg.to_dict(), "versions": versions(), "step": self.step, "backend": self.be.name}
        return ckpt.save(path, self.state_dict(), info)

    @classmethod
    def resume(cls, path, *, run_dir=None, overrides: dict | None = None, echo=print) -> Trainer:
        """A trainer in the state of checkpoint ``path`` (its config, with ``overrides`` applied)."""
        state, info = ckpt.load(path)
        cfg = from_dict(info["config"])
        if overrides:
            cfg = from_dict(overrides, base=cfg)
        t = cls(cfg, run_dir=run_dir if run_dir is not None else Path(path).resolve().parents[1], echo=echo)
        t.load_state_dict(state)
        t.echo(f"resumed from {path} at update {t.step}")
        return t


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _fmt(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.3g}"
