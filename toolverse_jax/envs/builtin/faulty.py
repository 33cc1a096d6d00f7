"""Test-only built-in server that misbehaves on request (hang, crash) for fault tests."""

import asyncio
import os

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin.base import Domain, db


class Echo(TypedDict):
    text: str
    calls: int


DOMAIN = Domain("faulty", "Fault injection (tests only).", lambda rng, seed, sandbox: {"calls": 0})


@DOMAIN.tool
def echo(text: str) -> Echo:
    """Echo text back and count calls."""
    db()["calls"] += 1
    return {"text": text, "calls": db()["calls"]}


@DOMAIN.tool
async def hang(seconds: float = 3600.0) -> Echo:
    """Sleep (simulates a hung server)."""
    await asyncio.sleep(seconds)
    return {"text": "woke", "calls": db()["calls"]}


@DOMAIN.tool
def block(seconds: float = 3600.0) -> Echo:
    """Block the whole server process (a hang the event loop cannot escape)."""
    import time

    time.sleep(seconds)
    return {"text": "woke", "calls": db()["calls"]}


@DOMAIN.tool
def crash() -> Echo:
    """Kill the server process."""
    os._exit(3)
