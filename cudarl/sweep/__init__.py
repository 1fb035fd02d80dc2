"""Sweeps: many configurations, seeds and walk-forward folds trained in populations and ranked.

    cudarl-train sweep SPEC.toml [--out DIR] [--ray [ADDRESS]] [--optuna ROUNDS]

    spec = cudarl.sweep.load_spec("sweep.toml")
    report = cudarl.sweep.run_sweep(spec)          # sweep.csv, sweep.json, sweep.png; resumes

The spec (:mod:`cudarl.sweep.spec`), the driver and its ledger (:mod:`cudarl.sweep.core`), the
unit of work (:mod:`cudarl.sweep.work`), the report (:mod:`cudarl.sweep.report`), Ray
(:mod:`cudarl.sweep.cluster`), Optuna (:mod:`cudarl.sweep.tune`), ensembles (:mod:`cudarl.sweep.ensemble`).
"""

from .core import SweepError
from .run import run_sweep, sweep_dir_of
from .spec import SpecError, SweepSpec, load_spec

__all__ = ["load_spec", "run_sweep", "sweep_dir_of", "SweepSpec", "SpecError", "SweepError"]
