"""Trajectories -> per-turn advantages -> `Row`s -> a padded (global) `TrainBatch`.

The join of rollouts and estimators, and the packing every phase (SFT demonstrations, RL
rollouts, Memory-R2 role calls) shares: `pack_rows` builds one process's [B, L] batch and
`global_batch` assembles the mesh-sharded batch of all processes from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from toolverse_jax.models.qwen3 import SHARED_SEGMENT
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
# A shared-prefix row holds at most this many times the longest row's tokens (its attention is
# dense over all of them), and is kept only where it holds at most SHARED_MAX_FRACTION of the
# tokens its rows hold unpacked (else they stay one row each). The packed batch is used only
# where its padded [B, L] has at most SHARED_MAX_FRACTION of the plain batch's tokens and no
# more attention area (B * L^2): all rows pad to the longest, so one long packed row can cost
# more than it saves. Measured on the tiny model's train step: prompt 300 / completions ~60
# (8 a group) 265 -> 191 ms; 150 / 150 and 32 / 64 were slower packed (and are now left plain).
SHARED_MAX_GROWTH = 2
SHARED_MAX_FRACTION = 0.75


def _padded_shape(layout, min_bucket: int, num_micro: int, pow2: bool = False
                  ) -> tuple[int, int]:
    """Returns the (rows, length) a layout pads to; pow2: rows to a power of two (>= num_micro),
    so packed batches, whose row count varies step to step, compile a handful of shapes."""
    length = bucket_length(max(s + sum(p.end - p.start for p in ps) for s, ps in layout),
                           min_bucket, linear_above=512, per_octave=TRAIN_BUCKETS_PER_OCTAVE)
    n = len(layout)
    if pow2:
        n = max(1 << (n - 1).bit_length(), num_micro)
    return -(-n // num_micro) * num_micro, length


class _Piece(NamedTuple):
    """A run of one row's input positions [start, end) in a packed training row."""
    row: int
    start: int
    end: int


def _first_loss_input(r: Row) -> int:
    """Returns the first input position whose target is a policy token (len - 1 if none)."""
    hits = np.flatnonzero(np.asarray(r.policy_mask[1:], bool))
    return int(hits[0]) if hits.size else len(r.tokens) - 1


def _shared_layout(rows: Sequence[Row], min_shared: int, max_len: int
                   ) -> list[tuple[int, list[_Piece]]]:
    """Returns the packed rows as (shared input count s, pieces): rows whose first `min_shared`
    tokens agree form a group; s is the number of leading inputs every row of the group has
    alike, with alike targets, and no loss token (so the shared copy carries no loss); each
    piece is a row's inputs from s on. A group is cut into packed rows of at most `max_len`
    tokens; a packed row holding more than SHARED_MAX_FRACTION of its rows' unpacked tokens,
    and rows that share nothing, are one packed row per row (s = 0, one piece)."""
    groups: dict[tuple, list[int]] = {}
    out: list[tuple[int, list[_Piece]]] = []
    for i, r in enumerate(rows):
        if len(r.tokens) - 1 > min_shared:
            groups.setdefault(tuple(int(t) for t in r.tokens[:min_shared]), []).append(i)
        else:
            out.append((0, [_Piece(i, 0, len(r.tokens) - 1)]))
    for idx in groups.values():
        toks = [np.asarray(rows[i].tokens) for i in idx]
        n = min(len(t) for t in toks)
        same = np.all(np.stack([t[:n] for t in toks]) == toks[0][:n], axis=0)
        lcp = int(np.argmin(same)) if not same.all() else n
        s = min([lcp - 1] + [_first_loss_input(rows[i]) for i in idx])
        if len(idx) < 2 or s < min_shared:
            out.extend((0, [_Piece(i, 0, len(rows[i].tokens) - 1)]) for i in idx)
            continue
        chunks: list[list[_Piece]] = [[]]
        used = s
        for i in idx:
            n_i = len(rows[i].tokens) - 1 - s
            if chunks[-1] and used + n_i > max_len:
                chunks.append([])
                used = s
            chunks[-1].append(_Piece(i, s, len(rows[i].tokens) - 1))
            used += n_i
        for ps in chunks:
            rest = sum(p.end - p.start for p in ps)
            if len(ps) > 1 and s + rest <= SHARED_MAX_FRACTION * (len(ps) * s + rest):
                out.append((s, ps))
            else:
                out.extend((0, [_Piece(p.row, 0, p.end)]) for p in ps)
    return out


def pack_rows(rows: Sequence[Row], pad_id: int, num_micro: int = 1,
              min_bucket: int = 64, share_prefix: bool = False,
              min_shared: int = 16) -> TrainBatch:
    """Returns a TrainBatch [B, L] (numpy) from rows; B is padded to a multiple of num_micro
    (padding rows have an all-zero mask) and L to a length bucket. targets[t] = tokens[t + 1]:
    every per-token field of a row is shifted the same way.

    share_prefix: rows that begin alike (a GRPO group's rollouts of one prompt) are packed into
    one training row holding their common prefix once (segment `SHARED_SEGMENT`, attended by
    every later token of the row) and then each row's remainder (segments 1, 2, ...; RoPE
    positions continuing the prefix's). Each token sees exactly the context it has unpacked,
    so log-probs and gradients are the same (up to float summation order) over fewer tokens:
    the prompt is run once a group instead of once a rollout. Only where that pays (see
    SHARED_MAX_FRACTION): otherwise the batch is the plain one. The loss must aggregate over
    tokens (token_mean): a packed row holds several sequences."""
    if not rows:
        raise ValueError("pack_rows needs at least one row")
    # Quarter-octave length buckets (_padded_shape): a batch of ~300-token rows pads to 320,
    # not 512 (the trainer's forward and backward run over every padded position).
    layout = [(0, [_Piece(i, 0, len(r.tokens) - 1)]) for i, r in enumerate(rows)]
    b, length = _padded_shape(layout, min_bucket, num_micro)
    if share_prefix:
        longest = max(len(r.tokens) - 1 for r in rows)
        shared = _shared_layout(rows, min_shared, SHARED_MAX_GROWTH * longest)
        b2, l2 = _padded_shape(shared, min_bucket, num_micro, pow2=True)
        if b2 * l2 <= SHARED_MAX_FRACTION * b * length and b2 * l2 * l2 <= b * length * length:
            layout, b, length = shared, b2, l2
    out = {k: np.zeros((b, length), np.float32) for k in
           ("loss_mask", "advantages", "sample_logprobs")}
    tokens = np.full((b, length), pad_id, np.int32)
    targets = np.full((b, length), pad_id, np.int32)
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    for i, (s, pieces) in enumerate(layout):
        at = 0
        if s:  # the group's shared inputs and their (alike, loss-free) targets
            t = np.asarray(rows[pieces[0].row].tokens, np.int32)
            tokens[i, :s], targets[i, :s] = t[:s], t[1:s + 1]
            seg[i, :s] = SHARED_SEGMENT
            pos[i, :s] = np.arange(s)
            at = s
        for j, p in enumerate(pieces):
            r = rows[p.row]
            t = np.asarray(r.tokens, np.int32)
            n = p.end - p.start
            span = slice(at, at + n)
            tokens[i, span], targets[i, span] = t[p.start:p.end], t[p.start + 1:p.end + 1]
            seg[i, span] = j + 1
            pos[i, span] = np.arange(p.start, p.end)
            for k, field in (("loss_mask", r.policy_mask), ("advantages", r.advantages),
                             ("sample_logprobs", r.sample_logprobs)):
                out[k][i, span] = np.asarray(field, np.float32)[p.start + 1:p.end + 1]
            at += n
    zeros = np.zeros((b, length), np.float32)
    return TrainBatch(tokens, targets, seg, pos, out["loss_mask"], out["advantages"],
                      out["sample_logprobs"], zeros, zeros)


def global_batch(rows: Sequence[Row], pad_id: int, mesh: Mesh, num_micro: int = 1,
                 share_prefix: bool = False) -> TrainBatch:
    """Returns the global TrainBatch [sum of rows, L] on `mesh` from this process's rows (a
    process with none contributes one blank row); all processes agree on L (the max bucket)
    and pad to the same row count (zero-mask rows)."""
    local = pack_rows(list(rows) or [Row.blank(pad_id)], pad_id, num_micro,
                      share_prefix=share_prefix)
    return distributed.global_arrays(local, mesh, num_micro,
                                     fills={"tokens": pad_id, "targets": pad_id})
