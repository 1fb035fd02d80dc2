"""Learning regressions fail CI (the CPU smoke of tools/learning_check.py): on the leakage canary both
heads must find the leak, with PopArt, and on a martingale the default configuration must stay flat.

The canary's bars (issue 18: removing PopArt or flipping a sign must fail a named test), measured on
the CPU at ef35931 (600 updates, seeds 0 and 1): with PopArt the held-out Sharpe was 20.0 and 20.2
(C51), 19.5 and 20.2 (IQN), and the batch variance of the expected Q (``q_var``, the head's units)
5.9-6.2 (C51) and 0.56-0.66 (IQN); without PopArt 5.6 and 0.0 (C51), and for IQN the validation
gate stayed shut (no edge: flat, no Sharpe), with ``q_var`` about 1e-3 for both. A held-out Sharpe
above 10 and ``q_var`` above 0.1 fail without PopArt; a flipped sign of the reward or of the leak
fails the Sharpe (the agent learns the opposite trade).
"""

import time

import pytest

from cudarl.config import from_dict, resolve_for_backend
from cudarl.trainer import Trainer


def train(over):
    cfg = resolve_for_backend(from_dict(over), False, over)
    tr = Trainer(cfg, run_dir=False, echo=lambda m: None)
    tr.run()
    return tr, tr.evaluate("test", write=False)


@pytest.mark.slow
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_cpu_canary_learns_the_leak(head):
    """builtin:canary leaks the next bar's return (named in features.extra); a correct learner's held-out
    Sharpe is far above 2 (buy-and-hold on a random walk is ~0). 600 updates of the CPU defaults."""
    over = {
        "run": {"device": "cpu", "steps": 600, "eval_every": 0, "checkpoint_every": 0},
        "data": {"source": "builtin:canary?n=3000"},
        "features": {"extra": ["next_return"]},  # the leak, named: answer columns are never features unless named
        "agent": {"gamma": 0.5},
        "replay": {"n_step": 1},
        "net": {"head": head},
    }
    t0 = time.process_time()  # CPU time: the check is the work done, not the machine's load
    tr, test = train(over)
    assert time.process_time() - t0 < 90
    assert test["deployment"]["trading"], test["deployment"]  # the validation gate opens on a real edge
    assert test["policy"]["sharpe"] > 10.0, test["policy"]  # PopArt removed: 5.6 and 0.0 (C51)
    assert test["policy"]["sharpe"] > test["buy_and_hold"]["sharpe"] + 2.0
    assert tr.monitor.last_stats["q_var"] > 0.1, tr.monitor.last_stats  # values on the support's scale


def test_cpu_noise_stays_flat_with_the_defaults():
    """On a martingale (builtin:noise: GARCH volatility, fat tails, no edge) the default configuration's
    deployed policy trades on at most 1% of the test bars and its Sharpe is within 2 standard errors of 0
    (flat: none). The trained policy itself does trade (the validation gate is what keeps it flat)."""
    over = {
        "run": {"device": "cpu", "steps": 600, "eval_every": 0, "checkpoint_every": 0},
        "data": {"source": "builtin:noise?n=3000"},
    }
    tr, test = train(over)
    pos = tr.last_evaluation.position
    changes = int((abs(pos[1:] - pos[:-1]) > 0).sum() + (pos[0] != 0))
    assert changes <= 0.01 * pos.size, test["deployment"]
    sharpe, se = test["statistics"]["sharpe"], test["statistics"]["sharpe_se"]
    assert sharpe != sharpe or abs(sharpe) <= 2 * se
    ungated = tr._evaluation("test", gate=False)
    assert ungated.summary["policy"]["trades"] > 0  # there was something to keep flat
