#!/usr/bin/env python3
"""Put each seed bug back and see its test fail (docs/seed-bugs.md, last column).

A mutation is one or more exact text replacements (``old`` -> ``new`` in one named file each; refused
unless ``old`` occurs exactly once) that reintroduce one bug of the seed system, and the pytest node
ids that must catch it (or a command, for the one check that is not a test). For each mutation the
tool:

1. (``--baseline``, the default) runs the tests on the unmutated tree: a mutation check means
   something only if they pass without it;
2. applies the edits in place, runs the tests in a subprocess (``python -m pytest``, the checkout on
   ``PYTHONPATH``), and restores every file byte for byte in a ``finally`` (also on Ctrl-C or SIGTERM);
3. gives a verdict: ``caught`` (at least one named test failed or errored), ``not checked (skipped)``
   (every test skipped, e.g. a GPU test without a GPU: never counted as caught), ``MISSED`` (they
   ran and passed), or ``error`` (pytest could not run them: a bad node id, a collection error).

Usage (from the repository root)::

    python3 tools/mutation_check.py --list
    python3 tools/mutation_check.py --cpu-only --out mutations.json
    PYTHONPATH=. python3 tools/mutation_check.py --gpu-only --out $OUT/mutations.json   # on the GPU host
    python3 tools/mutation_check.py --only allocation-during-capture

Exit status 0 if every mutation run was caught or not checked; 1 if any was missed, errored, timed
out, or its tests failed unmutated; 2 if GPU mutations were asked for while a CUDA MPS daemon runs.

The GPU mutations run alone on their GPU: under MPS a fatal fault of one client (the null-pointer
mutation faults on purpose) is raised in every client of the same GPU, so other work sharing the
MPS server dies with it (12 learning runs did, on an H200 at c7b19c7). The tool refuses to run them
while an MPS control pipe exists (``$CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from junit_read import read_junit  # noqa: E402


class MutationError(RuntimeError):
    """A mutation cannot be applied as written (its ``old`` text is missing or not unique)."""


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of ``old`` in ``path`` (relative to the repository root) by ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    """One seed bug put back: ``edits`` applied together, then ``tests`` (pytest node ids) run.

    ``command`` (argv after ``python3``) replaces pytest for a check that is a tool, not a test: caught
    when it exits non-zero and its output matches ``expect``; not checked when it matches ``unchecked``.
    """

    name: str
    bug: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...] = ()
    gpu: bool = False
    command: tuple[str, ...] = ()
    expect: str = ""
    unchecked: str = ""
    notes: str = ""
    files: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self):
        if bool(self.tests) == bool(self.command):
            raise ValueError(f"{self.name}: give tests or a command, not both or neither")
        object.__setattr__(self, "files", tuple(dict.fromkeys(e.path for e in self.edits)))


# --- apply / restore -------------------------------------------------------------------------
def apply(edits, root: Path = ROOT) -> dict[Path, bytes]:
    """Apply ``edits`` in place and return ``{path: original bytes}`` for :func:`restore`.

    Every edit is checked (its ``old`` text found exactly once, counting earlier edits of the same file)
    before any file is written, so a refused mutation leaves the tree as it was.
    """
    originals, texts = _planned(edits, root)
    for p, text in texts.items():
        p.write_bytes(text.encode("utf-8"))
    return originals


def _planned(edits, root: Path = ROOT) -> tuple[dict[Path, bytes], dict[Path, str]]:
    """``({path: original bytes}, {path: mutated text})``, writing nothing; raises :class:`MutationError`
    unless each ``old`` occurs exactly once (after the earlier edits of its file)."""
    originals: dict[Path, bytes] = {}
    texts: dict[Path, str] = {}
    for e in edits:
        p = (root / e.path).resolve()
        if p not in texts:
            originals[p] = p.read_bytes()
            texts[p] = originals[p].decode("utf-8")
        n = texts[p].count(e.old)
        if n != 1:
            raise MutationError(f"{e.path}: the text to replace occurs {n} times, expected exactly once: {e.old!r}")
        texts[p] = texts[p].replace(e.old, e.new)
    return originals, texts


def restore(originals: dict[Path, bytes]) -> None:
    """Write every file back byte for byte, then check it."""
    for p, data in originals.items():
        p.write_bytes(data)
    bad = [str(p) for p, data in originals.items() if p.read_bytes() != data]
    if bad:
        raise MutationError(f"restore failed for {bad}: restore them with git checkout")


# --- running the tests -----------------------------------------------------------------------
def _env(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(root), env.get("PYTHONPATH", "")) if x)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


def run_tests(tests, root: Path = ROOT, timeout: float = 600.0) -> dict:
    """Run pytest on ``tests`` in a subprocess; return the counts and a verdict: ``failed`` (a test
    failed or errored), ``passed``, ``skipped`` (all skipped), ``error`` (pytest could not run them)
    or ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stdout or b"")[-2000:]
            return {"outcome": "timeout", "seconds": round(time.perf_counter() - t0, 1), "tail": str(tail)}
        res = read_junit(xml)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["returncode"] = p.returncode
    res["tail"] = (p.stdout + p.stderr)[-2000:]
    if res["collection_errors"] == 0 and res["failed"] + res["errors"] > 0:
        res["outcome"] = "failed"  # whatever the exit status (a GPU fault may end the process badly after)
    elif p.returncode == 0 and res["passed"] > 0:
        res["outcome"] = "passed"
    elif p.returncode == 0 and res["skipped"] > 0:
        res["outcome"] = "skipped"
    else:  # 2 interrupted (collection errors), 3 internal, 4 usage (a node id not found), 5 nothing collected
        res["outcome"] = "error"
    return res


def run_command(m: Mutation, root: Path = ROOT, timeout: float = 600.0) -> dict:
    """Run ``m.command`` with this Python; the outcome as :func:`run_tests` gives it."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, *m.command], cwd=root, env=_env(root), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout", "seconds": round(time.perf_counter() - t0, 1)}
    text = p.stdout + p.stderr
    if m.unchecked and re.search(m.unchecked, text):
        outcome = "skipped"
    elif p.returncode != 0:
        outcome = "failed" if re.search(m.expect, text) else "error"
    else:
        outcome = "passed"
    return {
        "outcome": outcome,
        "returncode": p.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "tail": text[-2000:],
    }


def _run(m: Mutation, root: Path, timeout: float) -> dict:
    return run_command(m, root, timeout) if m.command else run_tests(m.tests, root, timeout)


VERDICTS = {
    "failed": "caught",
    "skipped": "not checked (skipped)",
    "passed": "MISSED",
    "error": "error",
    "timeout": "timeout",
}


class _Terminated(BaseException):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated()


def check(m: Mutation, root: Path = ROOT, timeout: float = 600.0, baseline: bool = True) -> dict:
    """The mutation's record: the baseline run (unmutated), the mutated run, the verdict, and
    whether every file was restored."""
    rec = {"name": m.name, "bug": m.bug, "gpu": m.gpu, "tests": list(m.tests or m.command), "notes": m.notes}
    rec["edits"] = [{"path": e.path, "old": e.old, "new": e.new} for e in m.edits]
    if baseline:
        rec["baseline"] = base = _run(m, root, timeout)
        if base["outcome"] in ("failed", "error", "timeout"):
            rec["verdict"] = f"invalid: the tests {base['outcome']} without the mutation"
            rec["restored"] = True
            return rec
    originals = apply(m.edits, root)
    rec["restored"] = False
    try:
        rec["mutated"] = mut = _run(m, root, timeout)
    finally:
        restore(originals)
        rec["restored"] = True
    rec["verdict"] = VERDICTS[mut["outcome"]]
    if baseline and rec["baseline"]["outcome"] == "skipped" and mut["outcome"] != "skipped":
        rec["verdict"] = "not checked (skipped unmutated)"
    return rec


def _ok(rec: dict) -> bool:
    return rec["verdict"] == "caught" or rec["verdict"].startswith("not checked")


# --- the mutations ---------------------------------------------------------------------------
_TG = "tests/unit/test_graph.py::"
_MECH = "tests/unit/test_mechanisms.py::"

MUTATIONS: tuple[Mutation, ...] = (
    # ---- GPU rows ----
    Mutation(
        "size-baked-at-capture",
        "stale buffer sizes baked into captured graphs",
        (
            Edit(
                "cudarl/pinned.py",
                '        family("util", self.xp).set_u64(self.buffer[i : i + 1], bits, stream=stream)\n',
                "        # mutation: each set writes a new buffer, so a graph keeps the value it was captured with\n"
                "        self.buffer = self.buffer.copy()\n"
                "        self._views = {n: self.buffer[k : k + 1].view(self.dtypes[n])[:1]\n"
                "                       for k, n in enumerate(self.names)}\n"
                '        family("util", self.xp).set_u64(self.buffer[i : i + 1], bits, stream=stream)\n',
            ),
        ),
        (_TG + "test_gpu_size_read_from_device_memory",),
        gpu=True,
        notes="DeviceScalars.set no longer writes the slot a captured kernel reads: a replay sees the capture's size",
    ),
    Mutation(
        "replay-counter-baked-at-capture",
        "stale buffer sizes baked into captured graphs (the replay's counter)",
        (
            Edit(
                "cuda_src/replay.cu",
                "cudarl::philox_block(seed, (u64)step[0], stream_id, (unsigned int)j)",
                "cudarl::philox_block(seed, 0ull, stream_id, (unsigned int)j)",
            ),
        ),
        ("tests/parity/test_replay.py::test_gpu_graph_captured_small_samples_rows_added_later_and_replays_differ",),
        gpu=True,
        notes="the sample's Philox counter is a constant, not the device step read at replay: replays repeat",
    ),
    Mutation(
        "launch-accepts-null-pointers",
        "null pointers for optional buffers (atomicAdd on address 0)",
        (
            Edit(
                "cudarl/kernels.py",
                "if (a.size == 0 or a.data.ptr == 0) and not (a.size == 0 and name in empty_ok):",
                "if False:  # mutation",
            ),
        ),
        (_TG + "test_gpu_launch_helper_refuses_bad_pointers",),
        gpu=True,
        notes="kernels.check_args lets an empty array (address 0) through to the kernel",
    ),
    Mutation(
        "allocation-during-capture",
        "allocation during capture (pooled addresses reused by other arrays)",
        (
            Edit(
                "cudarl/graph.py",
                "with kernels.use_context(context), _no_allocation(where):",
                "with kernels.use_context(context):  # mutation",
            ),
        ),
        (_TG + "test_gpu_allocation_inside_capture_is_refused",),
        gpu=True,
        notes="StepGraph no longer swaps CuPy's allocator for the refusing one while capturing",
    ),
    Mutation(
        "cublas-workspace-per-capture",
        "per-branch cuBLAS workspaces exhausted GPU memory",
        (
            Edit(
                "cudarl/blas.py",
                "    if h is None or h.ptr is None:\n",
                "    if not stream.is_capturing():  # mutation: a new handle and workspace at every prepare\n",
            ),
            Edit(
                "cudarl/blas.py",
                "        if h is None:\n            h = _handles[stream.ptr] = _Handle(stream)\n",
                "        _kept.append(h)  # mutation: the earlier handle stays alive\n"
                "        h = _handles[stream.ptr] = _Handle(stream)\n",
            ),
            Edit(
                "cudarl/blas.py",
                "_plans: dict[tuple, _LtPlan] = {}\n",
                "_plans: dict[tuple, _LtPlan] = {}\n_kept: list = []\n",
            ),
        ),
        ("tests/parity/test_blas.py::test_gpu_one_handle_and_workspace_per_stream_whatever_the_graphs",),
        gpu=True,
        notes="every capture (each StepGraph, each phase profiled alone) gets a handle and a 32 MiB workspace of its "
        "own, and the earlier ones stay alive: memory grows with the graphs on a stream, as the seed's per-branch "
        "workspaces did",
    ),
    # ---- CPU rows (docs/seed-bugs.md: 'yes: ...') ----
    Mutation(
        "popart-never-called",
        "rewards never normalised: PopArt written but never called",
        (
            Edit(
                "cudarl/agent.py",
                "            self.popart,\n",
                "            None,  # mutation: the rules never see PopArt\n",
            ),
        ),
        tuple(
            f"tests/unit/test_trainer.py::test_every_enabled_feature_moves_its_observable[{h}]"
            for h in ("c51", "iqn", "qrdqn", "c51+iqn")
        ),
        notes="the agent builds its PopArt but the learning rules get None, so no update calls it (the slow learning "
        "canary of docs/seed-bugs.md is left out)",
    ),
    Mutation(
        "popart-rescale-removed",
        "PopArt's normalising half without its output-preserving half",
        (
            Edit(
                "cudarl/rules/quantile.py",
                '            buf.popart.rescale(net.P[f"{out}.weight"], net.P[f"{out}.bias"])\n',
                "            pass  # mutation: no rescale\n",
            ),
        ),
        tuple(
            f"{_MECH}test_popart_rescale_preserves_the_unnormalised_outputs_through_the_agent[{h}]"
            for h in ("iqn", "qrdqn")
        ),
    ),
    Mutation(
        "popart-freeze-removed",
        "C51's atoms change meaning as the statistics move",
        (
            Edit(
                "cudarl/agent.py",
                "            self.popart.freeze(stream)\n",
                "            pass  # mutation: no freeze\n",
            ),
        ),
        (f"{_MECH}test_popart_statistics_move_during_the_warmup_then_freeze[c51]",),
    ),
    Mutation(
        "mirror-reward-negated",
        "counterfactual mirror reward negated twice",
        (
            Edit(
                "cudarl/reference/env.py",
                "        out.reward[rows] = reward(prev_g, p, ret_g, params)\n",
                "        out.reward[rows] = (-1 if mirrored else 1) * reward(prev_g, p, ret_g, params)  # mutation\n",
            ),
        ),
        ("tests/unit/test_env_counterfactual.py::test_mirror_reward_is_the_mirrored_market_reward_not_its_negation",),
    ),
    Mutation(
        "plan-gate-scales-by-conviction",
        "plan-head conviction (~0.1 at init) scaled every reward",
        (
            Edit(
                "cudarl/reference/nn.py",
                "    scale[...] = np.where(plan[:, 1] >= plan.dtype.type(threshold), plan[:, 0], scale.dtype.type(1))"
                "\n",
                "    scale[...] = plan[:, 0]  # mutation\n",
            ),
        ),
        (
            "tests/parity/test_nn.py::test_plan_gate_is_exactly_one_until_ready",
            f"{_MECH}test_readiness_is_trained_and_an_untrained_gate_is_exactly_one",
        ),
    ),
    Mutation(
        "readiness-gradient-zeroed",
        "the plan head's readiness got no gradient, so the gate never opened",
        (
            Edit(
                "cudarl/reference/nn.py",
                "    dplan[:, 1] = np.where(m, dr, dt(0))\n",
                "    dplan[:, 1] = dt(0)  # mutation\n",
            ),
        ),
        (
            f"{_MECH}test_readiness_is_trained_and_an_untrained_gate_is_exactly_one",
            f"{_MECH}test_plan_gate_opens_on_a_signal_and_stays_shut_on_noise",
        ),
    ),
    Mutation(
        "readback-before-write-allowed",
        "host read pinned memory before the device wrote it",
        (
            Edit(
                "cudarl/pinned.py",
                "        if not self._marked[s]:\n            raise ReadbackError(",
                "        if False:  # mutation\n            raise ReadbackError(",
            ),
        ),
        ("tests/unit/test_pinned.py::test_readback_refuses_a_read_before_a_recorded_write",),
    ),
    Mutation(
        "q-stats-phase-no-op",
        "statistics written to buffers nobody read",
        (Edit("cudarl/agent.py", '("q_stats", self.q_stats),', '("q_stats", lambda: None),  # mutation'),),
        (
            *(f"{_MECH}test_q_statistics_reach_every_metrics_row_one_step_late[{h}]" for h in ("c51", "iqn", "qrdqn")),
            f"{_MECH}test_the_guard_stops_a_collapsed_distribution",
        ),
    ),
    Mutation(
        "config-field-nobody-reads",
        "mechanisms that existed but no configuration reached",
        (
            Edit(
                "cudarl/config.py",
                '    gamma: float = 0.99\n    """Discount per bar."""\n',
                '    gamma: float = 0.99\n    """Discount per bar."""\n'
                '    mutation_unread: int = 0\n    """A field nothing reads (mutation)."""\n',
            ),
        ),
        ("tests/unit/test_config_fields_read.py::test_every_config_field_is_read_by_the_library",),
    ),
    Mutation(
        "one-module-name-for-every-context",
        "one CUmodule's function handles shared between graphed and ungraphed launches",
        (
            Edit(
                "cudarl/kernels.py",
                'name = f"{path.stem}.{context}{path.suffix}"',
                'name = f"{path.stem}.shared{path.suffix}"  # mutation',
            ),
        ),
        ("tests/unit/test_kernel_cache.py::test_each_context_loads_the_cubin_through_a_name_of_its_own",),
    ),
    Mutation(
        "float-atomic-in-a-kernel",
        "atomicAdd in the graph made steps non-deterministic",
        (
            Edit(
                "cuda_src/util.cu",
                'extern "C" __global__ void cudarl_util_add_i64(',
                'extern "C" __global__ void cudarl_util_mutation(float* x) { atomicAdd(x, 1.0f); }\n'
                'extern "C" __global__ void cudarl_util_add_i64(',
            ),
        ),
        command=("tools/compile_cuda.py",),
        expect=r"atom\.global\.add\.f32",
        unchecked=r"nvcc not found",
        notes="a float atomicAdd in cuda_src/util.cu: tools/compile_cuda.py (CI, needs nvcc) must exit 1 naming it",
    ),
    Mutation(
        "guard-reads-every-5th-update",
        "the guard read the loss only every 5th step",
        (
            Edit(
                "cudarl/monitor.py",
                "if self.pending is not None and self._check(self.pending):",
                "if self.pending is not None and self.pending % 5 == 0 and self._check(self.pending):  # mutation",
            ),
        ),
        ("tests/unit/test_monitor.py::test_every_update_is_read_once_in_order[True]",),
    ),
    Mutation(
        "default-hard-coded-twice",
        "a default hard-coded in two places (quantiles 64 vs 32)",
        (
            Edit(
                "cudarl/nn/heads.py",
                "        n_quantiles: int = _NET.n_quantiles,\n        n_cos: int = _NET.n_cos,\n",
                "        n_quantiles: int = 64,  # mutation\n        n_cos: int = _NET.n_cos,\n",
            ),
        ),
        ("tests/unit/test_defaults.py::test_constructor_defaults_are_the_configs[IQNHead]",),
    ),
)


def mps_pipe() -> Path | None:
    """The CUDA MPS control pipe this process's CUDA would connect to, if one exists (else None)."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps") / "control"
    return pipe if pipe.exists() else None


def select(names=(), gpu_only=False, cpu_only=False) -> list[Mutation]:
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutation(s) {unknown}; --list names them")
    ms = [known[n] for n in names] if names else list(MUTATIONS)
    if gpu_only:
        ms = [m for m in ms if m.gpu]
    if cpu_only:
        ms = [m for m in ms if not m.gpu]
    return ms


def _table(recs) -> str:
    rows = [("mutation", "gpu", "verdict", "baseline", "mutated", "s")]
    for r in recs:
        base = r.get("baseline", {}).get("outcome", "-")
        mut = r.get("mutated", {})
        bad = mut.get("failed", 0) + mut.get("errors", 0)
        counts = f"{bad} failed/{mut.get('passed', 0)} passed/{mut.get('skipped', 0)} skipped"
        secs = r.get("baseline", {}).get("seconds", 0) + mut.get("seconds", 0)
        rows.append(
            (
                r["name"],
                "yes" if r["gpu"] else "no",
                r["verdict"],
                base,
                counts if not r.get("command") else mut.get("outcome", "-"),
                f"{secs:.0f}",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run this mutation (repeatable)")
    ap.add_argument("--gpu-only", action="store_true", help="only the mutations whose tests need a GPU")
    ap.add_argument("--cpu-only", action="store_true", help="only the mutations checkable without a GPU")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the unmutated run")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    ap.add_argument("--out", type=Path, help="write the records as JSON here")
    args = ap.parse_args(argv)
    ms = select(args.only, args.gpu_only, args.cpu_only)
    for m in ms:  # refuse a stale mutation before running anything
        _planned(m.edits)
    if args.list:
        for m in ms:
            print(f"{m.name}  [{'GPU' if m.gpu else 'CPU'}]  {m.bug}")
            for e in m.edits:
                print(f"    edits {e.path}")
            for t in m.tests or (" ".join(m.command),):
                print(f"    runs  {t}")
        return 0
    pipe = mps_pipe()
    if pipe is not None and any(m.gpu for m in ms):
        print(
            f"refusing the GPU mutations: a CUDA MPS daemon runs ({pipe}); a fault they inject would end every "
            "process sharing the GPU. Stop it (echo quit | nvidia-cuda-mps-control) or pass --cpu-only.",
            file=sys.stderr,
        )
        return 2
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    recs = []
    try:
        for m in ms:
            print(f"== {m.name} ({'GPU' if m.gpu else 'CPU'}): {m.bug}", flush=True)
            rec = check(m, ROOT, args.timeout, args.baseline)
            if m.command:
                rec["command"] = True
            print(f"   {rec['verdict']}", flush=True)
            recs.append(rec)
    finally:
        signal.signal(signal.SIGTERM, old)
        if args.out is not None and recs:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
            info = {"root": str(ROOT), "commit": head.strip() or None, "python": sys.version.split()[0]}
            args.out.write_text(json.dumps({**info, "mutations": recs}, indent=1) + "\n")
    print(_table(recs))
    return 0 if all(_ok(r) for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
