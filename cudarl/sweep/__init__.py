"""Sweeps: many configurations, seeds and walk-forward folds trained in populations and ranked.

    cudarl-train sweep SPEC.toml [--out DIR] [--ray | --ray-address HOST:PORT] [--optuna ROUNDS]
    cudarl-train ensemble --sweep DIR [--rank 1] [--mode mean|vote]

    spec = cudarl.sweep.load_spec("sweep.toml")
    report = cudarl.sweep.run_sweep(spec)          # sweep.csv, sweep.json, sweep.png; resumes
    report = cudarl.sweep.run_sweep(spec, executor=cudarl.sweep.RayExecutor("HEAD:6379"))
    ens = cudarl.sweep.evaluate_ensemble(["a.safetensors", "b.safetensors"], "vote")

The spec (:mod:`cudarl.sweep.spec`), the driver and its ledger (:mod:`cudarl.sweep.core`), the
unit of work (:mod:`cudarl.sweep.work`), the report (:mod:`cudarl.sweep.report`), Ray
(:mod:`cudarl.sweep.cluster`), Optuna (:mod:`cudarl.sweep.tune`), ensembles (:mod:`cudarl.sweep.ensemble`).
The walkthrough is in docs/guide.md ("Sweeps").
"""

from .cluster import RayExecutor
from .core import SweepError
from .ensemble import evaluate_ensemble
from .run import run_sweep, sweep_dir_of
from .spec import SpecError, SweepSpec, load_spec

__all__ = [
    "load_spec",
    "run_sweep",
    "sweep_dir_of",
    "evaluate_ensemble",
    "RayExecutor",
    "SweepSpec",
    "SpecError",
    "SweepError",
]
