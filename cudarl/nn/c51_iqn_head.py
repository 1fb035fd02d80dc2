"""``C51IQNHead``: the dueling C51 head and an IQN head on one state embedding (``net.head = "c51+iqn"``).

The seed system trained both distributional heads on one encoder, IQN on a stream of its own. Here the
C51 head is the network's output (acting, evaluation and the fused C51 loss read it: :meth:`forward` is
C51's), and the IQN head is run by its rule (:class:`cudarl.rules.c51_iqn.C51IQNRule`) on a branch of
the train graph, from the psi the forward left in each workspace. :meth:`backward` adds both heads'
dL/dpsi, so the encoder learns from the sum of the two losses.
"""

from __future__ import annotations

from .heads import C51Head, Head, IQNHead
from .params import ParamLayout, Workspace


class C51IQNHead(Head):
    """C51 (``<name>.va``, logits ``[B, A, atoms]``) and IQN (``<name>.iqn``, quantiles ``[B, N, A]``).

    Args:
        name: prefix (the C51 head's parameters keep the plain C51 head's names).
        d: width of psi; n_actions: A; net: the :class:`cudarl.config.NetConfig` (atoms, n_quantiles,
            n_cos, tf32, gemm).

    Contract of :meth:`backward`: before it, the rule ran ``iqn.forward`` over the same workspace and the
    quantile loss wrote dL/dtheta into ``ws[iqn.grad_name]``, as the C51 loss wrote dL/dlogits (or dL/dva).
    """

    def __init__(self, name: str, d: int, n_actions: int, net):
        self.name, self.d, self.n_actions = name, int(d), int(n_actions)
        self.c51 = C51Head(name, d, n_actions, net.atoms, tf32=net.tf32, gemm=net.gemm)
        self.iqn = IQNHead(f"{name}.iqn", d, n_actions, net.n_quantiles, net.n_cos, tf32=net.tf32, gemm=net.gemm)
        self.children = [self.c51, self.iqn]

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        self.c51.declare(layout, ws_spec)
        self.iqn.declare(layout, ws_spec)

    def output_shape(self, B: int) -> tuple:
        return self.c51.output_shape(B)

    @property
    def grad_name(self) -> str:
        return self.c51.grad_name

    def raw_grad_name(self) -> str:
        return self.c51.raw_grad_name()

    def forward(self, psi, ws: Workspace, raw: bool = False):
        """The C51 head's output (logits, or with ``raw`` its ``va``); the IQN head is the rule's to run."""
        return self.c51.forward(psi, ws, raw=raw)

    def logits_of(self, va, ws: Workspace):
        """The C51 head's dueling combine of ``va`` (:meth:`cudarl.nn.heads.C51Head.logits_of`)."""
        return self.c51.logits_of(va, ws)

    accumulates_dpsi = False

    def backward(self, psi, ws: Workspace, dpsi=None, accumulate: bool = False, raw: bool = False) -> None:
        """Both heads' parameter gradients, and dpsi = IQN's + C51's dL/dpsi (IQN's backward overwrites
        dpsi, so it runs first and the sum is not an accumulation into a caller's buffer)."""
        if dpsi is None or accumulate:
            raise ValueError(f"{self.name}: the two-head backward overwrites dpsi; give it a buffer of its own")
        self.iqn.backward(psi, ws, dpsi)
        self.c51.backward(psi, ws, dpsi, accumulate=True, raw=raw)
