"""Every configuration field is read by the trainer or the library code it drives (issue 18: a field
nothing reads is dead code, and the seed system had knobs that turned nothing).

Each section's dataclass is instrumented to record which fields are read, except by the
configuration's own machinery (a class's ``__post_init__`` validation, ``to_dict``/TOML, overrides,
``dataclasses``: :data:`_NOT_A_USE`), while short CPU runs drive the trainer through every mode: each head,
the plan head, CQL, spectral norm, shrink-and-perturb, recording and training offline, an evaluation, a
run directory of its own, a resume, a policy file and a joined population. The test fails naming every
field never read."""

import dataclasses
import sys
from pathlib import Path

from test_trainer import small

from cudarl.config import SECTIONS
from cudarl.trainer import Trainer

#: Files, and functions of cudarl/config.py, whose reads are the configuration's own business, not a use.
_NOT_A_USE = ("/dataclasses.py", "/copy.py", "/reprlib.py", "test_config_fields_read.py")
_CONFIG_MACHINERY = {
    "to_dict",
    "to_toml",
    "dumps_toml",
    "from_dict",
    "with_overrides",
    "resolve_for_backend",
    "_coerce",
}


def _instrument(monkeypatch) -> set:
    reads: set = set()
    for section, cls in SECTIONS.items():
        names = {f.name for f in dataclasses.fields(cls)}
        original = cls.__getattribute__

        def getattribute(self, attr, _orig=original, _section=section, _names=names):
            if attr in _names:
                caller = sys._getframe(1)
                path = caller.f_code.co_filename.replace("\\", "/")
                name = caller.f_code.co_name
                machinery = path.endswith("cudarl/config.py") and name in _CONFIG_MACHINERY
                if not path.endswith(_NOT_A_USE) and not machinery and name != "__post_init__":
                    reads.add((_section, attr))
            return _orig(self, attr)

        monkeypatch.setattr(cls, "__getattribute__", getattribute)
    return reads


def _drive(tmp_path: Path) -> None:
    """Short runs through every mode (each one reads what it reads whether a feature is on or off)."""
    from cudarl.policy import load_policy

    quiet = {"echo": lambda m: None}
    rec = tmp_path / "exp.safetensors"
    t = Trainer(
        small(tmp_path, run={"steps": 40, "eval_every": 20, "checkpoint_every": 20, "record": str(rec)}),
        run_dir=None,
        **quiet,
    )
    t.run()  # run.steps
    Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", run_dir=tmp_path / "resumed", **quiet).run(45)
    load_policy(t.run_dir / "checkpoints" / "step-00000040.safetensors", device="cpu").evaluate(split="val")
    for over in (
        {"net": {"head": "iqn", "plan": True, "spectral": ["enc.1"]}, "agent": {"cql_alpha": 1.0}},
        {"net": {"head": "qrdqn"}, "optim": {"shrink_every": 10, "schedule": "cosine_restarts"}},
        {"run": {"offline": str(rec)}, "agent": {"cql_alpha": 1.0}},
        {"env": {"counterfactual": True, "mirror": True}, "replay": {"n_step": 1}, "guard": {"action": "stop"}},
        {"features": {"groups": ["returns", "log_vol", "level"]}},  # a group off by default reads its fields
        # issue 19's signals, all seven together (vaccine aligns the horizons and risk heads)
        {"agent": {"aux": ["horizons", "risk", "denoise", "homeostatic", "causal", "selectivity", "vaccine"]}},
    ):
        Trainer(small(**over), run_dir=False, **quiet).run(20)
    from cudarl.population import Population

    Population([small(run={"population": "joined"})], run_dirs=[False], **quiet).run(5)  # run.population


def test_every_config_field_is_read_by_the_library(monkeypatch, tmp_path):
    reads = _instrument(monkeypatch)
    _drive(tmp_path)
    every = {(s, f.name) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    dead = sorted(every - reads)
    assert not dead, f"configuration fields nothing reads (dead: wire them or remove them): {dead}"


def test_the_check_sees_a_field_nothing_reads(monkeypatch, tmp_path):
    """The instrument is not blind: a field added to a section and never read is reported."""
    reads = _instrument(monkeypatch)
    Trainer(small(), run_dir=False, echo=lambda m: None).run(5)
    assert ("agent", "gamma") in reads and ("net", "hidden") in reads
    assert ("agent", "__never_a_field__") not in reads
    # a read from config.py itself (validation, serialisation) is not a use
    from cudarl.config import Config

    before = set(reads)
    Config().to_dict()
    assert reads == before
