"""Framework for built-in stateful MCP servers: one `Domain` per file, per-episode state.

A domain is a set of typed tool functions plus `init_state(rng, seed, sandbox) -> dict` (JSON-able).
`DomainServer` serves a domain with the SDK's `MCPServer`; one process holds the state of many
episodes keyed by the episode id the client sends in the request `_meta` (so the env pool can
share one server process across episodes). `EpisodeControl` resets, reads and drops an
episode's state for the env pool alone: its calls are not MCP tools (tools/list never shows them)
and are refused to any client that does not hold the secret the pool gave the server process.
"""

import contextlib
import contextvars
import copy
import functools
import hmac
import inspect
import json
import logging
import os
import random
from typing import Any, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from toolverse_jax.envs.episode import CONTROL_META_KEY, CONTROL_TOKEN_VAR, EPISODE_META_KEY, HIDDEN_PREFIX

log = logging.getLogger(__name__)

DEFAULT_EPISODE = "default"

_STATE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tv_state", default=None)


def db() -> dict:
    """Returns the state dict of the episode the current tool call belongs to."""
    st = _STATE.get()
    if st is None:
        raise ToolError("no episode state: call the server through the env pool (reset first)")
    return st


def fail(msg: str) -> None:
    """Raises a ToolError (status tool_error) with a message the agent sees."""
    raise ToolError(msg)


def next_id(prefix: str) -> str:
    """Returns a fresh deterministic id like 'em_0007' for the current episode."""
    counters = db().setdefault("_counters", {})
    counters[prefix] = counters.get(prefix, 0) + 1
    return f"{prefix}_{counters[prefix]:04d}"


def get_row(table: str, key: str, what: str) -> dict:
    """Returns row `key` of `table`, or a tool error naming the id and how to find valid ones."""
    rows = db()[table]
    if key not in rows:
        known = ", ".join(list(rows)[:5])
        fail(f"{what} '{key}' not found (known ids start with: {known or 'none'})")
    return rows[key]


def delete_row(table: str, key: str, what: str) -> dict:
    """Removes row `key` of `table` (tool error if absent); returns {"<what>_id": key, "deleted": True}."""
    get_row(table, key, what)
    del db()[table][key]
    return {f"{what}_id": key, "deleted": True}


class Domain:
    """A built-in server definition: name, description, seeded initial state, tools."""

    def __init__(self, name: str, description: str, init_state: Callable[[random.Random, int, str | None], dict]):
        self.name = name
        self.description = description
        self.init_state = init_state
        self.tools: list[Callable[..., Any]] = []

    def tool(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Registers `fn` (typed params, TypedDict return) as a tool of this domain."""
        self.tools.append(fn)
        return fn

    def fresh_state(self, seed: int, sandbox: str | None = None) -> dict:
        """Returns the deterministic initial state for `seed`."""
        rng = random.Random(f"{self.name}:{seed}")
        st = self.init_state(rng, seed, sandbox)
        st.setdefault("_counters", {})
        return st


def _as_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    # The SDK runs sync tools on a worker thread; the tools are cheap, so run them inline.
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    async def run(**kwargs):
        return fn(**kwargs)

    return run


def _meta_get(meta: Any, key: str) -> Any:
    if meta is None:
        return None
    if isinstance(meta, dict):
        return meta.get(key)
    extra = getattr(meta, "model_extra", None) or {}
    return extra.get(key, getattr(meta, key, None))


def episode_of(meta: Any) -> str:
    """Returns the episode id a request's `_meta` names (dict or SDK model), DEFAULT_EPISODE if none."""
    return str(_meta_get(meta, EPISODE_META_KEY) or DEFAULT_EPISODE)


@contextlib.contextmanager
def _bound(var: contextvars.ContextVar, value: Any):
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def episode_state(state: dict):
    """Makes `state` what `db()` returns inside the block (a tool call of one episode)."""
    return _bound(_STATE, state)


class EpisodeStates:
    """Per-episode state store shared by DomainServer and the synthesizer."""

    def __init__(self, fresh: Callable[[int, str | None], Any]):
        self.fresh = fresh
        self.states: dict[str, Any] = {}

    def get(self, episode: str) -> Any:
        if episode not in self.states:
            if episode != DEFAULT_EPISODE:
                raise ToolError(f"episode '{episode}' has no state on this server (reset it first)")
            self.states[episode] = self.fresh(0, None)
        return self.states[episode]


class DomainServer(MCPServer):
    """MCPServer for one Domain, holding the state of many episodes."""

    def __init__(self, domain: Domain, control_token: str | None = None):
        super().__init__(domain.name, instructions=domain.description, log_level="WARNING")
        self.domain = domain
        self.episodes = EpisodeStates(domain.fresh_state)
        self.control = EpisodeControl(self.episodes, _public, token=control_token)
        self._fns = {}
        for fn in domain.tools:
            self.add_tool(_as_async(fn), name=fn.__name__, description=(fn.__doc__ or "").strip())
            if not inspect.iscoroutinefunction(fn):
                self._fns[fn.__name__] = fn

    async def _handle_call_tool(self, ctx, params):
        if self.control.handles(params.name):
            return self.control.call(ctx.meta, params.name, params.arguments or {})
        try:
            state = self.episodes.get(episode_of(ctx.meta))
        except ToolError as e:
            return text_result(str(e), is_error=True)
        with episode_state(state):
            if params.name in self._fns:
                return self._fast_call(params.name, params.arguments or {})
            return await super()._handle_call_tool(ctx, params)

    def _fast_call(self, name: str, arguments: dict):
        """Runs a tool like the SDK's tool manager does, minus the per-call Context and output
        re-validation (the tools' TypedDict returns are checked against outputSchema in tests);
        it halves the server's CPU per call."""
        from pydantic import ValidationError

        def error(text):
            return text_result(text, is_error=True)

        fn = self._fns.get(name)
        tool = self._tool_manager.get_tool(name)
        if fn is None or tool is None:
            return error(f"Unknown tool: {name}")
        try:
            kwargs = tool.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            return error(f"Error executing tool {name}: {exc}")
        try:
            out = fn(**kwargs)
        except ToolError as exc:
            return error(f"Error executing tool {name}: {exc}")
        except Exception:  # noqa: BLE001 - like the SDK: no internals leak to the client
            log.exception("tool %s raised", name)
            return error(f"Error executing tool {name}")
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(out, indent=1))],
                              structured_content=out)


def _public(st: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in st.items() if not k.startswith("_")}))


def text_result(obj: Any, is_error: bool = False) -> CallToolResult:
    """Returns a CallToolResult whose one text content is `obj` (a string, or JSON of it)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, indent=1)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


class EpisodeControl:
    """The env pool's control plane of a server that holds many episodes' state.

    `_tv_reset {seed, sandbox}`, `_tv_state {}` and `_tv_close {}` act on the episode the request's
    `_meta` names. They are not MCP tools: they never appear in tools/list, and a call is served
    only when its `_meta` carries the secret token the pool gave this server process (in
    CONTROL_TOKEN_VAR, read once at start and removed from the environment, or passed in by an
    in-process pool). Any other client (an MCP host serving these servers to an agent, say) gets
    the same "Unknown tool" error as for a name that does not exist; a server started without a
    token serves only its default episode.
    """

    def __init__(self, episodes: EpisodeStates, read: Callable[[Any], Any],
                 drop: Callable[[Any], None] | None = None, token: str | None = None):
        self.episodes, self.read, self.drop = episodes, read, drop
        self.token = token if token is not None else os.environ.pop(CONTROL_TOKEN_VAR, "")

    @staticmethod
    def handles(name: str) -> bool:
        """True for the names this plane owns (HIDDEN_PREFIX); no tool may use that prefix."""
        return name.startswith(HIDDEN_PREFIX)

    def allowed(self, meta: Any) -> bool:
        got = _meta_get(meta, CONTROL_META_KEY)
        return bool(self.token) and isinstance(got, str) and hmac.compare_digest(got, self.token)

    def call(self, meta: Any, name: str, args: dict) -> CallToolResult:
        """Serves one control request, or answers it like an unknown tool."""
        if not self.allowed(meta):
            return text_result(f"Unknown tool: {name}", is_error=True)
        ep, states = episode_of(meta), self.episodes.states
        if name == "_tv_reset":
            if ep in states and self.drop is not None:
                self.drop(states[ep])
            states[ep] = self.episodes.fresh(int(args.get("seed", 0)), args.get("sandbox"))
            return text_result({"episode": ep, "ok": True})
        if name == "_tv_state":
            if ep not in states:
                return text_result(f"episode '{ep}' has no state on this server", is_error=True)
            return text_result({"state": self.read(states[ep])})
        if name == "_tv_close":
            st = states.pop(ep, None)
            if st is not None and self.drop is not None:
                self.drop(st)
            return text_result({"ok": st is not None})
        return text_result(f"Unknown tool: {name}", is_error=True)


def clone(x: Any) -> Any:
    """Returns a deep copy (rows handed to the agent must not alias state)."""
    return copy.deepcopy(x)


class _PipeLines:
    """Async line iterator over an asyncio StreamReader (what stdio_server reads from)."""

    def __init__(self, reader):
        self.reader = reader

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        line = await self.reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _PipeWriter:
    def __init__(self, writer):
        self.writer = writer

    async def write(self, s: str) -> None:
        self.writer.write(s.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


async def _serve_stdio_pipes(server: MCPServer) -> None:
    import asyncio
    import os

    from mcp.server.stdio import stdio_server

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb", 0))
    wfd = os.dup(1)
    os.dup2(2, 1)  # stray prints from tools go to stderr, never onto the wire
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(wfd, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    low = server._lowlevel_server
    async with stdio_server(_PipeLines(reader), _PipeWriter(writer)) as (r, w):
        await low.run(r, w, low.create_initialization_options())


def run_stdio(server: MCPServer) -> None:
    """Serves `server` over stdio. With pipes (as the env pool uses) stdin/stdout are read and
    written on the event loop instead of the SDK's per-line worker threads: ~2x less CPU per call."""
    import asyncio
    import os
    import stat

    if all(stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in (0, 1)):
        asyncio.run(_serve_stdio_pipes(server))
    else:
        server.run()
