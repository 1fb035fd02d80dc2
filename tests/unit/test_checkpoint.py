"""Checkpoints: round trip, atomic writes that survive a kill, and refusal of pickles."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cudarl import checkpoint as ck


def _state(rng):
    return {
        "model": {"params": rng.standard_normal(1000).astype(np.float32), "step": np.int64(7)},
        "replay": {"ptr": np.int64(3), "prio": rng.integers(0, 9, 50).astype(np.uint64)},
        "name": "c51",
        "flags": [1, 2],
        "none": None,
        "ok": True,
        "layout": [("w", 0, (3, 4)), ("b", 64, (4,))],
    }


def test_round_trip(tmp_path, rng):
    s = _state(rng)
    ck.save(tmp_path / "a.npz", s, {"step": 7, "config": {"lr": 1e-4}})
    got, info = ck.load(tmp_path / "a.npz")
    np.testing.assert_array_equal(got["model"]["params"], s["model"]["params"])
    assert got["model"]["params"].dtype == np.float32 and got["replay"]["prio"].dtype == np.uint64
    assert int(got["model"]["step"]) == 7 and got["name"] == "c51" and got["flags"] == [1, 2]
    assert got["none"] is None and got["ok"] is True and info == {"step": 7, "config": {"lr": 1e-4}}
    assert got["layout"] == [["w", 0, [3, 4]], ["b", 64, [4]]]
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]  # no temporary left behind


def test_refuses_a_malicious_pickle_without_running_it(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "evil.npz"
    bad.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ck.CheckpointError, match="pickles are never loaded"):
        ck.load(bad)
    # an npz holding a pickled object array is refused too
    obj = tmp_path / "obj.npz"
    np.savez(
        obj,
        __meta__=np.frombuffer(b'{"format": "cudarl-checkpoint", "version": 1}', np.uint8),
        x=np.array([Evil()], dtype=object),
    )
    with pytest.raises(ck.CheckpointError):
        ck.load(obj)
    assert not marker.exists()


def test_refuses_foreign_and_missing_files(tmp_path):
    np.savez(tmp_path / "plain.npz", x=np.ones(3))
    with pytest.raises(ck.CheckpointError, match="no __meta__ header"):
        ck.load(tmp_path / "plain.npz")
    with pytest.raises(ck.CheckpointError, match="no such checkpoint"):
        ck.load(tmp_path / "missing.npz")
    with pytest.raises(ck.CheckpointError, match="dtype object"):
        ck.save(tmp_path / "x.npz", {"bad": np.array([object()], dtype=object)})


def test_kill_during_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    target = tmp_path / "latest.npz"
    script = textwrap.dedent(f"""
        import os, sys, time
        import numpy as np
        from cudarl import checkpoint as ck
        ck.save({str(target)!r}, {{"v": np.full(10, 1.0)}}, {{"step": 1}})
        def hang(fd):
            print("writing", flush=True)
            time.sleep(60)
        os.fsync = hang  # the second save stops after writing its data, before the rename
        ck.save({str(target)!r}, {{"v": np.full(2_000_000, 2.0)}}, {{"step": 2}})
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "writing"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
    state, info = ck.load(target)
    assert info["step"] == 1 and state["v"].tolist() == [1.0] * 10
    leftovers = [f.name for f in tmp_path.iterdir() if f.name != "latest.npz"]
    assert leftovers and all(f.endswith(".tmp") for f in leftovers)  # the interrupted write stayed aside


def test_atomic_open_leaves_the_old_file_on_error(tmp_path):
    from cudarl.atomic import atomic_open

    p = tmp_path / "a.txt"
    with atomic_open(p) as f:
        f.write("one")
    with pytest.raises(RuntimeError):
        with atomic_open(p) as f:
            f.write("two")
            raise RuntimeError("crash mid-write")
    assert p.read_text() == "one" and [x.name for x in tmp_path.iterdir()] == ["a.txt"]
    with pytest.raises(ValueError):
        with atomic_open(p, "a"):
            pass


def test_atomic_link_keeps_the_contents_when_the_source_is_rewritten(tmp_path):
    from cudarl.atomic import atomic_link, atomic_open

    src, dst = tmp_path / "latest.npz", tmp_path / "best.npz"
    with atomic_open(src, "wb") as f:
        f.write(b"step 20")
    atomic_link(src, dst)
    atomic_link(src, dst)  # again over an existing name
    with atomic_open(src, "wb") as f:  # the next latest: a new file renamed over the name
        f.write(b"step 40")
    assert dst.read_bytes() == b"step 20" and src.read_bytes() == b"step 40"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.npz", "latest.npz"]  # no temporary left
