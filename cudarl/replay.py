"""``PrioritizedReplay``: a GPU prioritized replay buffer with n-step returns.

The object owns the buffers and composes the ops of ``cudarl.ops.replay`` (CuPy) or
``cudarl.reference.replay`` (NumPy, the CPU backend); the math and the device rules are
documented in ``cudarl/reference/replay.py``. A training step typically reads::

    idx, w = replay.sample(512)                      # indices int32 [B], weights float32 [B]
    batch = replay.gather(idx)                       # obs, next_obs [B, W], action, ret, disc
    ...                                              # learn, producing td float32 [B]
    replay.update_priorities(idx, td)

All four calls are capture-safe once the batch buffers exist (``reserve(batch_size)`` or one
eager call before the capture). Counters live in device memory (:class:`DeviceScalars`), so a
graph captured at one buffer size samples rows added later, and two replays draw different
rows (the device increments ``step``).

Host-side calls validate eagerly and raise ``ValueError`` naming the argument, changing
nothing. Values the host cannot see without a synchronisation (CuPy arguments, values computed
inside a graph) follow the device rules and set bits in ``status()`` instead.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import backend as _backend
from .backend import family
from .config import ReplayConfig as _REPLAY
from .pinned import DeviceScalars
from .reference import replay as _ref

STATUS_NAMES = _ref.STATUS_NAMES


class Batch(NamedTuple):
    """Gathered rows. ``obs``/``next_obs`` float32 ``[B, D]``,
    ``action`` int32 ``[B]``, ``ret`` float32 ``[B]`` (n-step return), ``discount`` float32
    ``[B]`` (bootstrap discount, 0 when the episode ended inside the window)."""

    obs: object
    next_obs: object
    action: object
    ret: object
    discount: object


def _integer(name, v, lo) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return int(v)


def _real(name, v, lo, hi, lo_open=False) -> float:
    ok = isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < lo or v > hi or (lo_open and v == lo):
        raise ValueError(f"{name}: expected a finite number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def priority_constants(alpha, eps, beta0, beta_final, beta_steps) -> dict:
    """The priority exponent, its ``eps`` and the beta schedule of a :class:`PrioritizedReplay`, validated
    (a :class:`ValueError` names the argument), as :class:`cudarl.reference.replay.ReplaySpec` fields."""
    return {
        "alpha": _real("alpha", alpha, 0.0, 8.0),
        "eps": _real("eps", eps, 0.0, 1.0, True),
        "beta0": _real("beta0", beta0, 0.0, 1.0),
        "beta_final": _real("beta_final", beta_final, 0.0, 1.0),
        "beta_steps": _integer("beta_steps", beta_steps, 1),
    }


class PrioritizedReplay:
    """Proportional prioritized replay over a ring of ``capacity`` transitions.

    Args:
        capacity: rows, ``> n_step * n_envs`` and below 2**23 (exact int64 sums).
        obs_dim: features per observation row.
        n_step: n of the n-step return (>= 1); no default (the library's 1 and the trainer's 3 were two).
        n_envs: environments interleaved time-major; ``add`` takes multiples of it.
        alpha: priority exponent (>= 0). eps: added to ``|td|`` (> 0).
        beta0, beta_final: importance-weight exponent at step 0 and after ``beta_steps`` samples.
            (These defaults are :class:`cudarl.config.ReplayConfig`'s.)
        initial_priority: priority of the first rows before any update (> 0).
        store_next_obs: each row carries its own next observation (``add(..., next_obs=...)``),
            stored in a second ring and returned by ``gather``; a row is ready as soon as it is
            written. For rows whose next state is not the next row of their column (the env's
            counterfactual and mirrored rows). Requires ``n_step == 1``.
        seed, stream_id: Philox key and stream of the sampler.
        backend: ``"numpy"``, ``"cupy"`` or ``None`` (the process backend).
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        *,
        n_step: int,
        n_envs: int = 1,
        alpha: float = _REPLAY.alpha,
        eps: float = _REPLAY.eps,
        beta0: float = _REPLAY.beta0,
        beta_final: float = _REPLAY.beta_final,
        beta_steps: int = _REPLAY.beta_steps,
        initial_priority: float = 1.0,
        store_next_obs: bool = False,
        seed: int = 0,
        stream_id: int = 0x5E9,
        backend: str | None = None,
    ):
        integer, real = _integer, _real
        capacity = integer("capacity", capacity, 1)
        obs_dim = integer("obs_dim", obs_dim, 1)
        n_step = integer("n_step", n_step, 1)
        n_envs = integer("n_envs", n_envs, 1)
        if not isinstance(store_next_obs, (bool, np.bool_)):
            raise ValueError(f"store_next_obs: expected a bool, got {store_next_obs!r}")
        store_next_obs = bool(store_next_obs)
        if store_next_obs and n_step != 1:
            raise ValueError(f"store_next_obs: requires n_step == 1, got n_step={n_step}")
        if capacity <= n_step * n_envs or capacity >= 1 << 23:
            raise ValueError(f"capacity: must be > n_step * n_envs = {n_step * n_envs} and < 2**23, got {capacity}")
        self.spec = _ref.ReplaySpec(
            capacity=capacity,
            obs_dim=obs_dim,
            n_step=n_step,
            n_envs=n_envs,
            **priority_constants(alpha, eps, beta0, beta_final, beta_steps),
            seed=integer("seed", seed, 0) & 0xFFFFFFFFFFFFFFFF,
            stream_id=integer("stream_id", stream_id, 0) & 0xFFFFFFFF,
            store_next_obs=store_next_obs,
        )
        q0 = int(_ref.quantize(real("initial_priority", initial_priority, 0.0, 65536.0, True) ** self.spec.alpha))
        self.backend = _backend.get(backend)
        xp = self.xp = self.backend.xp
        self._ops = family("replay", xp)
        self._scalars = self._new_scalars(
            {
                "added": np.int64,
                "step": np.int64,
                "max_q": np.int64,
                "status": np.int64,
                "beta": np.float64,
                "seed": np.uint64,
            },
            xp,
            initial={"max_q": q0, "beta": self.spec.beta0, "seed": self.spec.seed},
        )
        C, lead = capacity, self._lead
        self.bufs = _ref.ReplayBuffers(
            obs=xp.zeros((*lead, C, obs_dim), np.float32),
            action=xp.zeros((*lead, C), np.int32),
            reward=xp.zeros((*lead, C), np.float32),
            discount=xp.zeros((*lead, C), np.float32),
            tree=xp.zeros((*lead, _ref.tree_nodes(C)), np.int64),
            levels=xp.asarray(np.array([o for o, _ in _ref.tree_layout(C)], np.int64)),
            owner=xp.full((*lead, C), -1, np.int32),
            flag=xp.zeros((*lead, _ref.FLAG_WORDS), np.int64),
            added=self._scalars.view("added"),
            step=self._scalars.view("step"),
            max_q=self._scalars.view("max_q"),
            status=self._scalars.view("status"),
            beta=self._scalars.view("beta"),
            seed=self._scalars.view("seed"),
            next_obs=xp.zeros((*lead, C, obs_dim), np.float32) if store_next_obs else None,
        )
        self._batches: dict[int, tuple] = {}
        # Rows added as the host saw them; None once an add() was captured (a graph's replays add
        # rows the host cannot count), after which batch sizes are checked on the device only.
        self._added_host: int | None = 0

    # The leading shape of every buffer and batch array: none for one buffer (the stacked subclass: (P,)).
    _lead: tuple = ()
    _form = ""  # how a batch array's shape begins in messages ("P, " with members)

    def _new_scalars(self, spec: dict, xp, initial: dict):
        return DeviceScalars(spec, xp, initial=initial)

    # --- properties ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.spec.capacity

    def added(self) -> int:
        """Rows ever added (a device read: synchronises; not inside a capture)."""
        return int(self._scalars.get("added"))

    def size(self) -> int:
        """Rows held, ``min(added, capacity)`` (a device read)."""
        return min(self.added(), self.capacity)

    @property
    def store_next_obs(self) -> bool:
        """Whether rows carry their own next observation (see the constructor)."""
        return self.spec.store_next_obs

    def ready(self) -> int:
        """Rows that can be sampled: held rows whose n-step window is complete, or every held
        row with ``store_next_obs`` (a device read)."""
        return _ref.ready_count(self.capacity, self.spec.lag, self.added())

    def status(self) -> list[str]:
        """The device's sticky status bits, as names (a device read). Empty when all is well."""
        s = int(self._scalars.get("status"))
        return [name for bit, name in STATUS_NAMES.items() if s & bit]

    def clear_status(self) -> None:
        """Clear the sticky status bits (not inside a capture)."""
        self._scalars.set("status", 0)

    # --- helpers ------------------------------------------------------------------------------
    def _capturing(self) -> bool:
        if not self.backend.is_gpu:
            return False
        import cupy

        return bool(cupy.cuda.get_current_stream().is_capturing())

    def _arg(self, name: str, a, shape: tuple, dtype, *, check_values=None):
        """Check one argument; NumPy values are validated here (and uploaded on the GPU)."""
        dtype = np.dtype(dtype)
        is_device = type(a).__module__.startswith("cupy")
        if not (isinstance(a, np.ndarray) or is_device):
            raise ValueError(f"{name}: expected an array of {dtype}, got {type(a).__name__}")
        if a.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype}, got {a.dtype}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
        if is_device and not self.backend.is_gpu:
            raise ValueError(f"{name}: a CuPy array was given to a buffer on the NumPy backend")
        if not is_device:
            if check_values is not None:
                msg = check_values(a)
                if msg:
                    raise ValueError(f"{name}: {msg}")
            if self.backend.is_gpu:
                if self._capturing():
                    raise ValueError(f"{name}: a NumPy array cannot be uploaded inside a capture; pass a CuPy array")
                return self.xp.asarray(np.ascontiguousarray(a))
            return np.ascontiguousarray(a)
        return a if a.flags.c_contiguous else self.xp.ascontiguousarray(a)

    @staticmethod
    def _finite(a):
        return None if np.all(np.isfinite(a)) else "contains NaN or inf"

    # --- the API ------------------------------------------------------------------------------
    def add(self, obs, action, reward, discount, next_obs=None) -> None:
        """Append ``B`` transitions (``B`` a multiple of ``n_envs``, time-major, at most capacity).

        Args:
            obs: float32 ``[B, obs_dim]``, the observation ``s_t`` the action was taken in.
            action: int32 ``[B]`` (>= 0).
            reward: float32 ``[B]``, ``r_t``.
            discount: float32 ``[B]`` in ``[0, 1]``: ``gamma``, or 0 when the episode ended after this step.
            next_obs: float32 ``[B, obs_dim]``, ``s_{t+1}`` of each row: required with
                ``store_next_obs``, refused without it.
        New rows become sampleable with the running maximum priority once their n-step window is
        complete (``n * n_envs`` rows later), or at once with ``store_next_obs``. CuPy arguments
        are checked on the device: a bad batch is rejected whole and sets status bit "bad rows rejected".
        """
        lead = self._lead
        if not hasattr(obs, "shape") or len(obs.shape) != 2 + len(lead):
            raise ValueError(
                f"obs: expected a float32 array [{self._form}B, {self.spec.obs_dim}], "
                f"got {getattr(obs, 'shape', type(obs).__name__)}"
            )
        B = int(obs.shape[len(lead)])
        if B < 1 or B > self.capacity or B % self.spec.n_envs:
            raise ValueError(
                f"obs: {B} rows; need 1..capacity={self.capacity} rows, a multiple of n_envs={self.spec.n_envs}"
            )
        obs = self._arg("obs", obs, (*lead, B, self.spec.obs_dim), np.float32, check_values=self._finite)
        action = self._arg(
            "action", action, (*lead, B), np.int32, check_values=lambda a: None if np.all(a >= 0) else "negative action"
        )
        reward = self._arg("reward", reward, (*lead, B), np.float32, check_values=self._finite)
        discount = self._arg(
            "discount",
            discount,
            (*lead, B),
            np.float32,
            check_values=lambda a: (
                None if np.all(np.isfinite(a) & (a >= 0) & (a <= 1)) else "must be finite and in [0, 1]"
            ),
        )
        if self.spec.store_next_obs:
            if next_obs is None:
                raise ValueError(
                    f"next_obs: required (float32 [{self._form}B, {self.spec.obs_dim}]) by a buffer with "
                    "store_next_obs=True"
                )
            next_obs = self._arg(
                "next_obs", next_obs, (*lead, B, self.spec.obs_dim), np.float32, check_values=self._finite
            )
        elif next_obs is not None:
            raise ValueError(
                "next_obs: this buffer takes s_{t+n} from the ring; construct it with store_next_obs=True to store it"
            )
        self._ops.insert(self.spec, self.bufs, obs, action, reward, discount, next_obs)
        if self._capturing():
            self._added_host = None
        elif self._added_host is not None:
            self._added_host += B

    def reserve(self, batch_size: int) -> None:
        """Allocate the output buffers of ``batch_size`` (do this before capturing a sample)."""
        B = batch_size
        if B not in self._batches:
            if self._capturing():
                raise ValueError(f"batch_size: buffers for {B} do not exist yet; call reserve({B}) before the capture")
            xp, W, lead = self.xp, self.spec.obs_dim, self._lead
            self._batches[B] = (
                xp.zeros((*lead, B), np.int32),
                xp.zeros((*lead, B), np.float32),
                xp.zeros((*lead, B), np.int64),
                Batch(
                    xp.zeros((*lead, B, W), np.float32),
                    xp.zeros((*lead, B, W), np.float32),
                    xp.zeros((*lead, B), np.int32),
                    xp.zeros((*lead, B), np.float32),
                    xp.zeros((*lead, B), np.float32),
                ),
            )

    def _check_batch_size(self, batch_size) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        B = int(batch_size)
        if self._added_host is not None:
            ready = _ref.ready_count(self.capacity, self.spec.lag, self._added_host)
            if B > ready:
                raise ValueError(f"batch_size: {B} is larger than the {ready} rows ready to sample")
        return B

    def sample(self, batch_size: int, side=None, out: Batch | None = None, windows=None, windows_out=None):
        """Draw ``batch_size`` rows with probability ``p_i**alpha / sum_k p_k**alpha`` (stratified).

        Returns ``(indices int32 [B], weights float32 [B])``, views of buffers this object owns
        that the next ``sample`` of the same size overwrites. ``weights = (N P(i))**-beta`` divided
        by their maximum over the batch. Advances the device step counter (and so beta).

        ``side`` (a :class:`cudarl.graph.SideStream`): the weights are computed on it, beside
        whatever follows the search; the caller joins it before reading ``weights``.
        ``out`` (a :class:`Batch`): the rows found are also gathered into it, as :meth:`gather`
        would (on the GPU in the search's launch: one launch fewer).
        ``windows`` (a :class:`cudarl.window.Windows`, with ``out`` of state rows) and ``windows_out``
        (float32 ``[2B, windows.width]``): the observation windows of ``out.obs`` into its first ``B``
        rows and of ``out.next_obs`` into the rest, what ``windows.gather`` of them writes (on the GPU
        in the same launch: one launch fewer again).
        """
        B = self._check_batch_size(batch_size)
        self.reserve(B)
        idx, w, qsel, _ = self._batches[B]
        if windows is not None:
            if out is None or windows_out is None:
                raise ValueError("sample: windows needs out (the state rows) and windows_out [2B, width]")
            self._check_out(out, B)
            self._ops.sample_search_gather_windows(
                self.spec, self.bufs, idx, qsel, *out, windows.features, windows.sign, windows.window,
                windows_out[..., :B, :], windows_out[..., B:, :],
            )  # fmt: skip
        elif out is not None:
            self._check_out(out, B)
            self._ops.sample_search_gather(self.spec, self.bufs, idx, qsel, *out)
        else:
            self._ops.sample_search(self.spec, self.bufs, idx, qsel)
        if side is None:
            self._sample_weights(qsel, w)
        else:
            with side.fork():
                self._sample_weights(qsel, w)
        return idx, w

    def _sample_weights(self, qsel, w) -> None:
        """The importance weights of the sampled leaves ``qsel`` into ``w`` (beta and step advance)."""
        self._ops.sample_weights(self.spec, self.bufs, qsel, w)

    def gather(self, indices, out: Batch | None = None) -> Batch:
        """Gather rows ``indices`` (int32 ``[B]``, as returned by ``sample``) with their n-step targets.

        Writes into ``out`` (the trainer's fixed buffers) or into buffers this object owns.
        """
        B = self._indices_batch(indices)
        indices = self._arg("indices", indices, (*self._lead, B), np.int32, check_values=self._index_check)
        if out is None:
            self.reserve(B)
            out = self._batches[B][3]
        self._check_out(out, B)
        self._ops.gather(self.spec, self.bufs, indices, *out)
        return out

    def _indices_batch(self, indices) -> int:
        """``B`` of an ``indices`` argument ``[B]`` (``[P, B]`` with members), refused when not of that form."""
        if not hasattr(indices, "shape") or len(indices.shape) != 1 + len(self._lead) or indices.shape[-1] < 1:
            raise ValueError(
                f"indices: expected an int32 array [{self._form}B], "
                f"got {getattr(indices, 'shape', type(indices).__name__)}"
            )
        return int(indices.shape[-1])

    def _check_out(self, out: Batch, B: int) -> None:
        W, lead = self.spec.obs_dim, self._lead
        for name, a, shape, dt in (
            ("out.obs", out.obs, (*lead, B, W), np.float32),
            ("out.next_obs", out.next_obs, (*lead, B, W), np.float32),
            ("out.action", out.action, (*lead, B), np.int32),
            ("out.ret", out.ret, (*lead, B), np.float32),
            ("out.discount", out.discount, (*lead, B), np.float32),
        ):
            if (
                type(a).__module__.split(".")[0] != self.xp.__name__
                or a.dtype != dt
                or tuple(a.shape) != shape
                or not a.flags.c_contiguous
            ):
                raise ValueError(f"{name}: expected a C-contiguous {self.xp.__name__} {np.dtype(dt)} array {shape}")

    def _index_check(self, a):
        return None if np.all((a >= 0) & (a < self.capacity)) else f"indices must lie in [0, {self.capacity})"

    def update_priorities(self, indices, td, device_rules: bool = False) -> None:
        """Set ``p_i = (|td_i| + eps)**alpha`` (fixed point) for rows ``indices``.

        Args:
            indices: int32 ``[B]``; td: float32 ``[B]``.
            device_rules: apply the device rules to NumPy ``td`` too instead of raising (the
                trainer's step does, so a NaN loss reaches the guard on both backends).
        When an index appears more than once, its last occurrence in batch order wins. NumPy
        arguments with NaN/inf ``td`` or out-of-range indices raise; CuPy arguments follow the
        device rules (that priority left unchanged, status bit set). Rows that are no longer
        ready (overwritten since they were sampled) keep their priority.
        """
        B = self._indices_batch(indices)
        indices = self._arg("indices", indices, (*self._lead, B), np.int32, check_values=self._index_check)
        td = self._arg("td", td, (*self._lead, B), np.float32, check_values=None if device_rules else self._finite)
        self._update_priorities(indices, td)

    def _update_priorities(self, indices, td) -> None:
        """The launch of :meth:`update_priorities` on checked arguments."""
        self._ops.update_priorities(self.spec, self.bufs, indices, td)

    def nbytes(self) -> int:
        """Bytes of every array the buffer holds (rows, tree, scratch, device scalars): about
        ``capacity * (row bytes + 24)`` plus the tree's internal nodes (docs/architecture.md)."""
        arrays = [v for v in vars(self.bufs).values() if v is not None]
        return int(sum(a.nbytes for a in arrays if a.base is None)) + int(self._scalars.buffer.nbytes)

    def priorities(self) -> np.ndarray:
        """``p_i**alpha`` of every slot as float64 ``[C]`` (0 = not ready; a device read)."""
        return _backend.to_numpy(self.bufs.tree[..., : self.capacity]).astype(np.float64) / _ref.SCALE

    # --- state --------------------------------------------------------------------------------
    @property
    def _row_names(self) -> tuple[str, ...]:
        return ("obs", "action", "reward", "discount") + (("next_obs",) if self.spec.store_next_obs else ())

    def state_dict(self) -> dict:
        """Every value needed to resume: rows, fixed-point priorities (int64 ``[C]``, ``p**alpha * 2**24``),
        ``added`` (write position = added mod C, size = min(added, C)), ``step``, ``max_priority``
        (fixed point), ``status``, and the constants for a compatibility check. NumPy values only.
        With ``store_next_obs`` the rows include ``next_obs`` float32 ``[C, obs_dim]``."""
        return self._state_of(self.bufs, self._scalars.get)

    def _state_of(self, bufs, scalar) -> dict:
        """:meth:`state_dict` of the buffers ``bufs`` (this buffer's, or a member's views) whose device scalar
        ``name`` is ``scalar(name)``."""
        state = {name: _backend.to_numpy(getattr(bufs, name)).copy() for name in self._row_names}
        state["priorities"] = _backend.to_numpy(bufs.tree[: self.capacity]).copy()
        state["added"] = int(scalar("added"))
        state["step"] = int(scalar("step"))
        state["max_priority"] = int(scalar("max_q"))
        state["status"] = int(scalar("status"))
        state["write_pos"] = state["added"] % self.capacity
        state["size"] = min(state["added"], self.capacity)
        return {**state, **self._state_constants()}

    def _state_constants(self) -> dict:
        """The constants a :meth:`state_dict` carries for the compatibility check."""
        state = {k: getattr(self.spec, k) for k in ("capacity", "obs_dim", "n_step", "n_envs")}
        if self.spec.store_next_obs:  # absent otherwise, so the default mode's state is as before
            state["store_next_obs"] = True
        state["priority_scale_bits"] = _ref.SCALE_BITS
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``. Everything is validated before anything is written."""
        arrays, scal = self._checked_state(state)
        self._write_state(self.bufs, arrays, scal, self._scalars.set)
        self._added_host = scal["added"]

    def _checked_state(self, state: dict) -> tuple[dict, dict]:
        """The rows and priorities (``arrays``) and the counters (``scal``) of a :meth:`state_dict`, each
        checked against this buffer's constants (nothing is written)."""
        missing = [
            k
            for k in (
                *self._row_names,
                "priorities",
                "added",
                "step",
                "max_priority",
                "status",
                "capacity",
                "obs_dim",
                "n_step",
                "n_envs",
            )
            if k not in state
        ]
        if missing:
            raise ValueError(f"state: missing {missing}")
        for k in ("capacity", "obs_dim", "n_step", "n_envs"):
            if int(state[k]) != getattr(self.spec, k):
                raise ValueError(f"state[{k!r}]: {state[k]} does not match this buffer's {getattr(self.spec, k)}")
        # states written before the option existed have no key: they stored no next_obs
        if bool(state.get("store_next_obs", False)) != self.spec.store_next_obs:
            raise ValueError(
                f"state['store_next_obs']: {state.get('store_next_obs', False)} does not match this buffer's "
                f"{self.spec.store_next_obs}"
            )
        if int(state.get("priority_scale_bits", _ref.SCALE_BITS)) != _ref.SCALE_BITS:
            raise ValueError("state['priority_scale_bits']: a different fixed-point scale")
        C, D = self.capacity, self.spec.obs_dim
        arrays = {}
        fields = {
            "obs": ((C, D), np.float32),
            "action": ((C,), np.int32),
            "reward": ((C,), np.float32),
            "discount": ((C,), np.float32),
            "next_obs": ((C, D), np.float32),
            "priorities": ((C,), np.int64),
        }
        for name in (*self._row_names, "priorities"):
            shape, dt = fields[name]
            a = np.asarray(_backend.to_numpy(state[name]))
            if a.dtype != dt or a.shape != shape:
                raise ValueError(f"state[{name!r}]: expected {np.dtype(dt)} {shape}, got {a.dtype} {a.shape}")
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                raise ValueError(f"state[{name!r}]: contains NaN or inf")
            arrays[name] = np.ascontiguousarray(a)
        scal = {}
        for k in ("added", "step", "max_priority", "status"):
            v = state[k]
            if isinstance(v, (bool, float, np.floating)) or int(v) < 0:
                raise ValueError(f"state[{k!r}]: expected a non-negative integer, got {v!r}")
            scal[k] = int(v)
        pr = arrays["priorities"]
        if np.any(pr < 0) or np.any(pr > _ref.Q_MAX):
            raise ValueError("state['priorities']: fixed-point priorities must lie in [0, 2**40]")
        ready = np.zeros(C, bool)
        ready[_ref.ready_slots(C, self.spec.lag, scal["added"])] = True
        if np.any(pr[ready] < 1) or np.any(pr[~ready] != 0):
            raise ValueError("state['priorities']: must be >= 1 exactly on the ready rows and 0 elsewhere")
        if not 1 <= scal["max_priority"] <= _ref.Q_MAX:
            raise ValueError("state['max_priority']: must lie in [1, 2**40]")
        return arrays, scal

    def _write_state(self, bufs, arrays: dict, scal: dict, set_scalar) -> None:
        """Write a :meth:`_checked_state` into ``bufs`` (this buffer's, or a member's views) and its device
        scalars through ``set_scalar(name, value)``; the tree's inner nodes are rebuilt from the leaves."""
        if self._capturing():
            raise ValueError("state: load_state_dict inside a capture")
        C, xp = self.capacity, self.xp
        for name in self._row_names:
            getattr(bufs, name)[...] = xp.asarray(arrays[name])
        bufs.tree[...] = 0
        bufs.tree[:C] = xp.asarray(arrays["priorities"])
        self._ops.build_tree(self.spec, bufs)
        set_scalar("added", scal["added"])
        set_scalar("step", scal["step"])
        set_scalar("max_q", scal["max_priority"])
        set_scalar("status", scal["status"])
