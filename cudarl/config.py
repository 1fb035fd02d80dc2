"""Every default of cudarl, in one place: frozen dataclasses with validated ranges.

A run's configuration is :class:`Config`: sections ``run``, ``data``, ``features``, ``env``,
``replay``, ``net``, ``optim``, ``agent``, ``guard``, ``eval``. The CLI and every entry point build it
from here (``Config()``, then a TOML file, then ``--set section.field=value`` overrides); a test
checks that the CLI's defaults are these. ``features`` and ``env`` are the dataclasses of
:mod:`cudarl.features` and :mod:`cudarl.env`, whose defaults live with them and nowhere else.

The NumPy backend runs the same step much slower, so :data:`CPU_DEFAULTS` scales the GPU
defaults down for it; fields the user sets explicitly are never touched.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .env import EnvConfig
from .features import FeatureConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range."""


def _need(section: str, ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{section}: {msg}")


def _in(section, name, v, lo, hi, integer=False, lo_open=False, hi_open=False):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (not integer or int(v) == v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    _need(
        section,
        ok,
        f"{name} must be {'an integer ' if integer else ''}in "
        f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}, got {v!r}",
    )


#: ``run.resume_checkpoint``'s choices: when ``latest.npz`` is written.
RESUME_CHECKPOINTS = ("eval", "end", "never")


@dataclass(frozen=True)
class RunConfig:
    """What to run and where the results go."""

    name: str = "cudarl"
    """Run name; the run directory is ``<out_dir>/<name>-<time>-<seed>`` (``-2``, ``-3``, ... if taken)."""
    seed: int = 0
    """Seed of every Philox stream (initialisation, sampling, exploration, environments). The environments'
    streams are keyed by ``cudarl.env.stream_seed(run.seed, env.seed)``, which is ``env.seed`` at ``run.seed
    = 0``."""
    steps: int = 10_000
    """Learner updates (train-graph replays). Measured on the GPU (docs/sweeps.md): over the 14,000
    training bars of ``builtin:regime?n=20000`` held-out Sharpe fell as updates grew from 5k to 50k
    (the net memorises the training noise); watch the validation Sharpe before training longer."""
    device: str = "auto"
    """``auto`` (GPU when usable), ``gpu`` or ``cpu``."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    eval_every: int = 2_000
    """Learner updates between validation evaluations (0: only at the end)."""
    checkpoint_every: int = 5_000
    """Learner updates between policy files ``checkpoints/step-N.safetensors`` (the resume checkpoint
    ``latest.npz``: ``run.resume_checkpoint``)."""
    resume_checkpoint: str = "eval"
    """When the resume checkpoint ``checkpoints/latest.npz`` (everything, the replay buffer too) is
    written. ``eval``: after each validation evaluation, at the end and on Ctrl-C or SIGTERM; ``end``:
    at the end and on Ctrl-C or SIGTERM only (a ``kill -9`` loses the run); ``never``: not at all (the
    run cannot be resumed; the guard's ``guard-stop.npz`` is still written). A sweep sets it from its
    spec's ``checkpoint``."""
    keep_best: bool = True
    """Write the policy file ``checkpoints/best.safetensors`` whenever the validation Sharpe improves
    (model selection on the validation split; more updates can overfit: docs/sweeps.md)."""
    log_every: int = 100
    """Learner updates between metric rows."""
    tensorboard: bool = False
    """Also write every number of ``metrics.jsonl`` to a TensorBoard event file in ``<run>/tensorboard/``
    (needs tensorboardX: ``pip install 'cudarl[tensorboard]'``)."""
    record: str = ""
    """Write the transitions the replay holds when the run ends to this file (a recorded behaviour policy
    for offline training; CLI ``--record``; format: cudarl/experience.py). Empty: none."""
    offline: str = ""
    """Train from the transitions recorded in this file (``run.record``) without collecting any (CLI
    ``--offline``); the replay buffer holds the recording's last ``replay.capacity`` rows. Empty: online."""
    grid_barrier: bool = True
    """GPU: let the train step's C51 targets-and-loss (with PopArt), its optimiser update and Gradient
    Vaccine's grad phase (``agent.aux`` with ``vaccine``) each be one launch whose blocks wait for one another
    (``cudarl::grid_barrier``; grid at most one block per SM). ``false``: the same bits in two and three
    launches (vaccine's: two). Turn it off when other processes share the GPU
    at once (MPS, as ``tools/gpu_sweep.sh`` runs): their kernels may hold the SMs a launch's last blocks
    wait for. ``true`` permits the one launches: the single agent takes them; a joined population
    (``run.population = "joined"``) takes each only where every member still gets the blocks one agent
    gets alone, ``SMs // P >= min(full grid, SMs)`` (:func:`cudarl.kernels.barrier_grid_fits`; the
    reference sizes: P = 1 only), and the barrier-free launches otherwise, two each (the launchers choose:
    ``c51.targets_loss_popart_one_launch``, ``optim.clip_adam_soft_one_launch``; a joined population has no
    auxiliary signals)."""
    population: str = "branches"
    """How :class:`cudarl.population.Population` (sweeps) trains its members. ``branches``: each member's own
    train and collect phases on a parallel branch of one graph (any configuration; P times the nodes).
    ``joined``: one launch per operation for every member (issue 23's agent axis: the stacked network,
    optimiser, loss, replay and environments; docs/perf-notes.md, "The agent axis, in stages"), member
    ``i`` bitwise the agent alone. ``joined`` takes the reference configuration only (MLP encoder without
    LayerNorm, dueling C51, ``net.gemm`` ``"cublaslt_nosplit"`` or ``"chain"``, no spectral norm, plan head, auxiliary
    signals or CQL, acting by the mean), members that differ in seeds, host-side settings and the per-member
    settings of ``cudarl.stacked_agent.MEMBER_SETTINGS`` (learning-rate schedule, Adam's constants, gamma,
    tau and epsilon schedules, PER alpha, eps and beta, costs, hold cap, fill, levels, PopArt's beta and
    warm-up, shrink-and-perturb), and no recording; anything else is refused naming the field. Each member's
    guard rolls back that member alone (its learning rate lowered alone), as a single run's. Its members
    write run directories and the checkpoints their Trainers alone would write."""

    def __post_init__(self):
        s = "run"
        _need(
            s,
            self.population in ("branches", "joined"),
            f"population must be branches or joined, got {self.population!r}",
        )
        _need(
            s,
            self.resume_checkpoint in RESUME_CHECKPOINTS,
            f"resume_checkpoint must be {', '.join(RESUME_CHECKPOINTS[:-1])} or {RESUME_CHECKPOINTS[-1]}, "
            f"got {self.resume_checkpoint!r}",
        )
        _need(
            s,
            bool(self.name) and "/" not in self.name,
            f"name must be a non-empty string without '/', got {self.name!r}",
        )
        _in(s, "seed", self.seed, 0, 2**63 - 1, integer=True)
        _in(s, "steps", self.steps, 1, 10**12, integer=True)
        _need(s, self.device in ("auto", "gpu", "cpu"), f"device must be auto, gpu or cpu, got {self.device!r}")
        for n in ("eval_every", "checkpoint_every"):
            _in(s, n, getattr(self, n), 0, 10**12, integer=True)
        _in(s, "log_every", self.log_every, 1, 10**12, integer=True)
        _need(s, not (self.record and self.offline), "record and offline: record a run that collects, or train offline")


@dataclass(frozen=True)
class DataConfig:
    """Which bars and how they are split (chronologically)."""

    source: str = "builtin:regime"
    """A CSV/Parquet path or ``builtin:<name>`` (synthetic: regime, ar, lag, ou, noise, randomwalk, canary;
    real: sp500, nasdaq, eurusd-1h)."""
    train_frac: float = 0.7
    """Fraction of usable bars for training (the earliest)."""
    val_frac: float = 0.15
    """Fraction for validation (next); the test split takes the rest."""
    periods_per_year: float = 0.0
    """Bars per year for annualised metrics; 0 infers it from the bar spacing (and records it)."""
    sort: bool = False
    """Sort rows by time instead of refusing unsorted data (CLI ``--sort``)."""
    dedupe: str = ""
    """``first`` or ``last``: keep that row of each duplicated time instead of refusing duplicates;
    empty: refuse them (CLI ``--dedupe``)."""
    drop_nan: bool = False
    """Drop rows with a NaN, inf or missing value instead of refusing them (CLI ``--drop-nan``)."""
    ffill: bool = False
    """Replace such rows by a flat bar at the previous close (CLI ``--ffill``)."""
    date_format: str = ""
    """A ``strptime`` format, or ``epoch_s`` / ``epoch_ms`` / ``epoch_us`` / ``epoch_ns``; empty: detect
    ISO, M/D/YYYY, dd.mm.YYYY or epoch numbers (CLI ``--date-format``)."""
    tz: str = "UTC"
    """Time zone of times without an offset, an IANA name (CLI ``--tz``)."""
    columns: tuple = ()
    """Column names by field, as ``"FIELD=NAME"`` strings, e.g. ``["close=Last"]`` (CLI ``--column``)."""
    extra_columns: tuple = ()
    """Further numeric columns to keep as features (CLI ``--extra``)."""

    def __post_init__(self):
        s = "data"
        _need(s, bool(self.source), "source must be given")
        _need(s, self.dedupe in ("", "first", "last"), f"dedupe must be first, last or empty, got {self.dedupe!r}")
        _need(s, not (self.drop_nan and self.ffill), "choose one of drop_nan and ffill")
        column_map(self.columns)
        _need(
            s,
            all(isinstance(c, str) and c for c in self.extra_columns),
            f"extra_columns must be column names, got {list(self.extra_columns)!r}",
        )
        if self.tz.upper() not in ("UTC", "Z", "GMT"):
            from zoneinfo import ZoneInfo

            try:
                ZoneInfo(self.tz)
            except (KeyError, ValueError):
                raise ConfigError(f"data: tz {self.tz!r} is not an IANA time zone (e.g. America/New_York)") from None
        _in(s, "train_frac", self.train_frac, 0, 1, lo_open=True, hi_open=True)
        _in(s, "val_frac", self.val_frac, 0, 1, lo_open=True, hi_open=True)
        _need(s, self.train_frac + self.val_frac < 1, "train_frac + val_frac must be < 1 (the test split needs bars)")
        _in(s, "periods_per_year", self.periods_per_year, 0, 1e8)


def column_map(pairs) -> dict:
    """``{"close": "Last"}`` from ``["close=Last"]`` (``data.columns``, CLI ``--column``)."""
    out = {}
    for p in pairs:
        field, eq, name = str(p).partition("=")
        if not eq or not field.strip() or not name.strip():
            raise ConfigError(f"data: columns takes FIELD=NAME entries (e.g. close=Last), got {p!r}")
        out[field.strip()] = name.strip()
    return out


def data_options(d: DataConfig) -> dict:
    """The keyword arguments of :func:`cudarl.data.load` that ``d`` sets (repairs and reading options)."""
    return {
        "sort": d.sort,
        "dedupe": d.dedupe or None,
        "drop_nan": d.drop_nan,
        "ffill": d.ffill,
        "date_format": d.date_format or None,
        "tz": d.tz,
        "columns": column_map(d.columns),
        "extra_columns": tuple(d.extra_columns),
    }


@dataclass(frozen=True)
class ReplayConfig:
    """Prioritized replay (Schaul et al. 2016), proportional variant."""

    capacity: int = 1_000_000
    """Transitions kept (below 2**23)."""
    alpha: float = 0.6
    """Priority exponent (0: uniform sampling)."""
    beta0: float = 0.4
    """Importance-weight exponent at the first sample."""
    beta_final: float = 1.0
    """Importance-weight exponent after ``beta_steps`` samples."""
    beta_steps: int = 100_000
    """Samples over which beta anneals linearly."""
    eps: float = 1e-6
    """Added to |TD| before the exponent."""
    n_step: int = 3
    """n of the n-step return. One for every member of a population (either mode): it sets how many
    collections come before the first update (``n_step`` more than the rows ``agent.learning_starts``
    needs), and members collect and update in step (``cudarl.stacked_agent.NOT_MEMBER_SETTINGS``)."""

    def __post_init__(self):
        s = "replay"
        _in(s, "capacity", self.capacity, 2, 2**23 - 1, integer=True)
        _in(s, "alpha", self.alpha, 0, 8)
        _in(s, "beta0", self.beta0, 0, 1)
        _in(s, "beta_final", self.beta_final, 0, 1)
        _in(s, "beta_steps", self.beta_steps, 1, 10**12, integer=True)
        _in(s, "eps", self.eps, 0, 1, lo_open=True)
        _in(s, "n_step", self.n_step, 1, 64, integer=True)


@dataclass(frozen=True)
class NetConfig:
    """The Q-network: an encoder and a distributional head."""

    encoder: str = "mlp"
    """The encoder of the observation window (``cudarl.nn.encoders.ENCODERS``): ``mlp`` (the widths
    ``hidden`` over the flat window), ``ssm`` (Mamba2 blocks: selective state space, Dao & Gu 2024) or
    ``attention`` (causal pre-norm transformer blocks with rotary positions). ``ssm`` and ``attention``
    read ``window``, ``d_model``, ``layers`` and their own ``ssm_*`` / ``attn_*`` fields (docs/encoders.md)."""
    window: int = 1
    """Bars the agent sees at each decision: the features of the last ``window`` bars up to the current
    one, oldest first (bars before the data's first are zeros), with the position and hold fraction on
    the newest bar. Replay rows and environments keep bar indices, not windows: the window is gathered
    from the feature matrix when sampling and acting (docs/architecture.md). ``ssm`` and ``attention``
    need at least 2 (attention at most 128)."""
    d_model: int = 128
    """Width of the temporal encoders' residual stream and of their output (``ssm``, ``attention``)."""
    layers: int = 2
    """Blocks of the temporal encoders (``ssm``, ``attention``)."""
    ssm_expand: int = 2
    """``ssm``: inner channels per ``d_model`` channel (E = ssm_expand * d_model)."""
    ssm_state: int = 64
    """``ssm``: state size N per group of heads."""
    ssm_headdim: int = 64
    """``ssm``: channels per head P (E / P heads, each with its own step and decay)."""
    ssm_groups: int = 1
    """``ssm``: groups of heads sharing the input-dependent B and C."""
    ssm_conv: int = 4
    """``ssm``: taps of the short causal convolution (2 to 8)."""
    ssm_chunk: int = 32
    """``ssm``: chunk length of the training scan (the chunked SSD form; the result does not depend on it
    beyond rounding, its shared memory does: docs/encoders.md)."""
    attn_heads: int = 4
    """``attention``: heads (d_model / attn_heads channels each, even and at most 64)."""
    attn_mlp_ratio: int = 4
    """``attention``: the MLP block's hidden width over ``d_model``."""
    head: str = "c51"
    """The distributional head and its learning rule (``cudarl.rules.HEAD_RULES``): ``c51`` (categorical,
    Bellemare et al. 2017), ``iqn`` (implicit quantiles, Dabney et al. 2018), ``qrdqn`` (quantile
    regression at ``n_quantiles`` fixed midpoints, Dabney et al. 2018) or ``c51+iqn`` (both C51 and IQN
    on one encoder, the sum of their losses, IQN on a branch of the train graph of its own; acts with
    C51's expected Q)."""
    hidden: tuple = (128, 128)
    """Encoder widths. Measured (docs/sweeps.md, sweeps 4-5, regime, 3 seeds, 10k updates): with batch
    256, 128-128 beat 256-256 with batch 512 for IQN (held-out Sharpe 2.77 +- 0.02 against 2.49 +- 0.04)
    and was level for C51 (2.65 +- 0.08 against 2.56 +- 0.14); 512-512 was less stable. The benchmarks'
    reference workload keeps 256-256."""
    layernorm: bool = False
    """LayerNorm before each ReLU of the encoder."""
    atoms: int = 51
    """C51 atoms."""
    v_min: float = -10.0
    """C51 support minimum (in reward units, or PopArt-normalised units when ``agent.popart``)."""
    v_max: float = 10.0
    """C51 support maximum."""
    n_quantiles: int = 32
    """IQN and QR-DQN quantiles per state (online and target)."""
    n_cos: int = 64
    """IQN cosine embedding size."""
    spectral: tuple = ()
    """Linear layers to spectrally normalise (Miyato et al. 2018; ``W / sigma_max(W)``, one power
    iteration per update), by name: ``enc.0``, ``enc.1``, ... (the encoder's), ``head.va`` (C51),
    ``head.out`` (IQN, QR-DQN); e.g. ``["enc.1"]``, the layer before the head (Gogianu et al. 2021).
    Empty: none."""
    plan: bool = False
    """The plan head on the encoder's output: conviction and readiness (sigmoids), trained by their own
    loss (``agent.plan_hurdle``). Where readiness >= 1/2 the gate opens and the position of the chosen
    action is scaled by conviction (fractional env positions, in training and evaluation); elsewhere the
    gate returns exactly 1, so an untrained head changes nothing (docs/guide.md)."""
    tf32: bool = False
    """Let cuBLAS use TF32 tensor cores for the network's GEMMs, and with ``encoder = "ssm"`` run the chunked
    scan's matrix products on them too (``ssm.ssd_forward_tc`` / ``ssd_backward_tc``; docs/encoders.md) (GPU;
    ~1e-3 relative error)."""
    gemm: str = "cublaslt_nosplit"
    """GEMMs of the linear layers (GPU): ``cublas`` (cuBLAS, then the bias/activation kernel),
    ``cublaslt`` (the forward as one cuBLASLt GEMM with the bias and ReLU fused into its epilogue;
    sigmoid layers keep the kernel), ``cublaslt_nosplit`` (``cublaslt``, and the forward and the
    input-gradient GEMMs limited to one-kernel algorithms, no split-K reduction kernels; the weight
    gradients are ``dw_gemm``'s), ``cudarl`` (the panel GEMMs of ``cuda_src/gemm.cu`` for the
    forward and input gradients where they take the shape, else ``cublaslt_nosplit``) or ``chain``
    (``cublaslt_nosplit``, except that the forward of an ``mlp`` encoder's layers, and of the C51 head's
    first, is one launch of ``cuda_src/gemm.cu``'s chain where it takes them: float32, no TF32, layernorm,
    spectral norm or input gate, widths multiples of 4 up to 256, compute capability 9.0 or later; each
    layer's output the panel GEMM's bits), and where that launch held the C51 head's first layer (an extra
    head that writes dL/dpsi first is added in, before the mask) the backward's dx chain, from dL/dva down to
    the first layer's dz, is one launch too (each step the panel GEMM's and the ReLU mask's bits); a joined
    population's members run theirs as one launch each for all members (``cudarl.nn.StackedQNetwork``). Same
    math to float32 rounding. The train step on an H100 at 01da88f: 97.8 us with ``cublaslt_nosplit``, 107.8
    ``cudarl``, 121.2 ``cublaslt``, 125.4 ``cublas``, 129.3 ``chain`` (slower: docs/perf-notes.md,
    thirty-first session) (``tools/bench_step.py``; docs/gpu-report.md)."""
    dw_gemm: str = "split_k"
    """The algorithm of the linear layers' weight-gradient GEMMs ``dW = x^T dz`` (GPU), under every ``gemm``:
    ``split_k`` (cuBLAS, whose heuristic splits K, the batch, into partial sums and a reduction kernel) or
    ``one_kernel`` (cuBLASLt limited to one-kernel algorithms, ``cudarl.blas.gemm_lt(split_k=False)``, on
    operands aligned to 16 bytes, as the train step's are; others keep cuBLAS). The same math to float32
    rounding, not the same bits. A joined population (``run.population = "joined"``) reads it too: with
    ``one_kernel`` each layer's dW is one strided-batched GEMM over every member
    (``cudarl.blas.gemm_lt_batched``), whose entry ``i`` is the single ``one_kernel`` GEMM bit for bit;
    with ``split_k`` a GEMM per member. Either way member ``i`` equals the agent alone under the same
    setting. The trade, predicted from the dW GEMMs timed alone (docs/perf-notes.md, "The agent axis, in
    stages"): ``one_kernel`` costs one agent a little and saves a population much. The NumPy backend
    computes the same product either way."""
    gemm_algo: str = "heuristic"
    """The algorithm of the linear layers' one-kernel cuBLASLt GEMMs (GPU: the forward and input-gradient
    GEMMs under ``gemm = "cublaslt_nosplit"`` or ``"cudarl"``, the weight gradients' under
    ``dw_gemm = "one_kernel"``): ``heuristic`` runs cuBLASLt's heuristic's first one-kernel algorithm;
    ``probe``, when each plan is made (before capture), asks the heuristic for its other one-kernel
    candidates, keeps those whose output on random inputs of the plan's shapes is bitwise the first's,
    times them and the first there and adopts the fastest (``cudarl.blas.gemm_lt(algo="probe")``, the
    probe of ``batched_algo = "probe"`` for a batch of one; ``cudarl.blas.batched_plan_info`` says what each
    plan chose). Same bits as ``heuristic`` wherever the probe's evidence holds (it is evidence on its
    inputs, not a proof); its verdicts are kept on disk as ``batched_algo``'s. The NumPy backend ignores it."""
    batched_algo: str = "single"
    """The algorithm of a joined population's strided-batched cuBLASLt GEMMs (``run.population = "joined"``;
    GPU; ``cudarl.blas.BATCHED_ALGOS``): ``single`` runs the algorithm the single agent's plan chose for one
    member (every member bit for bit the agent alone, by construction); ``probe`` asks cuBLASLt's heuristic
    for the batched problem's own candidates when each batched plan is made (before capture), keeps those
    whose output on random inputs of the real shapes is bitwise the single algorithm's, times them and the
    single one there and adopts the fastest (the single one when it is fastest or none is equal;
    ``cudarl.blas.batched_plan_info`` says what each plan probed, timed and chose). The batch-1 algorithm picks
    tiles for one member's GEMM, small for P of them (docs/perf-notes.md, "Batched GEMM algorithms").
    A probe is evidence of equal bits on its inputs, not a proof for every input. Its verdict is kept on
    disk (``$CUDARL_CACHE_DIR/probes``, ``cudarl.probe_cache``), keyed by the problem, the single algorithm,
    the GPU model and the cuBLASLt and driver versions, so a later run takes it without probing again. The
    NumPy backend and a single agent ignore it."""

    def __post_init__(self):
        s = "net"
        from .blas import BATCHED_ALGOS
        from .nn.encoders import ENCODERS
        from .nn.layers import DW_GEMMS, GEMM_ALGOS, GEMMS
        from .rules import HEAD_RULES

        _need(s, self.encoder in ENCODERS, f"encoder must be one of {sorted(ENCODERS)}, got {self.encoder!r}")
        _need(s, self.head in HEAD_RULES, f"head must be one of {sorted(HEAD_RULES)}, got {self.head!r}")
        _need(
            s,
            len(self.hidden) >= 1 and all(isinstance(h, int) and 1 <= h <= 65536 for h in self.hidden),
            f"hidden must be a non-empty list of widths in [1, 65536], got {self.hidden!r}",
        )
        _in(s, "atoms", self.atoms, 2, 1024, integer=True)
        _need(
            s,
            math.isfinite(self.v_min) and math.isfinite(self.v_max) and self.v_min < self.v_max,
            f"need v_min < v_max, got {self.v_min}, {self.v_max}",
        )
        _need(
            s,
            all(isinstance(x, str) and x for x in self.spectral) and len(set(self.spectral)) == len(self.spectral),
            f"spectral must be a list of distinct layer names, got {list(self.spectral)!r}",
        )
        _in(s, "n_quantiles", self.n_quantiles, 1, 1024, integer=True)
        _in(s, "n_cos", self.n_cos, 1, 1024, integer=True)
        _need(s, self.gemm in GEMMS, f"gemm must be one of {list(GEMMS)}, got {self.gemm!r}")
        _need(s, self.dw_gemm in DW_GEMMS, f"dw_gemm must be one of {list(DW_GEMMS)}, got {self.dw_gemm!r}")
        _need(s, self.gemm_algo in GEMM_ALGOS, f"gemm_algo must be one of {list(GEMM_ALGOS)}, got {self.gemm_algo!r}")
        _need(
            s,
            self.batched_algo in BATCHED_ALGOS,
            f"batched_algo must be one of {list(BATCHED_ALGOS)}, got {self.batched_algo!r}",
        )
        self._check_window_encoder(s)

    def _check_window_encoder(self, s: str) -> None:
        """The temporal encoders' sizes, each error naming its fields."""
        from .nn.encoders.attention import MAX_HEAD_DIM, MAX_WINDOW
        from .reference.ssm import CONV_MAX_K, MAX_SHARED, backward_shared

        _in(s, "window", self.window, 1, 4096, integer=True)
        for name in ("d_model", "layers", "ssm_expand", "ssm_state", "ssm_headdim", "ssm_groups", "ssm_chunk"):
            _in(s, name, getattr(self, name), 1, 65536, integer=True)
        _in(s, "attn_heads", self.attn_heads, 1, 1024, integer=True)
        _in(s, "attn_mlp_ratio", self.attn_mlp_ratio, 1, 64, integer=True)
        _in(s, "ssm_conv", self.ssm_conv, 2, CONV_MAX_K, integer=True)
        if self.encoder not in ("ssm", "attention"):
            return
        _need(s, self.window >= 2, f"encoder {self.encoder} reads a window of bars: set window >= 2, got {self.window}")
        if self.encoder == "ssm":
            inner = self.ssm_expand * self.d_model
            _need(
                s,
                inner % self.ssm_headdim == 0 and (inner // self.ssm_headdim) % self.ssm_groups == 0,
                f"ssm_expand * d_model = {inner} channels must split into heads of ssm_headdim = {self.ssm_headdim}, "
                f"their number a multiple of ssm_groups = {self.ssm_groups}",
            )
            smem = 4 * backward_shared(self.ssm_chunk, self.ssm_headdim, self.ssm_state, self.tf32)
            _need(
                s,
                smem <= MAX_SHARED,
                f"the scan's backward needs {smem} bytes of shared memory a block (> {MAX_SHARED}): lower "
                f"ssm_chunk ({self.ssm_chunk}), ssm_headdim ({self.ssm_headdim}) or ssm_state ({self.ssm_state})",
            )
        if self.encoder == "attention":
            hd = self.d_model // self.attn_heads
            _need(
                s,
                self.d_model % self.attn_heads == 0 and hd % 2 == 0 and hd <= MAX_HEAD_DIM,
                f"d_model / attn_heads = {self.d_model} / {self.attn_heads} must be an even integer <= {MAX_HEAD_DIM}",
            )
            _need(s, self.window <= MAX_WINDOW, f"encoder attention takes window <= {MAX_WINDOW}, got {self.window}")


@dataclass(frozen=True)
class OptimConfig:
    """Adam(W) with global-norm clipping and a device-side learning-rate schedule."""

    lr: float = 1e-4
    """Peak learning rate."""
    lr_min: float = 0.0
    """Floor of the cosine schedules."""
    schedule: str = "constant"
    """``constant``, ``cosine`` or ``cosine_restarts``."""
    warmup: int = 0
    """Linear warm-up updates."""
    period: int = 10_000
    """Cosine length (first cycle for restarts)."""
    mult: int = 1
    """Cycle-length multiplier between warm restarts."""
    restart_m_scale: float = 1.0
    """Factor on Adam's first moment at each warm restart."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.999
    """Adam's second-moment decay."""
    eps: float = 1e-8
    """Adam's epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (weights only, not biases or norms)."""
    max_grad_norm: float = 10.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    shrink_every: int = 0
    """Shrink-and-perturb (Ash & Adams 2020) every this many learner updates: every parameter of the
    online network becomes ``shrink * theta + perturb * N(0, 1)`` between two updates (the target
    follows by the soft update). 0: never."""
    shrink: float = 0.8
    """Shrink-and-perturb's factor on the parameters (read with ``shrink_every``)."""
    perturb: float = 0.01
    """Shrink-and-perturb's noise standard deviation (read with ``shrink_every``)."""

    def __post_init__(self):
        s = "optim"
        from .reference.optim import SCHEDULES

        _in(s, "lr", self.lr, 0, 1, lo_open=True)
        _in(s, "lr_min", self.lr_min, 0, self.lr)
        _need(s, self.schedule in SCHEDULES, f"schedule must be one of {sorted(SCHEDULES)}, got {self.schedule!r}")
        _in(s, "warmup", self.warmup, 0, 10**12, integer=True)
        _in(s, "period", self.period, 1, 10**12, integer=True)
        _in(s, "mult", self.mult, 1, 1000, integer=True)
        _in(s, "restart_m_scale", self.restart_m_scale, 0, 1)
        _in(s, "beta1", self.beta1, 0, 1, hi_open=True)
        _in(s, "beta2", self.beta2, 0, 1, hi_open=True)
        _in(s, "eps", self.eps, 0, 1, lo_open=True)
        _in(s, "weight_decay", self.weight_decay, 0, 1)
        _in(s, "max_grad_norm", self.max_grad_norm, 0, 1e9)
        _in(s, "shrink_every", self.shrink_every, 0, 10**12, integer=True)
        _in(s, "shrink", self.shrink, 0, 1)
        _in(s, "perturb", self.perturb, 0, 10)


#: ``agent.act_by``: the risk measures acting can use, and their codes in the act kernels (cuda_src/agent.cu).
ACT_BY = {"mean": 0, "cvar": 1, "mean_std": 2}
#: Gradient Vaccine's parameter scopes (``agent.vaccine_scope``).
VACCINE_SCOPES = ("encoder", "last")
#: ``agent.aux_gemm``: ``net`` (the network's ``net.gemm``) or one of ``net.gemm``'s layer-by-layer choices
#: (``chain`` is a whole network's forward in one launch, not a choice for a pass's layers).
AUX_GEMMS = ("net", "cublas", "cublaslt", "cublaslt_nosplit", "cudarl")


@dataclass(frozen=True)
class AgentConfig:
    """The learning rule: targets, exploration, target network, regularisers."""

    gamma: float = 0.99
    """Discount per bar."""
    batch_size: int = 256
    """Transitions per learner update (256: docs/sweeps.md, sweeps 4-5; 256, 512 and 1024 were level
    for C51, 256 better for IQN)."""
    updates_per_collect: int = 1
    """Learner updates per collection step (one step of every environment)."""
    learning_starts: int = 2_000
    """Transitions in the replay before the first update."""
    eps_start: float = 1.0
    """Exploration epsilon at the first collection step."""
    eps_end: float = 0.02
    """Exploration epsilon after ``eps_steps`` collection steps."""
    eps_steps: int = 20_000
    """Collection steps over which epsilon decays linearly (on the device). 20k beat 5k for C51 (held-out
    Sharpe 2.75 +- 0.03 against 2.56 +- 0.14) and was level with it for IQN (docs/sweeps.md, sweeps 4-5);
    with the default 10k updates (one per collection step) epsilon is still about 0.5 when training
    ends (the schedule's arithmetic), so the replay stays diverse."""
    tau_start: float = 0.005
    """Soft target-update rate at the first update."""
    tau_end: float = 0.005
    """Soft target-update rate after ``tau_period`` updates (cosine annealed)."""
    tau_period: int = 1
    """Updates over which tau anneals."""
    priority: str = "kl"
    """Replay priority signal of C51: ``kl`` (KL(target || prediction)) or ``ce`` (cross-entropy)."""
    kappa: float = 1.0
    """Huber threshold of the IQN quantile loss."""
    popart: bool = True
    """Map returns into normalised coordinates with PopArt statistics before the targets (docs/guide.md). C51:
    without it bar returns of a few basis points fill one or two atoms; IQN: quantiles of unit scale."""
    popart_beta: float = 3e-4
    """PopArt's statistics step size."""
    popart_warmup: int = 2_000
    """Learner updates during which PopArt's statistics move; then they are frozen (0: they never stop).
    C51's atoms are fixed, so while the statistics move each atom's return ``s z + mu`` moves under the
    learned distribution; frozen, its meaning cannot drift (docs/guide.md). The quantile heads rescale
    their last layer with every update, so their outputs keep their meaning either way. A fifth of the
    default budget: while updates << 1 / ``popart_beta`` the bias-corrected statistics weigh every batch
    so far about equally, so after a few hundred batches they barely move; ``tools/gpu_mechanisms.sh``
    measures it against never freezing."""
    cql_alpha: float = 0.0
    """Weight of discrete CQL (Kumar et al. 2020, ``alpha (logsumexp_a Q(s, a) - Q(s, a_data))`` on the
    head's expected Q) added to the loss: it pushes down the values of actions the data did not take,
    for offline training (``cudarl-train train --offline``). 0: off."""
    plan_hurdle: float = 0.1
    """The plan head's readiness clears 1/2 (its gate opens) where the greedy trade's expected n-step
    return exceeds this many times the batch's mean absolute return; without an edge readiness settles
    at 1 / (2 (1 + hurdle)) (cudarl.reference.nn.plan_loss). Read with ``net.plan``."""
    train_cost_bps: float = 0.0
    """Extra cost per unit of position change charged in the training environments' reward only (added
    to ``env.slippage_bps`` there; evaluation keeps the true costs): a turnover penalty against trading
    on noise. 0: the training reward is the evaluation's."""
    input_noise: float = 0.0
    """Standard deviation of zero-mean noise added to the feature columns (not the position columns) of
    the sampled observation windows ``s`` of every train step, in normalised feature units; everything
    the learner computes at ``s`` reads the noisy windows (the forward, its backward, the auxiliary
    signals), while ``s'``, acting and evaluation read clean ones. The draws are fresh each update (keyed
    by the optimiser's step: a resumed run draws the same). Training with input noise of variance
    ``s^2`` is Tikhonov regularisation of weight ``s^2`` (Bishop 1995): on standardised inputs a linear
    body's ridge with a penalty of ``s^2`` per training row. Against an encoder memorising a weak signal
    (docs/results.md, issue 22's supervised twins). 0: off (no launch)."""
    act_by: str = "mean"
    """The risk measure of the learned return distribution the agent acts on, in the collect step, in
    evaluation and in a policy file: ``mean`` (expected Q), ``cvar`` (the mean of the lower
    ``act_alpha`` tail: C51 sums its atoms' mass up to ``act_alpha``, a part of the boundary atom; IQN
    draws its acting quantile fractions in ``[0, act_alpha)``, Dabney et al. 2018's distortion; QR-DQN
    averages its fixed quantiles over ``[0, act_alpha)``) or ``mean_std`` (mean minus ``act_lambda``
    standard deviations of the distribution). PopArt's normalisation is affine with a positive scale,
    so the choices are those of the return-space measures. docs/guide.md, "Risk-sensitive acting"."""
    act_alpha: float = 0.25
    """CVaR level of ``act_by = "cvar"``: the share of the return distribution's lower tail averaged, in
    (0, 1] (1: the mean, up to rounding)."""
    act_lambda: float = 1.0
    """Standard deviations subtracted from the mean with ``act_by = "mean_std"`` (>= 0; 0: the mean, up to
    rounding)."""
    aux: tuple = ()
    """Auxiliary signals by name (``cudarl.auxiliary.AUX_SIGNALS``): each adds its head on the encoder's
    output (if it has one), its phases to the train step and its observables (``aux.<name>.<what>``) to
    ``metrics.jsonl`` (docs/guide.md, "Auxiliary signals"). Built in: ``horizons``, ``risk``, ``denoise``,
    ``homeostatic``, ``causal``, ``vaccine``, ``selectivity``."""
    aux_horizons: tuple = (1, 4, 16, 64)
    """Bars ahead whose cumulative log return the ``horizons`` head predicts (ascending, distinct; each
    target is in units of the split's per-bar deviation times sqrt(bars)). Read with ``aux = ["horizons"]``."""
    aux_horizons_weight: float = 1.0
    """Weight of the ``horizons`` head's squared error in the loss (shared Adam; UNREAL-style auxiliary task)."""
    aux_risk_bars: int = 16
    """Bars ahead over which the ``risk`` head predicts realised volatility and drawdown."""
    aux_risk_weight: float = 1.0
    """Weight of the ``risk`` loss's gradient into the encoder (the shared Adam steps the encoder); the
    head's own step divides it out, so its rate is ``aux_risk_lr`` whatever the weight (> 0)."""
    aux_risk_lr: float = 0.01
    """Learning rate of the ``risk`` head's own optimiser step: plain SGD on its parameters inside the
    train graph (the seed's "risk SGD"); the shared Adam leaves the head alone."""
    aux_denoise_mask: float = 0.25
    """Share of the observation window's inputs the ``denoise`` signal zeroes (masking noise, Vincent et
    al. 2008) before its encoder pass reconstructs the clean window."""
    aux_denoise_lr: float = 1e-3
    """Learning rate of the ``denoise`` signal's own optimiser step: plain SGD on the encoder and its
    decoder from the reconstruction's gradient, inside the train graph (the shared Adam never sees it)."""
    aux_batch: float = 0.125
    """Share of the batch the ``denoise`` and ``causal`` passes run over, in (0, 1]: :attr:`aux_rows` =
    ``ceil(aux_batch * batch_size)`` rows, spread evenly over the batch (row ``r`` of the sub-batch is
    batch row ``floor(r B / R)``). Spread, not the first rows: the replay's prioritised sampling is
    stratified (batch row ``j`` is drawn from the ``j``-th of ``B`` equal slices of the priority mass, in
    slot order), so the first rows all come from the start of the buffer, while rows spread over the
    batch are a stratified sample of the whole buffer, one from every ``B / R`` strata. Each of the two
    passes runs the encoder once more, forward and backward, so its cost grows with its rows; its loss
    is a mean over the sub-batch (the same expectation as over the whole batch, with about ``B / R``
    times the variance). 0.125 (32 rows of the default 256): on an H200 at 2664cc6 all seven signals
    then add 21.5% to the SSM encoder's train step, against 46.8% at 0.25 (issue 19's bound is 40%;
    22.9% on an H100 at 20a3871, whose SSM step is 2.5 times shorter),
    while the main Q loss, which the signals only shape, keeps every row; ``tools/bench_aux.py``
    measures it against 1 (every row, the cost and the bits of the passes before this field)."""
    aux_gemm: str = "net"
    """GEMMs of the ``denoise`` and ``causal`` passes over their :attr:`aux_rows` rows (GPU): ``net`` (as the
    network's, ``net.gemm``), or one of ``net.gemm``'s other choices for those passes only, e.g. ``cudarl``
    (the panel GEMMs, which stage the whole K panel at once) or ``cublaslt`` (cuBLASLt, free to split K).
    Measured on an H100 (docs/perf-notes.md, thirty-second session): at 64 rows the panel GEMM takes 5.7 us
    in a graph against cuBLASLt's 6.8, but the train step with the signals moved by -2.6 to +1.5 us, within
    the spread of a run, so the default stays ``net``. The main step's GEMMs, the vaccine's backward (over
    the whole batch) and a population's stacked networks keep ``net.gemm``. Same math to float32 rounding,
    not the same bits; each choice is deterministic. The NumPy backend ignores it."""
    homeostatic_target: float = 0.5
    """Set point of the effective share of atoms ``exp(H(m)) / K`` (``m`` the batch-mean atom distribution)
    that ``agent.aux = ["homeostatic"]`` holds C51's atom utilisation at (cudarl.reference.homeostatic)."""
    homeostatic_weight: float = 1.0
    """Weight of the homeostatic loss ``(u - homeostatic_target)^2`` beside the head's loss."""
    causal_groups: tuple = ("calendar", "level")
    """Feature groups ``agent.aux = ["causal"]`` intervenes on, one a step in rotation: ``calendar`` (the
    date columns swapped with another sample's), ``level`` (the price-level columns likewise), ``offset``
    (every feature column shifted by ``causal_offset``; not by default: the shift moves the return
    columns too, which do matter, and on the CPU it inflated Q instead of removing a dependence). Groups
    this run's features lack are skipped."""
    causal_weight: float = 0.1
    """Weight of the causal penalty ``mean (Q(do(x)) - Q(x))^2`` (cudarl.reference.causal)."""
    causal_offset: float = 0.5
    """The ``offset`` intervention's shift, in normalised feature units."""
    selectivity_over: str = "features"
    """What ``agent.aux = ["selectivity"]`` gates: ``features`` (a gate per feature column, every bar) or
    ``positions`` (a gate per bar of the window, every feature); the position columns are never gated. Either
    way, on the MLP encoder the gate is folded into the first layer's weight (:mod:`cudarl.auxiliary.selectivity`)."""
    selectivity_l1: float = 1e-3
    """Weight of the selectivity gates' L1 penalty ``(1/J) sum_j sigmoid(l_j)`` (cudarl.reference.selectivity)."""
    vaccine_beta: float = 0.01
    """Rate of the EMA of Gradient Vaccine's target cosine (Wang et al. 2021's beta; ``agent.aux`` with
    ``"vaccine"`` and at least one signal with a head)."""
    vaccine_scope: str = "last"
    """The shared parameters Gradient Vaccine aligns the auxiliary heads' gradient with the main loss's on
    (Wang et al. 2021 apply it at a chosen granularity of the shared parameters: the whole model, per
    module, per layer): ``encoder`` (every ``enc.*`` parameter; its extra backward, the auxiliary heads'
    gradient alone, runs through the whole encoder) or ``last`` (the encoder's last layer, the one psi
    comes out of: the MLP's last Linear (and its LayerNorm), the SSM's and the attention encoder's last
    block's output projection (``out_proj``, ``fc2``) and the final RMSNorm; its extra backward stops
    after that layer's parameter gradients, a small part of a whole backward). The rest of the gradient
    is the step's full one either way (:mod:`cudarl.auxiliary.vaccine`). ``last``: on the temporal
    encoders the ``encoder`` backward costs about as much as the step's own backward, and the last layer
    is where the heads' gradients meet before anything else mixes them."""

    @property
    def aux_rows(self) -> int:
        """Rows of the ``denoise`` and ``causal`` passes: ``ceil(aux_batch * batch_size)``, in ``[1, batch_size]``
        (the product rounded to 6 decimals first, so 0.1 of 30 is 3 rows, not 4)."""
        B = self.batch_size
        return max(1, min(B, math.ceil(round(self.aux_batch * B, 6))))

    def __post_init__(self):
        s = "agent"
        _in(s, "gamma", self.gamma, 0, 1)
        _in(s, "batch_size", self.batch_size, 1, 1 << 20, integer=True)
        _in(s, "updates_per_collect", self.updates_per_collect, 1, 1024, integer=True)
        _in(s, "learning_starts", self.learning_starts, 1, 10**12, integer=True)
        _in(s, "eps_start", self.eps_start, 0, 1)
        _in(s, "eps_end", self.eps_end, 0, 1)
        _in(s, "eps_steps", self.eps_steps, 1, 10**12, integer=True)
        _in(s, "tau_start", self.tau_start, 0, 1, lo_open=True)
        _in(s, "tau_end", self.tau_end, 0, 1, lo_open=True)
        _in(s, "tau_period", self.tau_period, 1, 10**12, integer=True)
        _need(s, self.priority in ("kl", "ce"), f"priority must be kl or ce, got {self.priority!r}")
        _in(s, "kappa", self.kappa, 0, 1e6)
        _in(s, "popart_beta", self.popart_beta, 0, 1, lo_open=True)
        _in(s, "popart_warmup", self.popart_warmup, 0, 10**12, integer=True)
        _in(s, "plan_hurdle", self.plan_hurdle, 0, 100)
        _in(s, "cql_alpha", self.cql_alpha, 0, 1e6)
        _in(s, "train_cost_bps", self.train_cost_bps, 0, 1e4)
        _in(s, "input_noise", self.input_noise, 0, 10)
        hz = self.aux_horizons
        _need(s, len(hz) >= 1, "aux_horizons: at least one horizon")
        for k in hz:
            _in(s, "aux_horizons", k, 1, 1 << 16, integer=True)
        _need(s, list(hz) == sorted(set(hz)), f"aux_horizons must be ascending and distinct, got {list(hz)}")
        _in(s, "aux_horizons_weight", self.aux_horizons_weight, 0, 1e6)
        _in(s, "aux_risk_bars", self.aux_risk_bars, 1, 1 << 16, integer=True)
        _in(s, "aux_risk_weight", self.aux_risk_weight, 0, 1e6, lo_open=True)
        _in(s, "aux_risk_lr", self.aux_risk_lr, 0, 10)
        _in(s, "aux_denoise_mask", self.aux_denoise_mask, 0, 1, hi_open=True)
        _in(s, "aux_denoise_lr", self.aux_denoise_lr, 0, 10)
        _in(s, "aux_batch", self.aux_batch, 0, 1, lo_open=True)
        _need(s, self.aux_gemm in AUX_GEMMS, f"aux_gemm must be one of {list(AUX_GEMMS)}, got {self.aux_gemm!r}")
        _need(s, self.act_by in ACT_BY, f"act_by must be one of {list(ACT_BY)}, got {self.act_by!r}")
        _in(s, "act_alpha", self.act_alpha, 0, 1, lo_open=True)
        _in(s, "act_lambda", self.act_lambda, 0, 1e6)
        _in(s, "homeostatic_target", self.homeostatic_target, 0, 1, lo_open=True)
        _in(s, "homeostatic_weight", self.homeostatic_weight, 0, 1e6)
        _in(s, "causal_weight", self.causal_weight, 0, 1e6)
        _in(s, "causal_offset", self.causal_offset, -1e3, 1e3)
        _in(s, "vaccine_beta", self.vaccine_beta, 0, 1)
        _need(
            s,
            self.vaccine_scope in VACCINE_SCOPES,
            f"vaccine_scope must be one of {list(VACCINE_SCOPES)}, got {self.vaccine_scope!r}",
        )
        _need(
            s,
            self.selectivity_over in ("features", "positions"),
            f"selectivity_over must be features or positions, got {self.selectivity_over!r}",
        )
        _in(s, "selectivity_l1", self.selectivity_l1, 0, 1e6)
        object.__setattr__(self, "causal_groups", tuple(self.causal_groups))
        bad = [g for g in self.causal_groups if g not in ("calendar", "level", "offset")]
        _need(
            s,
            not bad and len(set(self.causal_groups)) == len(self.causal_groups) and self.causal_groups,
            f"causal_groups: each of calendar, level, offset at most once, got {list(self.causal_groups)}",
        )
        from .auxiliary import AUX_SIGNALS

        unknown = [name for name in self.aux if name not in AUX_SIGNALS]
        _need(s, not unknown, f"aux: no auxiliary signal named {unknown} (registered: {sorted(AUX_SIGNALS)})")
        _need(s, len(set(self.aux)) == len(self.aux), f"aux: a signal named twice in {list(self.aux)}")


@dataclass(frozen=True)
class GuardConfig:
    """What happens when a step's loss or gradient norm is NaN, inf or a spike (:mod:`cudarl.guard`)."""

    action: str = "rollback"
    """``stop`` or ``rollback`` (restore the last good snapshot and lower the learning rate)."""
    window: int = 50
    """Healthy losses the spike rule's median looks at."""
    spike_factor: float = 20.0
    """A loss above this times the window's median is a spike."""
    max_rollbacks: int = 3
    """Rollbacks before the guard stops training."""
    lr_factor: float = 0.5
    """Learning-rate multiplier after a rollback."""
    snapshot_every: int = 500
    """Learner updates between in-memory snapshots (the rollback point)."""
    min_atom_utilisation: float = 0.05
    """Collapse rule (C51): the guard trips when the atom utilisation (``atom_utilisation`` in
    metrics.jsonl: the share of atoms whose batch-mean probability exceeds 1/(10 atoms)) of each of
    the last ``window`` updates was below this; 0 turns the rule off. The seed system trained with 2%
    of its atoms in use."""

    def __post_init__(self):
        s = "guard"
        _need(s, self.action in ("stop", "rollback"), f"action must be stop or rollback, got {self.action!r}")
        _in(s, "window", self.window, 2, 10**6, integer=True)
        _in(s, "spike_factor", self.spike_factor, 1, 1e9, lo_open=True)
        _in(s, "max_rollbacks", self.max_rollbacks, 0, 1000, integer=True)
        _in(s, "lr_factor", self.lr_factor, 0, 1, lo_open=True)
        _in(s, "snapshot_every", self.snapshot_every, 1, 10**12, integer=True)
        _in(s, "min_atom_utilisation", self.min_atom_utilisation, 0, 1)


@dataclass(frozen=True)
class EvalConfig:
    """How a trained policy is evaluated and deployed: the statistics of every evaluation summary
    (docs/metrics.md) and the rules that decide which positions the trained policy takes outside
    the validation split."""

    trials: int = 1
    """Configurations tried before choosing this one (seeds of one configuration do not count): the
    number of trials of the deflated Sharpe ratio."""
    level: float = 0.95
    """Confidence level of the intervals (the Sharpe's bootstrap interval, the difference with buy-and-hold)."""
    resamples: int = 1000
    """Stationary-bootstrap resamples of each evaluation."""
    gate_psr: float = 0.95
    """Validation-gated deployment: outside the validation split the trained policy trades only when its
    validation evaluation (same weights) has a probabilistic Sharpe ratio against 0 of at least this;
    otherwise it stays flat, and the summary says so. 0 turns the gate off. Why it is on: a learner fits
    the noise of its training bars, and on a martingale its Q-value differences are as large as on a weak
    real edge (a margin on them cuts both alike, docs/results.md); only out-of-sample evidence tells
    them apart. 0.95 closes on 95% of no-edge policies and opens for a validation Sharpe above
    1.65 standard errors."""
    margin: float = 0.0
    """No-trade margin of the greedy policy in evaluation: it leaves the held position only for an action
    whose expected value exceeds the held one's by more than this, in the head's value units
    (PopArt-normalised returns with ``agent.popart``, the default). 0: the plain argmax."""

    average_halflife: int = 0
    """Evaluate and deploy an exponential moving average of the online network's weights (Polyak
    averaging), half-life in learner updates, updated every 10 updates, instead of the last weights:
    the policy of many recent updates rather than of the last one. 0: the online weights."""

    def __post_init__(self):
        s = "eval"
        _in(s, "trials", self.trials, 1, 10**9, integer=True)
        _in(s, "level", self.level, 0, 1, lo_open=True, hi_open=True)
        _in(s, "resamples", self.resamples, 10, 10**6, integer=True)
        _in(s, "gate_psr", self.gate_psr, 0, 1, hi_open=True)
        _in(s, "margin", self.margin, 0, 1e6)
        _in(s, "average_halflife", self.average_halflife, 0, 10**9, integer=True)


SECTIONS = {
    "run": RunConfig,
    "data": DataConfig,
    "features": FeatureConfig,
    "env": EnvConfig,
    "replay": ReplayConfig,
    "net": NetConfig,
    "optim": OptimConfig,
    "agent": AgentConfig,
    "guard": GuardConfig,
    "eval": EvalConfig,
}


@dataclass(frozen=True)
class Config:
    """A whole run's configuration."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    net: NetConfig = field(default_factory=NetConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        _need(
            "replay",
            self.replay.capacity > self.replay.n_step * self.env.n_envs * self.env.rows_per_step,
            f"capacity {self.replay.capacity} must exceed n_step * env.n_envs * rows per step",
        )
        _need(
            "env",
            not (self.env.counterfactual and self.replay.n_step != 1),
            "counterfactual rows are single transitions: they need replay.n_step = 1",
        )
        _need(
            "agent",
            not (self.run.record and self.agent.gamma == 0),
            "run.record needs gamma > 0 (the recording's episode ends are read from the discounts)",
        )
        _need("agent", self.agent.batch_size <= self.replay.capacity, "batch_size must not exceed replay.capacity")

    def to_dict(self) -> dict:
        """``{section: {field: value}}`` of every field (JSON- and TOML-ready)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def to_toml(self) -> str:
        """Every field as TOML (``cudarl-train train --config`` reads it back)."""
        return dumps_toml(self.to_dict())

    def with_overrides(self, overrides: dict) -> Config:
        """A copy with ``{section: {field: value}}`` applied (values validated)."""
        return from_dict(overrides, base=self)


#: Defaults for the NumPy backend, applied by :func:`resolve_for_backend` to fields the user did not set.
CPU_DEFAULTS = {
    "env": {"n_envs": 16, "episode_len": 256},
    "replay": {"capacity": 100_000},
    # the temporal encoders' widths too (they run only where net.encoder asks for them)
    "net": {"hidden": (64, 64), "d_model": 32, "ssm_state": 16, "ssm_headdim": 16},
    # popart_warmup: a fifth of the budget, as on the GPU (2,000 of 10,000 updates)
    "agent": {"batch_size": 64, "learning_starts": 500, "eps_steps": 2_000, "popart_warmup": 400},
    # Fewer updates on the CPU want a larger step: on builtin:regime, 2000 updates, 3 seeds, the
    # test-split Sharpe was 1.62 at 1e-4, 1.96 at 3e-4, 1.41 at 1e-3 (docs/sweeps.md).
    "optim": {"lr": 3e-4},
    "run": {"steps": 2_000, "eval_every": 500, "log_every": 50},
}


def resolve_for_backend(cfg: Config, is_gpu: bool, explicit: dict) -> Config:
    """Apply :data:`CPU_DEFAULTS` on the CPU, except to fields in ``explicit`` ({section: {field}})."""
    if is_gpu:
        return cfg
    patch = {
        sec: {k: v for k, v in vals.items() if k not in explicit.get(sec, {})} for sec, vals in CPU_DEFAULTS.items()
    }
    return from_dict(patch, base=cfg)


def _coerce(section: str, f: dataclasses.Field, value):
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, tuple) or (default is None and isinstance(value, list)):
        if isinstance(value, str) and value.startswith("[") and value.endswith("]"):  # --set f=[a,b]: bare words
            value = [_toml_or_str(x.strip()) for x in value[1:-1].split(",") if x.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{section}.{f.name}: expected a list, got {value!r}")
        return tuple(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{section}.{f.name}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{section}.{f.name}: expected an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{section}.{f.name}: expected a number, got {value!r}")
        return float(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"{section}.{f.name}: expected a string, got {value!r}")
    return value


def from_dict(d: dict, base: Config | None = None) -> Config:
    """Build a :class:`Config` from ``{section: {field: value}}`` over ``base`` (default: the defaults)."""
    base = base or Config()
    unknown = sorted(set(d) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; sections are {sorted(SECTIONS)}")
    kw = {}
    for name, cls in SECTIONS.items():
        cur = getattr(base, name)
        vals = d.get(name, {}) or {}
        if not isinstance(vals, dict):
            raise ConfigError(f"{name}: expected a table of fields, got {vals!r}")
        known = {f.name: f for f in fields(cls)}
        bad = sorted(set(vals) - set(known))
        if bad:
            raise ConfigError(f"{name}: unknown field(s) {bad}; fields are {sorted(known)}")
        changes = {k: _coerce(name, known[k], v) for k, v in vals.items()}
        try:
            kw[name] = replace(cur, **changes) if changes else cur
        except ConfigError:
            raise
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return Config(**kw)


def load_toml(path) -> dict:
    """Read a TOML file into ``{section: {field: value}}`` (unvalidated)."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from None


def _toml_or_str(raw: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def parse_override(text: str) -> tuple[str, str, object]:
    """``"agent.gamma=0.95"`` -> ``("agent", "gamma", 0.95)``; the value is read as TOML, else as a string."""
    key, eq, raw = text.partition("=")
    sec, dot, name = key.strip().partition(".")
    if not eq or not dot or not sec or not name:
        raise ConfigError(f"override {text!r}: expected SECTION.FIELD=VALUE, e.g. agent.gamma=0.95")
    return sec, name, _toml_or_str(raw.strip())


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} as TOML")


def dumps_toml(d: dict) -> str:
    """Write ``{section: {field: value}}`` as TOML (``None`` fields are left out: TOML has no null)."""
    out = []
    for sec, vals in d.items():
        out.append(f"[{sec}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in vals.items() if v is not None]
        out.append("")
    return "\n".join(out)


def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a config dataclass (for the generated reference)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:], strict=False):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(getattr(b, "value", None), ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs
