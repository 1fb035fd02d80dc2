"""A learning regression fails CI: on the leakage canary the NumPy backend must find the leak."""

import time

from cudarl.config import from_dict, resolve_for_backend
from cudarl.trainer import Trainer


def test_cpu_canary_learns_the_leak():
    """builtin:canary leaks the next bar's return; a correct learner's held-out Sharpe is far above 2
    (buy-and-hold on a random walk is ~0). 600 updates of the CPU defaults, under 60 s."""
    over = {
        "run": {"device": "cpu", "steps": 600, "eval_every": 0, "checkpoint_every": 0},
        "data": {"source": "builtin:canary?n=3000"},
        "features": {"extra": ["next_return"]},  # the leak, named: answer columns are never features unless named
        "agent": {"gamma": 0.5},
        "replay": {"n_step": 1},
    }
    cfg = resolve_for_backend(from_dict(over), False, over)
    t0 = time.perf_counter()
    tr = Trainer(cfg, run_dir=False, echo=lambda m: None)
    tr.run()
    test = tr.evaluate("test", write=False)
    assert time.perf_counter() - t0 < 60
    assert test["policy"]["sharpe"] > 2.0, test["policy"]
    assert test["policy"]["sharpe"] > test["buy_and_hold"]["sharpe"] + 2.0
