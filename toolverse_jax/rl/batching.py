"""Trajectories -> per-token advantages -> training rows (the join of rollouts and estimators)."""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from toolverse_jax.rl.registry import AdvantageInputs, get_advantage
from toolverse_jax.rl.rollout import Trajectory


def turn_arrays(trajs: Sequence[Trajectory], num_turns: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns (turn_rewards, turn_mask) [B, num_turns]. Tool-call turns carry r_{i,t} (gold
    stage covered); a final answer turn is a turn too, rewarded by the outcome."""
    r = np.zeros((len(trajs), num_turns), np.float32)
    m = np.zeros((len(trajs), num_turns), bool)
    for i, tr in enumerate(trajs):
        vals = list(tr.turn_rewards)
        if tr.final_turn_is_answer:
            vals.append(tr.reward)
        n = min(len(vals), num_turns)
        r[i, :n] = vals[:n]
        m[i, :n] = True
    return r, m


def advantage_inputs(trajs: Sequence[Trajectory], num_turns: int,
                     readiness: np.ndarray | None = None) -> AdvantageInputs:
    """Returns the estimator inputs [B] / [B, T] for a batch of trajectories."""
    r, m = turn_arrays(trajs, num_turns)
    answer = np.zeros_like(m)
    for i, tr in enumerate(trajs):
        if tr.final_turn_is_answer and len(tr.turn_rewards) < num_turns:
            answer[i, len(tr.turn_rewards)] = True
    return AdvantageInputs(
        rewards=jnp.asarray([t.reward for t in trajs], jnp.float32),
        group_ids=jnp.asarray([t.group_id for t in trajs], jnp.int32),
        valid=jnp.asarray([not t.infra_failed for t in trajs]),
        turn_mask=jnp.asarray(m), turn_rewards=jnp.asarray(r), answer_mask=jnp.asarray(answer),
        readiness=None if readiness is None else jnp.asarray(readiness, jnp.float32))


def compute_advantages(trajs: Sequence[Trajectory], estimator: str, consts: dict[str, Any],
                       num_turns: int, readiness: np.ndarray | None = None) -> np.ndarray:
    """Returns per-turn advantages [B, num_turns] from the estimator registered as `estimator`
    (turns absent from a rollout are 0). Rollouts whose episode failed for infrastructure
    reasons get 0 and stay out of their group's statistics."""
    fn = get_advantage(estimator)
    return np.asarray(fn(advantage_inputs(trajs, num_turns, readiness), consts))


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
