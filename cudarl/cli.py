"""``cudarl-train``: the command line.

    cudarl-train data validate FILE [--report data_report.json] [repairs...]
    cudarl-train data synth regime OUT.csv [--seed 0] [--n 5000]

User errors print one message to stderr (no traceback) and exit non-zero; a failed command
writes nothing. Train and evaluate commands join this app as they are built.
"""

from __future__ import annotations

import json
import sys
import time
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

SYNTHETIC = ("regime", "randomwalk")


def fail(message: str, code: int = 1):
    typer.echo(f"cudarl-train: error: {message}", err=True)
    raise typer.Exit(code)


def _columns(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        field, eq, name = p.partition("=")
        if not eq or not name:
            fail(f"--column takes FIELD=NAME (e.g. close=Last), got {p!r}", 2)
        out[field.strip()] = name.strip()
    return out


@data_app.command("validate")
def validate(
    file: str = typer.Argument(..., help="CSV, CSV.gz or Parquet file, or builtin:<name>"),
    report_path: Path | None = typer.Option(None, "--report", help="also write data_report.json here (only if valid)"),
    sort: bool = typer.Option(False, "--sort", help="sort rows by time instead of refusing unsorted data"),
    dedupe: str | None = typer.Option(None, "--dedupe", help="keep the first or last row of each duplicated time"),
    drop_nan: bool = typer.Option(False, "--drop-nan", help="drop rows with NaN, inf or missing values"),
    ffill: bool = typer.Option(False, "--ffill", help="replace such rows by a flat bar at the previous close"),
    window: int = typer.Option(2, "--window", min=1, help="the fewest bars the run needs"),
    date_format: str | None = typer.Option(None, "--date-format", help="strptime format, or epoch_s / epoch_ms"),
    tz: str = typer.Option("UTC", "--tz", help="time zone of times without an offset (IANA name)"),
    column: list[str] = typer.Option([], "--column", help="FIELD=NAME, e.g. close=Last (repeatable)"),
    extra: list[str] = typer.Option([], "--extra", help="another numeric column to keep as a feature (repeatable)"),
):
    """Check a bar file; print its report (exit 0) or every problem found (exit 1)."""
    if dedupe not in (None, "first", "last"):
        fail(f"--dedupe takes first or last, got {dedupe!r}", 2)
    if drop_nan and ffill:
        fail("choose one of --drop-nan and --ffill", 2)
    try:
        bars = load(
            file,
            date_format=date_format,
            tz=tz,
            columns=_columns(column),
            extra_columns=tuple(extra),
            sort=sort,
            dedupe=dedupe,
            drop_nan=drop_nan,
            ffill=ffill,
            min_bars=window,
        )
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
    name: str = typer.Argument(..., help="regime or randomwalk"),
    out: Path = typer.Argument(..., help="the CSV file to write"),
    seed: int = typer.Option(0, "--seed"),
    n: int = typer.Option(5000, "--n", min=2, help="number of bars"),
    force: bool = typer.Option(False, "--force", help="overwrite OUT if it exists"),
):
    """Write a synthetic bar set (see docs/data.md for the models)."""
    if name not in SYNTHETIC:
        fail(f"no synthetic set {name!r}; choose one of {', '.join(SYNTHETIC)}", 2)
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to overwrite it")
    from cudarl.datasets import resolve

    try:
        bars = resolve(f"builtin:{name}?seed={seed}&n={n}")
        write_csv(bars, out)
    except (DataError, OSError, ValueError) as e:
        fail(str(e))
    typer.echo(f"wrote {len(bars)} bars of builtin:{name} (seed {seed}) to {out}")


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
):
    """The run's config: defaults (cudarl.config), then the TOML file, then --set, then the flags.

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
    cfg = from_dict(explicit, base=base or Config())
    be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy"}[cfg.run.device])
    return resolve_for_backend(cfg, be.is_gpu, explicit), explicit


def _progress_printer(total: int):
    """A rich progress bar on a TTY; None otherwise (the trainer then prints evaluations only)."""
    if not sys.stderr.isatty():
        return None, None
    try:
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
    from cudarl.guard import GuardStop

    return (DataError, ConfigError, CheckpointError, BackendError, GuardStop, FileNotFoundError)


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
        None, "--resume", help="continue from a checkpoint (its config; --steps may extend it)"
    ),
    walk_forward: int = typer.Option(
        0, "--walk-forward", min=0, help="train and test on K rolling-origin folds; report each and the aggregate"
    ),
):
    """Train an agent; writes runs/<name>-<time>-<seed>/ (config, metrics, checkpoints, eval)."""
    from cudarl.trainer import Trainer

    if walk_forward and resume is not None:
        fail("--walk-forward trains every fold from the start; it does not take --resume", 2)
    try:
        if walk_forward:
            from cudarl.walkforward import run_walk_forward

            cfg, _ = build_config(data, config_file, sets, steps, device, seed, name, out)
            stamp = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{cfg.run.seed}-wf{walk_forward}"
            root = Path(cfg.run.out_dir) / stamp
            typer.echo(f"walk-forward over {walk_forward} folds: {root}", err=True)
            run_walk_forward(cfg, walk_forward, root, echo=lambda m: typer.echo(m, err=True))
            return
        if resume is not None:
            overrides = {"run": {"steps": steps}} if steps is not None else None
            trainer = Trainer.resume(resume, overrides=overrides, echo=lambda m: typer.echo(m, err=True))
        else:
            cfg, _ = build_config(data, config_file, sets, steps, device, seed, name, out)
            trainer = Trainer(cfg, echo=lambda m: typer.echo(m, err=True))
        typer.echo(f"run directory: {trainer.run_dir} (backend {trainer.be.name}, {trainer.be.device})", err=True)
        prog, update = _progress_printer(trainer.cfg.run.steps)
        if prog is not None:
            with prog:
                trainer.run(progress=update)
        else:
            trainer.run()
    except _user_errors() as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


@app.command("evaluate")
def evaluate(
    checkpoint: Path = typer.Argument(..., help="a checkpoint written by train (e.g. runs/x/checkpoints/latest.npz)"),
    data: str | None = typer.Argument(None, help="bars to evaluate on (default: the run's data.source)"),
    split: str = typer.Option("test", "--split", help="train, val or test"),
    out: Path | None = typer.Option(None, "--out", help="output directory (default: <run>/eval/<split>-<step>)"),
):
    """Evaluate a checkpoint's greedy policy on a split: summary.json, equity.csv, trades.csv, equity.png."""
    from cudarl.checkpoint import load
    from cudarl.config import from_dict
    from cudarl.evaluate import json_safe, write_outputs
    from cudarl.features import Normaliser
    from cudarl.trainer import Trainer

    if split not in ("train", "val", "test"):
        fail(f"--split takes train, val or test, got {split!r}", 2)
    try:
        state, info = load(checkpoint)
        cfg = from_dict(info["config"])
        # the replay is not used here: keep it as small as the config allows
        rows = cfg.env.n_envs * cfg.env.rows_per_step
        over = {"replay": {"capacity": cfg.replay.n_step * rows + cfg.agent.batch_size + 1}, "run": {"device": "auto"}}
        if data is not None:
            over["data"] = {"source": data}
        cfg = from_dict(over, base=cfg)
        t = Trainer(
            cfg,
            run_dir=False,
            normaliser=Normaliser.from_state_dict(state["normaliser"]),
            echo=lambda m: typer.echo(m, err=True),
        )
        t.agent.load_state_dict(state["agent"])
        t.step = int(state["trainer"]["step"])
        summary = t.evaluate(split, write=False)
        ev = t.last_evaluation
        dest = out or Path(checkpoint).resolve().parents[1] / "eval" / f"{split}-{t.step:08d}"
        write_outputs(ev, dest)
        keys = ("split", "policy", "buy_and_hold", "flat", "statistics", "deployment")
        typer.echo(json.dumps(json_safe({k: summary[k] for k in keys}), indent=1, allow_nan=False))
        typer.echo(f"wrote {dest}", err=True)
    except _user_errors() as e:
        fail(str(e))
    except (KeyError, ValueError) as e:
        fail(f"{checkpoint}: {e}")


@app.command("config")
def config_cmd(cpu: bool = typer.Option(False, "--cpu", help="show the defaults as resolved for the NumPy backend")):
    """Print the default configuration as TOML (edit it and pass it with --config)."""
    from cudarl.config import Config, resolve_for_backend

    cfg = resolve_for_backend(Config(), not cpu, {})
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
    """Time the train and collect steps of the reference workload (DESIGN.md) as graph replays."""
    from cudarl.bench import step_benchmark

    try:
        rows = step_benchmark(repeats=steps, device="cpu" if cpu else "gpu")
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
        typer.echo(f"cudarl-train: error: {type(e).__name__}: {e} (set CUDARL_DEBUG=1 for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
