"""Rollouts through the continuous-batching engine: episodes progress independently.

`run_continuous` is `rollout.run_rollouts` for `RolloutConfig.engine == "continuous"`: the same
prompts, turn records, env responses, end reasons and scores (it reuses the turn loop's
`_record_turn`, `apply_observation`, `_continue` and `_score`), but each episode is an agent of
`sampling.engine.ContinuousEngine`: when its turn stops, its tool calls go to the env pool on
the engine's env thread while the other episodes keep decoding, and it resumes with the tool
responses and the next header prefilled. At temperature 0 the trajectories equal the turn
loop's token for token; at temperature > 0 a token's sample depends only on the run's key, the
episode and the token's position (`ContinuousEngine`), so a seed reproduces a run.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from toolverse_jax.envs import EnvPool, Episode
from toolverse_jax.rl.rollout import (RolloutConfig, SamplerPolicy, _continue, _record_turn,
                                      apply_observation, finish_rollouts, start_rollouts,
                                      state_key)
from toolverse_jax.rl.types import Trajectory
from toolverse_jax.sampling import SampleOutput
from toolverse_jax.sampling.engine import (ContinuousEngine, EngineConfig, EnvCalls,
                                           TurnOutput)
from toolverse_jax.tasks import Task


def engine_config(cfg: RolloutConfig) -> EngineConfig:
    """Returns the engine settings of a rollout config (RolloutConfig.engine_*)."""
    return EngineConfig(slots=cfg.engine_slots, chunk=cfg.engine_chunk,
                        resume_lag=cfg.engine_resume_lag)


class RolloutAgent:
    """The `sampling.engine.Agent` of a batch of rollouts: records turns on the trajectories,
    runs their calls on the pool, appends the responses, decides when each episode ends."""

    def __init__(self, trajs: list[Trajectory], episodes: list[Episode],
                 owners: list[tuple[int, Task]], pool: EnvPool, tokenizer, cfg: RolloutConfig):
        self.trajs, self.episodes, self.owners = trajs, episodes, owners
        self.pool, self.tokenizer, self.cfg = pool, tokenizer, cfg
        self.think_open = bool(cfg.chat_template and cfg.chat_template.think_open)
        self.executed: list[set[str]] = [set() for _ in trajs]
        self.invalid_streak = [0] * len(trajs)
        self.responses: list[list[str]] = [[] for _ in trajs]
        self.t_start = [0.0] * len(trajs)

    def _turn_allowed(self, i: int) -> bool:
        """Returns whether episode i may start another turn, else records why it ends (the turn
        loop's order: the turn limit, then the episode's wall time)."""
        tr = self.trajs[i]
        if len(tr.turns) >= self.cfg.max_turns:
            tr.end_reason = "max_turns"
            return False
        if self.cfg.max_episode_s > 0 and \
                time.monotonic() - self.t_start[i] >= self.cfg.max_episode_s:
            tr.end_reason = "wall_time"
            return False
        return True

    def prompt(self, i: int) -> Sequence[int] | None:
        # The wall cap counts from when the episode got its slot (all of them at the start
        # unless RolloutConfig.engine_slots is below the batch).
        self.t_start[i] = time.monotonic()
        return self.trajs[i].tokens if self._turn_allowed(i) else None

    def end_turn(self, i: int, out: TurnOutput) -> EnvCalls | Callable[[], Any] | None:
        tr = self.trajs[i]
        n = len(out.tokens)
        sample = SampleOutput(out.tokens[None], out.logprobs[None], np.array([n]),
                              np.array([out.stopped]))
        got = _record_turn(tr, self.owners[i][1], sample, 0, len(tr.turns),
                           state_key(self.executed[i]), self.tokenizer, self.think_open)
        if got is None:
            return None
        calls, errors = got
        # Parse errors come back first, then the executed calls' responses.
        self.responses[i] = [f"invalid tool call: {e}" for e in errors]
        batch = [(self.episodes[i], c["name"], c["arguments"]) for c in calls]
        # EnvCalls: the env thread merges the calls of episodes whose turns end together into
        # one pool.step, which runs them on the pool's workers side by side.
        return EnvCalls(self.pool.step, batch) if batch else list

    def resume(self, i: int, results: list) -> Sequence[int] | None:
        tr = self.trajs[i]
        for c, obs in zip(tr.turns[-1].calls, results):
            apply_observation(tr, c["name"], c["arguments"], obs, self.responses[i],
                              self.executed[i])
        if not _continue(tr, self.responses[i], self.invalid_streak, i, self.tokenizer,
                         self.cfg):
            return None
        return tr.tokens if self._turn_allowed(i) else None


def run_continuous(policy: SamplerPolicy, tasks: Sequence[Task], group_size: int, pool: EnvPool,
                   tokenizer, cfg: RolloutConfig, rng: jax.Array, seed: int = 0,
                   group_offset: int = 0, stats: dict | None = None) -> list[Trajectory]:
    """Returns `rollout.run_rollouts`' trajectories, sampled by the continuous engine; `stats`
    (if given) receives the engine's counters (decode/prefill calls, env wait seconds, ...)."""
    episodes, owners, trajs = start_rollouts(tasks, group_size, pool, tokenizer, cfg, seed,
                                             group_offset)
    try:
        agent = RolloutAgent(trajs, episodes, owners, pool, tokenizer, cfg)
        engine = ContinuousEngine(policy.params, policy.cfg, policy.sampling, engine_config(cfg))
        out = engine.run(agent, [jax.random.fold_in(rng, i) for i in range(len(trajs))])
        if stats is not None:
            stats.update(out)
        finish_rollouts(trajs, episodes, owners, pool, cfg)
    finally:
        pool.close(episodes)
    return trajs
