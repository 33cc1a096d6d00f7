"""One MCP client session to one server: a stdio subprocess or an in-process server object."""

import asyncio
import json
import os
from typing import Any

from toolverse_jax.envs.procs import kill_group, pid_with_tag

MAX_CONTENT_CHARS = 64 * 1024
# Handshake-era protocol ("legacy", initialize): every server speaks it, and per call it costs
# ~30% less CPU on both ends than 2026-07-28's per-request metadata (measured here).
MCP_MODE = os.environ.get("TOOLVERSE_MCP_MODE", "legacy")


def result_text(res, limit: int | None = MAX_CONTENT_CHARS) -> str:
    """Returns the agent-visible text of a CallToolResult, truncated at `limit` characters
    (None: whole, for control-plane replies such as a state read, which are parsed as JSON)."""
    parts = []
    for c in res.content or []:
        text = getattr(c, "text", None)
        parts.append(text if text is not None else f"[{getattr(c, 'type', 'content')}]")
    text = "\n".join(parts)
    if not text and res.structured_content is not None:
        text = json.dumps(res.structured_content)
    return text if limit is None or len(text) <= limit else text[:limit] + "\n[truncated]"


async def _no_validation(name, result) -> None:
    return None


class ServerConnection:
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
                async with Client(transport, cache=None, mode=MCP_MODE) as c:
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
                kill_group(pid_with_tag(self.tag))
            await self.stop()
            raise
        if self.tag is not None:
            self.pid = pid_with_tag(self.tag)

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
            kill_group(self.pid)
        self.dead = True
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            except BaseException:  # noqa: BLE001
                kill_group(self.pid)
                self._task.cancel()
