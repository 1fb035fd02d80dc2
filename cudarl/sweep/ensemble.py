"""Ensembles: several trained policies evaluated as one, against each of them.

    cudarl-train ensemble runs/a/checkpoints/best.safetensors runs/b/... [--mode mean|vote]
    cudarl-train ensemble --sweep sweeps/lr-gamma --rank 1        # the seeds of the top configuration

``mean``: the action with the largest mean over members of the expected Q (for members of one head
and support this is the expected value of the mean of their Q distributions: the expectation is
linear). ``vote``: each member's greedy action is one vote; the most votes win, a tie goes to the
tied action with the largest mean Q. Members must read the same observations: the same features,
normaliser, window and environment (positions, costs, fill). The ensemble is deployed with the first
member's ``eval`` rules (the validation gate on its own validation PSR; no margin).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..checkpoint import CheckpointError
from ..policy import evaluate_split
from .work import split_numbers

MODES = ("mean", "vote")


def check_compatible(policies) -> None:
    """Refuse members that do not read the same observations, naming the file that differs."""
    a = policies[0]
    for p in policies[1:]:
        na, nb = a.normaliser, p.normaliser
        same = (
            tuple(na.names) == tuple(nb.names)
            and np.array_equal(na.mean, nb.mean)
            and np.array_equal(na.std, nb.std)
            and a.obs_dim == p.obs_dim
            and a.config.env == p.config.env
        )
        if not same:
            raise CheckpointError(
                f"{p.source}: its features, normaliser, window or environment differ from {a.source}'s; "
                "an ensemble's members must read the same observations (same data, split and features)"
            )
        if p.config.net.plan:
            raise CheckpointError(f"{p.source}: a plan head sizes positions; ensembles take Q-only policies")
    if a.config.net.plan:
        raise CheckpointError(f"{a.source}: a plan head sizes positions; ensembles take Q-only policies")


def _combine(qs, mode: str, xp):
    """``[n, A]`` float32 scores whose first maximum is the ensemble's action; ``qs`` [M, n, A]."""
    mean = qs.mean(axis=0)
    if mode == "mean":
        return mean.astype(np.float32)
    a = qs.shape[2]
    votes = (qs.argmax(axis=2)[..., None] == xp.arange(a)).sum(axis=0)  # [n, A]
    score = xp.where(votes == votes.max(axis=1, keepdims=True), mean, -xp.inf)
    win = score.argmax(axis=1)
    return (xp.arange(a) == win[:, None]).astype(np.float32)


def ensemble_q(policies, mode: str):
    """``(q_values_into, q_rows)`` of the ensemble (:func:`cudarl.policy.greedy_walk`'s); ``q_rows``
    is None unless every member has a row-exact one (the NumPy backend's fast walk)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    xp = policies[0].xp
    n_act = policies[0].n_actions

    def q_into(obs, out):
        qs = xp.empty((len(policies), obs.shape[0], n_act), np.float32)
        for i, p in enumerate(policies):
            p.q_values_into(obs, qs[i])
        out[...] = _combine(qs.astype(np.float64), mode, xp)

    rows = [p._q_rows() for p in policies]
    if any(r is None for r in rows):
        return q_into, None
    return q_into, EnsembleRows(rows, mode)


class EnsembleRows:
    """The host walk's block Q (:class:`cudarl.policy.BlockQ`) of an ensemble whose
    members each have one: the members' rows combined by ``mode`` (host float32 ``[k, A]``)."""

    def __init__(self, rows: list, mode: str):
        self.rows, self.mode = rows, mode
        self.max_rows = min(r.max_rows for r in rows)
        self.row_cost = sum(r.row_cost for r in rows)

    def begin(self) -> None:
        for r in self.rows:
            r.begin()

    def of_states(self, states, windows) -> np.ndarray:
        qs = [r.of_states(states, windows) for r in self.rows]
        return _combine(np.stack(qs).astype(np.float64), self.mode, np)


def _evaluate(prepared, cfg, q_into, q_rows, backend: str) -> dict:
    """Validation and test numbers of one acting function, the test deployed under ``cfg.eval``'s gate."""
    from ..policy import deployment

    e = cfg.eval
    out = {}
    for split in ("val", "test"):

        def val_psr():
            return out["val"]["psr"]

        dep = deployment(e, split, val_psr)
        ev = evaluate_split(
            prepared, split, cfg.env, q_into, backend, eval_cfg=e, trading=dep["trading"], q_rows=q_rows
        )
        ev.summary["deployment"] = dep
        out[split] = split_numbers(ev.summary)
    return out


def evaluate_ensemble(paths, mode: str = "mean", data=None, splits=None, device: str = "auto") -> dict:
    """The ensemble of the policy files ``paths`` and each member alone, on validation and test.

    ``data``: bars, a path or ``builtin:<name>`` (default: the first member's ``data.source``);
    ``splits``: the members' splits (a sweep's walk-forward fold; default the config's chronological one).
    Returns ``{"mode", "members": [paths], "val": {...}, "test": {...}}``; each split has ``ensemble``
    and ``members`` (their numbers), ``best_member_sharpe``, ``mean_member_sharpe``,
    ``beats_every_member`` and ``beats_member_mean`` (a flat policy's undefined Sharpe counts as 0)."""
    from ..config import from_dict
    from ..policy import load_policy
    from ..prepare import prepare_data

    if not paths:
        raise ValueError("an ensemble needs at least one policy")
    policies = [load_policy(p, device=device) for p in paths]
    check_compatible(policies)
    cfg = policies[0].config
    if isinstance(data, (str, Path)):
        cfg = from_dict({"data": {"source": str(data)}}, base=cfg)
        data = None
    prepared = prepare_data(cfg, data, policies[0].normaliser, splits=splits)
    be = policies[0].be.name
    members = [_evaluate(prepared, cfg, p.q_values_into, p._q_rows(), be) for p in policies]
    ens = _evaluate(prepared, cfg, *ensemble_q(policies, mode), be)
    rep = {"mode": mode, "members": [str(p) for p in paths]}
    for split in ("val", "test"):
        s = [_zero(m[split]["sharpe"]) for m in members]
        e = _zero(ens[split]["sharpe"])
        rep[split] = {
            "ensemble": ens[split],
            "members": [m[split] for m in members],
            "best_member_sharpe": max(s),
            "mean_member_sharpe": float(np.mean(s)),
            "beats_every_member": e > max(s),
            "beats_member_mean": e > float(np.mean(s)),
        }
    return rep


def _zero(v) -> float:
    return 0.0 if v is None or not math.isfinite(v) else float(v)


def sweep_members(sweep_dir, rank: int = 1, fold: int | None = None) -> tuple[list[Path], object, dict]:
    """``(policy paths, splits, configuration row)`` of the configuration ranked ``rank`` (by validation)
    in a finished sweep: its trials of ``fold`` (default: the first fold, or the only split)."""
    from ..splits import Split, Splits

    d = Path(sweep_dir)
    try:
        rep = json.loads((d / "sweep.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{d}: no sweep.json (run the sweep to the end first)") from None
    rows = rep["configurations"]
    if not 1 <= rank <= len(rows):
        raise ValueError(f"--rank {rank}: the sweep ranked {len(rows)} configuration(s)")
    row = rows[rank - 1]
    recs = [json.loads(p.read_text()) for p in sorted((d / "trials").glob("*.json"))]
    mine = [r for r in recs if r["config_id"] == row["config_id"]]
    folds = sorted({r["fold"] for r in mine if r["fold"] is not None})
    want = fold if fold is not None else (folds[0] if folds else None)
    mine = sorted((r for r in mine if r["fold"] == want), key=lambda r: r["seed"])
    if not mine:
        raise ValueError(f"fold {fold}: configuration c{row['config_id']} has no trial there (folds {folds})")
    sp = mine[0]["splits"]
    splits = None if sp is None else Splits(*(Split(k, *sp[k]) for k in ("train", "val", "test")))
    return [d / r["policy"] for r in mine], splits, row


def table_lines(rep: dict) -> list[str]:
    def f(v):
        return "n/a" if v is None else f"{v:.2f}"

    out = [
        f"ensemble of {len(rep['members'])} ({rep['mode']}):  split  ensemble Sharpe  best member  member mean  beats"
    ]
    for split in ("val", "test"):
        s = rep[split]
        beats = "every member" if s["beats_every_member"] else "the mean" if s["beats_member_mean"] else "no"
        out.append(
            f"{'':>30}{split:>5}  {f(s['ensemble']['sharpe']):>15}  {f(s['best_member_sharpe']):>11}  "
            f"{f(s['mean_member_sharpe']):>11}  {beats}"
        )
    out.append("(a flat policy's undefined Sharpe counts as 0; judge on validation, confirm on test)")
    return out
