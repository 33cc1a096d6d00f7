"""The env pool: worker processes holding MCP client sessions to server subprocesses.

Trainer side (this process): `EnvPool` with a synchronous, batched API. Each worker (spawned
process, or the calling process when num_workers=0) runs an asyncio loop with `_WorkerCore`:
  - built-in and synthesized servers are *shared*: one process per (worker, server) holds the
    state of many episodes, keyed by the episode id sent in the request `_meta`;
  - third-party servers get one process per episode, launched on that episode's sandbox;
  - every call is validated (size, inputSchema, sandbox paths) before it is forwarded, has a
    timeout, and a dead or hung server is killed (its process group) and restarted on next use;
    the episodes whose state it held are marked failed, other episodes go on.
Server processes run in their own session (process group) under `setpriv --pdeathsig KILL`, so
they die with their worker even when the worker is killed; workers die with the trainer.
"""

import asyncio
import ctypes
import dataclasses
import itertools
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
import uuid
import weakref
from typing import Any

from toolverse_jax.envs import sandbox as sandbox_lib
from toolverse_jax.envs.catalog import Catalog, ServerEntry
from toolverse_jax.envs.validate import MAX_ARGS_BYTES, InvalidCall, check_arguments, confine_paths

log = logging.getLogger(__name__)

EPISODE_META_KEY = "toolverse/episode"
STATUSES = ("ok", "tool_error", "invalid_call", "timeout", "server_crashed")
_TAG_VAR = "TOOLVERSE_SERVER_TAG"
_MAX_CONTENT_CHARS = 64 * 1024
# Handshake-era protocol ("legacy", initialize): every server speaks it, and per call it costs
# ~30% less CPU on both ends than 2026-07-28's per-request metadata (measured here).
_MCP_MODE = os.environ.get("TOOLVERSE_MCP_MODE", "legacy")


# ----------------------------------------------------------------------------- public data types

@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """Which servers an episode uses and the seed of their initial state (hashable, JSON-able)."""

    servers: tuple[str, ...]
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.servers, str):
            object.__setattr__(self, "servers", (self.servers,))
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "seed", int(self.seed))

    def to_json(self) -> dict:
        return {"servers": list(self.servers), "seed": self.seed}

    @classmethod
    def from_json(cls, d: dict) -> "EpisodeSpec":
        return cls(servers=tuple(d["servers"]), seed=int(d.get("seed", 0)))


@dataclasses.dataclass(eq=False)
class Episode:
    """A live episode: id, the agent-visible tools, and the name → (server, tool) map."""

    id: str
    spec: EpisodeSpec
    tools: list[dict]
    names: dict[str, tuple[str, str]]
    worker: int = 0

    def resolve(self, name: str) -> tuple[str, str]:
        """Returns (server, tool) for an agent-facing tool name; KeyError names the valid ones."""
        if name in self.names:
            return self.names[name]
        hint = [n for n in self.names if n.endswith("." + name)]
        extra = f"; it is ambiguous, use one of {hint}" if hint else ""
        raise KeyError(f"episode {self.id} has no tool {name!r}{extra}; tools: {sorted(self.names)[:40]}")

    def __hash__(self):
        return hash(self.id)


@dataclasses.dataclass
class Observation:
    """Result of one tool call as the agent (content) and the verifier (structured) see it."""

    status: str
    content: str
    structured: dict | None = None
    reward_info: dict = dataclasses.field(default_factory=dict)


def episode_tools(catalog: Catalog, servers: tuple[str, ...]) -> tuple[list[dict], dict[str, tuple[str, str]]]:
    """Returns the agent-visible tool specs and name map; 'server.tool' only where names collide."""
    per = {s: catalog.list_tools(s) for s in servers}
    counts: dict[str, int] = {}
    for s in servers:
        for t in per[s]:
            counts[t["name"]] = counts.get(t["name"], 0) + 1
    tools, names = [], {}
    for s in servers:
        for t in per[s]:
            name = t["name"] if counts[t["name"]] == 1 else f"{s}.{t['name']}"
            names[name] = (s, t["name"])
            tools.append(dict(t, name=name))
    return tools, names


# ----------------------------------------------------------------------------- worker internals

def _set_pdeathsig() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_pids() -> list[int]:
    out = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _pid_with_tag(tag: str) -> int | None:
    needle = f"{_TAG_VAR}={tag}".encode()
    for pid in _child_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def _tag_of(pid: int) -> str | None:
    prefix = f"{_TAG_VAR}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix):].decode()
    except OSError:
        pass
    return None


def _kill_group(pid: int | None) -> None:
    if not pid:
        return
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _result_text(res) -> str:
    parts = []
    for c in res.content or []:
        text = getattr(c, "text", None)
        parts.append(text if text is not None else f"[{getattr(c, 'type', 'content')}]")
    text = "\n".join(parts)
    if not text and res.structured_content is not None:
        text = json.dumps(res.structured_content)
    return text if len(text) <= _MAX_CONTENT_CHARS else text[:_MAX_CONTENT_CHARS] + "\n[truncated]"


async def _no_validation(name, result) -> None:
    return None


class _Conn:
    """One MCP client session to one server (stdio subprocess, or in-process server object).

    The Client context is entered and exited by one owner task (anyio requires it); calls come
    from other tasks over the same session.
    """

    def __init__(self, key: str, target: Any, errlog, tag: str | None):
        self.key, self.target, self.errlog, self.tag = key, target, errlog, tag
        self.client = None
        self.pid: int | None = None
        self.dead = False
        self.episodes: set[str] = set()
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None

    async def start(self, timeout: float) -> None:
        from mcp import Client
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()

        async def run():
            try:
                transport = self.target
                if self.tag is not None:
                    transport = stdio_client(self.target, errlog=self.errlog)
                async with Client(transport, cache=None, mode=_MCP_MODE) as c:
                    # Results are not re-validated client side (it costs a tools/list per new tool
                    # name and ~10% of a call); the pool's contract is the server's own output.
                    c.session.validate_tool_result = _no_validation
                    self.client = c
                    ready.set_result(True)
                    await self._stop.wait()
            except BaseException as e:  # noqa: BLE001 - any failure means the server is gone
                if not ready.done():
                    ready.set_exception(RuntimeError(f"server {self.key} failed to start: {e!r}"))
            finally:
                self.dead = True

        self._task = asyncio.create_task(run())
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except BaseException:
            if self.tag is not None:
                _kill_group(_pid_with_tag(self.tag))
            await self.stop()
            raise
        if self.tag is not None:
            self.pid = _pid_with_tag(self.tag)

    def alive(self) -> bool:
        if self.dead:
            return False
        if self.pid is not None:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    if f.read().split(") ", 1)[1][0] in "ZX":
                        return False
            except OSError:
                return False
        return True

    async def stop(self, kill: bool = False) -> None:
        if kill:
            _kill_group(self.pid)
        self.dead = True
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            except BaseException:  # noqa: BLE001
                _kill_group(self.pid)
                self._task.cancel()


@dataclasses.dataclass
class _Ep:
    id: str
    servers: tuple[str, ...]
    seed: int
    root: str
    sandboxes: dict[str, str]
    conns: dict[str, _Conn]
    failed: bool = False
    reason: str = ""


class _WorkerCore:
    """Everything a worker does, as coroutines; used by worker processes and in-process mode."""

    def __init__(self, catalog: Catalog, root: str, in_process: bool, call_timeout_s: float,
                 start_timeout_s: float, max_arg_bytes: int):
        self.catalog, self.root, self.in_process = catalog, root, in_process
        self.call_timeout_s, self.start_timeout_s, self.max_arg_bytes = call_timeout_s, start_timeout_s, max_arg_bytes
        self.shared: dict[str, _Conn] = {}
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

    def _target(self, e: ServerEntry, sandbox: str):
        if self.in_process and e.kind == "builtin":
            from toolverse_jax.envs.builtin.run import build_server

            return build_server(e.name), None
        if self.in_process and e.kind == "synthesized":
            from toolverse_jax.envs.synth import build_server

            return build_server(e.manifest_path), None
        from mcp import StdioServerParameters

        tag = uuid.uuid4().hex
        launch = e.launch
        env = {k: e.format(v, sandbox) for k, v in launch.get("env", {}).items()}
        env.update({_TAG_VAR: tag, "TOOLVERSE_POOL_ROOT": self.root, "PYTHONPATH": os.pathsep.join(
            p for p in (e.format("{repo}"), os.environ.get("PYTHONPATH", "")) if p),
            "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
        cmd = e.format(launch["command"], sandbox)
        args = [e.format(a, sandbox) for a in launch.get("args", [])]
        if shutil.which("setpriv"):
            cmd, args = "setpriv", ["--pdeathsig", "KILL", "--", cmd, *args]
        cwd = e.format(launch["cwd"], sandbox) if launch.get("cwd") else (sandbox or None)
        return StdioServerParameters(command=cmd, args=args, env=env, cwd=cwd), tag

    async def _start(self, e: ServerEntry, key: str, sandbox: str) -> _Conn:
        target, tag = self._target(e, sandbox)
        if tag is not None:
            self._tags.add(tag)
        conn = _Conn(key, target, self.errlog, tag)
        await conn.start(self.start_timeout_s)
        return conn

    async def _shared_conn(self, e: ServerEntry) -> _Conn:
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
            conn = await self._start(e, e.name, self.root)
            self.shared[e.name] = conn
            fut.set_result(conn)
            return conn
        except BaseException as ex:
            fut.set_exception(ex)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._starting[e.name]

    async def _lost(self, conn: _Conn, reason: str) -> None:
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
                            "_tv_reset", {"seed": seed, "sandbox": sb}, meta={EPISODE_META_KEY: eid}),
                            self.start_timeout_s)
                        if res.is_error:
                            raise RuntimeError(f"{s}: reset failed: {_result_text(res)}")
                else:
                    conn = await self._start(e, f"{s}@{eid}", sb)
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
            return obs("invalid_call", f"episode {eid!r} is not open on this pool (closed or never reset)", valid=False)
        if server not in ep.conns and not ep.failed:
            return obs("invalid_call", f"server {server!r} is not part of episode {eid}; servers: {list(ep.servers)}",
                       valid=False)
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
        return obs("tool_error" if res.is_error else "ok", _result_text(res),
                   res.structured_content if isinstance(res.structured_content, dict) else None, executed=True)

    async def _responsive(self, conn: _Conn) -> bool:
        try:
            await asyncio.wait_for(conn.client.list_tools(), min(2.0, self.call_timeout_s))  # ping is gone in 2026-07-28
            return True
        except BaseException:  # noqa: BLE001
            return False

    async def _after_timeout(self, conn: _Conn, ep: _Ep) -> None:
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
                res = await asyncio.wait_for(conn.client.call_tool("_tv_state", {}, meta={EPISODE_META_KEY: eid}),
                                             self.call_timeout_s)
                out[s] = json.loads(_result_text(res))["state"] if not res.is_error else None
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
                        await asyncio.wait_for(conn.client.call_tool("_tv_close", {}, meta={EPISODE_META_KEY: eid}),
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
        for pid in _child_pids():  # only our own servers: in-process mode shares the process
            if _tag_of(pid) in self._tags:
                _kill_group(pid)
        self.errlog.close()


def _dispatch(core: _WorkerCore, msg: tuple):
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


def _worker_main(conn, catalog: Catalog, opts: dict) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and closes us
    _set_pdeathsig()
    if os.getppid() == 1:
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    core = _WorkerCore(catalog, in_process=False, **opts)
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
                res = await _dispatch(core, msg)
                reply = ("ok", res, core.take_failed())
            except BaseException as ex:  # noqa: BLE001
                reply = ("error", f"{type(ex).__name__}: {ex}\n{traceback.format_exc()}", core.take_failed())
            conn.send(reply)

    try:
        loop.run_until_complete(serve())
    finally:
        for pid in _child_pids():
            _kill_group(pid)
        loop.close()


def _shutdown(procs: list, pipes: list, local: list, root: str) -> None:
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
    """

    _ids = itertools.count()

    def __init__(self, catalog: Catalog, num_workers: int = 2, call_timeout_s: float = 10.0,
                 start_timeout_s: float = 60.0, max_arg_bytes: int = MAX_ARGS_BYTES, root: str | None = None):
        self.catalog = catalog
        self.num_workers = num_workers
        self.call_timeout_s = call_timeout_s
        self._root = root or tempfile.mkdtemp(prefix="toolverse_pool_")
        self._opts = dict(call_timeout_s=call_timeout_s, start_timeout_s=start_timeout_s,
                          max_arg_bytes=max_arg_bytes)
        self._failed: set[str] = set()
        self._live: dict[str, Episode] = {}
        self._procs: list = []
        self._pipes: list = []
        self._local: list = []
        self._closed = False
        if num_workers == 0:
            core = _WorkerCore(catalog, root=os.path.join(self._root, "w0"), in_process=True, **self._opts)
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="envpool-local", daemon=True)
            thread.start()
            self._local += [loop, core, thread]
        else:
            for w in range(num_workers):
                self._procs.append(None)
                self._pipes.append(None)
                self._start_worker(w)
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._pipes, self._local, self._root)

    def _start_worker(self, w: int) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        opts = dict(self._opts, root=os.path.join(self._root, f"w{w}"))
        p = ctx.Process(target=_worker_main, args=(child, self.catalog, opts), daemon=True, name=f"envpool-w{w}")
        p.start()
        child.close()
        self._procs[w], self._pipes[w] = p, parent

    # -- plumbing
    def _request(self, per_worker: dict[int, tuple]) -> dict[int, Any]:
        """Sends one message to each listed worker, then collects every reply."""
        if self._closed:
            raise RuntimeError("EnvPool is closed; create a new one")
        if self.num_workers == 0:
            loop, core, _ = self._local
            out = {}
            for w, msg in per_worker.items():
                out[w] = asyncio.run_coroutine_threadsafe(_dispatch(core, msg), loop).result()
                self._failed.update(core.take_failed())
            return out
        for w, msg in per_worker.items():
            self._pipes[w].send(msg)
        out, errors = {}, []
        for w in per_worker:
            try:
                status, res, failed = self._pipes[w].recv()
            except (EOFError, OSError):
                self._worker_died(w)
                out[w] = None
                continue
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
                out[i] = Observation("invalid_call", f"episode {ep.id} is closed", None,
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
