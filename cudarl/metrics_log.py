"""The run's metric log: ``metrics.jsonl`` (every row), ``metrics.csv`` (the per-step rows) and,
with ``run.tensorboard``, a TensorBoard event file; all written as the run goes.

Each row is one ``write`` of one line, so a kill leaves at most a torn last line. On a resume
:func:`truncate` keeps the rows up to the resumed update (later ones are from work the checkpoint
does not hold), drops a torn tail (saying which file), and rewrites both files.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from .atomic import atomic_open

JSONL, CSV = "metrics.jsonl", "metrics.csv"
#: Rows with this key are the per-step rows that go into metrics.csv.
STEP_KEY = "loss"


def read_rows(path, echo=print) -> list[dict]:
    """The rows of a ``metrics.jsonl``; a line that does not parse is dropped and reported (file, line)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            last = all(not x.strip() for x in lines[i + 1 :])
            what = "a torn last line (a write cut short)" if last else "a line that is not a JSON object"
            echo(f"{path}: line {i + 1} is {what}; dropped it")
            continue
        out.append(row)
    return out


def _csv_text(rows: list[dict], keys: list[str] | None) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


class MetricsLog:
    """Appends rows to ``<run_dir>/metrics.jsonl`` and the step rows to ``metrics.csv`` as they come.

    ``tensorboard``: also write every finite number of every row as a scalar (tag
    ``<split or train>/<key>``, global step ``row["step"]``) to ``<run_dir>/tensorboard/``
    through tensorboardX (``pip install 'cudarl[tensorboard]'``).
    """

    def __init__(self, run_dir, tensorboard: bool = False):
        self.dir = Path(run_dir)
        self.csv_keys: list[str] | None = None
        existing = self.dir / CSV
        if existing.is_file():
            header = existing.read_text().split("\n", 1)[0]
            self.csv_keys = next(csv.reader([header])) if header else None
        self.tb = None
        if tensorboard:
            self.tb = tensorboard_writer(self.dir / "tensorboard")

    def append(self, row: dict) -> None:
        with open(self.dir / JSONL, "a") as f:
            f.write(json.dumps(row) + "\n")
        if STEP_KEY in row:
            self._append_csv(row)
        if self.tb is not None:
            self._scalars(row)

    def _append_csv(self, row: dict) -> None:
        if self.csv_keys is None:
            self.csv_keys = list(row)
            text = _csv_text([row], self.csv_keys)
        else:
            text = _csv_text([row], self.csv_keys).split("\n", 1)[1]
        with open(self.dir / CSV, "a", newline="") as f:
            f.write(text)

    def _scalars(self, row: dict) -> None:
        step = row.get("step")
        if not isinstance(step, int):
            return
        group = row.get("split") or row.get("event") or "train"
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self.tb.add_scalar(f"{group}/{k}", v, step)
        self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def require_tensorboard():
    """tensorboardX's ``SummaryWriter`` class; a :class:`cudarl.config.ConfigError` without it."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        from .config import ConfigError

        raise ConfigError(
            "run: tensorboard = true needs tensorboardX; install it with pip install 'cudarl[tensorboard]'"
        ) from None
    return SummaryWriter


def tensorboard_writer(logdir):
    """A tensorboardX ``SummaryWriter`` for ``logdir``."""
    return require_tensorboard()(logdir=str(logdir))


def truncate(run_dir, step: int, echo=print) -> int:
    """Keep the rows of ``metrics.jsonl`` up to update ``step`` and rebuild ``metrics.csv`` from
    them (both written atomically); returns the number of rows dropped."""
    d = Path(run_dir)
    rows = read_rows(d / JSONL, echo)
    keep = [r for r in rows if not isinstance(r.get("step"), (int, float)) or r["step"] <= step]
    write_rows(d, keep)
    return len(rows) - len(keep)


def write_rows(run_dir, rows: list[dict]) -> None:
    """Write ``rows`` as the whole ``metrics.jsonl`` and their step rows as ``metrics.csv``."""
    d = Path(run_dir)
    with atomic_open(d / JSONL, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    steps = [r for r in rows if STEP_KEY in r]
    if steps:
        keys = list(dict.fromkeys(k for r in steps for k in r))
        with atomic_open(d / CSV, "w", newline="") as f:
            f.write(_csv_text(steps, keys))
    else:
        (d / CSV).unlink(missing_ok=True)
