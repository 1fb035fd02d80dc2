"""Which of a screen's runs to start, in which order, and when to stop starting them.

Shared by ``tools/mechanism_screen.py`` and ``tools/risk_screen.py`` (their ``--resume``,
``--deadline-s`` and ``--set`` options, :func:`add_args`), so that a screen larger than one GPU call
is measured over several calls without losing or repeating a run:

- :func:`pending` drops the jobs whose row a JSON-lines file already holds (``--resume``: a later call
  appends only the runs the earlier ones did not finish);
- :func:`seed_major` orders jobs seed by seed, and within a seed by their expected wall time, longest
  first (:func:`recorded_walls`): a deadline then cuts the last seed of the shortest runs, every row
  keeps its earlier seeds, and the last runs to start are short (a small tail);
- :class:`StartBy` declines, at the moment a worker is free, a job that is not expected to end before
  the deadline (``--deadline-s``): a call ends with whole runs, and the declined ones are left for
  ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Rows of earlier GPU calls of the learning check (same budget and tasks): their per-run wall time is
#: the expectation of a (task, head) before this call has finished one.
RECORDED = ROOT / "docs" / "bench" / "learning"
RECORDED_GLOB = "call-*-learning_check.json*"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE applied to every run")
    ap.add_argument(
        "--resume", action="store_true", help="skip the runs whose row --jsonl already holds (and is not an error)"
    )
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no run that is not expected to end within this many seconds of the start (run_plan.StartBy)",
    )


def key(r: dict) -> tuple:
    """What names one run of a screen: its row name, task, head and seed."""
    return (r.get("variant"), r["task"], r["head"], r["seed"])


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (none if it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def pending(jobs: list[dict], rows: list[dict]) -> list[dict]:
    """``jobs`` less those with a finished row (no error) in ``rows``."""
    done = {key(r) for r in rows if r.get("error") is None}
    return [j for j in jobs if key(j) not in done]


def recorded_walls(folder: Path = RECORDED, pattern: str = RECORDED_GLOB) -> dict:
    """Median wall seconds of a run per (task, head) over the recorded learning-check calls (the runs
    shared the GPU with others, as a screen's do)."""
    walls: dict = {}
    for path in sorted(folder.glob(pattern)):
        if path.suffix == ".jsonl":
            rows = read_rows(path)
        else:
            rows = json.loads(path.read_text()).get("rows", [])
        for r in rows:
            if r.get("error") is None and r.get("wall_s"):
                walls.setdefault((r["task"], r["head"]), []).append(r["wall_s"])
    return {k: statistics.median(v) for k, v in walls.items()}


def seed_major(jobs: list[dict], walls: dict) -> list[dict]:
    """``jobs`` sorted by seed, then by expected wall time, longest first (jobs with no expectation last
    in their seed); a stable sort, so a row's reference (listed before it) starts before it."""
    return sorted(jobs, key=lambda j: (j["seed"], -walls.get((j["task"], j["head"]), 0.0)))


class StartBy:
    """``start_if`` for ``learning_check.run_jobs``: a job starts only if it is expected to end before
    ``deadline_s`` seconds from now. The expectation of a (task, head) is the longest wall time of this
    call's finished runs of it (:meth:`saw`), else its recorded one (``walls``), else twice the longest
    of any finished or recorded run (an unknown job is not assumed short); with nothing to go on, the
    job starts."""

    def __init__(self, deadline_s: float | None, walls: dict | None = None):
        self.end = None if deadline_s is None else time.monotonic() + deadline_s
        self.recorded = dict(walls or {})
        self.seen: dict = {}
        self.declined: list[dict] = []

    def saw(self, row: dict) -> None:
        if row.get("wall_s"):
            k = (row["task"], row["head"])
            self.seen[k] = max(self.seen.get(k, 0.0), row["wall_s"])

    def expected(self, job: dict) -> float:
        k = (job["task"], job["head"])
        if k in self.seen:
            return self.seen[k]
        if k in self.recorded:
            return self.recorded[k]
        return 2.0 * max([*self.seen.values(), *self.recorded.values(), 0.0])

    def __call__(self, job: dict) -> bool:
        ok = self.end is None or time.monotonic() + self.expected(job) <= self.end
        if not ok:
            self.declined.append(job)
        return ok
