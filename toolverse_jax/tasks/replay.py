"""Replay check: a task is kept only if its gold chain re-executes in a fresh episode and its
verifier passes on what the replay produced (DESIGN §4)."""

from __future__ import annotations

import json
from typing import Any

from toolverse_jax.tasks import graph as tg
from toolverse_jax.tasks.executor import Close, Executor, Reset, State, Step, run_programs
from toolverse_jax.tasks.task import Task


def answer_text(value: Any) -> str:
    """Returns the text form of an answer value (what a perfect agent would reply)."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


def execute_chain(task: Task, executor: Executor):
    """Program that runs a task's gold stages in a fresh episode, filling each step's
    agent-facing `name`; returns (outputs per stage, final state), or (None, reason) at the
    first call that does not return ok."""
    handle = yield Reset(task.spec)
    for st in task.stages:
        for s in st:
            s.name = executor.agent_name(handle, s.server, s.tool)
    produced = []
    for i, st in enumerate(task.stages):
        res = yield Step([(handle, s.server, s.tool, s.arguments) for s in st])
        bad = [(s.tool, r.status) for s, r in zip(st, res) if r.status != "ok"]
        if bad:
            yield Close(handle)
            return None, f"stage {i}: {bad[0][0]} returned {bad[0][1]}"
        produced.append([r.value for r in res])
    final = yield State(handle)
    yield Close(handle)
    return produced, final


def replayed_answer(task: Task, produced: list[list[Any]]) -> Any:
    """Returns the answer an exact/set verifier reads from the replay's outputs."""
    v = task.verifier
    src = v["source"]
    obs = produced[src["stage"]][src["index"]]
    vals = tg.field_values(obs, src["field"]) if src["field"] else [obs]
    return vals[0] if v["kind"] == "exact" and vals else vals


def replay_program(task: Task, executor: Executor):
    """Program that replays a task's gold stages; returns (ok, reason).

    Also fills each step's agent-facing `name` from the fresh episode.
    """
    produced, final = yield from execute_chain(task, executor)
    if produced is None:
        return False, final
    v = task.verifier
    if v["kind"] in ("exact", "set"):
        got = replayed_answer(task, produced)
        if not task.check(answer_text(got), final):
            return False, f"replayed answer {got!r} does not match {task.answer!r}"
        if not task.check(answer_text(task.answer), final):
            return False, "gold answer does not pass its own verifier"
        return True, "ok"
    if not task.check(None, final):
        return False, "final-state check failed on replay"
    return True, "ok"


def verify_task(task: Task, env: Any) -> bool:
    """Returns whether the task's gold chain replays in a fresh episode and its verifier passes.

    `env` is an `Executor` (e.g. `PoolExecutor`) or an `envs.EnvPool`.
    """
    return verify_tasks([task], env)[0][0]


def verify_tasks(tasks: list[Task], env: Any, max_concurrent: int = 32) -> list[tuple[bool, str]]:
    """Returns (ok, reason) per task, replaying them concurrently."""
    executor = as_executor(env)
    out = run_programs(executor, (replay_program(t, executor) for t in tasks),
                       max_concurrent=max_concurrent)
    return [(False, r[1]) if r and r[0] == "error" else r for r in out]


def as_executor(env: Any) -> Executor:
    """Returns `env` if it is an Executor, else an Executor over an `envs.EnvPool`."""
    return env if hasattr(env, "agent_name") else _wrap_pool(env)


def _wrap_pool(pool: Any) -> Executor:
    from toolverse_jax.tasks.executor import PoolExecutor  # noqa: PLC0415

    ex = PoolExecutor.__new__(PoolExecutor)
    ex.pool = pool
    ex.catalog = getattr(pool, "catalog", None)
    ex._names = {}
    ex._spec_cache = {}
    ex.env_s, ex.env_ops = 0.0, 0
    return ex
