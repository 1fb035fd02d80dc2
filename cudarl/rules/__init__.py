"""Head rules: how a distributional head acts, learns and is read, behind one declared interface.

A rule (:class:`HeadRule`) is registered under its ``net.head`` name in :data:`HEAD_RULES`, the one
registry of heads: it names its network head (:meth:`HeadRule.make_head`, a module of
:mod:`cudarl.nn.heads`), allocates its buffers from a :class:`LearnerBuffers` (never the agent),
and hands the agent its graph phases. The agent composes the train step around them::

    schedules - sample - rule.forward - *rule.learn_phases() - *auxiliary losses - priorities
              - backward (over buffers.ws) - adam

so a new head is its network module, its rule, and one line in :data:`HEAD_RULES`
(docs/contributing.md shows QR-DQN). Rules: :class:`C51Rule` (``c51``), :class:`IQNRule` (``iqn``),
:class:`QRDQNRule` (``qrdqn``), :class:`C51IQNRule` (``c51+iqn``: both heads on one encoder).
"""

from __future__ import annotations

from .base import HeadRule, LearnerBuffers, Phase, RuleBase
from .c51 import C51Rule
from .c51_iqn import C51IQNRule
from .iqn import IQNRule
from .qrdqn import QRDQNRule

#: Head rules by ``net.head`` (STYLE.md: a registry, not an if/elif chain).
HEAD_RULES: dict[str, type] = {"c51": C51Rule, "iqn": IQNRule, "qrdqn": QRDQNRule, "c51+iqn": C51IQNRule}

__all__ = [
    "HEAD_RULES",
    "C51IQNRule",
    "C51Rule",
    "HeadRule",
    "IQNRule",
    "LearnerBuffers",
    "Phase",
    "QRDQNRule",
    "RuleBase",
]
