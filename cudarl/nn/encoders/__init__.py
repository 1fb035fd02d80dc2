"""Windowed encoders: ``x [B, W, F] -> psi [B, d_model]`` with hand-written backward passes and a
one-bar acting path.

* ``ssm``: Mamba2 blocks (:class:`SSMEncoder`; kernels ``cuda_src/ssm.cu`` and ``cuda_src/seq.cu``).
* ``attention``: causal pre-norm transformer blocks with RoPE (:class:`AttentionEncoder`; kernels
  ``cuda_src/attention.cu`` and ``cuda_src/seq.cu``).

Both keep the layer conventions of :mod:`cudarl.nn.layers` (see :mod:`.base`): ``declare``, ``bind``,
``forward(x, ws) -> psi``, ``backward(x, ws, dx)`` with dL/dpsi in ``ws[<out_name>.dout]``; and for
acting ``new_state(n_envs)``, ``reset_state(state)``, ``step(state, x_t) -> psi``.
"""

from .attention import AttentionEncoder
from .base import ActState, SequenceEncoder, Standalone
from .ssm import SSMEncoder

#: The windowed encoder classes by their ``net.encoder`` name (to be registered beside the MLP encoder when
#: the network takes them: the constructors want the window, d_model and each encoder's own sizes).
SEQUENCE_ENCODERS = {"ssm": SSMEncoder, "attention": AttentionEncoder}

__all__ = ["SEQUENCE_ENCODERS", "ActState", "AttentionEncoder", "SSMEncoder", "SequenceEncoder", "Standalone"]
