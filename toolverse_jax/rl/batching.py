"""Trajectories -> per-token advantages -> training rows (the join of rollouts and estimators)."""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from toolverse_jax.rl.registry import AdvantageInputs, get_advantage
from toolverse_jax.rl.rollout import Trajectory


def turn_arrays(trajs: Sequence[Trajectory], num_turns: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Returns (turn_rewards, turn_mask, outcome_only, state_keys), each [B, num_turns].

    Every turn of `Trajectory.turns` is a turn of the loss (mask True), whatever its kind, so
    every policy token gets credit. turn_rewards: r_{i,t} = the gold match of a call turn, the
    rollout's outcome reward for the answer turn, 0 for a truncated turn. outcome_only marks the
    terminal turns that did not reach the environment (answer, truncated): TRACE gives them the
    outcome advantage only. A rollout with more turns than `num_turns` is an error (its tokens
    would have no advantage)."""
    b = len(trajs)
    r = np.zeros((b, num_turns), np.float32)
    m = np.zeros((b, num_turns), bool)
    last = np.zeros((b, num_turns), bool)
    keys = np.zeros((b, num_turns), np.int32)
    for i, tr in enumerate(trajs):
        if len(tr.turns) > num_turns:
            raise ValueError(f"rollout of task {tr.task_id!r} has {len(tr.turns)} turns but the "
                             f"advantage arrays hold {num_turns}; pass num_turns >= max_turns + 1")
        for t, turn in enumerate(tr.turns):
            m[i, t] = True
            r[i, t] = tr.reward if turn.kind == "answer" else turn.gold_match
            last[i, t] = turn.kind != "calls"
            keys[i, t] = turn.state_key
    return r, m, last, keys


def advantage_inputs(trajs: Sequence[Trajectory], num_turns: int,
                     readiness: np.ndarray | None = None) -> AdvantageInputs:
    """Returns the estimator inputs [B] / [B, T] for a batch of trajectories."""
    r, m, last, keys = turn_arrays(trajs, num_turns)
    return AdvantageInputs(
        rewards=jnp.asarray([t.reward for t in trajs], jnp.float32),
        group_ids=jnp.asarray([t.group_id for t in trajs], jnp.int32),
        valid=jnp.asarray([not t.infra_failed for t in trajs]),
        turn_mask=jnp.asarray(m), turn_rewards=jnp.asarray(r), answer_mask=jnp.asarray(last),
        readiness=None if readiness is None else jnp.asarray(readiness, jnp.float32),
        state_keys=jnp.asarray(keys))


def compute_advantages(trajs: Sequence[Trajectory], estimator: str, consts: dict[str, Any],
                       num_turns: int, readiness: np.ndarray | None = None) -> np.ndarray:
    """Returns per-turn advantages [B, num_turns] from the estimator registered as `estimator`
    (turns absent from a rollout are 0). Rollouts whose episode failed for infrastructure
    reasons get 0 and stay out of their group's statistics."""
    fn = get_advantage(estimator)
    return np.asarray(fn(advantage_inputs(trajs, num_turns, readiness), consts))


def demonstration_row(tokens: Sequence[int], policy_mask: Sequence[bool]) -> dict:
    """Returns an SFT training row: advantage 1 on every token (the loss masks non-policy
    ones) and no sampler log-probs (the SFT loss reads none)."""
    return {"tokens": list(tokens), "policy_mask": list(policy_mask),
            "advantages": np.ones(len(tokens), np.float32),
            "sample_logprobs": np.zeros(len(tokens), np.float32)}


def trajectory_rows(trajs: Sequence[Trajectory], turn_adv: np.ndarray) -> list[dict]:
    """Returns training rows (tokens, policy_mask, advantages, sample_logprobs) per trajectory;
    infrastructure failures are dropped (they carry no learning signal, only a counted metric)."""
    rows = []
    for i, tr in enumerate(trajs):
        if tr.infra_failed:
            continue
        tt = np.asarray(tr.token_turn)
        adv = np.where(tt >= 0, turn_adv[i, np.clip(tt, 0, turn_adv.shape[1] - 1)], 0.0)
        rows.append({"tokens": tr.tokens, "policy_mask": tr.policy_mask,
                     "advantages": adv.astype(np.float32), "sample_logprobs": tr.sample_logprobs})
    return rows
