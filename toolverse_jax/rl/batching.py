"""Trajectories -> per-turn advantages -> `Row`s -> a padded (global) `TrainBatch`.

The join of rollouts and estimators, and the packing every phase (SFT demonstrations, RL
rollouts, Memory-R2 role calls) shares: `pack_rows` builds one process's [B, L] batch and
`global_batch` assembles the mesh-sharded batch of all processes from it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from toolverse_jax.rl.registry import AdvantageInputs, jitted_advantage
from toolverse_jax.rl.types import Row, TrainBatch, Trajectory
from toolverse_jax.sampling import bucket_length
from toolverse_jax.sharding import distributed
from toolverse_jax.sharding.mesh import batch_sharding


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
    fn = jitted_advantage(estimator, consts)
    return np.asarray(fn(advantage_inputs(trajs, num_turns, readiness)))


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
# Shared prefixes (pack_rows(share_prefix=True)) are used only where their cost comes to at
# most PREFIX_MAX_FRACTION of the plain batch's: padded tokens plus attention area (query x key
# pairs) at PREFIX_PAIRS_PER_TOKEN pairs a token (a token's projections and MLP cost ~1500
# attention pairs' dots on the tiny model; the softmax's elementwise work makes pairs dearer).
# Below 0.9 the saving would not cover the gather and the second forward's overhead.
PREFIX_MAX_FRACTION = 0.9
PREFIX_PAIRS_PER_TOKEN = 512
PREFIX_MIN_BUCKET = 16


def _first_loss_input(r: Row) -> int:
    """Returns the first input position whose target is a policy token (len - 1 if none)."""
    hits = np.flatnonzero(np.asarray(r.policy_mask[1:], bool))
    return int(hits[0]) if hits.size else len(r.tokens) - 1


def _shared_starts(rows: Sequence[Row], min_shared: int) -> tuple[list[int], list[int]]:
    """Returns (group, start) per row: rows whose first `min_shared` tokens agree form a group
    (-1: none); start = the number of leading inputs the group shares (held once, as its
    prefix): alike in every row, before any row's first loss target, and leaving each row at
    least one input. Groups of one row, or sharing fewer than `min_shared` inputs, get -1 / 0."""
    keys: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if len(r.tokens) - 2 >= min_shared:
            keys.setdefault(tuple(int(t) for t in r.tokens[:min_shared]), []).append(i)
    group, start = [-1] * len(rows), [0] * len(rows)
    for idx in keys.values():
        if len(idx) < 2:
            continue
        toks = [np.asarray(rows[i].tokens) for i in idx]
        n = min(len(t) for t in toks)
        same = np.all(np.stack([t[:n] for t in toks]) == toks[0][:n], axis=0)
        lcp = n if same.all() else int(np.argmin(same))
        s = min([lcp, n - 2] + [_first_loss_input(rows[i]) for i in idx])
        if s >= min_shared:
            for i in idx:
                group[i], start[i] = idx[0], s
    return group, start


def _prefix_plan(rows: Sequence[Row], group: list[int], start: list[int], b: int,
                 num_micro: int, shards: int
                 ) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Returns (order, prefixes, prefix_of_slot): batch slot k holds rows[order[k]]
    (slots past len(rows) are padding); rows of a group sit together; micro-batch m's slots
    reads prefix rows m * per_micro.. (per_micro the same for every micro: a power of two, or
    a multiple of `shards` where that is more, as the mesh splits a micro-batch's prefixes);
    prefixes[p] = (row whose tokens it copies, shared input count; (-1, 0) = blank, for rows
    that share nothing and for padding)."""
    order = sorted(range(len(rows)), key=lambda i: (group[i] < 0, group[i], i))
    bm = b // num_micro
    per: list[list[tuple[int, int]]] = []
    slot_local: list[int] = []
    for m in range(num_micro):
        local: dict[int, int] = {}
        for k in range(m * bm, (m + 1) * bm):
            i = order[k] if k < len(order) else -1
            key = group[i] if i >= 0 else -1
            if key not in local:
                local[key] = len(local)
            slot_local.append(local[key])
        per.append([(g, start[g]) if g >= 0 else (-1, 0) for g in local])
    per_micro = 1 << (max(len(p) for p in per) - 1).bit_length()
    per_micro = -(-per_micro // shards) * shards
    prefixes: list[tuple[int, int]] = []
    for p in per:
        prefixes += p + [(-1, 0)] * (per_micro - len(p))
    prefix_of_slot = [k // bm * per_micro + j for k, j in enumerate(slot_local)]
    return order, prefixes, prefix_of_slot


def pack_rows(rows: Sequence[Row], pad_id: int, num_micro: int = 1,
              min_bucket: int = 64, share_prefix: bool = False,
              min_shared: int = 16, shards: int = 1) -> TrainBatch:
    """Returns a TrainBatch [B, L] (numpy) from rows; B is padded to a multiple of
    num_micro * shards (padding rows have an all-zero mask; `shards`: how many ways the mesh
    splits a batch) and L to a length bucket. targets[t] = tokens[t + 1]: every per-token
    field of a row is shifted the same way.

    share_prefix: rows that begin alike (a GRPO group's rollouts of one prompt) hold their
    common leading inputs once, as a prefix row (TrainBatch.prefix_*), and each row keeps only
    its inputs after it: the trainer runs the prefix once and every row attends to its keys
    and values (`models.qwen3.prefix_cache`). Each token sees exactly its unsplit context, so
    log-probs and gradients are the same (up to float summation order) over fewer tokens.
    The prefix ends before any row's first loss target, so rows and their losses stay whole
    (any aggregation). Used only where it pays (PREFIX_MAX_FRACTION); otherwise the batch is
    the plain one. Rows of a group are put next to each other (row order is not kept)."""
    if not rows:
        raise ValueError("pack_rows needs at least one row")
    unit = num_micro * shards
    b = -(-len(rows) // unit) * unit
    # Quarter-octave length buckets: a batch of ~300-token rows pads to 320, not 512 (the
    # trainer's forward and backward run over every padded position).
    def bucket(n, least=min_bucket):
        return bucket_length(n, least, linear_above=512, per_octave=TRAIN_BUCKETS_PER_OCTAVE)

    length = bucket(max(len(r.tokens) - 1 for r in rows))
    order, start, prefix = list(range(len(rows))), [0] * len(rows), None
    if share_prefix:
        group, starts = _shared_starts(rows, min_shared)
        if any(g >= 0 for g in group):
            order_p, prefixes, prefix_of_slot = _prefix_plan(rows, group, starts, b,
                                                             num_micro, shards)
            lp = bucket(max(starts), PREFIX_MIN_BUCKET)
            lr = bucket(max(len(r.tokens) - 1 - s for r, s in zip(rows, starts)))
            n_prefix = len(prefixes)
            cost = (n_prefix * lp + b * lr
                    + (n_prefix * lp * lp + b * lr * (lp + lr)) / PREFIX_PAIRS_PER_TOKEN)
            plain = b * length + b * length * length / PREFIX_PAIRS_PER_TOKEN
            if cost <= PREFIX_MAX_FRACTION * plain:
                order, start, length = order_p, starts, lr
                prefix = (prefixes, prefix_of_slot, lp)
    out = {k: np.zeros((b, length), np.float32) for k in
           ("loss_mask", "advantages", "sample_logprobs")}
    tokens = np.full((b, length), pad_id, np.int32)
    targets = np.full((b, length), pad_id, np.int32)
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    for k, i in enumerate(order):
        r, s = rows[i], start[i]
        t = np.asarray(r.tokens, np.int32)
        n = len(t) - 1 - s
        tokens[k, :n], targets[k, :n] = t[s:-1], t[s + 1:]
        seg[k, :n] = 1
        pos[k, :n] = np.arange(s, s + n)
        for name, field in (("loss_mask", r.policy_mask), ("advantages", r.advantages),
                            ("sample_logprobs", r.sample_logprobs)):
            out[name][k, :n] = np.asarray(field, np.float32)[s + 1:]
    zeros = np.zeros((b, length), np.float32)
    batch = TrainBatch(tokens, targets, seg, pos, out["loss_mask"], out["advantages"],
                       out["sample_logprobs"], zeros, zeros)
    if prefix is None:
        return batch
    prefixes, prefix_of_slot, lp = prefix
    p_tokens = np.full((len(prefixes), lp), pad_id, np.int32)
    p_seg = np.zeros((len(prefixes), lp), np.int32)
    for j, (i, s) in enumerate(prefixes):
        if i >= 0:
            p_tokens[j, :s] = np.asarray(rows[i].tokens[:s], np.int32)
            p_seg[j, :s] = 1
    return batch._replace(prefix_tokens=p_tokens, prefix_segment_ids=p_seg,
                          prefix_index=np.asarray(prefix_of_slot, np.int32))


@functools.lru_cache(maxsize=None)
def _warn_plain_layout(processes: int) -> None:
    """Logs (once) that shared prefixes fall back to the plain layout on several processes."""
    logging.warning("rl.share_prefix lays out one process's rows; with %d processes the "
                    "update runs the plain layout (same loss and gradient)", processes)


def global_batch(rows: Sequence[Row], pad_id: int, mesh: Mesh, num_micro: int = 1,
                 share_prefix: bool = False) -> TrainBatch:
    """Returns the global TrainBatch [sum of rows, L] on `mesh` from this process's rows (a
    process with none contributes one blank row); all processes agree on L (the max bucket)
    and pad to the same row count (zero-mask rows). share_prefix (one process only): shared
    prefixes as `pack_rows` lays them out, split over the mesh like the rows (with several
    processes: the plain layout, logged once)."""
    rows = list(rows) or [Row.blank(pad_id)]
    fills = {"tokens": pad_id, "targets": pad_id}
    if not share_prefix:
        return distributed.global_arrays(pack_rows(rows, pad_id, num_micro), mesh, num_micro,
                                         fills=fills)
    if jax.process_count() > 1:
        # Each process would hold its own prefixes, and the global prefix arrays would need
        # per-process offsets: not built. The plain layout is the same update over more tokens.
        _warn_plain_layout(jax.process_count())
        return global_batch(rows, pad_id, mesh, num_micro, share_prefix=False)
    # Padded here to the mesh's shards, so the global batch keeps pack_rows's micro layout.
    local = pack_rows(rows, pad_id, num_micro, share_prefix=True,
                      shards=distributed.batch_shards(mesh))
    batch = distributed.global_arrays(
        local._replace(prefix_tokens=None, prefix_segment_ids=None, prefix_index=None),
        mesh, num_micro, fills=fills)
    if local.prefix_index is None:
        return batch
    return batch._replace(
        prefix_tokens=jax.device_put(local.prefix_tokens, batch_sharding(mesh, 2)),
        prefix_segment_ids=jax.device_put(local.prefix_segment_ids, batch_sharding(mesh, 2)),
        prefix_index=jax.device_put(local.prefix_index, batch_sharding(mesh, 1)))
