"""The env-pool worker: `WorkerCore` runs episodes as coroutines over MCP connections.

  - built-in and synthesized servers are *shared*: one process per (worker, server) holds the
    state of many episodes, keyed by the episode id sent in the request `_meta`;
  - third-party servers get one process per episode, launched on that episode's sandbox;
  - every call is validated (size, inputSchema, sandbox paths) before it is forwarded, has a
    timeout, and a dead or hung server is killed (its process group) and restarted on next use;
    the episodes whose state it held are marked failed, other episodes go on.
`worker_main` serves a core in a spawned process over a pipe; `EnvPool` (pool.py) with
num_workers=0 drives one in its own process.
"""

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import time
import traceback
import uuid
from typing import Any

from toolverse_jax.envs import isolate as isolate_lib
from toolverse_jax.envs import sandbox as sandbox_lib
from toolverse_jax.envs.catalog import Catalog, ServerEntry
from toolverse_jax.envs.connection import ServerConnection, result_text
from toolverse_jax.envs.episode import CONTROL_META_KEY, CONTROL_TOKEN_VAR, EPISODE_META_KEY
from toolverse_jax.envs.procs import SERVER_TAG_VAR, child_pids, kill_group, set_pdeathsig, tag_of
from toolverse_jax.envs.validate import InvalidCall, check_arguments, confine_paths

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Ep:
    """A worker's view of one open episode: its sandboxes, connections and failure."""
    id: str
    servers: tuple[str, ...]
    seed: int
    root: str
    sandboxes: dict[str, str]
    conns: dict[str, ServerConnection]
    failed: bool = False
    reason: str = ""


class WorkerCore:
    """Everything a worker does, as coroutines; used by worker processes and in-process mode."""

    def __init__(self, catalog: Catalog, root: str, in_process: bool, call_timeout_s: float,
                 start_timeout_s: float, max_arg_bytes: int,
                 isolation: isolate_lib.Isolation = isolate_lib.Isolation()):
        self.catalog, self.root, self.in_process = catalog, root, in_process
        self.isolation = isolation
        self.control_token = secrets.token_hex(16)  # what the servers this core starts obey
        self.call_timeout_s, self.start_timeout_s, self.max_arg_bytes = call_timeout_s, start_timeout_s, max_arg_bytes
        self.shared: dict[str, ServerConnection] = {}
        self.eps: dict[str, _Ep] = {}
        self.specs: dict[str, dict[str, dict]] = {}
        self.newly_failed: set[str] = set()
        os.makedirs(root, exist_ok=True)
        logging.getLogger("client").setLevel(logging.ERROR)  # mcp's "tool not listed" chatter
        self.errlog = open(os.path.join(root, f"servers-{os.getpid()}.log"), "a")
        self._starting: dict[str, asyncio.Future] = {}
        self._tags: set[str] = set()  # env tags of the server processes this core started

    # -- servers
    def _tool_specs(self, server: str) -> dict[str, dict]:
        if server not in self.specs:
            self.specs[server] = {t["name"]: t for t in self.catalog.list_tools(server)}
        return self.specs[server]

    def _control(self, eid: str) -> dict:
        """The `_meta` of a control-plane request for episode `eid` (see EpisodeControl)."""
        return {EPISODE_META_KEY: eid, CONTROL_META_KEY: self.control_token}

    def _target(self, e: ServerEntry, sandbox: str):
        if self.in_process and e.kind == "builtin":
            from toolverse_jax.envs.builtin.run import build_server

            return build_server(e.name, self.control_token), None
        if self.in_process and e.kind == "synthesized":
            from toolverse_jax.envs.synth import build_server

            return build_server(e.manifest_path, self.control_token), None
        from mcp import StdioServerParameters

        tag = uuid.uuid4().hex
        launch = e.launch
        env = {k: e.format(v, sandbox) for k, v in launch.get("env", {}).items()}
        env.update({SERVER_TAG_VAR: tag, "TOOLVERSE_POOL_ROOT": self.root, "PYTHONPATH": os.pathsep.join(
            p for p in (e.format("{repo}"), os.environ.get("PYTHONPATH", "")) if p),
            "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
        if e.stateful:  # our own servers: their settings (TOOLVERSE_SEARCH_CORPUS, ...) and the
            # control-plane token; no third-party server sees either
            env.update({k: v for k, v in os.environ.items()
                        if k.startswith("TOOLVERSE_") and k not in env and k != SERVER_TAG_VAR})
            env[CONTROL_TOKEN_VAR] = self.control_token
        cmd = e.format(launch["command"], sandbox)
        args = [e.format(a, sandbox) for a in launch.get("args", [])]
        # A shared server holds many episodes' sandboxes (all under this worker's root); an
        # episode's own server may write only its sandbox and a scratch directory beside it.
        writable = self.root if e.shared else sandbox
        tmp = os.path.join(self.root, ".tmp") if e.shared else os.path.join(
            os.path.dirname(sandbox), f".tmp-{os.path.basename(sandbox)}")
        prefix = self.isolation.prefix([writable, tmp], shared=e.shared)
        if prefix:
            os.makedirs(tmp, exist_ok=True)
            env["TMPDIR"] = tmp
            cmd, args = prefix[0], [*prefix[1:], cmd, *args]
        elif shutil.which("setpriv"):
            cmd, args = "setpriv", ["--pdeathsig", "KILL", "--", cmd, *args]
        cwd = e.format(launch["cwd"], sandbox) if launch.get("cwd") else (sandbox or None)
        return StdioServerParameters(command=cmd, args=args, env=env, cwd=cwd), tag

    async def start_server(self, e: ServerEntry, key: str, sandbox: str) -> ServerConnection:
        """Returns a started connection to server `e` (process on `sandbox`, or in-process)."""
        target, tag = self._target(e, sandbox)
        if tag is not None:
            self._tags.add(tag)
        conn = ServerConnection(key, target, self.errlog, tag)
        await conn.start(self.start_timeout_s)
        return conn

    async def _shared_conn(self, e: ServerEntry) -> ServerConnection:
        conn = self.shared.get(e.name)
        if conn is not None and conn.alive():
            return conn
        if conn is not None:
            await self._lost(conn, "server process died")
        if e.name in self._starting:  # another coroutine is already starting it
            return await asyncio.shield(self._starting[e.name])
        fut = asyncio.get_running_loop().create_future()
        self._starting[e.name] = fut
        try:
            conn = await self.start_server(e, e.name, self.root)
            self.shared[e.name] = conn
            fut.set_result(conn)
            return conn
        except BaseException as ex:
            fut.set_exception(ex)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._starting[e.name]

    async def _lost(self, conn: ServerConnection, reason: str) -> None:
        """Kills a dead/hung server and marks every episode whose state it held failed."""
        for eid in conn.episodes:
            ep = self.eps.get(eid)
            if ep is not None and not ep.failed:
                ep.failed, ep.reason = True, f"{conn.key}: {reason}"
                self.newly_failed.add(eid)
        if self.shared.get(conn.key) is conn:
            del self.shared[conn.key]
        await conn.stop(kill=True)

    # -- episodes
    async def reset(self, items: list[tuple[str, tuple[str, ...], int]]) -> list[str | None]:
        return list(await asyncio.gather(*(self._reset_one(*it) for it in items)))

    async def _reset_one(self, eid: str, servers: tuple[str, ...], seed: int) -> str | None:
        root = os.path.join(self.root, eid)
        ep = _Ep(eid, servers, seed, root, {}, {})
        self.eps[eid] = ep
        try:
            for s in servers:
                e = self.catalog.entry(s)
                sb = await asyncio.to_thread(sandbox_lib.make_sandbox, os.path.join(root, s), e.sandbox, seed)
                ep.sandboxes[s] = sb
                if e.shared:
                    conn = await self._shared_conn(e)
                    conn.episodes.add(eid)
                    ep.conns[s] = conn
                    if e.stateful:
                        res = await asyncio.wait_for(conn.client.call_tool(
                            "_tv_reset", {"seed": seed, "sandbox": sb}, meta=self._control(eid)),
                            self.start_timeout_s)
                        if res.is_error:
                            raise RuntimeError(f"{s}: reset failed: {result_text(res)}")
                else:
                    conn = await self.start_server(e, f"{s}@{eid}", sb)
                    conn.episodes.add(eid)
                    ep.conns[s] = conn
            return None
        except BaseException as ex:  # noqa: BLE001
            ep.failed, ep.reason = True, f"reset failed: {ex!r}"
            log.warning("episode %s: %s", eid, ep.reason)
            return ep.reason

    async def step(self, calls: list[tuple[str, str, str, Any]]) -> list[dict]:
        # Calls of one episode run in the given order; different episodes run concurrently.
        out: list[dict | None] = [None] * len(calls)
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(calls):
            groups.setdefault(c[0], []).append(i)

        async def run(idx):
            for i in idx:
                out[i] = await self._call(*calls[i])

        await asyncio.gather(*(run(idx) for idx in groups.values()))
        return out  # type: ignore[return-value]

    async def _call(self, eid: str, server: str, tool: str, args: Any) -> dict:
        t0 = time.perf_counter()

        def obs(status, content, structured=None, valid=True, executed=False):
            return {"status": status, "content": content, "structured": structured,
                    "reward_info": {"valid": valid, "executed": executed, "server": server, "tool": tool,
                                    "latency_s": time.perf_counter() - t0}}

        ep = self.eps.get(eid)
        if ep is None:
            return obs("invalid_call", "this episode is not open on this pool (closed or never reset)",
                       valid=False)
        if server not in ep.conns and not ep.failed:
            return obs("invalid_call", f"server {server!r} is not part of this episode; "
                                       f"servers: {list(ep.servers)}", valid=False)
        spec = self._tool_specs(server).get(tool) if server in ep.servers else None
        if spec is None:
            return obs("invalid_call", f"server {server!r} has no tool {tool!r}; tools: "
                                       f"{sorted(self._tool_specs(server))[:40] if server in ep.servers else []}",
                       valid=False)
        e = self.catalog.entry(server)
        try:
            args = check_arguments(tool, spec.get("inputSchema"), args, self.max_arg_bytes)
            if e.path_params:
                args = confine_paths(args, e.path_params, e.format(e.path_root, ep.sandboxes[server]))
        except InvalidCall as ex:
            return obs("invalid_call", str(ex), valid=False)
        if ep.failed:
            return obs("server_crashed", f"episode {eid} failed earlier ({ep.reason}); reset a new one")
        conn = ep.conns[server]
        if not conn.alive():
            await self._lost(conn, "server process died")
            return obs("server_crashed", f"server {server!r} died; episode {eid} is marked failed")
        meta = {EPISODE_META_KEY: eid} if e.shared and e.stateful else None
        try:
            res = await asyncio.wait_for(conn.client.call_tool(tool, args, meta=meta), self.call_timeout_s)
        except asyncio.TimeoutError:
            await self._after_timeout(conn, ep)
            return obs("timeout", f"tool {tool!r} on server {server!r} did not answer within "
                                  f"{self.call_timeout_s:.1f}s", executed=True)
        except Exception as ex:  # noqa: BLE001
            if conn.alive() and await self._responsive(conn):
                # The server is fine; its answer was not (e.g. a result violating its outputSchema).
                return obs("tool_error", f"tool {tool!r} on server {server!r} returned an unusable result: "
                                         f"{type(ex).__name__}: {str(ex)[:500]}", executed=True)
            await self._lost(conn, f"call failed: {ex!r}")
            return obs("server_crashed", f"server {server!r} crashed during {tool!r}: {type(ex).__name__}; "
                                         f"episode {eid} is marked failed", executed=True)
        return obs("tool_error" if res.is_error else "ok", result_text(res),
                   res.structured_content if isinstance(res.structured_content, dict) else None, executed=True)

    async def _responsive(self, conn: ServerConnection) -> bool:
        try:
            await asyncio.wait_for(conn.client.list_tools(), min(2.0, self.call_timeout_s))  # ping is gone in 2026-07-28
            return True
        except BaseException:  # noqa: BLE001
            return False

    async def _after_timeout(self, conn: ServerConnection, ep: _Ep) -> None:
        # A slow tool in a live server leaves the episode usable; an unresponsive server is killed.
        if not await self._responsive(conn):
            conn.episodes.add(ep.id)
            await self._lost(conn, "hung past the call timeout")

    async def read_state(self, eid: str) -> dict:
        ep = self.eps.get(eid)
        if ep is None:
            raise KeyError(f"episode {eid!r} is not open")
        out = {}
        for s in ep.servers:
            e = self.catalog.entry(s)
            conn = ep.conns.get(s)
            if e.stateful and conn is not None and conn.alive() and not ep.failed:
                res = await asyncio.wait_for(conn.client.call_tool("_tv_state", {}, meta=self._control(eid)),
                                             self.call_timeout_s)
                # whole text: a state past the agent-visible cap must still parse
                out[s] = json.loads(result_text(res, limit=None))["state"] if not res.is_error else None
            elif s in ep.sandboxes:
                out[s] = await asyncio.to_thread(sandbox_lib.read_sandbox, ep.sandboxes[s])
            else:
                out[s] = None
        return out

    async def close(self, eids: list[str]) -> None:
        await asyncio.gather(*(self._close_one(eid) for eid in eids))

    async def _close_one(self, eid: str) -> None:
        ep = self.eps.pop(eid, None)
        if ep is None:
            return
        for s, conn in ep.conns.items():
            conn.episodes.discard(eid)
            e = self.catalog.entry(s)
            if e.shared:
                if e.stateful and conn.alive():
                    try:
                        await asyncio.wait_for(conn.client.call_tool("_tv_close", {}, meta=self._control(eid)),
                                               self.call_timeout_s)
                    except BaseException:  # noqa: BLE001
                        pass
            else:
                await conn.stop(kill=False)
        self.newly_failed.discard(eid)
        await asyncio.to_thread(shutil.rmtree, ep.root, True)

    def server_pid(self, eid: str, server: str) -> int | None:
        ep = self.eps.get(eid)
        return ep.conns[server].pid if ep and server in ep.conns else None

    def take_failed(self) -> list[str]:
        out, self.newly_failed = sorted(self.newly_failed), set()
        return out

    async def shutdown(self) -> None:
        await self.close(list(self.eps))
        conns = list(self.shared.values())
        self.shared.clear()
        await asyncio.gather(*(c.stop() for c in conns), return_exceptions=True)
        for pid in child_pids():  # only our own servers: in-process mode shares the process
            if tag_of(pid) in self._tags:
                kill_group(pid)
        self.errlog.close()


def dispatch(core: WorkerCore, msg: tuple):
    """Returns the coroutine that runs one pool message `(op, arg)` on `core`."""
    op, arg = msg
    if op == "reset":
        return core.reset(arg)
    if op == "step":
        return core.step(arg)
    if op == "state":
        return core.read_state(arg)
    if op == "close":
        return core.close(arg)
    if op == "pid":
        async def pid():
            return core.server_pid(*arg)
        return pid()
    raise ValueError(f"unknown worker op {op!r}")


def worker_main(conn, catalog: Catalog, opts: dict) -> None:
    """Serves a `WorkerCore` over pipe `conn` until shutdown (the body of a spawned worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and closes us
    set_pdeathsig()
    if os.getppid() == 1:
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    core = WorkerCore(catalog, in_process=False, **opts)
    queue: asyncio.Queue = asyncio.Queue()

    def on_readable():
        try:
            queue.put_nowait(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            queue.put_nowait(("shutdown", None))

    loop.add_reader(conn.fileno(), on_readable)
    signal.signal(signal.SIGTERM, lambda *_: queue.put_nowait(("shutdown", None)))

    async def serve():
        while True:
            msg = await queue.get()
            if msg[0] == "shutdown":
                await core.shutdown()
                try:
                    conn.send(("ok", None, []))
                except (OSError, BrokenPipeError):
                    pass
                return
            try:
                res = await dispatch(core, msg)
                reply = ("ok", res, core.take_failed())
            except BaseException as ex:  # noqa: BLE001
                reply = ("error", f"{type(ex).__name__}: {ex}\n{traceback.format_exc()}", core.take_failed())
            conn.send(reply)

    try:
        loop.run_until_complete(serve())
    finally:
        for pid in child_pids():
            kill_group(pid)
        loop.close()
