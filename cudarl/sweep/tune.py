"""Optuna rounds (``cudarl-train sweep SPEC --optuna ROUNDS``): each round asks Optuna's TPE sampler for
``random.n`` configurations of the spec's ``[random]`` space, trains them (all seeds and folds; one
population when they fit), and tells it each configuration's mean validation Sharpe (a flat
policy's undefined Sharpe counts as 0). The sampler of round ``r`` is seeded with ``random.seed + r``,
so a round's configurations depend only on the rounds before. The configurations asked are written
to ``optuna.json`` before a round trains: a resumed sweep replays them (finished trials skipped) and
goes on from there.
"""

from __future__ import annotations

import json
import math

from ..atomic import atomic_open
from .core import SweepError
from .spec import SpecError


def _distribution(optuna, kind: str, args):
    d = optuna.distributions
    if kind == "uniform":
        return d.FloatDistribution(float(args[0]), float(args[1]))
    if kind == "log_uniform":
        return d.FloatDistribution(float(args[0]), float(args[1]), log=True)
    if kind == "int":
        return d.IntDistribution(int(args[0]), int(args[1]))
    return d.CategoricalDistribution(list(range(len(args))))  # choices by index: values may be lists


def _decode(spec, raw: dict) -> dict:
    return {k: spec.random[k][1][raw[k]] if spec.random[k][0] == "choice" else raw[k] for k in spec.random}


def optuna_trials(spec, rounds: int, train, sd, echo) -> list:
    """Run ``rounds`` Optuna rounds; ``train(configurations, first_id)`` trains them and returns their
    trials. Returns every round's trials."""
    try:
        import optuna
    except ImportError:
        raise SweepError("--optuna needs Optuna: pip install 'cudarl[tune]'") from None
    if not spec.random:
        raise SpecError(f"{spec.path}: --optuna searches the [random] space, and the spec has no [random] table")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {k: _distribution(optuna, *spec.random[k]) for k in spec.random}
    study = optuna.create_study(direction="maximize")
    path = sd.path / "optuna.json"
    saved = json.loads(path.read_text())["rounds"] if path.is_file() else []
    n, every = spec.random_n, []
    for r in range(rounds):
        study.sampler = optuna.samplers.TPESampler(seed=spec.random_seed + r)
        if r < len(saved):
            for raw in saved[r]:
                study.enqueue_trial(raw)
        asked = [study.ask(dists) for _ in range(n)]
        raws = [t.params for t in asked]
        if r >= len(saved):
            saved.append(raws)
            with atomic_open(path) as f:
                json.dump({"rounds": saved}, f, indent=1)
        echo(f"optuna round {r + 1}/{rounds}: {n} configuration(s)")
        trials = train([_decode(spec, raw) for raw in raws], r * n)
        ledger = sd.ledger()
        for i, t in enumerate(asked):
            vals = [ledger[x.key]["val"]["sharpe"] for x in trials if x.config_id == r * n + i]
            vals = [0.0 if v is None or not math.isfinite(v) else v for v in vals]
            study.tell(t, sum(vals) / len(vals))
        every += trials
        echo(f"optuna round {r + 1}/{rounds}: best mean validation Sharpe so far {study.best_value:.3f}")
    return every
