"""``cudarl-train``: the command line.

    cudarl-train data validate FILE [--report data_report.json] [repairs...]
    cudarl-train data synth regime OUT.csv [--seed 0] [--n 5000]

User errors print one message to stderr (no traceback) and exit non-zero; a failed command
writes nothing. Train and evaluate commands join this app as they are built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from cudarl.data import DataError, load, report, write_csv, write_json_atomic

app = typer.Typer(
    name="cudarl-train",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Train and evaluate distributional deep-Q trading agents.",
)
data_app = typer.Typer(no_args_is_help=True, help="Check bar data and make synthetic sets.")
app.add_typer(data_app, name="data")

#: The synthetic markets `data synth` writes (cudarl.datasets.MARKETS; docs/data.md).
SYNTHETIC = ("regime", "ar", "lag", "ou", "noise", "randomwalk", "canary")


def fail(message: str, code: int = 1):
    typer.echo(f"cudarl-train: error: {message}", err=True)
    raise typer.Exit(code)


# The data options of `data validate` and `train` (the data section of the config: docs/config.md).
# Their defaults are the config's: a flag left out sets nothing.
SORT = typer.Option(False, "--sort", help="sort rows by time instead of refusing unsorted data (data.sort)")
DEDUPE = typer.Option(None, "--dedupe", help="keep the first or last row of each duplicated time (data.dedupe)")
DROP_NAN = typer.Option(False, "--drop-nan", help="drop rows with NaN, inf or missing values (data.drop_nan)")
FFILL = typer.Option(False, "--ffill", help="replace such rows by a flat bar at the previous close (data.ffill)")
DATE_FORMAT = typer.Option(None, "--date-format", help="strptime format, or epoch_s / epoch_ms (data.date_format)")
TZ = typer.Option(None, "--tz", help="time zone of times without an offset, an IANA name (data.tz; default UTC)")
COLUMN = typer.Option([], "--column", help="FIELD=NAME, e.g. close=Last (repeatable; data.columns)")
EXTRA = typer.Option([], "--extra", help="another numeric column to keep as a feature (repeatable; data.extra_columns)")


def data_flags(sort, dedupe, drop_nan, ffill, date_format, tz, column, extra) -> dict:
    """The ``data`` config fields the flags set (only those given)."""
    if dedupe not in (None, "first", "last"):
        fail(f"--dedupe takes first or last, got {dedupe!r}", 2)
    if drop_nan and ffill:
        fail("choose one of --drop-nan and --ffill", 2)
    given = {
        "sort": sort or None,
        "dedupe": dedupe,
        "drop_nan": drop_nan or None,
        "ffill": ffill or None,
        "date_format": date_format,
        "tz": tz,
        "columns": list(column) or None,
        "extra_columns": list(extra) or None,
    }
    return {k: v for k, v in given.items() if v is not None}


@data_app.command("validate")
def validate(
    file: str = typer.Argument(..., help="CSV, CSV.gz or Parquet file, or builtin:<name>"),
    report_path: Path | None = typer.Option(None, "--report", help="also write data_report.json here (only if valid)"),
    sort: bool = SORT,
    dedupe: str | None = DEDUPE,
    drop_nan: bool = DROP_NAN,
    ffill: bool = FFILL,
    window: int = typer.Option(2, "--window", min=1, help="the fewest bars the run needs"),
    date_format: str | None = DATE_FORMAT,
    tz: str | None = TZ,
    column: list[str] = COLUMN,
    extra: list[str] = EXTRA,
):
    """Check a bar file; print its report (exit 0) or every problem found (exit 1)."""
    from cudarl.config import ConfigError, data_options, from_dict

    try:
        given = data_flags(sort, dedupe, drop_nan, ffill, date_format, tz, column, extra)
        options = data_options(from_dict({"data": given}).data)
    except ConfigError as e:
        fail(str(e), 2)
    try:
        bars = load(file, min_bars=window, **options)
    except DataError as e:
        typer.echo(f"cudarl-train: {len(e.problems)} problem(s) in the data; nothing was written", err=True)
        fail(str(e))
    except (OSError, ValueError) as e:
        fail(f"{file}: {e}")
    rep = report(bars)
    if report_path is not None:
        write_json_atomic(rep, report_path)
    typer.echo(json.dumps(rep, indent=2))


@data_app.command("synth")
def synth(
    name: str = typer.Argument(
        ..., help="regime, ar, lag, ou, noise, randomwalk or canary, with model parameters if any: 'lag?lag=2&phi=0.2'"
    ),
    out: Path = typer.Argument(..., help="the CSV file to write"),
    seed: int = typer.Option(0, "--seed"),
    n: int = typer.Option(5000, "--n", min=2, help="number of bars"),
    force: bool = typer.Option(False, "--force", help="overwrite OUT if it exists"),
):
    """Write a synthetic bar set (see docs/data.md for the models and their parameters; parameters in
    NAME's query string take precedence over --seed and --n)."""
    name, _, query = name.partition("?")
    if name not in SYNTHETIC:
        fail(f"no synthetic set {name!r}; choose one of {', '.join(SYNTHETIC)}", 2)
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to overwrite it")
    from cudarl.datasets import resolve

    try:
        bars = resolve(f"builtin:{name}?seed={seed}&n={n}" + (f"&{query}" if query else ""))
        write_csv(bars, out)
    except (DataError, OSError, ValueError) as e:
        fail(str(e))
    typer.echo(f"wrote {len(bars)} bars of {bars.source} to {out}")


# --- training, evaluation, configuration --------------------------------------------------------
def build_config(
    data: str | None = None,
    config_file: Path | None = None,
    sets: list[str] = (),
    steps: int | None = None,
    device: str | None = None,
    seed: int | None = None,
    name: str | None = None,
    out: Path | None = None,
    base=None,
    data_fields: dict | None = None,
):
    """The run's config: defaults (cudarl.config), then the TOML file, then --set, then the flags
    (``data_fields``: the data options given as flags, :func:`data_flags`).

    Returns ``(config, explicit)`` where ``explicit`` is ``{section: {field: value}}`` of what the
    user set (the CPU scale-down never touches those). The CLI has no defaults of its own.
    """
    from cudarl import backend as _backend
    from cudarl.config import Config, from_dict, load_toml, parse_override, resolve_for_backend

    explicit: dict = {}

    def put(sec, field, value):
        explicit.setdefault(sec, {})[field] = value

    if config_file is not None:
        for sec, vals in load_toml(config_file).items():
            if not isinstance(vals, dict):
                fail(f"{config_file}: [{sec}] must be a table of fields")
            for k, v in vals.items():
                put(sec, k, v)
    for text in sets:
        put(*parse_override(text))
    for sec, field, v in (
        ("data", "source", data),
        ("run", "steps", steps),
        ("run", "device", device),
        ("run", "seed", seed),
        ("run", "name", name),
        ("run", "out_dir", str(out) if out else None),
    ):
        if v is not None:
            put(sec, field, v)
    for field, v in (data_fields or {}).items():
        put("data", field, v)
    cfg = from_dict(explicit, base=base or Config())
    be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy"}[cfg.run.device])
    return resolve_for_backend(cfg, be.is_gpu, explicit), explicit


class Say:
    """Where the trainer's lines go: stderr, or above the progress bar while one is shown (rich's
    console keeps them on their own lines; written straight to the terminal they were glued to the bar)."""

    def __init__(self):
        self.prog = None

    def __call__(self, message: str) -> None:
        if self.prog is not None and self.prog.live.is_started:
            self.prog.console.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            typer.echo(message, err=True)


def _progress_printer(total: int, console=None):
    """``(progress, update)``: a rich progress bar on stderr when it is a terminal (or on ``console``);
    ``(None, None)`` otherwise (the trainer then prints its evaluations only)."""
    if console is None and not sys.stderr.isatty():
        return None, None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:
        return None, None
    prog = Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        transient=False,
        console=console or Console(stderr=True),
    )
    task = prog.add_task("train", total=total, info="")

    def update(step, row, last_eval):
        sharpe = "n/a" if not last_eval or last_eval.get("sharpe") is None else f"{last_eval['sharpe']:.2f}"
        prog.update(
            task, completed=step, info=f"{row['updates_per_s']:.0f} upd/s  loss {row['loss']:.4g}  val Sharpe {sharpe}"
        )

    return prog, update


def _user_errors():
    from cudarl.backend import BackendError
    from cudarl.checkpoint import CheckpointError
    from cudarl.config import ConfigError
    from cudarl.experience import ExperienceError
    from cudarl.guard import GuardStop

    return (DataError, ConfigError, CheckpointError, BackendError, GuardStop, FileNotFoundError, ExperienceError)


@app.command("train")
def train(
    data: str | None = typer.Argument(
        None, help="bars: a CSV/Parquet path or builtin:<name> (default: the config's data.source)"
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="a TOML file of config sections (see `cudarl-train config`)"
    ),
    sets: list[str] = typer.Option([], "--set", help="override one field: SECTION.FIELD=VALUE (repeatable)"),
    steps: int | None = typer.Option(None, "--steps", help="learner updates (run.steps)"),
    device: str | None = typer.Option(None, "--device", help="auto, gpu or cpu (run.device)"),
    seed: int | None = typer.Option(None, "--seed", help="run.seed"),
    name: str | None = typer.Option(None, "--name", help="run.name"),
    out: Path | None = typer.Option(None, "--out", help="parent of run directories (run.out_dir)"),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="continue from a resume checkpoint, checkpoints/latest.npz (its config; --steps may extend it)",
    ),
    record: Path | None = typer.Option(
        None, "--record", help="write the replay's transitions to FILE when the run ends (run.record)"
    ),
    offline: Path | None = typer.Option(
        None, "--offline", help="train from transitions recorded with --record, collecting none (run.offline)"
    ),
    sort: bool = SORT,
    dedupe: str | None = DEDUPE,
    drop_nan: bool = DROP_NAN,
    ffill: bool = FFILL,
    date_format: str | None = DATE_FORMAT,
    tz: str | None = TZ,
    column: list[str] = COLUMN,
    extra: list[str] = EXTRA,
    walk_forward: int = typer.Option(
        0, "--walk-forward", min=0, help="train and test on K rolling-origin folds; report each and the aggregate"
    ),
):
    """Train an agent; writes runs/<name>-<time>-<seed>/ (config, metrics, checkpoints, eval).

    Ctrl-C or SIGTERM writes checkpoints/latest.npz and exits 130 or 143; --resume continues."""
    from cudarl.interrupt import Interrupted
    from cudarl.trainer import Trainer

    say = Say()
    data_fields = data_flags(sort, dedupe, drop_nan, ffill, date_format, tz, column, extra)
    if walk_forward and resume is not None:
        fail("--walk-forward trains every fold from the start; it does not take --resume", 2)
    try:
        run_files = {k: str(v) for k, v in (("record", record), ("offline", offline)) if v is not None}
        if walk_forward and run_files:
            fail("--walk-forward trains its folds from the start; it does not take --record or --offline", 2)
        if walk_forward:
            from cudarl.walkforward import run_walk_forward

            cfg, _ = build_config(data, config_file, sets, steps, device, seed, name, out, data_fields=data_fields)
            say(f"walk-forward over {walk_forward} folds")
            run_walk_forward(cfg, walk_forward, echo=say)
            return
        if resume is not None:
            if data is not None or data_fields or sets or config_file is not None or run_files:
                fail("--resume takes the checkpoint's own config; only --steps may change it", 2)
            overrides = {"run": {"steps": steps}} if steps is not None else None
            trainer = Trainer.resume(resume, overrides=overrides, echo=say)
        else:
            cfg, _ = build_config(data, config_file, sets, steps, device, seed, name, out, data_fields=data_fields)
            if run_files:  # paths, taken as given (never read as TOML values)
                cfg = cfg.with_overrides({"run": run_files})
            trainer = Trainer(cfg, echo=say)
        say(f"run directory: {trainer.run_dir} (backend {trainer.be.name}, {trainer.be.device})")
        prog, update = _progress_printer(trainer.cfg.run.steps)
        if prog is not None:
            say.prog = prog
            with prog:
                trainer.run(progress=update)
        else:
            trainer.run()
    except Interrupted as e:
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("cudarl-train: interrupted", err=True)
        raise typer.Exit(130) from None
    except _user_errors() as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


def _claim_out(dest: Path) -> list[Path]:
    """Make the output folder ``dest`` and check a file can be created in it, before any work.

    Returns the folders it created (removed again if the command fails); exits with a hint of
    ``--out`` when ``dest`` cannot be written (a read-only place, no permission, a file in the way)."""
    import os

    from cudarl.atomic import create_temporary

    made, probe = [], dest
    while not probe.exists():
        made.append(probe)
        probe = probe.parent
    try:
        dest.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temporary(dest / "probe")
        os.close(fd)
        tmp.unlink()
    except OSError as e:
        _remove_empty(made)
        fail(f"cannot write the evaluation to {dest}: {e.strerror or e}; pass --out DIR to write it elsewhere")
    return made


def _remove_empty(folders: list[Path]) -> None:
    for d in folders:  # deepest first
        try:
            d.rmdir()
        except OSError:
            pass


@app.command("evaluate")
def evaluate(
    checkpoint: Path = typer.Argument(
        ..., help="a policy file (checkpoints/best.safetensors, step-N.safetensors) or checkpoints/latest.npz"
    ),
    data: str | None = typer.Argument(None, help="bars to evaluate on (default: the run's data.source)"),
    split: str = typer.Option("test", "--split", help="train, val or test"),
    out: Path | None = typer.Option(None, "--out", help="output directory (default: <run>/eval/<split>-<step>)"),
    device: str = typer.Option("auto", "--device", help="auto, gpu or cpu"),
    weights: str = typer.Option(
        "deployed",
        "--weights",
        help="deployed (what the run deploys), last (the online weights) or average (their moving average, "
        "eval.average_halflife); last and average from checkpoints/latest.npz, which holds both",
    ),
):
    """Evaluate a policy's greedy actions on a split: summary.json, equity.csv, trades.csv, equity.png.

    Loads the policy alone (cudarl.load_policy): no trainer, no replay buffer."""
    from cudarl import _driver

    if device in ("auto", "gpu"):
        _driver.start_early(device)  # the GPU's start, beside the imports below and the file's read
    from cudarl import rundir
    from cudarl.evaluate import json_safe, write_outputs
    from cudarl.policy import WEIGHTS, load_policy
    from cudarl.trainer import NO_PLOT

    if split not in ("train", "val", "test"):
        fail(f"--split takes train, val or test, got {split!r}", 2)
    if device not in ("auto", "gpu", "cpu"):
        fail(f"--device takes auto, gpu or cpu, got {device!r}", 2)
    if weights not in WEIGHTS:
        fail(f"--weights takes {', '.join(WEIGHTS)}, got {weights!r}", 2)
    try:
        policy = load_policy(checkpoint, device=device, weights=weights)
        run = rundir.run_dir_of(checkpoint)
        if out is None and run is None:
            fail(f"{checkpoint} is not in the checkpoints folder of a cudarl run directory; pass --out DIR")
        dest = out or run / "eval" / f"{split}-{policy.step:08d}"
        made = _claim_out(dest)
        try:
            ev = policy.evaluate(data, split, echo=lambda m: typer.echo(m, err=True))
        except BaseException:
            _remove_empty(made)
            raise
        written = write_outputs(ev, dest)
        if not any(p.name == "equity.png" for p in written):
            typer.echo(NO_PLOT, err=True)
        summary = ev.summary
        keys = ("split", "policy", "buy_and_hold", "flat", "statistics", "deployment")
        typer.echo(json.dumps(json_safe({k: summary[k] for k in keys}), indent=1, allow_nan=False))
        typer.echo(f"wrote {dest}", err=True)
    except _user_errors() as e:
        fail(str(e))
    except (KeyError, ValueError) as e:
        fail(f"{checkpoint}: {e}")
    except OSError as e:
        fail(f"{e.filename or checkpoint}: {e.strerror or e}")


@app.command("sweep")
def sweep(
    spec: Path = typer.Argument(
        ..., help="the sweep's TOML spec (docs/guide.md: base config, grid or random, seeds, folds)"
    ),
    out: Path | None = typer.Option(
        None, "--out", help="the sweep directory (default: <spec out>/<spec name>; an existing one resumes)"
    ),
    ray: bool = typer.Option(False, "--ray", help="run populations on Ray actors, one per GPU (CPU actors without)"),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="the Ray cluster to join, e.g. HOST:6379 (implies --ray; default: RAY_ADDRESS, "
        "a `ray start` of this host, else a new local one)",
    ),
    workers: int = typer.Option(0, "--workers", min=0, help="Ray CPU actors when the cluster has no GPU (0: its CPUs)"),
    gpus_per_actor: float = typer.Option(
        1.0, "--gpus-per-actor", help="GPU share of a Ray actor: 1 (one actor a GPU) or a fraction (0.5: two a GPU)"
    ),
    optuna: int = typer.Option(
        0, "--optuna", min=0, help="ROUNDS of Optuna over the spec's random table, a population a round"
    ),
):
    """Train a spec's trials in populations, evaluate each on validation and test, rank by validation.

    Writes sweep.csv (one row a trial), sweep.json, sweep.png.

    Ctrl-C or SIGTERM stops it: finished trials are kept, the population in training writes checkpoints
    (unless the spec says checkpoint = "never").

    The same command resumes: it skips finished trials and continues a cut population from its checkpoints.

    It says "resuming population K from update N", or why it starts that population over (docs/guide.md)."""
    from cudarl.interrupt import Interrupted
    from cudarl.sweep import SpecError, SweepError, load_spec, run_sweep

    say = Say()
    sp = None
    try:
        sp = load_spec(spec)
        executor = None
        if ray or ray_address:
            from cudarl.sweep.cluster import RayExecutor

            executor = RayExecutor(
                ray_address, workers=workers, device=sp.base.run.device, gpus_per_actor=gpus_per_actor, echo=say
            )
        run_sweep(sp, out=out, executor=executor, optuna_rounds=optuna, echo=say)
    except (Interrupted, KeyboardInterrupt) as e:
        cut = (
            'starts over (the spec\'s checkpoint = "never")'
            if sp is not None and sp.checkpoint == "never"
            else "continues from its members' checkpoints"
        )
        typer.echo(
            f"cudarl-train: sweep interrupted; finished trials are kept, and a population cut mid-training {cut}: "
            "run the same command to resume",
            err=True,
        )
        raise typer.Exit(getattr(e, "exit_code", 130)) from None
    except (SpecError, SweepError) as e:
        fail(str(e), 2 if isinstance(e, SpecError) else 1)
    except (*_user_errors(), ValueError) as e:
        fail(str(e))


@app.command("ensemble")
def ensemble(
    policies: list[Path] = typer.Argument(
        None, help="policy files (best.safetensors, a sweep's policies/*.safetensors)"
    ),
    sweep_dir: Path | None = typer.Option(None, "--sweep", help="take the members from a finished sweep directory"),
    rank: int = typer.Option(1, "--rank", min=1, help="with --sweep: the configuration of this validation rank"),
    fold: int | None = typer.Option(
        None, "--fold", min=0, help="with --sweep: its trials of this fold (default the first)"
    ),
    mode: str = typer.Option("mean", "--mode", help="mean (of the members' Q) or vote (of their greedy actions)"),
    data: str | None = typer.Option(None, "--data", help="bars to evaluate on (default: the members' data.source)"),
    out: Path | None = typer.Option(None, "--out", help="also write the report as JSON here"),
    device: str = typer.Option("auto", "--device", help="auto, gpu or cpu"),
):
    """Evaluate several policies as one (mean of their Q, or a vote) on validation and test, beside each member."""
    from cudarl.data.validate import write_json_atomic
    from cudarl.evaluate import json_safe
    from cudarl.sweep.ensemble import MODES, evaluate_ensemble, sweep_members, table_lines

    if mode not in MODES:
        fail(f"--mode takes {' or '.join(MODES)}, got {mode!r}", 2)
    if device not in ("auto", "gpu", "cpu"):
        fail(f"--device takes auto, gpu or cpu, got {device!r}", 2)
    if bool(policies) == (sweep_dir is not None):
        fail("give policy files or --sweep DIR (one of the two)", 2)
    try:
        splits = None
        if sweep_dir is not None:
            policies, splits, row = sweep_members(sweep_dir, rank, fold)
            typer.echo(
                f"members: the {len(policies)} trial(s) of c{row['config_id']} (validation rank {rank})", err=True
            )
        rep = evaluate_ensemble(policies, mode, data, splits, device)
        for line in table_lines(rep):
            typer.echo(line)
        if out is not None:
            write_json_atomic(json_safe(rep), out)
    except (*_user_errors(), ValueError) as e:
        fail(str(e))


@app.command("config")
def config_cmd(
    device: str = typer.Option(
        "auto", "--device", help="auto (this host's backend), gpu or cpu: whose defaults to show"
    ),
    cpu: bool = typer.Option(False, "--cpu", help="the same as --device cpu"),
):
    """Print the default configuration as TOML, as resolved for this host's backend (edit it and pass
    it with --config)."""
    from cudarl.backend import cupy_unavailable_reason
    from cudarl.config import Config, resolve_for_backend

    if device not in ("auto", "gpu", "cpu"):
        fail(f"--device takes auto, gpu or cpu, got {device!r}", 2)
    if cpu:
        device = "cpu"
    gpu = cupy_unavailable_reason() is None if device == "auto" else device == "gpu"
    cfg = resolve_for_backend(Config(), gpu, {})
    other = "cpu" if gpu else "gpu"
    typer.echo(
        f"# cudarl defaults for the {'GPU (CuPy)' if gpu else 'NumPy (CPU)'} backend; --device {other} shows the other"
    )
    typer.echo(cfg.to_toml())


@app.command("info")
def info():
    """Backend, device and kernel families of this installation."""
    from cudarl import __version__, kernels
    from cudarl.backend import cupy_unavailable_reason, get

    be = get()
    typer.echo(f"cudarl {__version__}")
    typer.echo(
        f"backend: {be.name} ({be.device})"
        + (f", compute capability {be.compute_capability}" if be.compute_capability else "")
    )
    reason = cupy_unavailable_reason()
    if reason:
        typer.echo(f"GPU: not used: {reason}")
    typer.echo(f"CUDA sources: {kernels.SRC_DIR}")
    typer.echo(f"kernel families: {', '.join(kernels.families())}")


@app.command("bench")
def bench(
    steps: int = typer.Option(200, "--steps", help="timed replays"),
    cpu: bool = typer.Option(False, "--cpu", help="time the NumPy backend instead (slow)"),
):
    """Time the train and collect steps of the reference workload (64 features, MLP 256-256, C51 with
    51 atoms, batch 512, replay 1M; docs/architecture.md) as graph replays."""
    from cudarl.backend import BackendError
    from cudarl.bench import step_benchmark

    try:
        rows = step_benchmark(repeats=steps, device="cpu" if cpu else "gpu")
    except BackendError as e:
        fail(f"{e}; `cudarl-train bench --cpu` times the NumPy backend instead")
    except _user_errors() as e:
        fail(str(e))
    for r in rows:
        typer.echo(f"{r['case']:<40} {r['metric']:<28} {r['value']:>12.4g} {r['unit']}")


def main() -> None:
    """Console-script entry point: an unexpected error is one line too (CUDARL_DEBUG=1 shows the traceback)."""
    import os

    try:
        app(prog_name="cudarl-train")
    except Exception as e:  # commands report user errors themselves; this is the last line of defence
        if os.environ.get("CUDARL_DEBUG"):
            raise
        typer.echo(
            f"cudarl-train: internal error: {e or type(e).__name__} "
            "(please report it; set CUDARL_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
