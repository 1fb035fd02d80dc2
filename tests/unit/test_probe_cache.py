"""The batched-GEMM probe's verdicts on disk (cudarl.probe_cache) and blas's use of them, without a GPU:
a fake plan, a fake probe and a fake cublasLtMatmulAlgoCheck (the GPU test is in tests/parity/test_blas.py)."""

from __future__ import annotations

import ctypes
import json
from types import SimpleNamespace

import pytest

from cudarl import blas, probe_cache
from cudarl.probe_cache import ProbeVerdicts

KEY = "(512, 256, 13, False, False, 6, False, 16, 16, 16, 16, False, 64, 6656, 3328, 131072, 256, 'probe')"


def test_a_verdict_comes_back_only_for_its_own_key_and_format(tmp_path):
    v = ProbeVerdicts(tmp_path)
    name = v.name("H200 sm_90", 130000, KEY)
    assert v.load(name, KEY) is None  # nothing kept yet
    assert v.store(name, KEY, {"algo": "00ff", "info": {"changed": True}})
    assert v.load(name, KEY) == {"algo": "00ff", "info": {"changed": True}}
    assert v.load(name, KEY + " ") is None, "another key under the same name (a collision, a stale file)"
    entry = json.loads(v.path(name).read_text())
    v.path(name).write_text(json.dumps({**entry, "format": probe_cache.FORMAT + 1}))
    assert v.load(name, KEY) is None, "another format"
    v.path(name).write_text('{"format": 1, "key"')  # a torn or foreign file
    assert v.load(name, KEY) is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "atomic writes leave no temporary"


def test_every_part_of_a_verdicts_name_counts():
    parts = ("H200 sm_90", 130000, 580159, KEY, "ab" * 32, 8, 3, 15, 20261204)
    names = {ProbeVerdicts.name(*parts)}
    for i in range(len(parts)):
        names.add(ProbeVerdicts.name(*parts[:i], f"{parts[i]}x", *parts[i + 1 :]))
    assert len(names) == len(parts) + 1
    assert ProbeVerdicts.name("ab", "c") != ProbeVerdicts.name("a", "bc"), "length-prefixed parts"


def test_an_unwritable_folder_costs_the_probe_only_with_one_warning(tmp_path):
    """A folder that cannot be made: store says False, load finds nothing, and the process is warned once,
    whichever instance (a plan each) tries it."""
    import warnings

    blocker = tmp_path / "file"
    blocker.write_text("")
    v = ProbeVerdicts(blocker / "probes")  # a folder under a file: cannot be made
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not v.store("n", KEY, {})
        assert not v.store("n", KEY, {})
        assert not ProbeVerdicts(blocker / "probes").store("m", KEY, {})
    assert [str(w.message)[:32] for w in caught] == ["probe verdicts cannot be kept in"]
    assert v.load("n", KEY) is None


def test_the_default_folder_is_beside_the_kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDARL_CACHE_DIR", str(tmp_path))
    assert probe_cache.default_dir() == tmp_path / "probes"


def _algo(byte: int) -> blas._LtAlgo:
    return blas._LtAlgo.from_buffer_copy(bytes([byte]) * ctypes.sizeof(blas._LtAlgo))


def _fake_plan(single: int = 1) -> blas._LtPlan:
    """A batched plan as _batch leaves it before its probe (no descriptors: the fake check ignores them)."""
    plan = blas._LtPlan.__new__(blas._LtPlan)
    plan.desc = ctypes.c_void_p()
    plan.layout_a, plan.layout_b, plan.layout_d = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    plan.layout_c = ctypes.c_void_p()  # no residual: C is D
    plan.algo, plan.single_algo = _algo(single), _algo(single)
    plan.recall = None
    plan.info = {"shape": "[512x13] x [13x256]", "batch": 64, "mode": "probe", "candidates": 0, "probed": 0,
                 "equal": [], "probes": [], "single_us": None, "chosen_index": None, "changed": False,
                 "cached": False}  # fmt: skip
    return plan


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """The probe (it adopts algorithm 7 after timing two candidates), the device's context and the check
    (``status`` and ``workspace`` settable), counted."""
    calls = {"probe": 0, "check": 0}
    check = {"status": 0, "workspace": 0}

    def probe(self, lib, key, stream):
        calls["probe"] += 1
        self.info.update(candidates=3, probed=2, equal=[False, True], single_us=9.0, chosen_index=1, changed=True)
        self.info["probes"] = [
            {"algo_id": 1, "tile_name": "64x64", "stages": 3, "equal": False, "us": None},
            {"algo_id": 21, "tile_name": "128x128", "stages": 3, "equal": True, "us": 7.0},
        ]
        self.algo = _algo(7)

    def algo_check(handle, desc, a, b, c, d, algo, result):
        calls["check"] += 1
        result._obj.workspaceSize = check["workspace"]
        return check["status"]

    monkeypatch.setattr(blas._LtPlan, "_probe", probe)
    monkeypatch.setattr(blas, "_probe_context", lambda: ("Fake GPU sm_90", 130000, 580159))
    monkeypatch.setattr(blas, "_lt_handle", lambda: None)
    monkeypatch.setenv("CUDARL_CACHE_DIR", str(tmp_path))
    lib = SimpleNamespace(cublasLtMatmulAlgoCheck=algo_check)
    return SimpleNamespace(calls=calls, check=check, lib=lib, root=tmp_path / "probes")


def test_a_second_build_takes_the_first_builds_verdict_without_probing(fakes):
    first = _fake_plan()
    first._probe_or_recall(fakes.lib, ("key",), 0)
    assert fakes.calls["probe"] == 1 and bytes(first.algo) == bytes(_algo(7)) and not first.info["cached"]
    assert len(list(fakes.root.glob("*.json"))) == 1
    second = _fake_plan()
    second._probe_or_recall(fakes.lib, ("key",), 0)
    assert fakes.calls == {"probe": 1, "check": 1}, "recalled, and its algorithm checked for this plan"
    assert first.recall["outcome"] == "no entry" and second.recall == {**first.recall, "outcome": "taken"}
    assert (fakes.root / f"{second.recall['entry']}.json").is_file()
    assert bytes(second.algo) == bytes(first.algo)
    assert second.info == {**first.info, "cached": True}


def test_a_verdict_for_the_single_algorithm_is_recalled_without_a_check(fakes, monkeypatch):
    def probe_keeps_single(self, lib, key, stream):
        fakes.calls["probe"] += 1
        self.info.update(candidates=2, probed=1, equal=[False])

    monkeypatch.setattr(blas._LtPlan, "_probe", probe_keeps_single)
    _fake_plan()._probe_or_recall(fakes.lib, ("key",), 0)
    again = _fake_plan()
    again._probe_or_recall(fakes.lib, ("key",), 0)
    assert fakes.calls == {"probe": 1, "check": 0}
    assert bytes(again.algo) == bytes(_algo(1)) and again.info["cached"] and again.info["equal"] == [False]


@pytest.mark.parametrize("status,workspace", [(15, 0), (0, blas.WORKSPACE_BYTES + 1)])
def test_a_verdict_the_check_refuses_is_probed_again_and_rewritten(fakes, status, workspace):
    _fake_plan()._probe_or_recall(fakes.lib, ("key",), 0)
    fakes.check.update(status=status, workspace=workspace)
    again = _fake_plan()
    again._probe_or_recall(fakes.lib, ("key",), 0)
    assert fakes.calls["probe"] == 2 and not again.info["cached"]
    assert (
        again.recall["outcome"] == f"refused by cublasLtMatmulAlgoCheck: status {status}, workspace {workspace} bytes"
    )


def test_another_key_or_single_algorithm_is_another_verdict(fakes):
    for key, single in ((("key",), 1), (("other",), 1), (("key",), 2)):
        _fake_plan(single)._probe_or_recall(fakes.lib, key, 0)
    assert fakes.calls["probe"] == 3 and len(list(fakes.root.glob("*.json"))) == 3


def test_a_damaged_verdict_is_probed_again(fakes):
    _fake_plan()._probe_or_recall(fakes.lib, ("key",), 0)
    (path,) = fakes.root.glob("*.json")
    entry = json.loads(path.read_text())
    outcomes = []
    for bad in ({"algo": "zz", "info": entry["record"]["info"]}, {"algo": "00", "info": entry["record"]["info"]},
                {"algo": None, "info": {"changed": False}}):  # fmt: skip
        path.write_text(json.dumps({**entry, "record": bad}))
        plan = _fake_plan()
        plan._probe_or_recall(fakes.lib, ("key",), 0)
        assert not plan.info["cached"]
        outcomes.append(plan.recall["outcome"])
    assert fakes.calls["probe"] == 4
    assert outcomes == ["algorithm not hex", "algorithm of 1 bytes, not 64", "fields differ"]
