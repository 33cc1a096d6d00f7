"""EnvPool's Ray backend: one async Ray actor per pool worker, each holding a `WorkerCore`.

`EnvPool(catalog, num_workers, backend="ray")` keeps the process backend's API and statuses; only
the transport changes. Each actor runs the same worker code (worker.py) on its own node: server
processes, sandboxes and isolation live where the actor lives, so actors can be placed on
CPU-only nodes (`ray_options={"resources": {"env_node": 1}}` or a scheduling strategy).
Ray restarts a dead actor (`max_restarts=-1`); the episodes it held are marked failed and their
calls answer `server_crashed`, as when a worker process dies. Calls are never retried by Ray: a
tool call is not idempotent.

The pool joins the Ray cluster named by `RAY_ADDRESS` (or starts a local one) unless the caller
has already called `ray.init`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback

from toolverse_jax.envs.catalog import Catalog
from toolverse_jax.envs.worker import WorkerCore, dispatch


def require_ray(user: str = "EnvPool(backend='ray')"):
    """Returns the `ray` module, or raises naming `user` and the extra that installs Ray."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(f"{user} needs Ray: pip install -e '.[ray]' "
                          "(the test extra includes it)") from e
    return ray


class EnvWorker:
    """The body of one pool worker as a Ray async actor (wrapped by `ray.remote` at start)."""

    def __init__(self, catalog: Catalog, opts: dict, name: str):
        # The root is made on the actor's own node: the driver's temp dir may not exist there.
        self.root = tempfile.mkdtemp(prefix=f"toolverse_{name}_")
        self.core = WorkerCore(catalog, in_process=False, root=self.root, **opts)

    async def run(self, msg: tuple) -> tuple:
        """Runs one pool message; returns (status, result, newly failed episode ids)."""
        try:
            res = await dispatch(self.core, msg)
            return "ok", res, self.core.take_failed()
        except BaseException as ex:  # noqa: BLE001 - reported to the driver like a worker error
            return "error", f"{type(ex).__name__}: {ex}\n{traceback.format_exc()}", self.core.take_failed()

    async def shutdown(self) -> None:
        await self.core.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    def pid(self) -> int:
        return os.getpid()


class RayWorkers:
    """The pool's transport to `n` EnvWorker actors: send a message to some, collect replies."""

    def __init__(self, catalog: Catalog, n: int, opts: dict, options: dict | None = None):
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        self.ray = ray
        opts = {k: v for k, v in opts.items() if k != "root"}
        cls = ray.remote(EnvWorker)
        # Actors wait on I/O and on their server processes: they reserve no CPU by default.
        base = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 64}
        base.update(options or {})
        self.actors = [cls.options(**base).remote(catalog, opts, f"w{w}") for w in range(n)]

    def request(self, per_worker: dict[int, tuple]) -> dict[int, tuple | None]:
        """Returns {worker: (status, result, failed ids)}, None for a worker that died."""
        refs = {w: self.actors[w].run.remote(msg) for w, msg in per_worker.items()}
        out: dict[int, tuple | None] = {}
        for w, ref in refs.items():
            try:
                out[w] = self.ray.get(ref)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError):
                out[w] = None
        return out

    def actor_pid(self, w: int) -> int:
        return self.ray.get(self.actors[w].pid.remote())

    def kill(self, w: int, restart: bool = True) -> None:
        """Kills worker `w`'s actor (fault tests); Ray restarts it unless `restart` is False."""
        self.ray.kill(self.actors[w], no_restart=not restart)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        refs = [a.shutdown.remote() for a in self.actors]
        try:
            self.ray.get(refs, timeout=timeout_s)
        except Exception:  # noqa: BLE001 - dead actors: their servers die with them (pdeathsig)
            pass
        for a in self.actors:
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []


__all__ = ["EnvWorker", "RayWorkers", "require_ray"]

