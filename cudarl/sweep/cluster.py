"""Populations over a Ray cluster: one actor per GPU (``num_gpus=1``), CPU actors on the NumPy backend
without a GPU. Ray places the actors and carries the work and the results (the bars go once into its
object store); the driver hands a population to each idle actor and records what comes back.

When an actor dies (its process or node lost, or ``ray.kill``), the population it held comes back as
``RayActorError``; its trials were not recorded, so they go back to the queue and run on another actor,
and the sweep's report lists what was retried. A dead actor is not replaced. Trials recorded before
stay recorded; if every actor dies the sweep stops, and running it again resumes it. Populations on
actors write no run directories (an actor's disk need not be the driver's), so a population cut there
runs again from update 0.

    ray start --head                       # or a cluster: ray start --address HEAD:6379 on each node
    cudarl-train sweep SPEC.toml --ray-address HEAD:6379
"""

from __future__ import annotations

import time
from collections import deque

from .core import SweepError, check_stop


class _Worker:
    """A Ray actor: runs populations (:func:`cudarl.sweep.work.run_population`)."""

    def __init__(self, gpu: bool):
        self.gpu = gpu

    def info(self) -> dict:
        import os
        import socket

        from .core import free_device_memory

        free = free_device_memory() if self.gpu else None
        return {"host": socket.gethostname(), "pid": os.getpid(), "free_bytes": free}

    def run(self, job: dict, bars) -> dict:
        from .work import run_population

        return run_population(job, bars)


class RayExecutor:
    """Populations sharded over Ray actors (their members keep no checkpoints: ``checkpoints = False``).

    ``address``: the cluster (``None``: what ``ray.init()`` finds, ``RAY_ADDRESS``, then a
    ``ray start`` of this host, else a new local instance);
    ``workers``: CPU actors when there is no GPU (0: the cluster's CPUs); ``device``: the spec's
    ``run.device`` (``cpu`` keeps GPU hosts on the NumPy backend); ``gpus_per_actor``: 1 (one actor a
    GPU), or a fraction for several actors on one GPU (0.5: two); ``on_dispatch(executor, actor, job)``
    is called after each hand-out (tests kill an actor there)."""

    def __init__(
        self,
        address=None,
        *,
        workers: int = 0,
        device: str = "auto",
        gpus_per_actor: float = 1.0,
        echo=print,
        on_dispatch=None,
    ):
        try:
            import ray
        except ImportError:
            raise SweepError("--ray needs Ray: pip install 'cudarl[cluster]'") from None
        self.ray, self.echo, self.on_dispatch = ray, echo, on_dispatch
        self.checkpoints = False  # no run directories: a population cut on an actor restarts
        self.retried: list[dict] = []
        t0 = time.perf_counter()
        self.started_here = not ray.is_initialized()
        if self.started_here:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        if device == "gpu" and not gpus:
            raise SweepError("run.device is gpu but the Ray cluster has no GPU")
        if not 0 < gpus_per_actor <= 1:
            raise SweepError(f"--gpus-per-actor must be in (0, 1], got {gpus_per_actor}")
        self.gpu = bool(gpus) and device != "cpu"
        n = int(gpus / gpus_per_actor + 1e-9) if self.gpu else (workers or max(1, int(res.get("CPU", 1))))
        opts = {"num_cpus": 1, "num_gpus": gpus_per_actor if self.gpu else 0, "max_restarts": 0}
        cls = ray.remote(**opts)(_Worker)
        self.actors = [cls.remote(self.gpu) for _ in range(n)]
        infos = ray.get([a.info.remote() for a in self.actors])
        self.names = {
            a: f"{i} ({x['host']} pid {x['pid']})" for i, (a, x) in enumerate(zip(self.actors, infos, strict=True))
        }
        free = [x["free_bytes"] for x in infos if x["free_bytes"] is not None]
        self.gpu_free = min(free) if free else None
        self.startup_s = time.perf_counter() - t0
        kind = "GPU" if self.gpu else "CPU (NumPy backend)"
        echo(f"Ray: {n} {kind} actor(s) ready in {self.startup_s:.1f} s")

    @property
    def slots(self) -> int:
        """Populations at a time: the live actors."""
        return max(1, len(self.actors))

    def describe(self) -> str:
        """Where populations run, in words (the report's ``executor``)."""
        return f"{len(self.actors)} Ray {'GPU' if self.gpu else 'CPU'} actor(s)"

    def run(self, jobs: list[dict], bars, done, echo, stop=()) -> None:
        """Hand each job to an idle actor; ``done(result)`` as each returns; requeue a dead actor's job.
        Once ``stop`` is set (a signal), return at once: the populations in flight are dropped with the
        actors (:meth:`close`), and their trials run again on resume."""
        ray = self.ray
        bars_ref = ray.put(bars)
        queue, idle, inflight = deque(jobs), list(self.actors), {}
        while queue or inflight:
            while queue and idle:
                actor, job = idle.pop(0), queue.popleft()
                inflight[actor.run.remote(job, bars_ref)] = (actor, job)
                echo(f"population {job['index']}: {len(job['trials'])} member(s) on actor {self.names[actor]}")
                if self.on_dispatch is not None:
                    self.on_dispatch(self, actor, job)
            if not inflight:
                raise SweepError(
                    f"every Ray actor died; {sum(len(j['trials']) for j in queue)} trial(s) not run "
                    "(finished trials are kept: run the sweep again to resume)"
                )
            ready = []
            while not ready:  # wake up now and then to see a signal
                check_stop(stop)
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            ref = ready[0]
            actor, job = inflight.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self.actors.remove(actor)
                why = f"actor {self.names[actor]} died ({type(e).__name__})"
                self.retried.append(
                    {"population": job["index"], "trials": [t["key"] for t in job["trials"]], "reason": why}
                )
                echo(f"{why}; population {job['index']} ({len(job['trials'])} trial(s)) goes to another actor")
                queue.appendleft(job)
                continue
            idle.append(actor)
            done(result)

    def close(self) -> None:
        """Kill the actors; shut Ray down if this executor started it."""
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started_here:
            self.ray.shutdown()
