"""Networks with hand-written backward passes over one flat parameter buffer.

``ParamLayout`` (flat layout + Philox initialisation), ``Workspace`` (preallocated
activations), layers (``Linear``, ``SplitLinear``, ``LayerNorm``, ``MLP``), encoders (:data:`ENCODERS`), heads
(``C51Head``, ``IQNHead``, ``QRHead``, ``PlanHead``), ``QNetwork`` and ``StackedQNetwork`` (P members of
the reference network with a leading member axis). Kernels: ``cuda_src/nn.cu``;
NumPy twin: ``cudarl.reference.nn``.
"""

from .encoders import ENCODERS, Encoder
from .heads import C51Head, Head, IQNHead, PlanHead, QRHead
from .layers import MLP, LayerNorm, Linear, Module, SplitLinear
from .network import QNetwork
from .params import ALIGN, ParamLayout, Workspace, matmul
from .stacked import StackedQNetwork, StackedWorkspace

__all__ = [
    "ALIGN",
    "C51Head",
    "ENCODERS",
    "Encoder",
    "Head",
    "IQNHead",
    "LayerNorm",
    "Linear",
    "MLP",
    "Module",
    "ParamLayout",
    "PlanHead",
    "QNetwork",
    "QRHead",
    "SplitLinear",
    "StackedQNetwork",
    "StackedWorkspace",
    "Workspace",
    "matmul",
]
