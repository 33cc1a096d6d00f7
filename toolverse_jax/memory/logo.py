"""LoGo-GRPO (Memory-R2, DESIGN.md §5): global trajectory groups + local re-rollout groups.

Global term: GRPO over the G full multi-session rollouts of one conversation; the advantage
lands on every trained role token of the rollout. Local term: the K re-rollouts of one session
from one snapshotted bank state form their own group, z-scored within the K, scaled by
λ_local; the advantage lands only on the extractor / manager tokens of that re-rolled session.
Both kinds of rows go into one PPO batch; with token-mean aggregation the loss is then
global + λ_local · local (each term weighted by its share of the batch's tokens).
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from toolverse_jax.memory.roles import check_roles
from toolverse_jax.rl.advantages import grpo
from toolverse_jax.rl.types import Row

LOCAL_ROLES = ("extractor", "manager")


def logo_advantages(global_rewards, global_groups, global_valid, local_rewards, local_groups,
                    local_valid, local_coef: float = 1.0, eps: float = 1e-6
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Returns (A_global [B], A_local [N]).

    A_global = GRPO z-score of the B global rewards within their conversation groups;
    A_local = local_coef · z-score of the N local rewards within their snapshot groups. Invalid
    rows (infrastructure failures) get 0 and stay out of their group's statistics; a group whose
    members all agree gets exactly 0. N may be 0 (global-only GRPO)."""
    a_g = np.asarray(grpo(jnp.asarray(global_rewards, jnp.float32), jnp.asarray(global_groups),
                          eps, jnp.asarray(global_valid, bool)))
    if len(local_rewards) == 0:
        return a_g, np.zeros((0,), np.float32)
    a_l = np.asarray(grpo(jnp.asarray(local_rewards, jnp.float32), jnp.asarray(local_groups),
                          eps, jnp.asarray(local_valid, bool)))
    return a_g, (local_coef * a_l).astype(np.float32)


def trajectory_rows(trajs: Sequence, advantages: Sequence[float], roles: Sequence[str],
                    local: bool = False) -> list[Row]:
    """Returns training rows (tokens, policy_mask, advantages, sample_logprobs), one per role
    call of the trained `roles` (local members: extractor / manager calls only); the advantage
    of a trajectory is placed on its completion tokens. Infrastructure failures are dropped."""
    roles = check_roles(roles)
    if local:
        roles = tuple(r for r in roles if r in LOCAL_ROLES)
    rows = []
    for tr, a in zip(trajs, advantages):
        if tr.infra_failed:
            continue
        for call in tr.calls:
            if call.role not in roles:
                continue
            mask = np.asarray(call.policy_mask, bool)
            rows.append(Row(call.tokens, call.policy_mask,
                            np.where(mask, np.float32(a), 0.0).astype(np.float32),
                            np.asarray(call.sample_logprobs, np.float32)))
    return rows
