"""The env pool: worker processes holding MCP client sessions to server subprocesses.

Trainer side (this process): `EnvPool` with a synchronous, batched API. Each worker (spawned
process, or the calling process when num_workers=0) runs an asyncio loop with a `WorkerCore`
(worker.py) over `ServerConnection`s (connection.py). Server processes run in their own session
(process group) and die with their worker even when the worker is killed (pdeathsig, procs.py);
workers die with the trainer. Server processes are isolated (isolate.py: no network, writes only
to their sandbox, resource limits) where the machine supports it (`isolation=`).

The episode types live in episode.py and are re-exported here and from `toolverse_jax.envs`.
"""

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from typing import Any

from toolverse_jax.envs.catalog import Catalog
from toolverse_jax.envs.episode import (EPISODE_META_KEY, STATUSES, Episode, EpisodeSpec,
                                        Observation, episode_tools)
from toolverse_jax.envs.isolate import Isolation
from toolverse_jax.envs.validate import MAX_ARGS_BYTES
from toolverse_jax.envs.worker import WorkerCore, dispatch, worker_main

BACKENDS = ("process", "ray")

__all__ = ["BACKENDS", "EPISODE_META_KEY", "STATUSES", "EnvPool", "Episode", "EpisodeSpec", "Observation",
           "episode_tools"]

log = logging.getLogger(__name__)


def _shutdown(procs: list, pipes: list, local: list, root: str, ray_workers: list) -> None:
    if ray_workers:
        ray_workers[0].shutdown()
    for p, c in zip(procs, pipes):
        try:
            if p.is_alive():
                c.send(("shutdown", None))
        except (OSError, BrokenPipeError):
            pass
    deadline = time.time() + 10
    for p, c in zip(procs, pipes):
        try:
            if c.poll(max(0.0, deadline - time.time())):
                c.recv()
        except (OSError, EOFError):
            pass
        p.join(max(0.1, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(2)
        c.close()
    if local:
        loop, core, thread = local
        try:
            asyncio.run_coroutine_threadsafe(core.shutdown(), loop).result(30)
        except Exception as e:  # noqa: BLE001 - still stop the loop and remove the sandboxes
            log.warning("in-process env worker shutdown: %r", e)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            if not thread.is_alive():
                loop.close()
    shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------- trainer side

class EnvPool:
    """Batched, synchronous access to MCP environments run by `num_workers` worker processes.

    num_workers=0 runs the same worker code in this process (built-in and synthesized servers
    in-memory, no subprocesses except third-party servers): for fast unit tests. Its asyncio
    loop runs on a thread of its own, so the pool also works where the caller's thread already
    runs a loop (Jupyter, an async application).

    isolation: "auto" (default), "require", "off", or an `isolate.Isolation` with limits: how the
    server processes this pool launches are confined (isolate.py); in-process servers are not.
    backend: "process" (default: spawned worker processes on this machine) or "ray" (one Ray
    actor per worker, anywhere in the cluster; `ray_options` go to `actor.options`, e.g.
    {"resources": {"env_node": 1}}; see ray_backend.py).
    """

    _ids = itertools.count()

    def __init__(self, catalog: Catalog, num_workers: int = 2, call_timeout_s: float = 10.0,
                 start_timeout_s: float = 60.0, max_arg_bytes: int = MAX_ARGS_BYTES, root: str | None = None,
                 isolation: str | Isolation = "auto", backend: str = "process",
                 ray_options: dict | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"EnvPool backend must be one of {BACKENDS}; got {backend!r}")
        if backend == "ray" and num_workers < 1:
            raise ValueError("EnvPool(backend='ray') needs num_workers >= 1 (one actor per worker)")
        self.catalog = catalog
        self.backend = backend
        if isinstance(isolation, str):
            isolation = Isolation(mode=isolation)
        self.num_workers = num_workers
        self.call_timeout_s = call_timeout_s
        self._root = root or tempfile.mkdtemp(prefix="toolverse_pool_")
        self._opts = dict(call_timeout_s=call_timeout_s, start_timeout_s=start_timeout_s,
                          max_arg_bytes=max_arg_bytes, isolation=isolation)
        self._failed: set[str] = set()
        self._live: dict[str, Episode] = {}
        self._procs: list = []
        self._pipes: list = []
        self._local: list = []
        self._ray: list = []
        self._closed = False
        if backend == "ray":
            from toolverse_jax.envs.ray_backend import RayWorkers

            self._ray.append(RayWorkers(catalog, num_workers, self._opts, ray_options))
        elif num_workers == 0:
            core = WorkerCore(catalog, root=os.path.join(self._root, "w0"), in_process=True, **self._opts)
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="envpool-local", daemon=True)
            thread.start()
            self._local += [loop, core, thread]
        else:
            for w in range(num_workers):
                self._procs.append(None)
                self._pipes.append(None)
                self._start_worker(w)
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._pipes, self._local, self._root,
                                           self._ray)

    def _start_worker(self, w: int) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        opts = dict(self._opts, root=os.path.join(self._root, f"w{w}"))
        p = ctx.Process(target=worker_main, args=(child, self.catalog, opts), daemon=True, name=f"envpool-w{w}")
        p.start()
        child.close()
        self._procs[w], self._pipes[w] = p, parent

    # -- plumbing
    def _request(self, per_worker: dict[int, tuple]) -> dict[int, Any]:
        """Sends one message to each listed worker, then collects every reply."""
        if self._closed:
            raise RuntimeError("EnvPool is closed; create a new one")
        if self._ray:
            return self._collect(self._ray[0].request(per_worker))
        if self.num_workers == 0:
            loop, core, _ = self._local
            out = {}
            for w, msg in per_worker.items():
                out[w] = asyncio.run_coroutine_threadsafe(dispatch(core, msg), loop).result()
                self._failed.update(core.take_failed())
            return out
        for w, msg in per_worker.items():
            self._pipes[w].send(msg)
        replies = {}
        for w in per_worker:
            try:
                replies[w] = self._pipes[w].recv()
            except (EOFError, OSError):
                replies[w] = None
        return self._collect(replies)

    def _collect(self, replies: dict[int, tuple | None]) -> dict[int, Any]:
        """Returns each worker's result from its (status, result, failed ids) reply; a worker
        that died (None) gets its episodes failed and result None; errors raise together."""
        out, errors = {}, []
        for w, reply in replies.items():
            if reply is None:
                self._worker_died(w)
                out[w] = None
                continue
            status, res, failed = reply
            self._failed.update(failed)
            if status == "error":
                errors.append(f"worker {w}: {res}")
            out[w] = res
        if errors:
            raise RuntimeError("env pool worker error:\n" + "\n".join(errors))
        return out

    def _worker_died(self, w: int) -> None:
        log.error("env pool worker %d died; restarting it and failing its episodes", w)
        for ep in self._live.values():
            if ep.worker == w:
                self._failed.add(ep.id)
        if self._ray:
            return  # Ray restarts the actor (max_restarts=-1)
        self._procs[w].join(1)
        self._start_worker(w)

    # -- API
    def reset(self, specs: list[EpisodeSpec]) -> list[Episode]:
        """Returns one fresh Episode per spec (new sandbox and seeded state for each server)."""
        eps = []
        load = {w: 0 for w in range(max(1, self.num_workers))}
        for ep in self._live.values():
            load[ep.worker] = load.get(ep.worker, 0) + 1
        for spec in specs:
            if not isinstance(spec, EpisodeSpec):
                spec = EpisodeSpec.from_json(spec) if isinstance(spec, dict) else EpisodeSpec(*spec)
            for s in spec.servers:
                e = self.catalog.entry(s)
                if not e.available:
                    raise ValueError(f"server {s!r} is unavailable: {e.reason}")
            tools, names = episode_tools(self.catalog, spec.servers)
            w = min(load, key=load.get)
            load[w] += 1
            eid = f"ep{next(self._ids)}-{uuid.uuid4().hex[:8]}"
            eps.append(Episode(eid, spec, tools, names, w))
        per: dict[int, list] = {}
        for ep in eps:
            per.setdefault(ep.worker, []).append(ep)
        replies = self._request({w: ("reset", [(ep.id, ep.spec.servers, ep.spec.seed) for ep in group])
                                 for w, group in per.items()})
        for w, group in per.items():
            for ep, err in zip(group, replies[w] or [f"worker {w} died"] * len(group)):
                if err:
                    log.warning("episode %s failed at reset: %s", ep.id, err)
                    self._failed.add(ep.id)
        for ep in eps:
            self._live[ep.id] = ep
        return eps

    def step(self, calls: list[tuple[Episode, str, dict]]) -> list[Observation]:
        """Returns one Observation per (episode, agent tool name, arguments), in order."""
        out: list[Observation | None] = [None] * len(calls)
        per: dict[int, list] = {}
        for i, (ep, name, args) in enumerate(calls):
            if ep.id not in self._live:
                out[i] = Observation("invalid_call", "this episode is closed", None,
                                     {"valid": False, "executed": False, "latency_s": 0.0})
                continue
            try:
                server, tool = ep.resolve(name)
            except KeyError as e:
                out[i] = Observation("invalid_call", str(e.args[0]), None,
                                     {"valid": False, "executed": False, "latency_s": 0.0})
                continue
            per.setdefault(ep.worker, []).append((i, (ep.id, server, tool, args)))
        replies = self._request({w: ("step", [c for _, c in items]) for w, items in per.items()})
        for w, items in per.items():
            res = replies[w]
            for k, (i, (eid, server, tool, _)) in enumerate(items):
                if res is None:
                    out[i] = Observation("server_crashed", f"env worker died during {tool!r}", None,
                                         {"valid": True, "executed": True, "latency_s": 0.0})
                else:
                    r = res[k]
                    out[i] = Observation(r["status"], r["content"], r["structured"], r["reward_info"])
        return out  # type: ignore[return-value]

    def read_state(self, ep: Episode) -> dict:
        """Returns {server: JSON state} of an episode (hidden state read, for verifiers)."""
        return self._request({ep.worker: ("state", ep.id)})[ep.worker]

    def is_failed(self, ep: Episode) -> bool:
        """Returns True if an infrastructure failure (crash, hang, failed reset) hit `ep`."""
        return ep.id in self._failed

    def close(self, episodes: list[Episode] | None = None) -> None:
        """Closes episodes (sandboxes removed); with no argument, shuts the whole pool down."""
        if episodes is None:
            self.shutdown()
            return
        per: dict[int, list] = {}
        for ep in episodes:
            if self._live.pop(ep.id, None) is not None:
                per.setdefault(ep.worker, []).append(ep.id)
            self._failed.discard(ep.id)
        if per:
            self._request({w: ("close", ids) for w, ids in per.items()})

    def server_pid(self, ep: Episode, server: str) -> int | None:
        """Returns the pid of the process serving `server` for `ep` (for fault tests)."""
        return self._request({ep.worker: ("pid", (ep.id, server))})[ep.worker]

    def shutdown(self) -> None:
        """Stops all workers and servers and removes every sandbox."""
        if not self._closed:
            self._closed = True
            self._live.clear()
            self._finalizer()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
