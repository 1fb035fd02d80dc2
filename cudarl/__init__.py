"""cudarl: distributional deep-Q trading agents with the whole training step on the GPU.

The CUDA path (CuPy) and the NumPy path compute the same functions; every kernel in
``cuda_src/`` has a NumPy twin in ``cudarl.reference`` that is both the CPU backend and
the oracle of its parity test.

The public API is :data:`__all__`; each name is imported on first use, so ``import cudarl`` stays
cheap (the command line imports only what a command needs).
"""

from importlib import import_module

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_PUBLIC = {
    # configuration and the run
    "Config": "cudarl.config",
    "ConfigError": "cudarl.config",
    "from_dict": "cudarl.config",
    "load_toml": "cudarl.config",
    "Trainer": "cudarl.trainer",
    "StepMonitor": "cudarl.monitor",
    "Guard": "cudarl.guard",
    "GuardStop": "cudarl.guard",
    # the learner and its parts
    "Agent": "cudarl.agent",
    "HeadRule": "cudarl.rules",
    "LearnerBuffers": "cudarl.rules",
    "Encoder": "cudarl.nn.encoders",
    "AuxSignal": "cudarl.auxiliary",
    "QNetwork": "cudarl.nn",
    "Adam": "cudarl.optim",
    "Schedule": "cudarl.optim",
    "SoftUpdate": "cudarl.optim",
    "PopArt": "cudarl.popart",
    "losses": "cudarl",
    # data, environment, replay, evaluation
    "TradingEnv": "cudarl.env",
    "EnvConfig": "cudarl.env",
    "PrioritizedReplay": "cudarl.replay",
    "evaluate_positions": "cudarl.evaluate",
    # the GPU machinery
    "StepGraph": "cudarl.graph",
    "SideStream": "cudarl.graph",
    "family": "cudarl.backend",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562)."""
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'cudarl' has no attribute {name!r}")
    value = import_module(f"{where}.{name}") if where == "cudarl" else getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
