"""Batched multi-turn agent rollouts over MCP environments, token in / token out.

Every rollout's sequence is built by appending ids: the rendered prompt, the ids the sampler
produced (policy tokens, with their sampling log-probs), the rendered tool responses (env tokens),
and so on. Nothing is ever re-tokenized, so the trainer scores exactly the sampled ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Any, Protocol, Sequence

import jax
import numpy as np

from toolverse_jax.envs import EnvPool, Episode
from toolverse_jax.models.chat import render_chat, render_prompt, render_tool_responses
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.toolcall import parse_tool_calls_lenient
from toolverse_jax.sampling import KVSession, SampleOutput, SamplingParams, generate
from toolverse_jax.tasks import Task
from toolverse_jax.tasks.task import values_equal
from toolverse_jax.rl.types import Trajectory, Turn

DEFAULT_SYSTEM = ("Use the tools. Finish with <answer>...</answer>.")
ENGINES = ("sync", "continuous")


class Policy(Protocol):
    """Anything that continues a batch of token-id prompts (our sampler, a scripted test policy)."""

    def __call__(self, prompts: Sequence[Sequence[int]], rng: jax.Array) -> SampleOutput: ...


@dataclasses.dataclass
class SamplerPolicy:
    """Policy backed by the jitted KV-cache sampler on a params pytree.

    kv_reuse: keep each rollout's KV cache between turns (`sampling.KVSession`), so a turn
    prefills only the tool responses and the next header; False re-prefills every context
    from token 0 each turn (`sampling.generate`, the synchronous baseline)."""

    params: Any
    cfg: ModelConfig
    sampling: SamplingParams
    kv_reuse: bool = True
    _session: KVSession | None = dataclasses.field(default=None, init=False, repr=False)

    def __call__(self, prompts, rng):
        if not self.kv_reuse:
            return generate(self.params, self.cfg, prompts, self.sampling, rng)
        if self._session is None:
            self._session = KVSession(self.params, self.cfg, self.sampling)
        return self._session.generate(prompts, rng)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 4
    max_context: int = 2048          # a rollout whose context would exceed this ends
    tool_format: str = "compact"     # "json" (Qwen3's) or "compact" (short, for tiny models)
    # Which tools the prompt lists: "all" of the episode's servers, or "gold" (the task's gold
    # tools plus `num_distractors` others of its servers): a curriculum knob for tiny models.
    prompt_tools: str = "all"
    num_distractors: int = 2
    system_prompt: str = DEFAULT_SYSTEM
    max_observation_chars: int = 600  # long tool outputs are cut (and say so) to bound context
    # Outcome reward = success (0/1) + ok_call_bonus * (fraction of calls that executed ok)
    # + gold_turn_bonus * (fraction of gold stages matched turn by turn)
    # + arg_match_bonus * (mean over turns of the fraction of gold argument values matched):
    # partial credit per literal, so a call with two of three values right beats one with one.
    # All 0 = pure outcome.
    ok_call_bonus: float = 0.0
    gold_turn_bonus: float = 0.0
    arg_match_bonus: float = 0.0
    # Waste control (recorded end reasons; 0 = off): a rollout ends after this many consecutive
    # turns whose every call was invalid ("invalid_calls"), or once its episode has run this
    # many seconds ("wall_time"; checked between turns).
    max_invalid_streak: int = 0
    max_episode_s: float = 0.0
    # Success needs the rollout to end with an answer (not cut at max_new_tokens, max_turns
    # or max_context) for every verifier kind. False: a "state" task passes on the final env
    # state alone, so a rollout that made the right calls and then rambled until the token cap
    # counts as solved (and RL pushes its rambling up).
    require_answer: bool = True
    # The checkpoint's chat template (models.template.chat_template_for(tokenizer)); None
    # renders chat.py's Qwen3 format (tokenizers without a template: byte, trained BPE).
    chat_template: Any = None
    # The rollout engine (ENGINES): "sync" runs every turn of the batch in lockstep (the
    # policy's own sampler; with a SamplerPolicy, KV kept across turns); "continuous" runs
    # a SamplerPolicy's episodes in decode slots that progress independently, env calls
    # overlapped with decoding (rl/engine.py; `engine_slots` 0 = a slot per episode,
    # `engine_chunk` decode steps per compiled call, `engine_resume_lag` decode steps a
    # turn's env calls get before its slot waits for them).
    engine: str = "sync"
    engine_slots: int = 0
    engine_chunk: int = 16
    engine_resume_lag: int = 8

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"RolloutConfig.engine={self.engine!r}; use one of {ENGINES}")


def state_key(executed: set[str] | Sequence[str]) -> int:
    """Returns a 31-bit key of the environment state reached by `executed` (canonical JSON of
    each executed call with its status and observation): order free, so two rollouts that made
    the same calls, in any turns and order, share a key; invalid calls change nothing."""
    h = hashlib.blake2b(digest_size=8)
    for part in sorted(executed):
        h.update(part.encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF


def shaped_reward(tr: "Trajectory", cfg: RolloutConfig) -> float:
    """Returns the scalar reward of a finished rollout (see RolloutConfig's bonus fields)."""
    reward = float(tr.success)
    statuses = [s for turn in tr.turn_statuses for s in turn]
    if cfg.ok_call_bonus and statuses:
        reward += cfg.ok_call_bonus * statuses.count("ok") / len(statuses)
    tool_turns = tr.tool_turns  # a truncated turn counts as one that missed its stage
    if cfg.gold_turn_bonus and tool_turns:
        reward += cfg.gold_turn_bonus * sum(t.gold_match for t in tool_turns) / len(tool_turns)
    if cfg.arg_match_bonus and tool_turns:
        reward += cfg.arg_match_bonus * sum(t.arg_match for t in tool_turns) / len(tool_turns)
    return reward


def _calls_cover(gold: Sequence[Any], calls: Sequence[dict]) -> bool:
    """Returns whether every gold call (name + arguments, order free) appears among `calls`."""
    remaining = list(calls)
    for step in gold:
        for j, c in enumerate(remaining):
            if c["name"] == step.name and _args_equal(step.arguments, c["arguments"]):
                remaining.pop(j)
                break
        else:
            return False
    return True


def arg_overlap(gold: Sequence[Any], calls: Sequence[dict]) -> float:
    """Returns the fraction of gold (call, argument) values reproduced by `calls`, in [0, 1].

    Each gold call is paired with the unused call of the same name that matches most of its
    argument values; a gold call without arguments counts as one value (its name). No gold
    calls: 0."""
    remaining = list(calls)
    hit = total = 0
    for step in gold:
        want = step.arguments
        total += max(len(want), 1)
        best, best_j = -1, None
        for j, c in enumerate(remaining):
            if c["name"] != step.name or not isinstance(c.get("arguments"), dict):
                continue
            got = c["arguments"]
            n = sum(k in got and _value_equal(want[k], got[k]) for k in want) if want else 1
            if n > best:
                best, best_j = n, j
        if best_j is not None:
            remaining.pop(best_j)
            hit += best
    return hit / total if total else 0.0


def _value_equal(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or values_equal(a, b)


def _args_equal(gold: dict, got: dict) -> bool:
    if set(gold) != set(got):
        return False
    return all(_value_equal(gold[k], got[k]) for k in gold)


def prompt_tool_specs(task: Task, episode_tools: list[dict], cfg: RolloutConfig,
                      rng: np.random.Generator) -> list[dict]:
    """Returns the tool specs the prompt lists (see RolloutConfig.prompt_tools)."""
    if cfg.prompt_tools == "all":
        return episode_tools
    if cfg.prompt_tools != "gold":
        raise ValueError(f"RolloutConfig.prompt_tools={cfg.prompt_tools!r}; use 'all' or 'gold'")
    gold = {s.name for st in task.stages for s in st}
    others = [t for t in episode_tools if t["name"] not in gold]
    picked = set(gold)
    if others:
        idx = rng.choice(len(others), size=min(cfg.num_distractors, len(others)), replace=False)
        picked |= {others[i]["name"] for i in idx}
    return [t for t in episode_tools if t["name"] in picked]  # catalog order, not gold order


def task_messages(task: Task, cfg: RolloutConfig) -> list[dict]:
    return [{"role": "system", "content": cfg.system_prompt},
            {"role": "user", "content": task.instruction}]


def _answer_text(task: Task) -> str:
    v = task.verifier
    if v["kind"] == "exact":
        return str(v["value"])
    if v["kind"] == "set":
        return ", ".join(str(x) for x in v["values"])
    return "done"


def gold_demonstration(task: Task, tools: list[dict], tokenizer, cfg: RolloutConfig):
    """Returns the rendered gold chain (SFT warm-start target): tokens, policy mask, token_turn."""
    messages = task_messages(task, cfg)
    for stage in task.stages:
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"name": s.name, "arguments": s.arguments} for s in stage]})
        for s in stage:
            messages.append({"role": "tool", "content": observation_text(s.observation, cfg)})
    messages.append({"role": "assistant", "content": f"<answer>{_answer_text(task)}</answer>"})
    r = render_chat(messages, tokenizer, tools=tools, tool_format=cfg.tool_format,
                    template=cfg.chat_template)
    token_turn = [-1] * len(r.tokens)
    for t, (a, b) in enumerate(zip(r.turn_starts, r.turn_ends)):
        for j in range(a, b):
            token_turn[j] = t
    return r.tokens, r.policy_mask, token_turn


def observation_text(obs: Any, cfg: RolloutConfig) -> str:
    """Returns a tool result as the policy sees it: JSON text, cut at cfg.max_observation_chars."""
    text = obs if isinstance(obs, str) else json.dumps(obs, ensure_ascii=False, sort_keys=True)
    if len(text) > cfg.max_observation_chars:
        text = text[:cfg.max_observation_chars] + f"... [truncated {len(text)} chars]"
    return text


def run_rollouts(policy: Policy, tasks: Sequence[Task], group_size: int, pool: EnvPool,
                 tokenizer, cfg: RolloutConfig, rng: jax.Array, seed: int = 0,
                 group_offset: int = 0) -> list[Trajectory]:
    """Returns len(tasks) * group_size trajectories; rollouts of one task share a group id and
    start from identical environment state (same episode seed).

    cfg.engine "continuous" runs a `SamplerPolicy` (with kv_reuse) through `rl.engine`
    (continuous batching, env calls overlapped with decoding); "sync" and any other policy run
    the turn loop below."""
    if cfg.engine == "continuous" and isinstance(policy, SamplerPolicy) and policy.kv_reuse:
        from toolverse_jax.rl.engine import run_continuous
        return run_continuous(policy, tasks, group_size, pool, tokenizer, cfg, rng, seed,
                              group_offset)
    episodes, owners, trajs = start_rollouts(tasks, group_size, pool, tokenizer, cfg, seed,
                                             group_offset)
    active = [i for i in range(len(trajs))]
    # Per rollout, the executed calls with their observations so far: the state keys.
    executed: list[set[str]] = [set() for _ in trajs]
    invalid_streak = [0] * len(trajs)
    t_start = time.monotonic()
    try:
        for turn in range(cfg.max_turns):
            if active and cfg.max_episode_s > 0 and time.monotonic() - t_start >= cfg.max_episode_s:
                for i in active:
                    trajs[i].end_reason = "wall_time"
                active = []
            if not active:
                break
            rng, key = jax.random.split(rng)
            out = policy([trajs[i].tokens for i in active], key)
            calls_batch, owners_batch = [], []
            still = []
            pending: dict[int, list[str]] = {}  # rollout -> tool responses, in call order
            for row, i in enumerate(active):
                got = _record_turn(trajs[i], owners[i][1], out, row, turn,
                                   state_key(executed[i]), tokenizer,
                                   bool(cfg.chat_template and cfg.chat_template.think_open))
                if got is None:
                    continue  # answered or truncated: the rollout ends
                calls, errors = got
                # Parse errors come back first, then the executed calls' responses.
                pending[i] = [f"invalid tool call: {e}" for e in errors]
                for c in calls:
                    calls_batch.append((episodes[i], c["name"], c["arguments"]))
                    owners_batch.append(i)
                still.append(i)
            if calls_batch:
                results = pool.step(calls_batch)
                for (_, name, args), i, obs in zip(calls_batch, owners_batch, results):
                    apply_observation(trajs[i], name, args, obs, pending[i], executed[i])
            active = [i for i in still if _continue(trajs[i], pending[i], invalid_streak, i,
                                                    tokenizer, cfg)]
        for i in active:
            trajs[i].end_reason = "max_turns"
        finish_rollouts(trajs, episodes, owners, pool, cfg)
    finally:
        pool.close(episodes)
    return trajs


def start_rollouts(tasks: Sequence[Task], group_size: int, pool: EnvPool, tokenizer,
                   cfg: RolloutConfig, seed: int, group_offset: int
                   ) -> tuple[list[Episode], list[tuple[int, Task]], list[Trajectory]]:
    """Returns (episodes, (group, task) of each, trajectories holding their rendered prompts):
    group_size fresh episodes per task, in task order."""
    np_rng = np.random.default_rng(seed)
    specs, owners = [], []
    for gi, task in enumerate(tasks):
        for _ in range(group_size):
            specs.append(task.spec)
            owners.append((gi, task))
    episodes: list[Episode] = pool.reset(specs)
    trajs: list[Trajectory] = []
    task_tools: dict[int, list[dict]] = {}
    for (gi, task), ep in zip(owners, episodes):
        if gi not in task_tools:  # the same listed tools for every rollout in a group
            task_tools[gi] = prompt_tool_specs(task, ep.tools, cfg, np_rng)
        prompt = render_prompt(task_messages(task, cfg), tokenizer, task_tools[gi], cfg.tool_format,
                               template=cfg.chat_template)
        trajs.append(Trajectory(task.id, group_offset + gi, list(prompt), [False] * len(prompt),
                                [0.0] * len(prompt), [-1] * len(prompt), len(prompt)))
    return episodes, owners, trajs


def apply_observation(tr: Trajectory, name: str, args: Any, obs: Any, responses: list[str],
                      executed: set[str]) -> None:
    """Records one executed call's observation on rollout `tr`'s last turn: its response text,
    status, the state key's executed set, and a server crash as an infra failure."""
    responses.append(obs.content)
    tr.turns[-1].statuses.append(obs.status)
    executed.add(json.dumps([name, args, obs.status, obs.content],
                            ensure_ascii=False, sort_keys=True, default=str))
    if obs.status == "server_crashed":
        tr.infra_failed = True


def finish_rollouts(trajs: Sequence[Trajectory], episodes: Sequence[Episode],
                    owners: Sequence[tuple[int, Task]], pool: EnvPool, cfg: RolloutConfig) -> None:
    """Scores every finished rollout (`_score`)."""
    for tr, ep, (_, task) in zip(trajs, episodes, owners):
        _score(tr, ep, task, pool, cfg)


def _record_turn(tr: Trajectory, task: Task, out: SampleOutput, row: int, turn: int, skey: int,
                 tokenizer, think_open: bool = False) -> tuple[list[dict], list] | None:
    """Appends sample row `row` (the policy's turn) to rollout `tr` with its Turn record;
    returns (the parsed calls to execute, the parse errors), or None when the turn ended the
    rollout (an answer, or a turn cut at max_new_tokens)."""
    n = int(out.lengths[row])
    gen = [int(t) for t in out.tokens[row, :n]]
    tr.tokens += gen
    tr.policy_mask += [True] * n
    tr.sample_logprobs += [float(x) for x in out.logprobs[row, :n]]
    tr.token_turn += [turn] * n
    parsed = parse_tool_calls_lenient(tokenizer.decode(gen), think_open)
    calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
    if not bool(out.stopped[row]):
        tr.end_reason = "max_new_tokens"
        tr.turns.append(Turn("truncated", calls, ["truncated"], 0.0, skey, 0.0))
        return None
    if not calls and not parsed.errors:
        tr.final_answer = parsed.final_answer if parsed.final_answer is not None \
            else parsed.content.strip()
        tr.finished, tr.end_reason = True, "answer"
        tr.turns.append(Turn("answer", [], [], 0.0, skey))
        return None
    stage = task.stages[turn] if turn < len(task.stages) else []
    tr.turns.append(Turn("calls", calls, ["invalid_call"] * len(parsed.errors),
                         float(bool(stage) and _calls_cover(stage, calls)), skey,
                         arg_overlap(stage, calls)))
    return calls, list(parsed.errors)


def _continue(tr: Trajectory, responses: list[str], invalid_streak: list[int], i: int,
              tokenizer, cfg: RolloutConfig) -> bool:
    """Appends the turn's tool responses to rollout `tr` and returns True, or records why it
    ends here (server crash, an invalid-call streak, the context limit) and returns False."""
    if tr.infra_failed:
        tr.end_reason = "server_crashed"
        return False
    statuses = tr.turns[-1].statuses
    invalid_streak[i] = invalid_streak[i] + 1 if statuses and all(
        st == "invalid_call" for st in statuses) else 0
    if cfg.max_invalid_streak > 0 and invalid_streak[i] >= cfg.max_invalid_streak:
        tr.end_reason = "invalid_calls"
        return False
    env_ids = render_tool_responses([observation_text(c, cfg) for c in responses], tokenizer,
                                    template=cfg.chat_template)
    if len(tr.tokens) + len(env_ids) >= cfg.max_context:
        tr.end_reason = "max_context"
        return False
    tr.tokens += env_ids
    tr.policy_mask += [False] * len(env_ids)
    tr.sample_logprobs += [0.0] * len(env_ids)
    tr.token_turn += [-1] * len(env_ids)
    return True


def _score(tr: Trajectory, ep: Episode, task: Task, pool: EnvPool, cfg: RolloutConfig) -> None:
    """Sets the finished rollout's success (the task's verifier on its answer or the final
    env state; with cfg.require_answer only for a rollout that ended with an answer) and shaped
    reward; an episode the pool marked failed is an infra failure."""
    if pool.is_failed(ep):
        tr.infra_failed = True
    if tr.infra_failed:
        return
    state = pool.read_state(ep) if task.needs_state else None
    tr.success = bool(task.check(tr.final_answer, state)) if (
        tr.finished or (task.verifier["kind"] == "state" and not cfg.require_answer)) else False
    tr.reward = shaped_reward(tr, cfg)
