"""Executing tool calls for task generation and replay.

`Executor` is the small protocol DUSA needs from an environment; `PoolExecutor` implements it
over `toolverse_jax.envs.EnvPool`, tests implement it with an in-process fake.

Generation and replay are written as *programs*: generators that yield `Reset`, `Step`,
`State` and `Close` requests and receive their results. `run_programs` runs many programs in
lockstep and batches their requests, so one `EnvPool.step` carries the calls of many tasks.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any, Generator, Iterable, Protocol, Sequence

from toolverse_jax.tasks import schema as sch


@dataclasses.dataclass
class CallResult:
    """Result of one tool call: status as in `envs.Observation.status`, value = JSON result."""
    status: str
    value: Any
    content: str = ""


class Executor(Protocol):
    """What task generation needs from an environment (servers of one catalog)."""

    def server_names(self) -> list[str]: ...

    def tool_specs(self, servers: Sequence[str] | None = None) -> list[tuple[str, dict]]: ...

    def reset(self, specs: Sequence[Any]) -> list[Any]: ...

    def agent_name(self, handle: Any, server: str, tool: str) -> str: ...

    def step(self, calls: Sequence[tuple[Any, str, str, dict]]) -> list[CallResult]: ...

    def read_state(self, handle: Any) -> dict: ...

    def close(self, handles: Sequence[Any]) -> None: ...


@dataclasses.dataclass
class Reset:
    spec: Any


@dataclasses.dataclass
class Step:
    calls: list  # [(handle, server, tool, arguments)]


@dataclasses.dataclass
class State:
    handle: Any


@dataclasses.dataclass
class Close:
    handle: Any


Program = Generator[Any, Any, Any]


class PoolExecutor:
    """`Executor` over an `envs.EnvPool` (owns the pool; use as a context manager)."""

    def __init__(self, catalog: Any = None, kinds: Sequence[str] = ("builtin",),
                 num_workers: int = 0, call_timeout_s: float = 10.0, root: str | None = None):
        from toolverse_jax import envs  # noqa: PLC0415 - keep tasks importable without envs

        self.catalog = catalog if catalog is not None else envs.Catalog.default(kinds=tuple(kinds))
        # root: the pool's sandbox directory (None: a fresh temporary one, removed on shutdown)
        self.pool = envs.EnvPool(self.catalog, num_workers=num_workers,
                                 call_timeout_s=call_timeout_s, root=root)
        self._names: dict[str, dict[tuple[str, str], str]] = {}
        self._spec_cache: dict[str, list[dict]] = {}
        self.env_s = 0.0   # wall time spent inside the env pool (reset/step/state/close)
        self.env_ops = 0   # episodes reset + calls + state reads + episodes closed

    def __enter__(self) -> "PoolExecutor":
        enter = getattr(self.pool, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        closer = getattr(self.pool, "__exit__", None)
        if closer is not None:
            closer(None, None, None)
        elif hasattr(self.pool, "shutdown"):
            self.pool.shutdown()

    def server_names(self) -> list[str]:
        return sorted(s.name for s in self.catalog.servers if getattr(s, "available", True))

    def tool_specs(self, servers: Sequence[str] | None = None) -> list[tuple[str, dict]]:
        out = []
        for s in sorted(servers if servers is not None else self.server_names()):
            if s not in self._spec_cache:
                self._spec_cache[s] = list(self.catalog.list_tools(s))
            out.extend((s, spec) for spec in sorted(self._spec_cache[s], key=lambda t: t["name"]))
        return out

    def _timed(self, n: int, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_s += time.perf_counter() - t
            self.env_ops += n

    def reset(self, specs: Sequence[Any]) -> list[Any]:
        eps = self._timed(len(specs), self.pool.reset, list(specs))
        for ep in eps:
            names = {}
            for t in ep.tools:
                names[tuple(ep.resolve(t["name"]))] = t["name"]
            self._names[ep.id] = names
        return eps

    def agent_name(self, handle: Any, server: str, tool: str) -> str:
        return self._names[handle.id].get((server, tool), tool)

    def step(self, calls: Sequence[tuple[Any, str, str, dict]]) -> list[CallResult]:
        if not calls:
            return []
        obs = self._timed(len(calls), self.pool.step,
                          [(ep, self.agent_name(ep, s, t), args) for ep, s, t, args in calls])
        return [CallResult(o.status, sch.parse_observation(o.content, o.structured), o.content)
                for o in obs]

    def read_state(self, handle: Any) -> dict:
        return self._timed(1, self.pool.read_state, handle)

    def close(self, handles: Sequence[Any]) -> None:
        if handles:
            self._timed(len(handles), self.pool.close, list(handles))


def run_programs(executor: Executor, programs: Iterable[Program], max_concurrent: int = 32,
                 ) -> list[Any]:
    """Returns each program's return value (in order), running up to `max_concurrent` at once.

    Requests of the same kind from different programs are batched into one executor call. A
    program that raises returns `("error", message)`; its episode handles are closed.
    """
    programs = iter(enumerate(programs))
    results: dict[int, Any] = {}
    active: dict[int, tuple[Program, Any]] = {}  # idx -> (gen, pending request)
    opened: dict[int, list[Any]] = {}

    def advance(idx: int, gen: Program, value: Any, first: bool = False) -> None:
        try:
            req = next(gen) if first else gen.send(value)
            active[idx] = (gen, req)
        except StopIteration as stop:
            results[idx] = stop.value
            active.pop(idx, None)
            leftover = opened.pop(idx, [])
            if leftover:
                executor.close(leftover)
        except Exception as e:  # noqa: BLE001 - one broken task must not stop generation
            results[idx] = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
            active.pop(idx, None)
            leftover = opened.pop(idx, [])
            if leftover:
                try:
                    executor.close(leftover)
                except Exception:  # noqa: BLE001
                    pass

    def refill() -> None:
        while len(active) < max_concurrent:
            nxt = next(programs, None)
            if nxt is None:
                return
            idx, gen = nxt
            opened[idx] = []
            advance(idx, gen, None, first=True)

    refill()
    while active:
        pending = list(active.items())
        resets = [(i, r) for i, (_, r) in pending if isinstance(r, Reset)]
        steps = [(i, r) for i, (_, r) in pending if isinstance(r, Step)]
        states = [(i, r) for i, (_, r) in pending if isinstance(r, State)]
        closes = [(i, r) for i, (_, r) in pending if isinstance(r, Close)]
        other = [(i, r) for i, (_, r) in pending
                 if not isinstance(r, (Reset, Step, State, Close))]
        replies: dict[int, Any] = {}
        if resets:
            handles = executor.reset([r.spec for _, r in resets])
            for (i, _), h in zip(resets, handles):
                opened[i].append(h)
                replies[i] = h
        if steps:
            flat = [c for _, r in steps for c in r.calls]
            out = executor.step(flat)
            pos = 0
            for i, r in steps:
                replies[i] = out[pos:pos + len(r.calls)]
                pos += len(r.calls)
        for i, r in states:
            replies[i] = executor.read_state(r.handle)
        if closes:
            executor.close([r.handle for _, r in closes])
            for i, r in closes:
                opened[i] = [h for h in opened[i] if h is not r.handle]
                replies[i] = None
        for i, r in other:
            raise TypeError(f"program {i} yielded {r!r}; expected Reset, Step, State or Close")
        for i, _ in pending:
            advance(i, active[i][0], replies.get(i))
        refill()
    return [results[i] for i in sorted(results)]
