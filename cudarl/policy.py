"""Trained policies: the files ``best`` and ``step-N`` of a run, and :func:`load_policy`.

A policy file is a safetensors file (:mod:`cudarl.tensorfile`: no pickle, memory-mapped) with

* tensors ``online/<layer>`` (float32, one per parameter of the Q-network, e.g.
  ``online/enc.0.w [in, out]``), ``normaliser/mean`` and ``normaliser/std`` (float64 ``[F]``),
  for IQN ``iqn/tau_counter`` (int64 ``[1]``, the Philox counter of the acting taus), and with
  ``net.spectral`` ``spectral/<layer>/u`` and ``/v`` (float32, the power iteration's vectors, so the
  policy's ``W / sigma`` is the trainer's bit for bit);
* ``__metadata__``: ``format`` (``cudarl-policy``), ``version``, ``config`` (the run's resolved
  configuration, JSON; its ``agent.act_by`` is the risk measure the policy acts by, as in
  training), ``normaliser`` (feature names, clip, fitted rows), ``step``, ``best``
  (the best validation Sharpe so far and its update), ``data`` (a fingerprint of the training
  bars: source, count, first and last time, SHA-256 of the closes), ``validation`` (the validation
  split's probabilistic Sharpe ratio of these weights, ``{"step", "psr"}``, what ``eval.gate_psr``
  reads, when the trainer had it at the save: ``evaluate`` then need not walk the validation split)
  and ``versions``.

No replay buffer, optimiser state or target network: those live only in the resume checkpoint
``latest.npz``. :func:`load_policy` reads either kind of file.

    policy = cudarl.load_policy("runs/x/checkpoints/best.safetensors")
    q = policy.q_values(obs)          # obs float32 [n, F + 2] (normalised features, position, hold);
                                      # the expected Q, or the risk measure of the config's agent.act_by
    a = policy.act(obs)               # int32 [n], the greedy action (the first maximum)
    ev = policy.evaluate(split="test")  # the trainer's greedy evaluation, Evaluation
"""

from __future__ import annotations

import hashlib
import json
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from . import __version__, tensorfile
from . import backend as _backend
from ._driver import DEVICE_BACKENDS
from .checkpoint import CheckpointError
from .config import Config, from_dict
from .features import Normaliser
from .graph import follow_caller

FORMAT = "cudarl-policy"
#: ``device`` of :func:`load_policy` -> the backend it asks for
VERSION = 1
SUFFIX = ".safetensors"


def data_fingerprint(bars) -> dict:
    """Which bars a policy was trained on: source, count, first and last time, SHA-256 of the closes."""
    from .data.bars import iso

    close = np.ascontiguousarray(bars.close, dtype="<f8")
    return {
        "source": str(bars.source),
        "bars": len(bars),
        "first": iso(bars.time[0]) if len(bars) else None,
        "last": iso(bars.time[-1]) if len(bars) else None,
        "close_sha256": hashlib.sha256(close.tobytes()).hexdigest(),
    }


@dataclass
class PolicyState:
    """What a policy file holds, on the host: ``weights`` maps layer names to float32 arrays."""

    config: Config
    weights: dict
    normaliser: Normaliser
    step: int
    tau_counter: int | None = None
    spectral: dict | None = None  # net.spectral: {layer: {"u": ..., "v": ...}}
    best: dict | None = None
    data: dict | None = None
    versions: dict | None = None
    weights_kind: str = "last"  # "moving average" when eval.average_halflife made the deployed weights
    validation: dict | None = None  # {"step", "psr"}: the validation PSR of these weights (the gate's input)

    @classmethod
    def of_trainer(cls, trainer, best=None) -> PolicyState:
        """The deployed network of a :class:`cudarl.trainer.Trainer` now (synchronises): the online one,
        or the moving average of its weights with ``eval.average_halflife``."""
        trainer.synchronize()
        agent = trainer.agent.state_dict()
        from .trainer import versions

        online = agent["online"]
        if getattr(trainer, "average", None) is not None:
            online = {**online, "params": _backend.to_numpy(trainer.average).copy()}
        # the gate's evidence when the trainer has it for these weights (after a validation evaluation,
        # as for ``best``); otherwise evaluate recomputes it. Walking the split here would slow training
        val = getattr(trainer, "_val_psr", None)
        validation = {"step": int(val[0]), "psr": float(val[1])} if val and val[0] == trainer.step else None
        return cls(
            config=trainer.cfg,
            weights=_split_params(online),
            normaliser=trainer.data.normaliser,
            step=int(trainer.step),
            tau_counter=_tau(agent),
            spectral=agent["online"].get("spectral") or None,
            best=best if best is not None else trainer.best,
            data=data_fingerprint(trainer.data.bars),
            versions=versions(),
            weights_kind="last" if online is agent["online"] else "moving average",
            validation=validation,
        )

    @classmethod
    def of_checkpoint(cls, path, weights: str = "deployed") -> PolicyState:
        """The policy inside a resume checkpoint (``latest.npz``); its replay buffer is not read.

        ``weights`` (:data:`WEIGHTS`): ``deployed``, what the run deploys (the moving average of the weights
        with ``eval.average_halflife``, else the last weights); ``last``, the online network's own weights;
        ``average``, the moving average (a run without one is refused). The checkpoint holds both, so one
        run compares them on the same training."""
        from . import checkpoint as ckpt

        _check_weights(weights)
        state, info = ckpt.load(path, only=("agent/online/", "agent/iqn/", "normaliser/", "trainer/", "average/"))
        t = state["trainer"]
        online = state["agent"]["online"]
        if weights == "average" and "average" not in state:
            raise CheckpointError(
                f"{path}: this run kept no moving average of its weights (eval.average_halflife = 0); "
                "take weights 'last' or 'deployed'"
            )
        averaged = "average" in state and weights != "last"
        if averaged:  # eval.average_halflife: the moving average is what is deployed
            online = {**online, "params": state["average"]["params"]}
        best_step = int(t.get("best_step", -1))
        return cls(
            config=from_dict(info["config"]),
            weights=_split_params(online),
            normaliser=Normaliser.from_state_dict(state["normaliser"]),
            step=int(info.get("step", t["step"])),
            weights_kind="moving average" if averaged else "last",
            tau_counter=_tau(state["agent"]),
            spectral=state["agent"]["online"].get("spectral") or None,
            best=None if best_step < 0 else {"step": best_step, "sharpe": float(t["best_sharpe"])},
            data=info.get("data"),
            versions=info.get("versions"),
        )

    def save(self, path) -> Path:
        """Write this policy as a safetensors file, atomically."""
        n = self.normaliser
        tensors = {f"online/{k}": np.asarray(v, np.float32) for k, v in self.weights.items()}
        tensors["normaliser/mean"] = np.asarray(n.mean, np.float64)
        tensors["normaliser/std"] = np.asarray(n.std, np.float64)
        if self.tau_counter is not None:
            tensors["iqn/tau_counter"] = np.array([self.tau_counter], np.int64)
        for layer, vecs in (self.spectral or {}).items():
            for k in ("u", "v"):
                tensors[f"spectral/{layer}/{k}"] = np.asarray(vecs[k], np.float32)
        meta = {
            "format": FORMAT,
            "version": str(VERSION),
            "config": json.dumps(self.config.to_dict()),
            "normaliser": json.dumps({"names": list(n.names), "clip": n.clip, "fitted_on": list(n.fitted_on)}),
            "step": str(self.step),
            "best": json.dumps(self.best),
            "data": json.dumps(self.data),
            "versions": json.dumps(self.versions or {"cudarl": __version__}),
            "weights": self.weights_kind,
            "validation": json.dumps(self.validation),
        }
        return tensorfile.save(path, tensors, meta)

    @classmethod
    def read(cls, path) -> PolicyState:
        """Read a policy file written by :meth:`save` (memory-mapped)."""
        try:
            tensors, meta = tensorfile.load(path)
        except tensorfile.TensorFileError as exc:
            raise CheckpointError(str(exc)) from None
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a cudarl policy file (format {meta.get('format')!r})")
        if int(meta.get("version", "-1")) > VERSION:
            raise CheckpointError(f"{path}: policy version {meta['version']} is newer than this cudarl ({VERSION})")
        try:
            nm = json.loads(meta["normaliser"])
            norm = Normaliser(
                mean=np.asarray(tensors["normaliser/mean"], np.float64),
                std=np.asarray(tensors["normaliser/std"], np.float64),
                names=tuple(nm["names"]),
                clip=float(nm["clip"]),
                fitted_on=tuple(nm["fitted_on"]),
            )
            tau = tensors.get("iqn/tau_counter")
            spectral: dict = {}
            for k, v in tensors.items():
                if k.startswith("spectral/"):
                    _, layer, which = k.split("/")
                    spectral.setdefault(layer, {})[which] = v
            return cls(
                config=from_dict(json.loads(meta["config"])),
                weights={k[len("online/") :]: v for k, v in tensors.items() if k.startswith("online/")},
                normaliser=norm,
                step=int(meta["step"]),
                tau_counter=None if tau is None else int(tau[0]),
                spectral=spectral or None,
                best=json.loads(meta.get("best", "null")),
                data=json.loads(meta.get("data", "null")),
                versions=json.loads(meta.get("versions", "null")),
                weights_kind=meta.get("weights", "last"),
                validation=json.loads(meta.get("validation", "null")),
            )
        except KeyError as exc:
            raise CheckpointError(f"{path}: the policy file has no {exc.args[0]!r}") from None

    def check_finite(self, source) -> None:
        """Refuse weights or normaliser statistics that are NaN or infinite, naming the tensor."""
        named = {f"online/{k}": v for k, v in self.weights.items()}
        named.update({"normaliser/mean": self.normaliser.mean, "normaliser/std": self.normaliser.std})
        for name, a in named.items():
            bad = ~np.isfinite(np.asarray(a))
            if bad.any():
                first = [int(i) for i in np.argwhere(bad)[0]]
                raise CheckpointError(
                    f"{source}: tensor {name!r} has {int(bad.sum())} value(s) that are not finite (NaN or inf), "
                    f"the first at {first}; this policy cannot be used (train again, or take an earlier checkpoint)"
                )


def _split_params(online: dict) -> dict:
    """``{layer name: array}`` from a network state ``{"params": flat, "layout": [(name, offset, shape)]}``."""
    flat = np.asarray(online["params"])
    out = {}
    for name, off, shape in online["layout"]:
        size = int(np.prod(shape))
        out[name] = flat[int(off) : int(off) + size].reshape([int(s) for s in shape])
    return out


def _tau(agent_state: dict) -> int | None:
    iqn = agent_state.get("iqn")
    return None if not iqn else int(np.asarray(iqn["tau"]))


def read_policy_info(path) -> dict:
    """The metadata of a policy file (config, step, best, data, versions), decoded; reads no tensor."""
    try:
        _, meta, _ = tensorfile.read_header(path)
    except tensorfile.TensorFileError as exc:
        raise CheckpointError(str(exc)) from None
    out = dict(meta)
    for k in ("config", "normaliser", "best", "data", "versions", "validation"):
        if k in out:
            out[k] = json.loads(out[k])
    if "step" in out:
        out["step"] = int(out["step"])
    return out


def is_policy_file(path) -> bool:
    """Whether ``path`` is a safetensors file (as opposed to an ``.npz`` resume checkpoint)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and not head.startswith(b"PK") and head[8:9] == b"{"


def save_policy(path, trainer, best=None) -> Path:
    """Write the trainer's online network, normaliser, config and data fingerprint to ``path``."""
    return PolicyState.of_trainer(trainer, best).save(path)


#: Which weights :func:`load_policy` takes: what the run deploys, the last weights, or their moving average.
WEIGHTS = ("deployed", "last", "average")
_KIND = {"last": "last", "average": "moving average"}


def _check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise ValueError(f"weights takes {', '.join(WEIGHTS)}, got {weights!r}")


def load_policy(path, device: str = "auto", weights: str = "deployed") -> Policy:
    """A :class:`Policy` from a policy file (``best``/``step-N``) or a resume checkpoint (``latest.npz``).

    ``device``: ``auto`` (the GPU when usable), ``gpu`` or ``cpu``. ``weights`` (:data:`WEIGHTS`):
    ``deployed`` (the default), ``last`` or ``average`` (:meth:`PolicyState.of_checkpoint`); a policy
    file holds one set of weights, so it takes only ``deployed`` or the kind it holds. Refuses NaN or
    infinite weights, naming the tensor.
    """
    path = Path(path)
    _check_weights(weights)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such policy or checkpoint file")
    if is_policy_file(path):
        state = PolicyState.read(path)
        if weights != "deployed" and _KIND[weights] != state.weights_kind:
            raise CheckpointError(
                f"{path}: a policy file holds one set of weights (the {state.weights_kind} weights), not the "
                f"{_KIND[weights]} ones; the run's checkpoints/latest.npz holds both"
            )
    else:
        state = PolicyState.of_checkpoint(path, weights)
    state.check_finite(path)
    return Policy(state, device=device, source=str(path))


class Policy:
    """A trained Q-network with its feature normaliser: greedy actions and Q-values.

    Observations are float32 ``[n, window * (F + 2)]`` (``net.window`` bars, oldest first): the
    normalised features of each bar (:meth:`features`), then on the newest bar the position held
    (``-1 .. 1``) and the hold fraction, zeros on the others, as :class:`cudarl.TradingEnv` gathers
    them (with one bar: ``[features, position, hold]``). Q-values are the expected values of the head's
    distribution (in PopArt's normalised units when ``agent.popart``), float32 ``[n, A]``.
    Inputs may be NumPy or CuPy arrays; outputs are of the same kind as the input.
    """

    def __init__(self, state: PolicyState, device: str = "auto", source: str = "<memory>"):
        from .auxiliary import AUX_SIGNALS, input_gate
        from .nn.network import param_layout
        from .reference.window import width

        self.state, self.source = state, source
        cfg = self.config = state.config
        self.normaliser, self.step = state.normaliser, state.step
        self._request = DEVICE_BACKENDS[device]
        self.obs_dim = width(len(self.normaliser.names), cfg.net.window)
        self.n_actions = cfg.env.n_actions
        self.levels = cfg.env.position_levels().astype(np.float64)
        aux = [AUX_SIGNALS[name](cfg) for name in cfg.agent.aux]  # their heads are in the weights too
        #: QNetwork's arguments besides the backend: the selectivity gate is in the weights and in every forward
        self._net_args = {"extra_heads": {s.name: s.make_head for s in aux}, "input_gate": input_gate(aux)}
        layout = param_layout(self.obs_dim, self.n_actions, cfg.net, **self._net_args)
        mine = {e.name: e.shape for e in layout.entries}
        theirs = {k: tuple(v.shape) for k, v in state.weights.items()}
        if mine != theirs:
            raise CheckpointError(f"{source}: the weights {theirs} do not fit the network of its config {mine}")
        if set(state.spectral or {}) != set(cfg.net.spectral):
            raise CheckpointError(
                f"{source}: spectral vectors for {sorted(state.spectral or {})}, config {list(cfg.net.spectral)}"
            )
        self._on_device = None  # the network and its workspaces, made by _device() at the first forward
        # On a backend not yet started, CuPy's import, the device's start and this policy's network and
        # walk plans on it are made in a background thread while the caller works on the host (reading
        # the bars, their features: evaluate), and the first use of the device waits for them; the
        # walk's GEMM plans and their kernels' first run are made in the driver's thread, without CuPy.
        # None first: the thread may ask _device() before warm_up returns and this line assigns it
        self._warm_up = None
        self._warm_up = _backend.warm_up(self._request, then=lambda be: self._q_rows(), on_context=self._warm_plans)

    def _warm_plans(self) -> None:
        """The cuBLASLt plans of the GPU walk's forward (:class:`PaddedQ`, :data:`EVAL_ROWS` rows), made
        and run once through the driver (:func:`cudarl.blas.warm_plans`)."""
        from . import blas
        from .nn.network import forward_plan_keys

        cfg = self.config
        blas.warm_plans(forward_plan_keys(self.obs_dim, self.n_actions, cfg.net, EVAL_ROWS, **self._net_args))

    @property
    def be(self) -> _backend.Backend:
        """The backend this policy runs on (waits for the device's start, if it is still going)."""
        return _backend.get(self._request)

    @property
    def xp(self):
        """The array module of :attr:`be`."""
        return self.be.xp

    @property
    def net(self):
        """The :class:`cudarl.nn.QNetwork` with the policy's weights (made on the device at its first use)."""
        return self._device().net

    def _device(self) -> _OnDevice:
        t = self._warm_up
        if t is not None and t is not threading.current_thread():  # (the warm-up itself makes it)
            t.join()  # it may be making the device side now: it is made once
            self._warm_up = None
        if self._on_device is None:
            self._on_device = _OnDevice(self, self.be)
        return self._on_device

    def __repr__(self) -> str:
        n = self.config.net
        return (
            f"Policy({n.head}, hidden={list(n.hidden)}, obs_dim={self.obs_dim}, actions={self.n_actions}, "
            f"act_by={self.config.agent.act_by}, "
            f"step={self.step}, backend={self.be.name}, from {self.source})"
        )

    # --- Q-values and actions ---------------------------------------------------------------------
    def q_values_into(self, obs, out) -> None:
        """Expected Q of ``obs`` (float32 ``[n, obs_dim]`` of this backend) into ``out`` ``[n, A]``: through
        the block Q of the evaluation walk where the network has one (:func:`row_exact_q`), so each row
        is bit for bit the Q that :meth:`evaluate` acts on, whatever the batch."""
        d = self._device()
        block = d.block_q()
        if block is not None:
            block.into(obs, out)
        else:
            d.values(out, obs, d.workspace(obs.shape[0]))

    def plan_scale_into(self, obs, out) -> None:
        """The plan head's gate (``out [n]``, ``net.plan``) of the forward :meth:`q_values_into` just ran on ``obs``."""
        from .plan import gate

        d = self._device()
        gate(d.net, d.workspace(obs.shape[0]), obs.shape[0], out)

    def _q_rows(self):
        """:func:`row_exact_q` of this policy's network, made at the first walk (on the GPU it has a
        workspace of its own)."""
        return self._device().block_q()  # _device() first waits for a warm-up that may be making them

    def _input(self, obs):
        on_gpu = type(obs).__module__.startswith("cupy")
        x = obs if (on_gpu and self.be.is_gpu) else self.xp.asarray(_backend.to_numpy(obs))
        if x.ndim != 2 or x.shape[1] != self.obs_dim:
            raise ValueError(
                f"obs: expected [n, {self.obs_dim}] ({self.config.net.window} bars of features, position, hold), "
                f"got {list(x.shape)}"
            )
        return self.xp.ascontiguousarray(x, dtype=np.float32), on_gpu

    def q_values(self, obs):
        """float32 ``[n, A]``: expected Q of each action for ``obs`` ``[n, obs_dim]`` (with the config's
        ``agent.act_by`` its risk measure: CVaR or mean - lambda std, what the policy acts on)."""
        x, on_gpu = self._input(obs)
        out = self.xp.empty((x.shape[0], self.n_actions), np.float32)
        self.q_values_into(x, out)
        return out if on_gpu else _backend.to_numpy(out)

    def act(self, obs):
        """int32 ``[n]``: the greedy action (the first maximum of :meth:`q_values`)."""
        q = self.q_values(obs)
        return q.argmax(axis=1).astype(np.int32)

    # --- bars to decisions --------------------------------------------------------------------------
    def features(self, bars):
        """float32 ``[T, F]``: the normalised features of ``bars`` (the normaliser fitted in training)."""
        from .prepare import prepare_data

        return prepare_data(self.config, bars, self.normaliser).x

    def evaluate(self, data=None, split: str = "test", echo=None):
        """The trainer's greedy evaluation of this policy over ``split`` of ``data`` (bars, a path or
        ``builtin:<name>``; default: the training run's ``data.source`` with its data options), with the
        deployment rules of its config's ``eval`` (the validation gate, the margin): a
        :class:`cudarl.evaluate.Evaluation` whose summary carries ``step`` and ``deployment``. ``echo`` (a function of
        one line) hears when the default bars are no longer those the policy was trained on.

        The gate reads the validation PSR the policy file recorded (:meth:`validation_psr`) when
        ``data`` is the training run's bars (same closes); otherwise it evaluates the validation split
        of ``data`` now. ``deployment.validation_psr_from`` says which.

        With ``agent.aux = ["selectivity"]`` the summary lists ``features_used``, the gates of these weights
        largest first, as the trainer's evaluation does (:func:`cudarl.auxiliary.selectivity.features_used_of`);
        with ``agent.aux = ["causal"]``, ``causal_sensitivity_heldout``, each feature group's mean absolute
        change of Q over ``split`` under its intervention, as the trainer's evaluation does
        (:func:`cudarl.auxiliary.causal_heldout.split_sensitivity`; the training-time ``causal_sensitivity``
        is not in a policy file)."""
        from .auxiliary.causal_heldout import split_sensitivity
        from .auxiliary.selectivity import features_used_of
        from .prepare import prepare_data

        cfg = self.config
        if isinstance(data, (str, Path)):
            cfg = from_dict({"data": {"source": str(data)}}, base=cfg)
        prepared = prepare_data(cfg, None if isinstance(data, (str, Path)) else data, self.normaliser)
        trained = (self.state.data or {}).get("close_sha256")
        same_bars = trained == data_fingerprint(prepared.bars)["close_sha256"]
        if data is None and echo is not None and trained is not None and not same_bars:
            echo(f"warning: the bars of {cfg.data.source} differ from those the policy was trained on")
        stored = self.state.validation if data is None and same_bars else None

        def val_psr():
            if stored is not None:
                return stored["psr"]
            return self._evaluate_split(prepared, "val").summary["statistics"]["psr"]

        dep = deployment(cfg.eval, split, val_psr)
        ev = self._evaluate_split(prepared, split, trading=dep["trading"])
        ev.summary["step"] = self.step
        ev.summary["deployment"] = {**dep, "margin": cfg.eval.margin, "weights": self.state.weights_kind}
        if "validation_psr" in dep:
            ev.summary["deployment"]["validation_psr_from"] = "policy file" if stored is not None else "recomputed"
        used = features_used_of(self.state.weights, self.config, self.normaliser.names)
        if used:  # agent.aux = ["selectivity"]: its gates, as the trainer's evaluation lists them
            ev.summary["features_used"] = used
        if "causal" in cfg.agent.aux:  # each group's sensitivity over the split, as the trainer's evaluation
            sens = split_sensitivity(self.q_values_into, self.xp, self.n_actions, prepared, split, cfg)
            ev.summary["causal_sensitivity_heldout"] = sens
        return ev

    def validation_psr(self, recompute: bool = False) -> float:
        """The validation split's probabilistic Sharpe ratio of this policy on its training bars, what
        ``eval.gate_psr`` compares: the value the trainer recorded in the policy file at its save (the
        same weights, config and bars), or (``recompute``, or none recorded) the split walked and
        evaluated now."""
        if not recompute and self.state.validation is not None:
            return self.state.validation["psr"]
        from .prepare import prepare_data

        prepared = prepare_data(self.config, None, self.normaliser)
        return self._evaluate_split(prepared, "val").summary["statistics"]["psr"]

    def _evaluate_split(self, prepared, split: str, trading: bool = True):
        """:func:`evaluate_split` of this policy (its env, margin and statistics config) over ``split``."""
        cfg = self.config
        # the env first: the walk's network may still be in the making in the warm-up thread
        env = eval_env(prepared, getattr(prepared.splits, split), cfg.env, self.be.name) if trading else None
        return evaluate_split(
            prepared,
            split,
            cfg.env,
            self.q_values_into,
            self.be.name,
            env=env,
            margin=cfg.eval.margin,
            eval_cfg=cfg.eval,
            trading=trading,
            q_rows=self._q_rows(),
            scale=self.plan_scale_into if cfg.net.plan else None,
        )


class _OnDevice:
    """A :class:`Policy`'s device side: the Q-network with the policy's weights on the policy's backend,
    its workspaces by row count and the head rule's greedy values. The default workspace has
    ``env.n_envs`` rows, as the trainer's acting workspace, so the GEMMs of a forward of up to that
    many rows see the trainer's shapes; it is made at its first use (a walk on the GPU has its own)."""

    def __init__(self, policy: Policy, be: _backend.Backend):
        from .nn import QNetwork
        from .pinned import DeviceScalars
        from .rules import HEAD_RULES

        state, cfg = policy.state, policy.config
        xp = be.xp
        self.n_envs = cfg.env.n_envs
        self.net = QNetwork(
            policy.obs_dim, policy.n_actions, cfg.net, **policy._net_args, xp=xp, max_batch=None, seed=cfg.run.seed
        )
        for name, w in state.weights.items():
            self.net.P[name][...] = xp.asarray(np.asarray(w, np.float32))
        # net.spectral: the trainer's vectors, and W_sn made from them once, as the trainer acts
        self.net.spectral_in_steps()
        for layer, vecs in (state.spectral or {}).items():
            for k in ("u", "v"):
                self.net.linears[layer].sn[k][...] = xp.asarray(np.asarray(vecs[k], np.float32))
        self.net.spectral_step(iterate=False)
        self.ws = {}
        counters = None  # IQN: the Philox counter of the acting taus, as the trainer had it
        if state.tau_counter is not None:
            counters = DeviceScalars({"tau": np.int64}, xp, initial={"tau": state.tau_counter})
        #: the expected Q the head's rule acts and evaluates with (the same bits as the trainer's)
        self.values = HEAD_RULES[cfg.net.head].greedy_values(self.net, cfg, counters)
        self._block_q = None  # (row_exact_q,) once made: it may be None

    def block_q(self):
        """:func:`row_exact_q` of this network, made once (on the GPU it has buffers and a workspace of its own)."""
        if self._block_q is None:
            self._block_q = (row_exact_q(self.net, self.values),)
        return self._block_q[0]

    def workspace(self, n: int):
        """The workspace of a forward over ``n`` rows: ``n_envs`` rows for up to that many, else ``n``."""
        cap = min((c for c in self.ws if c >= n), default=None)
        if cap is None:
            cap = self.n_envs if n <= self.n_envs else n
            self.ws[cap] = self.net.new_workspace(cap)
        return self.ws[cap]


# --- the greedy walk, shared with the trainer ------------------------------------------------------
def row_exact_q(net, values):
    """The host walk's :class:`RowExactQ` (NumPy) or :class:`PaddedQ` (GPU) of ``net`` and the head
    rule's greedy ``values``: Q of many bars at once, each row bit for bit what the walk defines as
    that bar's Q; None where there is none: the MLP encoder, the C51 head (IQN's acting taus depend on
    the batch), no spectral norm and no plan head (its gate reads the forward's workspace and scales
    positions that are then no levels: that walk goes a bar at a time) are needed."""
    from .nn.heads import C51Head
    from .nn.layers import MLP
    from .rules.c51 import C51Values

    plain_c51 = isinstance(values, C51Values) and type(net.head) is C51Head  # not c51+iqn's joint head
    if not plain_c51 or not isinstance(net.encoder, MLP):
        return None
    if any(lin.spectral for lin in net.linears.values()) or net.plan is not None:
        return None
    return RowExactQ(net, values) if _backend.is_numpy(net.xp) else PaddedQ(net, values)


class BlockQ(Protocol):
    """What the host walk (:func:`_walk_on_host`) asks of a block Q: the Q of many bar states in one
    forward, each row bit for bit what the walk defines as that bar's Q (:class:`RowExactQ`,
    :class:`PaddedQ`, the ensemble's ``EnsembleRows``; a bar at a time: ``_OneBar``)."""

    #: most rows one call takes
    max_rows: int
    #: one more row's cost as a share of a call's fixed cost (0: free up to ``max_rows``); the
    #: :class:`WalkPlanner` weighs rows with it
    row_cost: float

    def begin(self) -> None:
        """A walk starts: what the block Q derives from the network's weights is made from their values
        now (every block of the walk uses them)."""
        ...

    def of_states(self, rows: np.ndarray, windows) -> np.ndarray:
        """Host float32 ``[k, A]``: the Q of the state rows ``rows`` (host float32 ``[k, STATE_DIM]``,
        ``k <= max_rows``), their observations gathered by ``windows`` (:class:`cudarl.window.Windows`)."""
        ...


#: Most rows of one block of the NumPy host walk (:class:`RowExactQ`).
CPU_BLOCK_ROWS = 1024
#: What one more row of a NumPy block costs, as a share of a block's fixed cost (its NumPy calls and
#: the walk's Python): from timing the walk's blocks on a 2-core x86-64 host (an estimate the block
#: planner weighs rows with; the walk's actions do not depend on it).
CPU_ROW_COST = 1 / 30


class RowExactQ:
    """The NumPy backend's block Q: ``q(obs [k, obs_dim]) -> Q [k, A]`` (float32, host) whose every matrix
    product is an :class:`ExactGemm`: a GEMM whose result is exact in float64 whatever order the BLAS
    sums in, so a row's Q is a function of that row alone, bit for bit the same whatever the other rows
    hold and wherever it sits, in a block of one bar as of a thousand, on any BLAS (a test holds it on
    the machine it runs on). A bar's Q on the NumPy host walk is defined as its row of this forward, as
    :class:`PaddedQ` defines it on the GPU; :meth:`Policy.q_values <cudarl.policy.Policy.q_values>` goes
    through it too. ``of_states(rows [k, STATE_DIM], windows)`` gathers the state rows' observations
    first.

    Every other op works element by element or row by row: the selectivity gate, bias, activation,
    LayerNorm and dueling twins (``cudarl.reference``), then the C51 expectation ``sum(e z) / sum(e)``
    with ``e = exp(logits - max)`` (both sums NumPy's row-by-row reductions), or the risk
    measure's twin with ``agent.act_by``. These bits are not the trainer's ``qstats.per_sample`` Q (the
    same value within float32 rounding; a test holds both). :meth:`reference` is that composition in
    plain NumPy; ``__call__`` does the same operations in the same order into buffers made once (a walk
    runs over a thousand blocks of a few dozen rows, where NumPy's temporaries and calls are most of the
    cost), and a test holds the two bit for bit equal."""

    max_rows = CPU_BLOCK_ROWS
    row_cost = CPU_ROW_COST

    def __init__(self, net, values):
        from .nn.layers import Linear
        from .reference import nn as ref

        self.net, self.values = net, values
        self.P, self.head, self.support = net.P, net.head, values.support
        self.gate = net.gate  # the selectivity signal's input gate, before the encoder (None without)
        self.layers = [(layer, isinstance(layer, Linear)) for layer in net.encoder.children]
        self.va = net.head.va  # the dueling head's linear layer, folded by begin()
        self.obs = np.zeros((self.max_rows, net.n_in), np.float32)
        # each layer's output rows, and the head's logits and their softmax's work, as [max_rows, ...]
        self.outs = [
            np.zeros((self.max_rows, layer.n_out if linear else layer.n), np.float32) for layer, linear in self.layers
        ]
        #: each linear layer's exact GEMM (its weights set by begin()), None for a LayerNorm
        self.gemms = [
            ExactGemm(layer.n_in, layer.n_out, self.max_rows) if linear else None for layer, linear in self.layers
        ]
        a_n, k_n = self.head.n_actions, self.head.atoms
        #: the head's weights and bias with the dueling combine folded in: logits = h @ w_fold + b_fold
        self.w_fold = np.empty((self.va.n_in, a_n * k_n), np.float32)
        self.b_fold = np.empty(a_n * k_n, np.float32)
        self.head_gemm = ExactGemm(self.va.n_in, a_n * k_n, self.max_rows)
        self.logits = np.empty((self.max_rows, a_n, k_n), np.float32)
        self.work = np.empty((self.max_rows, a_n, k_n), np.float32)
        self.rmax = np.empty((self.max_rows, a_n, 1), np.float32)
        self.moments = np.empty((2, self.max_rows, a_n), np.float32)  # sum exp * z, sum exp
        self.q = np.empty((self.max_rows, a_n), np.float32)
        self.stats = np.empty((2, self.max_rows), np.float32)  # a LayerNorm's mean and rstd
        self.risky = values.risk[0] != 0  # agent.act_by other than the mean
        for layer, linear in [*self.layers, (self.va, True)]:  # the MLP's: __call__ restates these two only
            if linear and layer.act not in (ref.IDENTITY, ref.RELU):
                raise ValueError(f"RowExactQ: {layer.name}'s activation {layer.act} is neither identity nor ReLU")

    def begin(self) -> None:
        """Fold the dueling combine into the head's current weights (:func:`fold_dueling`), the input gate into
        the first layer's where the network folds it (:meth:`cudarl.nn.QNetwork.fold_gate`: the same function as
        its forward's), and split every layer's current weights for its :class:`ExactGemm`."""
        self.net.fold_gate()
        fold_dueling(self.va.weight(), self.P[f"{self.va.name}.bias"], self.head.n_actions, self.w_fold, self.b_fold)
        self.head_gemm.set(self.w_fold)
        for (layer, _), gemm in zip(self.layers, self.gemms, strict=True):
            if gemm is not None:
                gemm.set(layer.weight())

    def into(self, obs, out) -> None:
        """``out [n, A] = Q(obs [n, obs_dim])`` for any ``n``, with the weights as they are now, a block of
        up to :attr:`max_rows` at a time."""
        self.begin()
        for i in range(0, obs.shape[0], self.max_rows):
            part = obs[i : i + self.max_rows]
            self.obs[: len(part)] = part
            out[i : i + len(part)] = self._forward(len(part))

    def of_states(self, rows, windows) -> np.ndarray:
        windows.gather(rows, self.obs[: len(rows)])
        return self._forward(len(rows))

    def _gated(self, x) -> np.ndarray:
        """The encoder's input: ``x`` through the input gate, if any and not folded into the first layer's
        weight (:meth:`begin`; its twin, row by row)."""
        if self.gate is None or self.net.folded is not None:
            return x
        from .reference import selectivity

        g = self.gate
        return selectivity.forward(x, g.logit, g.W, g.C, g.F, g.over, compute_dtype=np.float32)

    def reference(self, obs) -> np.ndarray:
        """The composition of the reference twins that ``__call__`` computes (its test oracle)."""
        from .reference import nn as ref

        self.net.fold_gate()  # the first layer's weight() with the gate folded in, as begin()
        P, head, h = self.P, self.head, self._gated(obs)
        for layer, linear in self.layers:
            if linear:
                y = exact_matmul(h, layer.weight())
                ref.bias_act_forward(y, P[f"{layer.name}.bias"], y, layer.act)
            else:  # LayerNorm
                y, stats = np.empty_like(h), np.empty((2, len(h)), h.dtype)
                g, b = P[f"{layer.name}.gamma"], P[f"{layer.name}.beta"]
                ref.layernorm_forward(h, g, b, y, stats[0], stats[1], layer.eps, layer.act)
            h = y
        a_n, k_n = head.n_actions, head.atoms
        w = np.empty((self.va.n_in, a_n * k_n), np.float32)
        b = np.empty(a_n * k_n, np.float32)
        fold_dueling(self.va.weight(), P[f"{self.va.name}.bias"], a_n, w, b)
        logits = (exact_matmul(h, w) + b).reshape(len(h), a_n, k_n)
        if self.risky:
            return self._risk_q(logits)
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (e * self.support).sum(axis=-1) / e.sum(axis=-1)

    def _risk_q(self, logits) -> np.ndarray:
        """agent.act_by's risk measure of ``logits [k, A, K]``: the twin C51Values runs, row by row."""
        q = np.empty(logits.shape[:2], np.float32)
        self.values.of_logits(logits, q)
        return q

    def __call__(self, obs) -> np.ndarray:
        """Q ``[k, A]`` of ``obs [k, obs_dim]``, ``k <= max_rows``, with the weights as they are now (a view
        of buffers the next call reuses)."""
        self.begin()
        self.obs[: len(obs)] = obs
        return self._forward(len(obs))

    def _forward(self, k: int) -> np.ndarray:
        """Q of the first ``k`` rows of ``self.obs``."""
        from .reference import nn as ref

        P = self.P
        h, relu = self._gated(self.obs[:k]), False  # relu: h is a ReLU's output
        for (layer, linear), gemm, out in zip(self.layers, self.gemms, self.outs, strict=True):
            y = out[:k]
            if linear:  # ref.bias_act_forward: act(y + bias), in place
                gemm(h, y, nonneg=relu)
                np.add(y, P[f"{layer.name}.bias"], out=y)
                if layer.act == ref.RELU:
                    np.maximum(y, np.float32(0), out=y)
            else:
                g, b = P[f"{layer.name}.gamma"], P[f"{layer.name}.beta"]
                ref.layernorm_forward(h, g, b, y, self.stats[0, :k], self.stats[1, :k], layer.eps, layer.act)
            h, relu = y, linear and layer.act == ref.RELU
        # the head, its dueling combine folded in (begin): logits = h @ w_fold + b_fold
        a_n, k_n = self.head.n_actions, self.head.atoms
        logits = self.logits[:k]
        flat = logits.reshape(k, a_n * k_n)
        self.head_gemm(h, flat, nonneg=relu)
        np.add(flat, self.b_fold, out=flat)
        return self._risk_q(logits) if self.risky else self._expected(logits)

    def _expected(self, logits) -> np.ndarray:
        """The C51 expectation ``sum_j p_j z_j`` of ``logits [k, A, K]``, ``p = softmax``: ``sum_j e_j z_j /
        sum_j e_j`` with ``e = exp(logits - max)``, each sum NumPy's reduction along the contiguous last
        axis (one C loop a row whose order depends on ``K`` alone: no BLAS)."""
        k, a_n, k_n = logits.shape
        m, e, ez, q = self.rmax[:k], self.work[:k], self.logits[:k], self.q[:k]
        np.maximum.reduce(logits, axis=-1, keepdims=True, out=m)
        np.subtract(logits, m, out=e)
        np.exp(e, out=e)
        np.multiply(e, self.support, out=ez)  # the logits are not needed any more
        num, den = self.moments[:, :k]
        np.add.reduce(ez, axis=-1, out=num)
        np.add.reduce(e, axis=-1, out=den)
        np.divide(num, den, out=q)
        return q


def fold_dueling(w, b, n_actions: int, w_out, b_out) -> None:
    """The dueling combine folded into the head's linear layer: with ``w [n, (1 + A) K]`` and ``b [(1 + A) K]``
    (the value's K columns, then each action's advantage), ``w_out [n, A K]`` and ``b_out [A K]`` give
    ``logits[a] = h @ w_out[:, a] + b_out[a] = V + Adv_a - mean_a' Adv_a'`` as one GEMM (the same logits
    as ``cudarl.reference.nn.dueling_forward`` of ``h @ w + b``, within float32 rounding; a test holds it):
    ``w_out[:, a] = (w_adv[:, a] - mean_a' w_adv[:, a']) + w_val``, the bias likewise, in float32."""
    k = w.shape[1] // (n_actions + 1)
    for src, dst in ((w, w_out), (b, b_out)):
        val, adv = src[..., :k], src[..., k:].reshape(*src.shape[:-1], n_actions, k)
        out = dst.reshape(adv.shape)
        np.subtract(adv, adv.mean(axis=-2, keepdims=True, dtype=np.float32), out=out)
        np.add(out, val[..., None, :], out=out)


class ExactGemm:
    """``out [k, M] = x [k, K] @ w [K, M]`` (float32) as a function of each row of ``x`` alone, on any BLAS.

    A float32 SGEMM's row is not: OpenBLAS 0.3.31 (DYNAMIC_ARCH, on an AMD EPYC) sums a row of a 64-row
    GEMM in one of three orders by its place in the block (docs/perf-notes.md), and any BLAS may tile
    rows differently by shape and place. Here the sums are made exact, so their order cannot matter:

    * each column of ``w`` (:meth:`set`, once a walk) is rounded to a multiple of ``2^gw``, a power of
      two ``bw`` binades below the one just above the column's largest magnitude (``|w| <= 2^(gw + bw)``);
    * each row of ``x`` likewise to a multiple of ``2^gx``, ``bx`` binades below its largest magnitude's
      (``|x| <= 2^(gx + bx)``), in float64;
    * one float64 GEMM of the two: every product in column ``j`` is an integer times ``2^(gx + gw_j)``,
      and with ``bx + bw + ceil(log2 K) <= 52`` every partial sum is an integer of at most 52 bits
      times it: exact in float64 in any order, with or without FMA, so the BLAS's tiling, threads and
      kernels cannot change a bit (the one assumption: its float64 GEMM is IEEE sums of products, not
      Strassen's algorithm or reduced precision, and keeps no denormal flushed: the grids are at least
      ``2^-298``);
    * the exact sum is rounded once to float32.

    Every step is a function of the row and the (set) weights alone, so a row's bits are too. They are
    not a float32 GEMM's bits: the rounding of ``x`` and ``w`` to ``bx`` and ``bw`` (22 to 24) bits below
    their row's and column's largest magnitude moves an output by at most ``2^-bx max|x_row| sum_k |w_kj|
    + 2^-bw max|w_j| sum_k |x_k|`` (and the rounding of ``x``'s to ``w``'s), about a float32 GEMM's own
    rounding."""

    def __init__(self, k_in: int, m: int, rows: int):
        budget = 52 - max(1, int(k_in - 1).bit_length())  # 52 - ceil(log2 K)
        self.bw = budget // 2
        self.bx = budget - self.bw
        self.w = np.empty((k_in, m), np.float64)  # w rounded to its columns' grids
        self.xq = np.empty((rows, k_in), np.float64)  # x rounded to its rows' grids
        self.y = np.empty((rows, m), np.float64)
        self.amax = np.empty(rows, np.float32)
        self.exp = np.empty(rows, np.int32)
        self.magic = np.empty((rows, 1), np.float64)  # 1.5 * 2^(gx + 52) of each row

    def set(self, w) -> None:
        """Round the right side ``w [K, M]`` (float32) to its columns' grids for the calls that follow."""
        _, e = np.frexp(np.abs(w).max(axis=0))  # |w| < 2^e in each column (0 for a zero column)
        grid = np.ldexp(1.0, e - self.bw)
        np.rint(w / grid, out=self.w)  # a power of two's quotient is exact
        np.multiply(self.w, grid, out=self.w)

    def __call__(self, x, out, nonneg: bool = False) -> None:
        """``out [k, M] (float32) = x [k, K] (float32) @ w``; ``nonneg``: ``x`` has no negative element (a
        ReLU's output: its largest element is its largest magnitude, one NumPy call fewer, the same bits)."""
        k = len(x)
        xq, y, amax, exp, magic = self.xq[:k], self.y[:k], self.amax[:k], self.exp[:k], self.magic[:k]
        np.maximum.reduce(x if nonneg else np.abs(x), axis=1, out=amax)
        np.frexp(amax, out=(amax, exp))  # |x| < 2^exp in each row (0 for a zero row)
        # with gx = exp - bx, adding and taking away 1.5 * 2^(gx + 52) rounds x to a multiple of 2^gx
        np.ldexp(1.5 * 2.0 ** (52 - self.bx), exp[:, None], out=magic)
        np.add(x, magic, out=xq)
        np.subtract(xq, magic, out=xq)  # exact
        np.matmul(xq, self.w, out=y)  # exact in any order
        out[...] = y  # rounded once to float32


def exact_matmul(x, w) -> np.ndarray:
    """``x [k, K] @ w [K, M]`` (float32) by a fresh :class:`ExactGemm`: float32 ``[k, M]``."""
    gemm = ExactGemm(w.shape[0], w.shape[1], len(x))
    gemm.set(w)
    out = np.empty((len(x), w.shape[1]), np.float32)
    gemm(x, out)
    return out


#: Rows of every evaluation forward of a GPU host walk (:class:`PaddedQ`). One forward costs about the
#: same from 256 to 4096 rows (189 and 196 us on an H200 at 9a99649, launches and all), so a block
#: holds up to 4096 bar states.
EVAL_ROWS = 4096


class PaddedQ:
    """The GPU's block Q: every block of ``k <= EVAL_ROWS`` rows is written into the first rows of one
    ``[EVAL_ROWS, obs_dim]`` buffer and the whole buffer goes through the forward, so every GEMM has
    the same shape whatever ``k`` is. At one shape a row's Q is bit for bit the same whatever the other
    rows hold (checked on an H200 for every ``net.gemm``: tests/unit/test_policy.py's GPU walk test);
    across shapes it is not (cuBLASLt picks another algorithm for 1 to 4 rows than for 17 and more).
    A bar's Q is therefore defined as its row of that forward, for a block of one bar as for 4096.
    ``q(obs [k, obs_dim])`` and ``of_states(rows [k, STATE_DIM] host, windows)`` (the state rows are
    uploaded into a fixed buffer and gathered straight into the padded one) return host float32
    ``[k, A]``."""

    max_rows = EVAL_ROWS
    row_cost = 0.0  # rows up to EVAL_ROWS cost nothing more: the forward has one shape

    def begin(self) -> None:
        """Nothing to derive: the forward reads the network's weights."""

    def __init__(self, net, values):
        from .reference.window import STATE_DIM

        xp = net.xp
        self.values = values
        self.buf = xp.zeros((EVAL_ROWS, net.n_in), np.float32)
        self.rows = xp.zeros((EVAL_ROWS, STATE_DIM), np.float32)  # bar 0: a valid row until written
        self.out = xp.empty((EVAL_ROWS, net.n_actions), np.float32)
        self.ws = net.new_workspace(EVAL_ROWS)

    def _forward(self, k: int) -> np.ndarray:
        self.values(self.out, self.buf, self.ws)
        return _backend.to_numpy(self.out[:k])

    def into(self, obs, out) -> None:
        """``out [n, A] = Q(obs [n, obs_dim])`` on the device for any ``n``, :data:`EVAL_ROWS` rows at a time."""
        for i in range(0, obs.shape[0], EVAL_ROWS):
            k = min(EVAL_ROWS, obs.shape[0] - i)
            self.buf[:k] = obs[i : i + k]
            self.values(self.out, self.buf, self.ws)
            out[i : i + k] = self.out[:k]

    def __call__(self, obs) -> np.ndarray:
        k = obs.shape[0]
        self.buf[:k] = obs
        return self._forward(k)

    def of_states(self, rows, windows) -> np.ndarray:
        k = len(rows)
        self.rows[:k].set(np.ascontiguousarray(rows))
        windows.gather(self.rows, self.buf)  # rows past k: earlier blocks' (valid) states
        return self._forward(k)


class _OneBar:
    """The NumPy walk's block Q for a network without a row-exact one (IQN, a temporal encoder, the
    plan head): ``q_values(obs [1, obs_dim], out [1, A])`` a bar at a time, and the plan head's gate
    ``scale(obs, out [1])`` of the same forward (kept in ``self.scale``)."""

    max_rows, row_cost = 1, 0.0

    def begin(self) -> None:
        """Nothing to derive: ``q_values`` reads the network's weights."""

    def __init__(self, env, q_values, scale):
        self.q_values, self.scale_fn = q_values, scale
        self.obs = np.zeros((1, env.obs_dim), np.float32)
        self.q = np.zeros((1, env.n_actions), np.float32)
        self.scale = np.ones(1, np.float32)

    def of_states(self, rows, windows) -> np.ndarray:
        windows.gather(rows, self.obs)
        self.q_values(self.obs, self.q)
        if self.scale_fn is not None:  # the gate of this same forward
            self.scale_fn(self.obs, self.scale)
        return self.q


#: Environments of an evaluation env (:func:`eval_env`): the rows a greedy walk's forward acts on.
EVAL_ENVS = 1


def eval_env(prepared, split, env_cfg, backend: str):
    """:data:`EVAL_ENVS` environment over ``split``, one episode of ``len(split) - 2`` steps from its first bar."""
    from dataclasses import replace

    from .env import TradingEnv

    n = split.stop - split.start - 2
    cfg = replace(env_cfg, n_envs=EVAL_ENVS, episode_len=n, stagger=False, counterfactual=False, mirror=False)
    b = prepared.bars
    return TradingEnv(
        b.open,
        b.close,
        prepared.x,
        prepared.sign,
        cfg,
        t_begin=split.start,
        t_end=split.stop,
        window=prepared.window,
        backend=backend,
    )


def greedy_actions(
    env, q_values, stream=None, walk_on_host: bool = True, margin: float = 0.0, q_rows=None
) -> np.ndarray:
    """int64 ``[episode_len]``: the greedy actions of one episode of ``env`` (:func:`greedy_walk`'s,
    without a plan head)."""
    return greedy_walk(env, q_values, stream, walk_on_host, margin, q_rows)[0]


def greedy_walk(
    env, q_values, stream=None, walk_on_host: bool = True, margin: float = 0.0, q_rows=None, scale=None
) -> tuple:
    """``(actions int64, scales float32)``, each ``[episode_len]``: one greedy episode of ``env`` (reset first).

    ``q_values(obs, out)`` writes Q ``[1, A]``; the action is the first maximum (the env's act with
    epsilon 0) of Q with ``margin`` added to the held position's action (``eval.margin``: the position
    is left only for an action whose value exceeds the held one's by more than the margin; on the
    device the held action is found from the env's position, so nothing synchronises).
    ``scale(obs, out)``, the plan head's gate (``net.plan``), is called right after ``q_values`` on the
    same ``obs`` and writes the position scale ``[1]`` (it reads that forward); the position taken is
    ``levels[a] * scale``; without it every scale is 1.
    For an evaluation env (one env, one episode from its first bar) on the NumPy backend, and on the
    GPU when ``q_rows`` is given, the walk is done on the host with the env's observation rule
    (docs/env.md) instead of its act and step, which draw Philox numbers a greedy walk never uses
    (``walk_on_host=False`` takes the env's path; a test holds the two equal); ``q_rows`` (a block Q,
    :func:`row_exact_q`; see :func:`_walk_on_host`) lets it evaluate at once every state the walk can
    reach in a block of bars (not with a plan head). Otherwise on
    the GPU the env's kernels step it and the actions stay on the device until the end (no
    synchronisation per bar, but about ten launches a bar: 0.9 ms a bar on an H200 at 3447ac3).
    """
    xp = env.xp
    # the walk's buffers and the env may have been made on the caller's stream (an evaluation's first
    # walk builds its env and block Q there): the walk, on ``stream``, follows that work
    follow_caller(stream)
    one_episode = env.n_envs == 1 and env.params.n_starts == 1 and not env.params.stagger
    if scale is not None:
        q_rows = None  # the plan head's gate: one bar at a time
    if walk_on_host and one_episode and (not env.is_gpu or q_rows is not None):
        with stream if stream is not None else nullcontext():  # ordered after the caller's work on it
            return _walk_on_host(env, q_values, margin, q_rows, scale)
    with stream if stream is not None else nullcontext():
        env.reset()
        q = xp.zeros((1, env.n_actions), np.float32)
        eps = xp.zeros(1, np.float32)
        n = env.config.episode_len
        acts, scales = xp.zeros(n, np.int32), xp.ones(n, np.float32)
        row = xp.zeros(1, np.int64)
        env.scale[...] = 1
        for k in range(n):
            q_values(env.obs, q)
            if scale is not None:
                scale(env.obs, env.scale)
                scales[k : k + 1] = env.scale
            if margin:
                held = xp.argmin(xp.abs(env.data.levels - env.state.position[:1]))  # the held level's action
                q[row, held] += np.float32(margin)
            env.act(q, eps)
            env.step()
            acts[k : k + 1] = env.actions
        out, out_scales = _backend.to_numpy(acts), _backend.to_numpy(scales)
    return out.astype(np.int64), out_scales


def block_tree(depth: int, hold_max: int, n_levels: int) -> tuple:
    """The states a greedy walk can reach in ``depth`` bars from one state, as rows of one block:
    rows ``0 .. depth - 1`` are the path that holds the block's first position (row ``i``: bar ``i``);
    after them, for each bar ``i >= 1``, each hold ``h = 1 .. min(i, hold_max)`` and each level ``l``,
    the state of a walk that moved to level ``l`` ``h`` bars before bar ``i`` (a move at bar ``i - h``).

    Returns ``(bar, level, hold, index)``: int64 ``[R]`` each (``level`` -1 and ``hold`` 0 on the held
    path; ``hold`` is the state row's hold count), and int64 ``index [depth, hold_max + 1, n_levels]``,
    the row of bar ``i``'s state ``(l, h)``. ``R = depth + n_levels * sum_i min(i, hold_max)``."""
    return _block_tree(int(depth), int(hold_max), int(n_levels))


@lru_cache(maxsize=64)
def _block_tree(depth: int, hold_max: int, n_levels: int) -> tuple:
    i, h, lvl = np.meshgrid(np.arange(depth), np.arange(1, hold_max + 1), np.arange(n_levels), indexing="ij")
    keep = h <= i
    i, h, lvl = i[keep], h[keep], lvl[keep]  # in (bar, hold, level) order
    index = np.full((depth, hold_max + 1, n_levels), -1, np.int64)
    index[i, h, lvl] = depth + np.arange(i.size)
    bar = np.concatenate([np.arange(depth), i]).astype(np.int64)
    level = np.concatenate([np.full(depth, -1), lvl]).astype(np.int64)
    hold = np.concatenate([np.zeros(depth, np.int64), h]).astype(np.int64)
    for a in (bar, level, hold, index):
        a.flags.writeable = False  # cached: shared by every caller
    return bar, level, hold, index


def tree_rows(depth: int, hold_max: int, n_levels: int) -> int:
    """Rows of :func:`block_tree` ``(depth, hold_max, n_levels)``: ``depth + n_levels * sum_{i < depth}
    min(i, hold_max)``."""
    full = min(depth, hold_max + 1)  # bars i < full hold every hold 1..i; the later ones 1..hold_max
    return depth + n_levels * (full * (full - 1) // 2 + hold_max * (depth - full))


class WalkPlanner:
    """The shape ``(depth, hold_max)`` of the host walk's next block (:func:`block_tree`).

    A block covers the walk until a position entered inside it is held past ``hold_max`` bars (its state
    is then in no row) or ``depth`` bars pass, and costs ``1 + row_cost * rows`` (a block's fixed cost
    and its rows'). From the holds at which the walk moved in its last 256 moves (once it has 8),
    every ``REPLAN`` blocks the planner picks the shape of least expected cost per bar, counting bars from
    each move out of a position held longer than ``hold_max`` to the next such move (the stretches a
    block of that shape covers, split into ``depth``-bar blocks), within ``max_rows``. A block that
    held its first position throughout is followed by one of up to twice its bars (a policy that holds
    has no moves to learn from). Only the speed depends on the plan, never the actions."""

    HOLD_CHOICES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    REPLAN = 128

    def __init__(self, max_rows: int, row_cost: float, n_levels: int, first: tuple = (4, 0)):
        self.max_rows, self.row_cost, self.n_levels = int(max_rows), float(row_cost), int(n_levels)
        self.depths = [1 << j for j in range(max(self.max_rows, 1).bit_length())]
        # each hold_max's depths that fit and their rows (the same at every plan)
        depths = np.asarray(self.depths)
        self.shapes = []
        for hold_max in self.HOLD_CHOICES:
            rows = np.array([tree_rows(d, hold_max, self.n_levels) for d in self.depths])
            ok = (rows <= self.max_rows) & ((depths > hold_max) | (hold_max == 0))
            if ok.any():
                self.shapes.append((hold_max, depths[ok], rows[ok]))
        self.moves: list[int] = []
        self.plan, self.blocks, self.held, self.last = first, 0, False, first[0]
        self.planned = None  # the block count at the last plan

    def note_move(self, hold: int) -> None:
        """The walk left a position it had held ``hold`` bars."""
        self.moves.append(hold)

    def note_held(self) -> None:
        """The last block held its first position throughout."""
        self.held = True

    def next(self, left: int) -> tuple[int, int]:
        """``(depth, hold_max)`` of the next block, ``left`` bars before the episode's end."""
        if self.max_rows <= 1:
            return 1, 0
        if len(self.moves) >= 8 and (self.planned is None or self.blocks - self.planned >= self.REPLAN):
            self.plan, self.planned = self._best(np.asarray(self.moves[-256:], np.int64)), self.blocks
        self.blocks += 1
        depth, hold_max = self.plan
        if self.held:
            while depth < 2 * self.last and tree_rows(2 * depth, hold_max, self.n_levels) <= self.max_rows:
                depth *= 2
        self.held = False
        self.last = depth = max(1, min(depth, left))
        return depth, hold_max

    def _best(self, m) -> tuple[int, int]:
        ends = np.concatenate([[0], np.cumsum(m)])
        best = None
        for hold_max, depths, rows in self.shapes:
            cuts = np.unique(np.concatenate([[0], np.flatnonzero(m > hold_max), [len(m)]]))
            stretch = np.diff(ends[cuts])
            stretch = stretch[stretch > 0]
            blocks = np.ceil(stretch[:, None] / depths[None, :]).sum(axis=0)
            cost = (1.0 + self.row_cost * rows) * blocks / stretch.sum()
            j = int(np.argmin(cost))
            if best is None or cost[j] < best[0]:
                best = (float(cost[j]), int(depths[j]), hold_max)
        return best[1:]


def _walk_on_host(env, q_values, margin: float = 0.0, q_rows=None, scale=None) -> tuple:
    """The env's greedy episode from bar ``t_begin`` on the host: the state row ``[t, 0, p_{t-1},
    min(hold, cap) / cap]`` and its window (``env.windows``), action the first maximum of Q (a strict
    ``>`` scan, as ``env.act``; ``margin`` added to the held position's action first),
    ``p = levels[a] * scale`` (float32, as the env; ``scale`` the plan head's gate, else 1),
    ``hold + 1`` if ``p`` did not change, else 1. Returns ``(actions, scales)``.

    ``q_values(obs [1, obs_dim], out [1, A])`` gives the Q of one bar, and the walk takes one bar at
    a time. With ``q_rows`` (a :class:`BlockQ`: each row bit for bit that bar's Q) it evaluates, in
    one forward, every state the walk can reach in the next bars (:func:`block_tree`, shaped by a
    :class:`WalkPlanner`), then follows the walk through them up to the first state the block does not
    hold: the same actions, with one forward per block of bars instead of per bar.
    """
    from .reference.env import write_state

    levels = _backend.to_numpy(env.data.levels).astype(np.float32)
    n, cap, t0 = env.config.episode_len, env.params.hold_cap, env.params.t_begin
    block_q = q_rows if (q_rows is not None and scale is None) else _OneBar(env, q_values, scale)
    n_levels = len(levels) if scale is None else 0  # a plan head's positions are not levels: no tree
    planner = WalkPlanner(block_q.max_rows, block_q.row_cost, n_levels)
    block_q.begin()
    rows = np.zeros((block_q.max_rows, env.windows.state_dim), np.float32)
    acts, scales = np.empty(n, np.int64), np.ones(n, np.float32)
    prev, hold, k = np.float32(0), 0, 0
    trees: dict = {}  # (depth, hold_max) -> what each block of that shape reuses
    while k < n:
        depth, hold_max = planner.next(n - k)
        tree = trees.get((depth, hold_max))
        if tree is None:
            bar, level, row_hold, index = block_tree(depth, hold_max, n_levels)
            if len(bar) > len(rows):
                raise ValueError(
                    f"walk: a block of {depth} bars and holds up to {hold_max} has {len(bar)} rows, over {len(rows)}"
                )
            on_held = level < 0
            tree = trees[(depth, hold_max)] = (
                bar,
                on_held,
                levels[np.maximum(level, 0)],
                row_hold,
                index.tolist(),  # nested lists: the walk below indexes it a bar at a time
            )
        bar, on_held, tree_pos, row_hold, index = tree
        r_n = len(bar)
        pos = np.where(on_held, prev, tree_pos).astype(np.float32)
        write_state(rows[:r_n], t0 + k + bar, pos, np.where(on_held, hold + bar, row_hold), cap)
        q = block_q.of_states(rows[:r_n], env.windows)
        if margin:  # each state's held level's action (the first nearest level, as the env finds it)
            held = np.abs(levels[None, :] - pos[:, None]).argmin(axis=1)
            q[np.arange(r_n), held] += np.float32(margin)
        a = first_max(q)
        sc = block_q.scale[0] if scale is not None else np.float32(1)
        p = levels[a] * sc if scale is not None else levels[a]
        moved, a_l = (p != pos).tolist(), a.tolist()
        r, i, on_path, taken = 0, 0, True, []
        while True:  # follow the walk through the block's states
            taken.append(a_l[r])
            if moved[r]:
                planner.note_move(hold)
                prev, hold, on_path, lvl = p[r], 1, False, a_l[r]
            else:
                hold += 1
            i += 1
            if i == depth:
                break
            if on_path:
                r = i
            elif hold <= hold_max:
                r = index[i][hold][lvl]
            else:
                break
        acts[k : k + i] = taken
        if scale is not None:
            scales[k : k + i] = sc
        if on_path:
            planner.note_held()
        k += i
    return acts, scales


def first_max(q: np.ndarray) -> np.ndarray:
    """int64 ``[k]``: the index of the first maximum of each row of ``q`` ``[k, A]`` by a strict
    ``>`` scan from index 0, ``env.act``'s rule (``argmax``'s, but for a NaN after index 0, which
    the scan passes over)."""
    if not np.isnan(q).any():
        return q.argmax(axis=1)
    a = np.zeros(len(q), np.int64)
    best = q[:, 0].copy()
    for j in range(1, q.shape[1]):
        up = q[:, j] > best
        a[up] = j
        best[up] = q[up, j]
    return a


def evaluate_split(
    prepared,
    split_name: str,
    env_cfg,
    q_values,
    backend: str,
    env=None,
    stream=None,
    *,
    margin: float = 0.0,
    eval_cfg=None,
    trading: bool = True,
    q_rows=None,
    scale=None,
):
    """Greedy positions over ``split_name`` of ``prepared`` (with the no-trade ``margin``; all flat when
    not ``trading``; sized by the plan head's gate ``scale``) evaluated with the env's fill and costs and
    the statistics of ``eval_cfg`` (:class:`cudarl.config.EvalConfig`: trials, level, resamples; default
    its defaults). ``q_values``, ``q_rows``, ``scale``: :func:`greedy_walk`."""
    from .config import EvalConfig
    from .evaluate import evaluate_positions

    e = eval_cfg if eval_cfg is not None else EvalConfig()
    split = getattr(prepared.splits, split_name)
    if trading:
        env = env if env is not None else eval_env(prepared, split, env_cfg, backend)
        actions, scales = greedy_walk(env, q_values, stream, margin=margin, q_rows=q_rows, scale=scale)
        pos = (env_cfg.position_levels()[actions] * scales).astype(np.float64)  # float32 levels * scale, as the env
    else:  # the gate keeps it flat: no walk (an episode of len(split) - 2 decisions, as the env's)
        pos = np.zeros(split.stop - split.start - 2, np.float64)
    return evaluate_positions(
        prepared.bars,
        pos,
        split,
        cost_bps=env_cfg.cost_bps,
        slippage_bps=env_cfg.slippage_bps,
        periods_per_year=prepared.periods_per_year,
        fill=env_cfg.fill,
        trials=e.trials,
        level=e.level,
        resamples=e.resamples,
    )


def deployment(eval_cfg, split_name: str, validation_psr) -> dict:
    """Whether a policy trades on ``split_name`` under ``eval.gate_psr``: always on the validation split
    (its evidence is what the gate reads) and with the gate off; otherwise only when
    ``validation_psr()`` (the PSR of the same policy on the validation split) is at least the gate (an
    undefined PSR, e.g. a flat validation policy, keeps it closed)."""
    import math

    g = eval_cfg.gate_psr
    if g == 0 or split_name == "val":
        return {"gate": "off" if g == 0 else "not applied to the validation split", "trading": True}
    psr = validation_psr()
    ok = psr is not None and math.isfinite(psr) and psr >= g
    return {"gate": "open" if ok else "closed", "trading": bool(ok), "validation_psr": psr, "threshold": g}
