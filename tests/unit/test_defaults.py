"""One source of defaults (DESIGN.md rule 6): every library constructor either takes its config dataclass
or has defaults equal to the config's, and the public API says what it is.

(The Guard's spike factor was 10 in the class and 20 in the config; QNetwork's widths and GEMM, and
Adam's clipping, disagreed with theirs too.)
"""

import inspect

import pytest

import cudarl
from cudarl import config as C
from cudarl.costs import bar_net_return
from cudarl.env import TradingEnv
from cudarl.guard import Guard
from cudarl.nn import MLP, C51Head, IQNHead, Linear, PlanHead, QNetwork, QRHead
from cudarl.optim import Adam, Schedule, SoftUpdate
from cudarl.popart import PopArt
from cudarl.replay import PrioritizedReplay

SECTIONS = {name: cls() for name, cls in C.SECTIONS.items()}

#: (constructor, its config section, {parameter: field, (fields,), None for the section itself, or a
#: function of the section} where the names differ)
CASES = [
    (QNetwork, "net", {}),
    (Linear, "net", {"spectral": "(a flag per layer: whether net.spectral names it)"}),
    (MLP, "net", {}),
    (C51Head, "net", {}),
    (IQNHead, "net", {}),
    (QRHead, "net", {}),
    (PlanHead, "net", {}),
    (Schedule, "optim", {"kind": "schedule"}),
    (Adam, "optim", {"betas": ("beta1", "beta2"), "schedule": Schedule.from_config}),
    (SoftUpdate, "agent", {"period": "tau_period"}),
    (PopArt, "agent", {"beta": "popart_beta"}),
    (PrioritizedReplay, "replay", {}),
    (Guard, "guard", {"cfg": None}),
    (TradingEnv, "env", {"config": None, "window": lambda _: SECTIONS["net"].window}),
    (bar_net_return, "env", {}),
]


def _compared(obj, section: str, names: dict) -> list:
    """``(parameter, default, config's value)`` for each defaulted parameter the config also sets."""
    cfg, out = SECTIONS[section], []
    for p in inspect.signature(obj).parameters.values():
        if p.default is inspect.Parameter.empty:
            continue
        field = names.get(p.name, p.name)
        if field is None:  # the config dataclass itself
            out.append((p.name, p.default, None if p.default is None else cfg))
        elif callable(field):
            out.append((p.name, p.default, field(cfg)))
        elif isinstance(field, tuple):
            out.append((p.name, tuple(p.default), tuple(getattr(cfg, f) for f in field)))
        elif hasattr(cfg, field):
            out.append((p.name, p.default, getattr(cfg, field)))
        elif p.name == "seed":
            out.append((p.name, p.default, SECTIONS["run"].seed))
    return out


@pytest.mark.parametrize("obj,section,names", CASES, ids=[c[0].__name__ for c in CASES])
def test_constructor_defaults_are_the_configs(obj, section, names):
    compared = _compared(obj, section, names)
    assert compared, f"{obj.__name__}: no default compared with {section} (a stale case?)"
    bad = [(n, d, want) for n, d, want in compared if d != want]
    assert not bad, f"{obj.__name__}: defaults that disagree with config.{section}: {bad}"


def test_the_check_sees_a_disagreeing_default():
    def make(hidden=(256, 256), gemm="cublas", atoms=51):
        pass

    got = {n: d == want for n, d, want in _compared(make, "net", {})}
    assert got == {"hidden": False, "gemm": False, "atoms": True}


def _own_doc(obj) -> str:
    """The object's own docstring (a class's, not one it inherits)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def test_every_public_name_is_declared_and_documented():
    """``cudarl.__all__`` is the public API (docs/api.md lists it): each name resolves to a module, class or
    function with a docstring of its own."""
    assert len(cudarl.__all__) == len(set(cudarl.__all__)) >= 20
    objs = {n: getattr(cudarl, n) for n in cudarl.__all__ if n != "__version__"}
    kinds = {n for n, o in objs.items() if not (inspect.ismodule(o) or inspect.isclass(o) or inspect.isfunction(o))}
    assert not kinds, f"public names that are neither module, class nor function: {sorted(kinds)}"
    undocumented = [n for n, o in objs.items() if not _own_doc(o)]
    assert not undocumented, f"public names without a docstring: {undocumented}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cudarl.nope  # noqa: B018
