"""``cudarl.load_policy``: light to import, so a GPU's start begins before cudarl's modules are."""

from __future__ import annotations

from . import _driver


def load_policy(path, device: str = "auto", weights: str = "deployed"):
    """A :class:`cudarl.Policy` from a policy file (``best``/``step-N``) or a resume checkpoint
    (``latest.npz``): :func:`cudarl.policy.load_policy`, after beginning the CUDA driver's start in a
    thread (``device`` ``gpu`` or ``auto``, where CuPy is installed: :func:`cudarl._driver.start_early`),
    so it runs while cudarl's modules are imported and the file is read.

    ``device``: ``auto`` (the GPU when usable), ``gpu`` or ``cpu``. ``weights``: ``deployed`` (what the run
    deploys), ``last`` or ``average`` (the moving average of the weights, ``eval.average_halflife``; both from
    a ``latest.npz``, which holds them). Refuses NaN or infinite weights, naming the tensor.
    """
    _driver.start_early(device)
    from .policy import load_policy as load

    return load(path, device, weights)
