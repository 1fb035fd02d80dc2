"""The CUDA sources ship inside the wheel: build one, install it into a fresh venv, find the sources."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_cuda_sources_and_loader_finds_them(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = wheels.glob("cudarl-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for cu in (ROOT / "cuda_src").glob("*.cu"):
        assert f"cudarl/cuda_src/{cu.name}" in names, f"{cu.name} missing from the wheel"
    assert "cudarl/cuda_src/include/cudarl/philox.cuh" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    code = "import cudarl, cudarl.kernels as k; print(cudarl.__file__); print(k.SRC_DIR); print(len(k.program('util')))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    pkg_file, src_dir, n = r.stdout.split()
    assert str(venv) in pkg_file, f"imported cudarl from {pkg_file}, not from the installed wheel"
    assert src_dir.startswith(str(venv)) and src_dir.endswith("cudarl/cuda_src")
    assert int(n) > 100


def test_every_subpackage_is_declared_in_setup_cfg():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = set(cfg["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cudarl").rglob("__init__.py")}
    assert found - declared == set(), f"packages missing from setup.cfg: {sorted(found - declared)}"
