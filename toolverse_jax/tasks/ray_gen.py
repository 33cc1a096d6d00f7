"""GUST generation on a Ray cluster: `generate_gust(cfg)` with `backend="ray"`.

One `GustGenerator` actor per generator (`num_processes` of them) builds what a generator
process builds (its executor and env pool, the tool graph, the instruction writer) on its own
node and runs index chunks with the same `_run_chunk` code. The driver keeps the process
backend's in-order consumption (`gust.feed_chunks`), so the kept task set is the same as with
processes or in one process. A chunk is a pure function of its task seeds (every DUSA walk runs
against fresh episodes), so unlike tool calls it is safe to rerun: Ray restarts a dead actor and
retries its chunk (`max_restarts`, `max_task_retries`); a chunk that still fails raises naming
its seeds.

The driver joins the cluster named by `RAY_ADDRESS` (or starts a local one) unless the caller
has already called `ray.init`. Actors reserve one CPU each by default (DUSA is CPU-bound);
`ray_options` go to `actor.options`, e.g. `{"resources": {"gen_node": 1}}` to place them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from toolverse_jax.envs.ray_backend import require_ray
from toolverse_jax.tasks import gust

ACTOR_DEFAULTS = {"num_cpus": 1, "max_restarts": 2, "max_task_retries": 2}


class GustGenerator:
    """The body of one generator as a Ray actor (wrapped by `ray.remote` in `generate_on_ray`)."""

    def __init__(self, settings: dict):
        # Sandboxes go below a root made on the actor's own node and removed by `shutdown`.
        self.root = tempfile.mkdtemp(prefix="toolverse_gust_ray_")
        gust._init_worker({**settings, "pool_root": self.root})

    def run(self, indices: list[int]) -> list:
        """Returns `_run_chunk(indices)`: (index, task JSON | None, reason, info) rows."""
        return gust._run_chunk(indices)

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        gust._shutdown_worker()
        shutil.rmtree(self.root, ignore_errors=True)


def generate_on_ray(n: int, s: dict, t0: float, consume) -> float:
    """Runs `gust.feed_chunks` on `n` GustGenerator actors until `consume` says done; returns
    the startup time (until every actor had built its executor and graph)."""
    ray = require_ray("generate_gust(backend='ray')")
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    options = {**ACTOR_DEFAULTS, **(s.get("ray_options") or {})}
    settings = {k: v for k, v in s.items() if k != "ray_options"}
    cls = ray.remote(GustGenerator)
    actors = [cls.options(**options).remote(settings) for _ in range(n)]
    try:
        try:
            ray.get([a.pid.remote() for a in actors], timeout=s["worker_start_timeout_s"])
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"GUST Ray generators did not start within {s['worker_start_timeout_s']} s: "
                f"does the cluster have {n} x {options} free (ray status)?") from None
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"a GUST Ray generator failed to start: {e}") from e
        startup = time.time() - t0
        turn = iter(range(1 << 62))

        def submit(chunk):
            return chunk, actors[next(turn) % n].run.remote(chunk)

        def result(handle):
            chunk, ref = handle
            try:
                return ray.get(ref)
            except ray.exceptions.RayError as e:
                raise RuntimeError(f"GUST chunk of task indices {chunk[0]}..{chunk[-1]} failed "
                                   f"on Ray after {options['max_task_retries']} retries: "
                                   f"{type(e).__name__}: {e}") from e

        gust.feed_chunks(s, 2 * n, submit, result, consume)
        return startup
    finally:
        done = [a.shutdown.remote() for a in actors]
        ray.wait(done, num_returns=len(done), timeout=30)
        for a in actors:
            ray.kill(a, no_restart=True)


__all__ = ["ACTOR_DEFAULTS", "GustGenerator", "generate_on_ray"]
