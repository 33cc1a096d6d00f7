"""TRACE: dense turn-level credit from the reference model's answer readiness (DESIGN.md §5).

Layout of one rollout with n tool turns (0-indexed) and an optional final-answer turn:

    S_0 = prompt | a_0 o_0 | S_1 | a_1 o_1 | S_2 ... | a_{n-1} o_{n-1} | S_n | final answer

`readiness[b, k]` = ℓ̄_k for state S_k, k = 0..T (entries past n are padding). `turn_mask[b, t]`
marks existing turns; `answer_mask[b, t]` the terminal turn that reached no environment (the
final answer, or a turn cut at max_new_tokens; at index n when present). Tool
turns (turn_mask & ~answer_mask) must be the prefix 0..n-1 of the row, as the rollout engine
produces them.

This module is the maths only (pure jnp, jittable): `trace_rewards`, `kstep_backup`,
`trace_advantages`. Computing ℓ̄ under the frozen reference model from rollouts is
`rl.trace_scoring`.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from toolverse_jax.rl import advantages as _adv

Array = jax.Array

__all__ = ["MODES", "kstep_backup", "trace_advantages", "trace_rewards"]

MODES = ("log_ratio", "raw", "gap_normalized")


def trace_rewards(readiness: Array, turn_mask: Array, eps: float = 0.1,
                  mode: str = "log_ratio") -> Array:
    """Returns the one-step TD credit δ [B, T] of the action leading from S_k to S_{k+1}.

    readiness: ℓ̄ [B, T+1] for S_0..S_T (mean gold-answer log-prob, <= 0); turn_mask: [B, T]
    tool turns. d_k = -ℓ̄_k + eps; modes: "log_ratio" δ_k = log(d_k / d_{k+1}) (default; Σδ over
    a row telescopes to log(d_0 / d_n)), "raw" δ_k = ℓ̄_{k+1} - ℓ̄_k, "gap_normalized"
    δ_k = (ℓ̄_{k+1} - ℓ̄_k) / d_k. Masked turns get 0.
    """
    if mode not in MODES:
        raise ValueError(f"trace_rewards mode {mode!r} is unknown; use one of {MODES}")
    lb = jnp.asarray(readiness, jnp.result_type(readiness, jnp.float32))
    m = jnp.asarray(turn_mask, bool)
    if lb.shape[1] != m.shape[1] + 1:
        raise ValueError(f"readiness must be [B, T+1] for turn_mask [B, T]; got {lb.shape} "
                         f"and {m.shape}")
    cur, nxt = lb[:, :-1], lb[:, 1:]
    # Padding entries may hold anything: keep them out of log/divide so no NaN leaks via where.
    d_cur = jnp.where(m, -cur + eps, 1.0)
    d_nxt = jnp.where(m, -nxt + eps, 1.0)
    if mode == "log_ratio":
        delta = jnp.log(d_cur) - jnp.log(d_nxt)
    elif mode == "raw":
        delta = nxt - cur
    else:
        delta = (nxt - cur) / d_cur
    return jnp.where(m, delta, 0.0)


def kstep_backup(delta: Array, tool_mask: Array, a_out: Array, k_steps: int = 3,
                 gamma_td: float = 0.8, fill: float = 2.0) -> Array:
    """Returns the K-step backed-up turn credit c [B, T] (with terminal fill), 0 off tool turns.

    c_k = Σ_{u=k}^{h} γ^{u-k} δ_u / Σ_{u=k}^{h} γ^{u-k}, h = min(k+K-1, n-1), n = tool turns of
    the row; where the window reaches the end (k+K-1 >= n-1) add fill·γ^{n-k}·A_out. The fill is
    part of c_k (so it is scaled by α_turn in the mixed advantage).
    """
    m = jnp.asarray(tool_mask, bool)
    dt = delta.dtype
    t = delta.shape[1]
    idx = jnp.arange(t)
    lag = idx[None, :] - idx[:, None]  # [k, u] = u - k
    w = jnp.where((lag >= 0) & (lag < k_steps), gamma_td ** jnp.maximum(lag, 0), 0.0).astype(dt)
    mf = m.astype(dt)
    num = jnp.where(m, delta, 0.0) @ w.T
    den = mf @ w.T
    c = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)
    n = jnp.sum(mf, axis=1, keepdims=True)
    k = idx[None, :].astype(dt)
    reaches_end = k + k_steps - 1 >= n - 1
    c = c + jnp.where(reaches_end, fill * gamma_td ** (n - k) * a_out[:, None], 0.0)
    return jnp.where(m, c, 0.0)


def trace_advantages(readiness: Array, turn_mask: Array, rewards: Array, group_ids: Array,
                     answer_mask: Optional[Array] = None, valid: Optional[Array] = None,
                     eps: float = 0.1, mode: str = "log_ratio", k_steps: int = 3,
                     gamma_td: float = 0.8, fill: float = 2.0, alpha_out: float = 1.0,
                     alpha_turn: float = 0.2, grpo_eps: float = 1e-6) -> Array:
    """Returns TRACE mixed per-turn advantages [B, T].

    Tool turn k: α_out·A_out + α_turn·c_k; final-answer or truncated turn (answer_mask):
    α_out·A_out only;
    padded turns and invalid rows: 0. A_out = GRPO outcome advantage (population std) over
    `group_ids`; c is not group-normalized. readiness [B, T+1], turn_mask/answer_mask [B, T],
    rewards/group_ids/valid [B].
    """
    m = jnp.asarray(turn_mask, bool)
    ans = jnp.zeros_like(m) if answer_mask is None else jnp.asarray(answer_mask, bool) & m
    tool = m & ~ans
    v = jnp.ones(m.shape[0], bool) if valid is None else jnp.asarray(valid, bool)
    a_out = _adv.grpo(rewards, group_ids, eps=grpo_eps, valid=v)
    delta = trace_rewards(readiness, tool, eps=eps, mode=mode)
    c = kstep_backup(delta, tool, a_out, k_steps=k_steps, gamma_td=gamma_td, fill=fill)
    adv = alpha_out * a_out[:, None] + alpha_turn * c
    return jnp.where(m & v[:, None], adv, 0.0)
