"""cudarl: distributional deep-Q trading agents with the whole training step on the GPU.

The CUDA path (CuPy) and the NumPy path compute the same functions; every kernel in
``cuda_src/`` has a NumPy twin in ``cudarl.reference`` that is both the CPU backend and
the oracle of its parity test.

The public names (``docs/api.md``) are imported on first use, so ``import cudarl`` stays cheap::

    policy = cudarl.load_policy("runs/x/checkpoints/best.safetensors")
    trainer = cudarl.Trainer(cudarl.Config())
"""

from importlib import import_module

__version__ = "0.1.0"

#: Public name -> (module, attribute); a module itself where the attribute is None.
_PUBLIC = {
    "Config": ("cudarl.config", "Config"),
    "Trainer": ("cudarl.trainer", "Trainer"),
    "TradingEnv": ("cudarl.env", "TradingEnv"),
    "EnvConfig": ("cudarl.env", "EnvConfig"),
    "Policy": ("cudarl.policy", "Policy"),
    "load_policy": ("cudarl.policy", "load_policy"),
    "data": ("cudarl.data", None),
    "datasets": ("cudarl.datasets", None),
    "evaluate": ("cudarl.evaluate", None),
    "gym": ("cudarl.gym", None),
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
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
