"""Policy losses (registered by name): PPO-clip with asymmetric clipping, k3 KL to the frozen
reference, truncated importance sampling against the sampler; and the SFT warm-start loss.

Every loss is a pure function (logprobs [B, L], entropy [B, L], batch, cfg) -> (loss, metrics),
aggregated over `batch.loss_mask` (token-mean by default, or sequence-mean)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from toolverse_jax.registry import Registry
from toolverse_jax.rl.types import TrainBatch


LOSSES: Registry[Callable] = Registry("policy loss", plural="policy losses",
                                      hint="(config.rl.loss)")


def register_loss(name: str) -> Callable[[Callable], Callable]:
    """Returns a decorator registering `fn(logprobs, entropy, batch, cfg) -> (loss, metrics)`."""
    return LOSSES.register(name)


def get_loss(name: str) -> Callable:
    """Returns the loss registered as `name`; an unknown name raises listing the known ones."""
    return LOSSES.get(name)


def aggregate(x: jax.Array, mask: jax.Array, mode: str = "token_mean") -> jax.Array:
    """Returns the masked mean of x [B, L]: over all tokens, or per sequence then over sequences."""
    if mode == "token_mean":
        return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if mode == "seq_mean":
        per = jnp.sum(x * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        has = (jnp.sum(mask, axis=1) > 0).astype(x.dtype)
        return jnp.sum(per * has) / jnp.maximum(jnp.sum(has), 1.0)
    raise ValueError(f"loss aggregation {mode!r}; use 'token_mean' or 'seq_mean'")


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Returns the k3 estimator of KL(pi || ref) per token: exp(r) - r - 1, r = ref - lp."""
    r = ref_logprobs - logprobs
    return jnp.exp(r) - r - 1.0


def _mask_stats(x, mask):
    n = jnp.maximum(jnp.sum(mask), 1.0)
    return jnp.sum(x * mask) / n, jnp.max(jnp.where(mask > 0, x, -jnp.inf))


@register_loss("ppo_clip")
def ppo_clip(logprobs, entropy, batch: TrainBatch, cfg: Any):
    """Returns (loss, metrics) of PPO-clip; ratio pi_theta / pi_old on each policy token.

    cfg.old_from_current: pi_old is the policy being updated (one update per rollout batch),
    so its log-probs are this forward's, gradient stopped: the ratio is 1 in value (its
    gradient is the policy gradient) and no separate scoring pass is needed."""
    mask = batch.loss_mask
    old = (jax.lax.stop_gradient(logprobs) if getattr(cfg, "old_from_current", False)
           else batch.old_logprobs)
    log_ratio = logprobs - old
    ratio = jnp.exp(log_ratio)
    adv = batch.advantages
    neg_scale = getattr(cfg, "neg_adv_scale", 1.0)
    if neg_scale != 1.0:
        adv = jnp.where(adv < 0, neg_scale * adv, adv)
    clipped = jnp.clip(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    per_token = -jnp.minimum(ratio * adv, clipped * adv)
    # Truncated importance sampling: the trainer's old log-probs and the sampler's differ
    # (numerics, bf16, kernels); weight by the capped ratio old/sampler to correct for it.
    if cfg.tis_cap > 0:
        w = jnp.minimum(jnp.exp(old - batch.sample_logprobs), cfg.tis_cap)
        per_token = per_token * jax.lax.stop_gradient(w)
    loss = aggregate(per_token, mask, cfg.aggregation)
    kl = kl_k3(logprobs, batch.ref_logprobs)
    kl_mean = aggregate(kl, mask, cfg.aggregation)
    if cfg.kl_coef > 0:
        loss = loss + cfg.kl_coef * kl_mean
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.aggregation)
    clip_frac = aggregate((jnp.abs(ratio - clipped) > 1e-6).astype(jnp.float32), mask)
    diff = jnp.abs(old - batch.sample_logprobs)
    diff_mean, diff_max = _mask_stats(diff, mask)
    return loss, {
        "pg_loss": aggregate(per_token, mask, cfg.aggregation), "kl": kl_mean,
        "clip_frac": clip_frac, "entropy": aggregate(entropy, mask),
        "approx_kl_old": aggregate(0.5 * log_ratio ** 2, mask),
        "logprob_diff_mean": diff_mean, "logprob_diff_max": diff_max,
    }


@register_loss("sft")
def sft(logprobs, entropy, batch: TrainBatch, cfg: Any):
    """Returns (loss, metrics): negative log-likelihood of the policy tokens (gold chains)."""
    nll = aggregate(-logprobs, batch.loss_mask, cfg.aggregation)
    return nll, {"nll": nll, "entropy": aggregate(entropy, batch.loss_mask)}
