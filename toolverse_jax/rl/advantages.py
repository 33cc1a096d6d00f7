"""Advantage estimators as pure `jnp` functions on padded arrays (DESIGN.md §5).

Shapes: B rollouts (a batch holds several groups of G rollouts of one task each, identified by
`group_ids`), T padded turns. Every function is jittable: group statistics use
`jax.ops.segment_*` with a static number of segments (= B, or B*T for state groups), and any
integer ids (hashes included) are first remapped to dense ids with a fixed-size `jnp.unique`.

Conventions shared by all estimators:
- `valid` [B] bool marks rows whose episode ran (False = infrastructure failure: crashed server,
  timeout of the env layer). Invalid rows take no part in any statistic and get advantage 0.
- z-scores use the population std (ddof=0) and are exactly 0 where every participant agrees
  (max == min inside the group), so a group of identical rewards gives no signal, not
  rounding noise divided by eps.
- Per-turn outputs are 0 on padded turns (`turn_mask` False).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array

__all__ = [
    "dense_ids",
    "grouped_zscore",
    "grpo",
    "turn_aware",
    "state_grouped",
    "discounted_future",
]


def dense_ids(ids: Array) -> Array:
    """Returns ids remapped to 0..n-1 (same shape), so they can index `num_segments = size`."""
    flat = ids.reshape(-1)
    _, inv = jnp.unique(flat, size=flat.shape[0], fill_value=0, return_inverse=True)
    return inv.reshape(ids.shape).astype(jnp.int32)


def grouped_zscore(x: Array, weight: Array, seg: Array, num_segments: int,
                   eps: float = 1e-6) -> Array:
    """Returns (x - mean_g) / (std_g + eps) over the weighted members of each segment.

    x, weight: [N, ...] (weight 0/1, broadcastable trailing dims are reduced per column);
    seg: [N] dense ids in [0, num_segments). Members with weight 0 get 0 and are left out of the
    statistics; a segment whose members all agree gets exactly 0.
    """
    w = weight.astype(x.dtype)
    on = w > 0
    n = jax.ops.segment_sum(w, seg, num_segments)
    mean = jax.ops.segment_sum(x * w, seg, num_segments) / jnp.maximum(n, 1.0)
    dev = (x - mean[seg]) * w
    var = jax.ops.segment_sum(dev * dev, seg, num_segments) / jnp.maximum(n, 1.0)
    std = jnp.sqrt(var)
    big = jnp.asarray(jnp.inf, x.dtype)
    hi = jax.ops.segment_max(jnp.where(on, x, -big), seg, num_segments)
    lo = jax.ops.segment_min(jnp.where(on, x, big), seg, num_segments)
    agree = hi[seg] <= lo[seg]
    z = dev / (std[seg] + eps)
    return jnp.where(on & ~agree, z, jnp.zeros_like(z))


def _valid_rows(rewards: Array, valid: Optional[Array]) -> Array:
    if valid is None:
        return jnp.ones(rewards.shape[0], bool)
    return jnp.asarray(valid, bool)


def grpo(rewards: Array, group_ids: Array, eps: float = 1e-6,
         valid: Optional[Array] = None) -> Array:
    """Returns the GRPO outcome advantage [B]: (R - mean_group) / (std_group + eps).

    rewards [B] float, group_ids [B] int (any ints), valid [B] bool or None (all valid).
    Population std; invalid rows are excluded from the group's statistics and get 0.
    """
    rewards = jnp.asarray(rewards, jnp.result_type(rewards, jnp.float32))
    b = rewards.shape[0]
    v = _valid_rows(rewards, valid)
    return grouped_zscore(rewards, v, dense_ids(jnp.asarray(group_ids)), b, eps)


def discounted_future(r: Array, gamma: float, include_current: bool = False) -> Array:
    """Returns F[b, t] = sum_{k>=1} gamma^(k-1) r[b, t+k] (or sum_{k>=0} gamma^k r[b, t+k]).

    r: [B, T] (already zero on padded turns). O(T^2) via a constant discount matrix: T is a turn
    count (tens), so this is cheaper to compile than a reverse scan.
    """
    t = r.shape[1]
    idx = jnp.arange(t)
    lag = idx[None, :] - idx[:, None]  # [t, u] = u - t
    if include_current:
        m = jnp.where(lag >= 0, gamma ** jnp.maximum(lag, 0), 0.0)
    else:
        m = jnp.where(lag >= 1, gamma ** jnp.maximum(lag - 1, 0), 0.0)
    return r @ m.T.astype(r.dtype)


def turn_aware(rewards: Array, turn_rewards: Array, turn_mask: Array, group_ids: Array,
               lam: float = 0.5, gamma: float = 0.5, eps: float = 1e-6, gate: bool = True,
               local_only: bool = False, valid: Optional[Array] = None,
               outcome_coef: float = 1.0) -> Array:
    """Returns TARA per-turn advantages [B, T] (ToolVerse, DESIGN.md §5).

    rewards [B] outcome rewards; turn_rewards [B, T] r_{i,t} (1 = turn t's gold calls covered);
    turn_mask [B, T] bool (turn exists); group_ids [B]; valid [B] bool or None.

        A_local(i,t)  = z-score of r_{i,t} over the group's valid rollouts that have turn t
        V_{i,t}       = r_{i,t} * sum_{k>=1} gamma^(k-1) r_{i,t+k}   (gate=False: no r_{i,t})
        A_future(i,t) = z-score of V_{i,t} over the same participants
        A(i,t)        = A_local + lam * A_future  (+ outcome_coef * A_grpo(i) on every turn)

    The outcome term is our addition (DESIGN's formula has none): with sparse turn rewards a
    group where every rollout fails each turn alike gets A_local = A_future = 0 and learns
    nothing even when outcomes differ. outcome_coef=0.0 gives the paper's formula exactly.
    """
    dt = jnp.result_type(turn_rewards, jnp.float32)
    r = jnp.asarray(turn_rewards, dt)
    b = r.shape[0]
    v = _valid_rows(r, valid)
    m = jnp.asarray(turn_mask, bool) & v[:, None]
    r = jnp.where(m, r, 0.0)
    seg = dense_ids(jnp.asarray(group_ids))
    adv = grouped_zscore(r, m, seg, b, eps)
    if not local_only:
        fut = discounted_future(r, gamma)
        val = r * fut if gate else fut
        adv = adv + lam * grouped_zscore(val, m, seg, b, eps)
    if outcome_coef:
        a_out = grpo(jnp.asarray(rewards, dt), group_ids, eps=eps, valid=v)
        adv = adv + outcome_coef * a_out[:, None]
    return jnp.where(m, adv, 0.0)


def state_grouped(rewards: Array, turn_rewards: Array, turn_mask: Array, group_ids: Array,
                  state_keys: Array, gamma: float = 0.95, step_coef: float = 1.0,
                  outcome_coef: float = 1.0, eps: float = 1e-6,
                  valid: Optional[Array] = None) -> Array:
    """Returns GiGPO-style per-turn advantages [B, T], steps grouped by environment state.

    state_keys [B, T] int: a key of the environment state the turn acted from (e.g. a hash of
    the unlocked tools and produced values; any int, equal keys = same anchor state). Steps of
    one task group that share a key form a step group; the step advantage is the z-score of the
    discounted return G_{i,t} = sum_{k>=0} gamma^k r_{i,t+k} inside that step group (a state
    seen once gets 0). A(i,t) = outcome_coef * A_grpo(i) + step_coef * A_step(i,t).
    """
    dt = jnp.result_type(turn_rewards, jnp.float32)
    r = jnp.asarray(turn_rewards, dt)
    b, t = r.shape
    v = _valid_rows(r, valid)
    m = jnp.asarray(turn_mask, bool) & v[:, None]
    r = jnp.where(m, r, 0.0)
    ret = discounted_future(r, gamma, include_current=True)
    gid = jnp.broadcast_to(dense_ids(jnp.asarray(group_ids))[:, None], (b, t))
    keys = jnp.stack([gid.reshape(-1), jnp.asarray(state_keys).reshape(-1).astype(jnp.int32)], 1)
    _, seg = jnp.unique(keys, axis=0, size=b * t, fill_value=0, return_inverse=True)
    a_step = grouped_zscore(ret.reshape(-1), m.reshape(-1), seg.reshape(-1), b * t, eps)
    adv = step_coef * a_step.reshape(b, t)
    if outcome_coef:
        adv = adv + outcome_coef * grpo(jnp.asarray(rewards, dt), group_ids, eps, v)[:, None]
    return jnp.where(m, adv, 0.0)

