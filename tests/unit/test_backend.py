import numpy as np
import pytest

from cudarl import _driver, backend
from cudarl.testing import gpu_skip_reason


def test_forced_numpy(monkeypatch):
    monkeypatch.setenv("CUDARL_BACKEND", "numpy")
    b = backend.select()
    assert b.name == "numpy" and b.xp is np and not b.is_gpu and b.device == "cpu"


def test_argument_overrides_environment(monkeypatch):
    monkeypatch.setenv("CUDARL_BACKEND", "cupy")
    assert backend.select("numpy").name == "numpy"


def test_auto_picks_what_the_machine_has(monkeypatch):
    monkeypatch.delenv("CUDARL_BACKEND", raising=False)
    b = backend.select()
    assert b.name == ("numpy" if gpu_skip_reason() else "cupy")


def test_forced_cupy_is_one_clear_error_without_gpu(monkeypatch):
    monkeypatch.setenv("CUDARL_BACKEND", "cupy")
    reason = gpu_skip_reason()
    if reason is None:
        assert backend.select().name == "cupy"
    else:
        with pytest.raises(backend.BackendError, match="cupy backend was requested but"):
            backend.select()


def test_forced_cupy_error_when_cupy_cannot_import(monkeypatch):
    # Simulate a machine with no CuPy at all, whatever this one has.
    monkeypatch.setattr(backend, "cupy_unavailable_reason", lambda: "CuPy is not importable (ImportError: x)")
    with pytest.raises(backend.BackendError, match="CuPy is not importable"):
        backend.select("cupy")
    assert backend.select("auto").name == "numpy"


def test_bad_value_is_rejected(monkeypatch):
    monkeypatch.setenv("CUDARL_BACKEND", "tpu")
    with pytest.raises(backend.BackendError, match="not one of numpy, cupy, auto"):
        backend.select()


def test_get_array_module_and_to_numpy():
    a = np.arange(3)
    assert backend.get_array_module(a, 1.0) is np
    assert backend.to_numpy(a) is a
    assert backend.to_numpy([1, 2]).tolist() == [1, 2]


def _pretend_selection(monkeypatch, select=None) -> None:
    """A warm-up with nothing of its own yet: ``select`` (default: NumPy named "warmed <request>") for
    the selection, CuPy "installed", no environment override."""
    monkeypatch.setattr(backend, "select", select or (lambda r: backend.Backend("numpy", np, f"warmed {r}")))
    monkeypatch.setattr(backend, "_cached", backend.functools.cache(lambda r, env: backend.select(r)))
    monkeypatch.setattr(backend, "_warming", {})
    monkeypatch.setattr(backend, "_selected", set())
    monkeypatch.delenv("CUDARL_BACKEND", raising=False)
    monkeypatch.setattr(backend, "_cupy_installed", lambda: True)
    monkeypatch.setattr(_driver, "_early", [])  # the driver's early start: none here (see _fake_early_start)
    monkeypatch.setattr(_driver, "cupy_installed", lambda: False)


def _fake_early_start(monkeypatch, calls: list, cublas_s: float = 0.0) -> None:
    """The early start's two calls recorded in ``calls`` with their threads (``load_cublas`` slowed by
    ``cublas_s``), CuPy "installed" for it, and no early start yet."""
    import threading
    import time

    def cublas():
        time.sleep(cublas_s)
        calls.append(("libraries", threading.current_thread().name))

    monkeypatch.setattr(_driver, "_early", [])
    monkeypatch.setattr(_driver, "cupy_installed", lambda: True)
    monkeypatch.setattr(
        _driver, "start", lambda: calls.append(("early start", threading.current_thread().name)) or True
    )
    monkeypatch.setattr(_driver, "load_cublas", cublas)


def test_warm_up_selects_in_the_background_and_get_waits_for_it(monkeypatch):
    """warm_up starts the selection in a thread; get() waits for it and returns what it selected, the
    selection running once; a failure there is raised by get() in the caller's thread; numpy and a
    known backend start nothing."""
    import threading
    import time

    calls, release = [], threading.Event()

    def slow_select(requested):
        calls.append(threading.current_thread().name)
        release.wait(5)
        return backend.Backend("numpy", np, f"warmed {requested}")

    _pretend_selection(monkeypatch, slow_select)
    monkeypatch.setattr(backend, "_start_driver", lambda: calls.append("driver"))
    backend.warm_up("cupy")
    time.sleep(0.05)
    assert calls == ["driver", "cudarl-backend-warm-up"]  # the driver's start, then the selection, waiting
    release.set()
    assert backend.get("cupy").device == "warmed cupy"
    assert calls == ["driver", "cudarl-backend-warm-up"]  # get() reused the warm-up's selection
    backend.warm_up("cupy")  # known now: nothing starts
    backend.warm_up("numpy")
    assert not backend._warming and len(calls) == 2

    def failing(requested):
        raise backend.BackendError(f"no {requested} here")

    monkeypatch.setattr(backend, "select", failing)
    backend.warm_up("other")
    assert ("other", None) in backend._warming
    with pytest.raises(backend.BackendError, match="no other here"):
        backend.get("other")
    monkeypatch.setattr(backend, "_cupy_installed", lambda: False)
    backend.warm_up("auto")  # no CuPy: nothing to warm up
    assert not backend._warming and len(calls) == 3


def test_warm_up_then_runs_in_the_thread_after_the_selection(monkeypatch):
    """then(backend) runs in the warm-up thread after the selection (a get() there returns at once); a
    get() from the caller waits for the selection only, not for then, whose end the caller waits for by
    joining the returned thread; what then raises is dropped."""
    import threading

    calls, release = [], threading.Event()
    _pretend_selection(monkeypatch)
    monkeypatch.setattr(backend, "_start_driver", lambda: None)

    def then(be):
        calls.append((threading.current_thread().name, be.device, backend.get("cupy").device))
        release.wait(5)
        calls.append("then done")

    t = backend.warm_up("cupy", then=then)
    assert backend.get("cupy").device == "warmed cupy"  # while then still waits
    assert "then done" not in calls and t.is_alive()
    release.set()
    t.join(5)
    assert calls == [("cudarl-backend-warm-up", "warmed cupy", "warmed cupy"), "then done"]
    assert not backend._warming and backend.warm_up("cupy", then=then) is None  # known now

    def raising(be):
        raise RuntimeError("dropped")

    t = backend.warm_up("other", then=raising)
    t.join(5)
    assert backend.get("other").device == "warmed other"


def test_warm_up_runs_on_context_in_the_driver_thread_after_the_libraries(monkeypatch):
    """The warm-up's driver thread begins the early start (the driver's start, cuBLAS's load beside it)
    unless cudarl.load_policy did, waits for it, makes the context current in itself, then runs
    on_context() there once the GEMM libraries' load has ended; not when the driver did not start; what
    on_context raises is dropped, and the selection still happens."""
    import threading

    calls = []
    _pretend_selection(monkeypatch)
    _fake_early_start(monkeypatch, calls, cublas_s=0.2)  # slower than the driver: on_context must wait for it
    monkeypatch.setattr(backend, "_start_driver", lambda: calls.append("driver") or True)
    t = backend.warm_up("cupy", on_context=lambda: calls.append(("context", threading.current_thread().name)))
    t.join(5)
    assert calls == [
        ("early start", "cudarl-driver-early"),
        ("libraries", "cudarl-gemm-libraries"),
        "driver",
        ("context", "cudarl-driver-start"),
    ]
    assert backend.get("cupy").device == "warmed cupy"

    calls.clear()
    _fake_early_start(monkeypatch, calls)
    monkeypatch.setattr(backend, "_start_driver", lambda: calls.append("no driver") or False)
    backend.warm_up("other", on_context=lambda: calls.append("context")).join(5)
    assert sorted(map(str, calls)) == sorted(
        map(str, [("early start", "cudarl-driver-early"), ("libraries", "cudarl-gemm-libraries"), "no driver"])
    )  # no context: on_context skipped
    assert calls[-1] == "no driver"  # after the early start's two calls

    # an early start begun before (cudarl.load_policy) is waited for, not begun again
    calls.clear()
    _fake_early_start(monkeypatch, calls)
    _driver.start_early("gpu")
    monkeypatch.setattr(backend, "_start_driver", lambda: calls.append("driver") or True)
    backend.warm_up("fifth", on_context=lambda: calls.append("context")).join(5)
    assert len(_driver._early) == 1 and calls[-2:] == ["driver", "context"] and len(calls) == 4

    def raising():
        raise RuntimeError("dropped")

    _fake_early_start(monkeypatch, calls)
    monkeypatch.setattr(backend, "_start_driver", lambda: True)
    backend.warm_up("third", on_context=raising).join(5)
    assert backend.get("third").device == "warmed third"

    # the selection (and so get()) does not wait for on_context; then does
    calls.clear()
    release = threading.Event()
    _fake_early_start(monkeypatch, [])

    def slow_context():
        release.wait(5)
        calls.append("context")

    t = backend.warm_up("fourth", on_context=slow_context, then=lambda be: calls.append("then"))
    assert backend.get("fourth").device == "warmed fourth" and calls == []
    release.set()
    t.join(5)
    assert calls == ["context", "then"]


def test_load_policy_begins_the_drivers_start_before_cudarls_modules(monkeypatch):
    """cudarl.load_policy (cudarl._load, light to import) begins the driver's start in a thread for a
    gpu or auto request where CuPy is installed, once a process, before importing cudarl.policy; the
    warm-up's driver thread waits for it; cpu, auto with CUDARL_BACKEND=numpy, an unknown device and no
    CuPy start nothing, while an explicit gpu overrides the variable (backend.select's precedence)."""
    import subprocess
    import sys
    import threading

    calls = []
    monkeypatch.setattr(_driver, "_early", [])
    monkeypatch.setattr(_driver, "start", lambda: calls.append(("start", threading.current_thread().name)) or True)
    monkeypatch.setattr(_driver, "load_cublas", lambda: calls.append("cublas"))
    monkeypatch.setattr(_driver, "cupy_installed", lambda: False)  # no CuPy
    _driver.start_early("gpu")
    monkeypatch.setenv("CUDARL_BACKEND", "numpy")
    _driver.start_early("auto")
    assert not _driver._early
    monkeypatch.setattr(_driver, "cupy_installed", lambda: True)  # CuPy "installed"
    _driver.start_early("auto")  # CUDARL_BACKEND=numpy: auto is NumPy, as backend.select picks
    _driver.start_early("tpu")  # an unknown device: its load reports it
    assert not _driver._early
    monkeypatch.delenv("CUDARL_BACKEND")
    _driver.start_early("cpu")
    assert not _driver._early
    monkeypatch.setenv("CUDARL_BACKEND", "numpy")
    _driver.start_early("gpu")  # an explicit gpu overrides the variable, as in backend.select
    monkeypatch.delenv("CUDARL_BACKEND")
    _driver.start_early("auto")  # once a process
    _driver.join_early()
    assert len(_driver._early) == 1 and _driver._early[0][1] == {"started": True}
    assert sorted(map(str, calls)) == sorted(map(str, ["cublas", ("start", "cudarl-driver-early")]))
    # importing cudarl.load_policy imports neither NumPy nor cudarl.policy (a fresh interpreter)
    code = "import sys, cudarl; cudarl.load_policy; print('numpy' in sys.modules, 'cudarl.policy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
