"""Train state, optimizer, batch packing, reference scoring and the jitted train step.

`train_step(state, batch) -> (state, metrics)` is one pure function (purejaxrl style): micro-
batches are scanned with gradient accumulation inside the same jit, so the update is one
compiled program per batch shape.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from toolverse_jax.models import logprobs_of
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.rl.losses import TrainBatch, get_loss
from toolverse_jax.sampling import bucket_length


class TrainState(NamedTuple):
    step: jax.Array
    params: Any
    opt_state: Any


class LossConfig(NamedTuple):
    """Static loss constants (hashable, so they can shape the jitted step)."""

    name: str = "ppo_clip"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    tis_cap: float = 2.0
    aggregation: str = "token_mean"
    temperature: float = 1.0
    # Weight of negative advantages (1.0 = plain PPO). Below 1 a failed rollout's tokens are
    # pushed down less than a successful one's are pushed up: the tokens it shares with the
    # successes (call syntax, tool name) then drift less, the part that differs still moves.
    neg_adv_scale: float = 1.0


def make_optimizer(lr: float, warmup_steps: int, total_steps: int, weight_decay: float = 0.0,
                   max_grad_norm: float = 1.0, b2: float = 0.99,
                   schedule: str = "constant") -> optax.GradientTransformation:
    """Returns AdamW with global-norm clipping and a linear warmup (then constant or cosine)."""
    warm = max(int(warmup_steps), 1)
    if schedule == "cosine":
        sched = optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(total_steps, warm + 1),
                                                   end_value=0.1 * lr)
    elif schedule == "constant":
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warm), optax.constant_schedule(lr)], [warm])
    else:
        raise ValueError(f"optimizer schedule {schedule!r}; use 'constant' or 'cosine'")
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.adamw(sched, b1=0.9, b2=b2, weight_decay=weight_decay))


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def pack_rows(rows: Sequence[dict], pad_id: int, num_micro: int = 1,
              min_bucket: int = 64) -> TrainBatch:
    """Returns a TrainBatch [B, L] from rows with keys tokens, policy_mask, advantages (per
    token) and sample_logprobs (per token); B is padded to a multiple of num_micro (padding rows
    have an all-zero mask) and L to a length bucket."""
    if not rows:
        raise ValueError("pack_rows needs at least one row")
    length = bucket_length(max(len(r["tokens"]) - 1 for r in rows), min_bucket)
    b = -(-len(rows) // num_micro) * num_micro
    out = {k: np.zeros((b, length), np.float32) for k in
           ("loss_mask", "advantages", "sample_logprobs")}
    tokens = np.full((b, length), pad_id, np.int32)
    targets = np.full((b, length), pad_id, np.int32)
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    for i, r in enumerate(rows):
        t = np.asarray(r["tokens"], np.int32)
        n = len(t) - 1
        tokens[i, :n], targets[i, :n] = t[:-1], t[1:]
        seg[i, :n] = 1
        pos[i, :n] = np.arange(n)
        out["loss_mask"][i, :n] = np.asarray(r["policy_mask"][1:], np.float32)
        out["advantages"][i, :n] = np.asarray(r["advantages"][1:], np.float32)
        out["sample_logprobs"][i, :n] = np.asarray(r["sample_logprobs"][1:], np.float32)
    zeros = np.zeros((b, length), np.float32)
    return TrainBatch(tokens, targets, seg, pos, out["loss_mask"], out["advantages"],
                      out["sample_logprobs"], zeros, zeros)


def score_logprobs(params, cfg: ModelConfig, batch: TrainBatch, temperature: float = 1.0):
    """Returns (logprobs, entropy) [B, L] of the batch's targets under `params` (masked to 0)."""
    return logprobs_of(params, cfg, batch.tokens, batch.targets, batch.positions,
                       batch.segment_ids, mask=batch.segment_ids.astype(jnp.float32),
                       temperature=temperature)


@functools.partial(jax.jit, static_argnames=("cfg", "temperature"))
def score_jit(params, batch: TrainBatch, *, cfg: ModelConfig, temperature: float = 1.0):
    return score_logprobs(params, cfg, batch, temperature)


def _split_micro(batch: TrainBatch, num_micro: int) -> TrainBatch:
    return jax.tree.map(lambda x: x.reshape(num_micro, x.shape[0] // num_micro, *x.shape[1:]),
                        batch)


def make_train_step(cfg: ModelConfig, loss_cfg: LossConfig,
                    optimizer: optax.GradientTransformation, num_micro: int = 1):
    """Returns the jitted `train_step(state, batch) -> (state, metrics)`."""
    loss_fn = get_loss(loss_cfg.name)

    def micro_loss(params, mb: TrainBatch):
        lp, ent = score_logprobs(params, cfg, mb, loss_cfg.temperature)
        loss, metrics = loss_fn(lp, ent, mb, loss_cfg)
        return loss, metrics

    def step(state: TrainState, batch: TrainBatch):
        micro = _split_micro(batch, num_micro)
        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
        # Accumulate in float32 whatever the param dtype (bf16 params give bf16 grads; a bf16
        # carry would also lose the small micro-batch contributions).
        zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        weights = jnp.sum(micro.loss_mask, axis=(1, 2))
        weights = weights / jnp.maximum(jnp.sum(weights), 1.0)

        def body(acc, xs):
            mb, w = xs
            (loss, metrics), grads = grad_fn(state.params, mb)
            acc = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), acc, grads)
            return acc, (loss, metrics)

        grads, (losses, metrics) = jax.lax.scan(body, zero, (micro, weights))
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = {k: jnp.sum(v * weights) if k != "logprob_diff_max" else jnp.max(v)
               for k, v in metrics.items()}
        out["loss"] = jnp.sum(losses * weights)
        out["grad_norm"] = optax.global_norm(grads)
        out["num_tokens"] = jnp.sum(batch.loss_mask)
        return TrainState(state.step + 1, params, opt_state), out

    return jax.jit(step, donate_argnums=(0,))
