"""Networks with hand-written backward passes over one flat parameter buffer.

``ParamLayout`` (flat layout + Philox initialisation), ``Workspace`` (preallocated
activations), layers (``Linear``, ``LayerNorm``, ``MLP``), heads (``C51Head``, ``IQNHead``,
``PlanHead``) and ``QNetwork``. Kernels: ``cuda_src/nn.cu``; NumPy twin: ``cudarl.reference.nn``.
"""

from .heads import C51Head, IQNHead, PlanHead
from .layers import MLP, LayerNorm, Linear, Module
from .network import HEADS, QNetwork
from .params import ALIGN, ParamLayout, Workspace, matmul

__all__ = [
    "ALIGN",
    "C51Head",
    "HEADS",
    "IQNHead",
    "LayerNorm",
    "Linear",
    "MLP",
    "Module",
    "ParamLayout",
    "PlanHead",
    "QNetwork",
    "Workspace",
    "matmul",
]
