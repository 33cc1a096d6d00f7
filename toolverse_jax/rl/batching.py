"""Trajectories -> per-turn advantages -> `Row`s -> a padded (global) `TrainBatch`.

The join of rollouts and estimators, and the packing every phase (SFT demonstrations, RL
rollouts, Memory-R2 role calls) shares: `pack_rows` builds one process's [B, L] batch and
`global_batch` assembles the mesh-sharded batch of all processes from it.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from toolverse_jax.rl.registry import AdvantageInputs, get_advantage
from toolverse_jax.rl.types import Row, TrainBatch, Trajectory
from toolverse_jax.sampling import bucket_length
from toolverse_jax.sharding import distributed


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


def demonstration_row(tokens: Sequence[int], policy_mask: Sequence[bool]) -> Row:
    """Returns an SFT training row: advantage 1 on every token (the loss masks non-policy
    ones) and no sampler log-probs (the SFT loss reads none)."""
    return Row(list(tokens), list(policy_mask), np.ones(len(tokens), np.float32),
               np.zeros(len(tokens), np.float32))


def trajectory_rows(trajs: Sequence[Trajectory], turn_adv: np.ndarray) -> list[Row]:
    """Returns training rows (tokens, policy_mask, advantages, sample_logprobs) per trajectory;
    infrastructure failures are dropped (they carry no learning signal, only a counted metric)."""
    rows = []
    for i, tr in enumerate(trajs):
        if tr.infra_failed:
            continue
        tt = np.asarray(tr.token_turn)
        adv = np.where(tt >= 0, turn_adv[i, np.clip(tt, 0, turn_adv.shape[1] - 1)], 0.0)
        rows.append(Row(tr.tokens, tr.policy_mask, adv.astype(np.float32),
                        np.asarray(tr.sample_logprobs, np.float32)))
    return rows


def pad_rows(rows: Sequence[Row], pad_id: int, multiple: int = 1) -> list[Row]:
    """Returns `rows` padded with blank rows to a power of two (>= multiple), so a phase whose
    row count varies step to step compiles the train step for a handful of shapes only."""
    n = max(len(rows), multiple)
    target = max(1 << (n - 1).bit_length(), multiple)
    return list(rows) + [Row.blank(pad_id)] * (target - len(rows))


TRAIN_BUCKETS_PER_OCTAVE = 4


def pack_rows(rows: Sequence[Row], pad_id: int, num_micro: int = 1,
              min_bucket: int = 64) -> TrainBatch:
    """Returns a TrainBatch [B, L] (numpy) from rows; B is padded to a multiple of num_micro
    (padding rows have an all-zero mask) and L to a length bucket. targets[t] = tokens[t + 1]:
    every per-token field of a row is shifted the same way."""
    if not rows:
        raise ValueError("pack_rows needs at least one row")
    # Quarter-octave length buckets: a batch of ~300-token rows pads to 320, not 512 (the
    # trainer's forward and backward run over every padded position).
    length = bucket_length(max(len(r.tokens) - 1 for r in rows), min_bucket, linear_above=512,
                           per_octave=TRAIN_BUCKETS_PER_OCTAVE)
    b = -(-len(rows) // num_micro) * num_micro
    out = {k: np.zeros((b, length), np.float32) for k in
           ("loss_mask", "advantages", "sample_logprobs")}
    tokens = np.full((b, length), pad_id, np.int32)
    targets = np.full((b, length), pad_id, np.int32)
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    for i, r in enumerate(rows):
        t = np.asarray(r.tokens, np.int32)
        n = len(t) - 1
        tokens[i, :n], targets[i, :n] = t[:-1], t[1:]
        seg[i, :n] = 1
        pos[i, :n] = np.arange(n)
        out["loss_mask"][i, :n] = np.asarray(r.policy_mask[1:], np.float32)
        out["advantages"][i, :n] = np.asarray(r.advantages[1:], np.float32)
        out["sample_logprobs"][i, :n] = np.asarray(r.sample_logprobs[1:], np.float32)
    zeros = np.zeros((b, length), np.float32)
    return TrainBatch(tokens, targets, seg, pos, out["loss_mask"], out["advantages"],
                      out["sample_logprobs"], zeros, zeros)


def global_batch(rows: Sequence[Row], pad_id: int, mesh: Mesh, num_micro: int = 1
                 ) -> TrainBatch:
    """Returns the global TrainBatch [sum of rows, L] on `mesh` from this process's rows (a
    process with none contributes one blank row); all processes agree on L (the max bucket)
    and pad to the same row count (zero-mask rows)."""
    local = pack_rows(list(rows) or [Row.blank(pad_id)], pad_id, num_micro)
    return distributed.global_arrays(local, mesh, num_micro,
                                     fills={"tokens": pad_id, "targets": pad_id})
