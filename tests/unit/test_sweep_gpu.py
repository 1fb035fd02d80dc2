"""Sweeps on the GPU (run by tools/gpu_check.sh): populations packed by free device memory, and Ray
actors sharing one GPU with one killed mid-sweep, bit for bit equal to a sweep in one process.

On a host with several GPUs the second test runs one actor per GPU instead (``gpus_per_actor=1``)."""

import pytest
from test_sweep import GRID, ledger, write_spec

from cudarl.sweep import load_spec, run_sweep

GPU_SET = '"run.device" = "gpu"\n"run.grid_barrier" = false\n"env.n_envs" = 64\n"agent.batch_size" = 128\n'


def gpu_spec(tmp_path, **kw):
    p = write_spec(tmp_path, GRID, **kw)
    p.write_text(p.read_text().replace('"run.device" = "cpu"\n', "").replace("[set]\n", "[set]\n" + GPU_SET, 1))
    text = p.read_text().replace('"env.n_envs" = 4\n', "").replace('"agent.batch_size" = 32\n', "")
    p.write_text(text.replace('"agent.learning_starts" = 64', '"agent.learning_starts" = 256'))
    return p


@pytest.mark.gpu
def test_gpu_sweep_packs_trials_by_free_memory(tmp_path):
    rep = run_sweep(load_spec(gpu_spec(tmp_path, population=0)), echo=print)
    assert rep["trials"] == 4 and rep["populations_now"] == 1  # they differ in lr only: one population fits
    recs = ledger(tmp_path / "sweeps" / "s")
    assert {r["worker"]["backend"] for r in recs.values()} == {"cupy"}
    assert all(r["val"]["sharpe"] is not None for r in recs.values())


@pytest.mark.gpu
def test_gpu_ray_actors_with_one_killed_match_one_process_bit_for_bit(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'cudarl[cluster]')")
    from cudarl.sweep.cluster import RayExecutor

    spec = load_spec(gpu_spec(tmp_path, population=1))  # 4 populations of one
    run_sweep(spec, out=tmp_path / "local", echo=print)
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        killed = []

        def kill_first(executor, actor, job):
            if not killed:
                killed.append(job["index"])
                ray.kill(actor)

        share = 1.0 if gpus > 1 else 0.5  # several GPUs: one actor each; one GPU: two actors on it
        ex = RayExecutor(device="gpu", gpus_per_actor=share, on_dispatch=kill_first, echo=print)
        rep = run_sweep(spec, out=tmp_path / "ray", executor=ex, echo=print)
    finally:
        ray.shutdown()
    assert [r["population"] for r in rep["retried"]] == killed
    a, b = ledger(tmp_path / "local"), ledger(tmp_path / "ray")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k]["val"] == b[k]["val"] and a[k]["test"] == b[k]["test"]
        assert a[k]["weights_sha256"] == b[k]["weights_sha256"]
    print("GPU ray sweep:", len(b), "trials on", len({r["worker"]["pid"] for r in b.values()}), "actors")
