"""cudarl: distributional deep-Q trading agents with the whole training step on the GPU.

The CUDA path (CuPy) and the NumPy path compute the same functions; every kernel in
``cuda_src/`` has a NumPy twin in ``cudarl.reference`` that is both the CPU backend and
the oracle of its parity test.

The public names (:data:`__all__`, ``docs/api.md``) are imported on first use, so ``import cudarl``
stays cheap::

    policy = cudarl.load_policy("runs/x/checkpoints/best.safetensors")
    trainer = cudarl.Trainer(cudarl.Config())
"""

from importlib import import_module

__version__ = "0.1.0"

#: Public name -> (module, attribute); a module itself where the attribute is None.
_PUBLIC = {
    # configuration, the run, the policy
    "Config": ("cudarl.config", "Config"),
    "ConfigError": ("cudarl.config", "ConfigError"),
    "from_dict": ("cudarl.config", "from_dict"),
    "load_toml": ("cudarl.config", "load_toml"),
    "Trainer": ("cudarl.trainer", "Trainer"),
    "Population": ("cudarl.population", "Population"),
    "can_share": ("cudarl.population", "can_share"),
    "memory_per_member": ("cudarl.population", "memory_per_member"),
    "StepMonitor": ("cudarl.monitor", "StepMonitor"),
    "Guard": ("cudarl.guard", "Guard"),
    "GuardStop": ("cudarl.guard", "GuardStop"),
    "Policy": ("cudarl.policy", "Policy"),
    "load_policy": ("cudarl._load", "load_policy"),
    # the learner and its declared parts
    "Agent": ("cudarl.agent", "Agent"),
    "HeadRule": ("cudarl.rules", "HeadRule"),
    "LearnerBuffers": ("cudarl.rules", "LearnerBuffers"),
    "Encoder": ("cudarl.nn.encoders", "Encoder"),
    "AuxSignal": ("cudarl.auxiliary", "AuxSignal"),
    "QNetwork": ("cudarl.nn", "QNetwork"),
    "Adam": ("cudarl.optim", "Adam"),
    "Schedule": ("cudarl.optim", "Schedule"),
    "SoftUpdate": ("cudarl.optim", "SoftUpdate"),
    "PopArt": ("cudarl.popart", "PopArt"),
    "losses": ("cudarl.losses", None),
    # data, environment, replay, evaluation
    "data": ("cudarl.data", None),
    "TradingEnv": ("cudarl.env", "TradingEnv"),
    "EnvConfig": ("cudarl.env", "EnvConfig"),
    "PrioritizedReplay": ("cudarl.replay", "PrioritizedReplay"),
    "datasets": ("cudarl.datasets", None),
    "evaluate": ("cudarl.evaluate", None),
    "gym": ("cudarl.gym", None),
    "sweep": ("cudarl.sweep", None),
    # the GPU machinery
    "StepGraph": ("cudarl.graph", "StepGraph"),
    "SideStream": ("cudarl.graph", "SideStream"),
    "family": ("cudarl.backend", "family"),
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    """Import a public name on first use (PEP 562)."""
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'cudarl' has no attribute {name!r}") from None
    mod = import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
