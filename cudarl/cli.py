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
from typing import List, Optional

import typer

from cudarl.data import DataError, load, report, write_csv, write_json_atomic

app = typer.Typer(name="cudarl-train", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Train and evaluate distributional deep-Q trading agents.")
data_app = typer.Typer(no_args_is_help=True, help="Check bar data and make synthetic sets.")
app.add_typer(data_app, name="data")

SYNTHETIC = ("regime", "randomwalk")


def fail(message: str, code: int = 1):
    typer.echo(f"cudarl-train: error: {message}", err=True)
    raise typer.Exit(code)


def _columns(pairs: List[str]) -> dict:
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
    report_path: Optional[Path] = typer.Option(None, "--report", help="also write data_report.json here (only if valid)"),
    sort: bool = typer.Option(False, "--sort", help="sort rows by time instead of refusing unsorted data"),
    dedupe: Optional[str] = typer.Option(None, "--dedupe", help="keep the first or last row of each duplicated time"),
    drop_nan: bool = typer.Option(False, "--drop-nan", help="drop rows with NaN, inf or missing values"),
    ffill: bool = typer.Option(False, "--ffill", help="replace such rows by a flat bar at the previous close"),
    window: int = typer.Option(2, "--window", min=1, help="the fewest bars the run needs"),
    date_format: Optional[str] = typer.Option(None, "--date-format", help="strptime format, or epoch_s / epoch_ms"),
    tz: str = typer.Option("UTC", "--tz", help="time zone of times without an offset (IANA name)"),
    column: List[str] = typer.Option([], "--column", help="FIELD=NAME, e.g. close=Last (repeatable)"),
    extra: List[str] = typer.Option([], "--extra", help="another numeric column to keep as a feature (repeatable)"),
):
    """Check a bar file; print its report (exit 0) or every problem found (exit 1)."""
    if dedupe not in (None, "first", "last"):
        fail(f"--dedupe takes first or last, got {dedupe!r}", 2)
    if drop_nan and ffill:
        fail("choose one of --drop-nan and --ffill", 2)
    try:
        bars = load(file, date_format=date_format, tz=tz, columns=_columns(column), extra_columns=tuple(extra),
                    sort=sort, dedupe=dedupe, drop_nan=drop_nan, ffill=ffill, min_bars=window)
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
