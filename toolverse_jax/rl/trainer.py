"""Train state, optimizer, reference scoring, the jitted train step and the PPO update over it.

`train_step(state, batch) -> (state, metrics)` is one pure function (purejaxrl style): micro-
batches are scanned with gradient accumulation inside the same jit, so the update is one
compiled program per batch shape.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from toolverse_jax.models import logprobs_of
from toolverse_jax.models.config import ModelConfig
from toolverse_jax.rl.batching import global_batch, pad_rows
from toolverse_jax.sharding import distributed
from toolverse_jax.rl.losses import get_loss
from toolverse_jax.rl.types import Row, TrainBatch


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
    # Token log-prob kernel of the train step and its scoring (kernels.BACKENDS; "auto" =
    # Pallas on GPU, chunked XLA elsewhere).
    backend: str = "auto"
    # pi_old = the params being updated, read from the update's own forward (no scoring pass);
    # valid when each rollout batch gets exactly one update (ppo_update's score_old=False).
    old_from_current: bool = False


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


def score_logprobs(params, cfg: ModelConfig, batch: TrainBatch, temperature: float = 1.0,
                   backend: str = "auto"):
    """Returns (logprobs, entropy) [B, L] of the batch's targets under `params` (masked to 0)."""
    prefix = None if batch.prefix_tokens is None else (
        batch.prefix_tokens, batch.prefix_segment_ids, batch.prefix_index)
    return logprobs_of(params, cfg, batch.tokens, batch.targets, batch.positions,
                       batch.segment_ids, mask=(batch.segment_ids != 0).astype(jnp.float32),
                       temperature=temperature, backend=backend, prefix=prefix)


@functools.partial(jax.jit, static_argnames=("cfg", "temperature", "backend", "num_micro"))
def score_jit(params, batch: TrainBatch, *, cfg: ModelConfig, temperature: float = 1.0,
              backend: str = "auto", num_micro: int = 1):
    """Returns score_logprobs(...) of the batch; num_micro > 1 scores it one micro-batch at a
    time (a batch laid out for that many, `pack_rows`), so its activations are a micro-batch's."""
    if num_micro == 1:
        return score_logprobs(params, cfg, batch, temperature, backend)
    lp, ent = jax.lax.map(lambda mb: score_logprobs(params, cfg, mb, temperature, backend),
                          _split_micro(batch, num_micro))
    return lp.reshape(batch.tokens.shape), ent.reshape(batch.tokens.shape)


def _split_micro(batch: TrainBatch, num_micro: int) -> TrainBatch:
    """Returns the batch with a leading [num_micro] axis. Shared prefixes are laid out per
    micro-batch (`pack_rows`): micro m holds prefix rows m * Pm.., and its rows' prefix_index
    becomes local to them."""
    micro = jax.tree.map(lambda x: x.reshape(num_micro, x.shape[0] // num_micro, *x.shape[1:]),
                         batch)
    if batch.prefix_index is None:
        return micro
    per_micro = batch.prefix_tokens.shape[0] // num_micro
    first = (jnp.arange(num_micro, dtype=jnp.int32) * per_micro)[:, None]
    return micro._replace(prefix_index=micro.prefix_index - first)


def make_train_step(cfg: ModelConfig, loss_cfg: LossConfig,
                    optimizer: optax.GradientTransformation, num_micro: int = 1):
    """Returns the jitted `train_step(state, batch, grad_scale=1.0) -> (state, metrics)`.
    grad_scale multiplies the gradient (and the reported loss) before clipping and the
    optimizer: `ppo_update` uses it to keep the loss's normalizer when it leaves out rows that
    contribute no gradient."""
    loss_fn = get_loss(loss_cfg.name)

    def micro_loss(params, mb: TrainBatch):
        lp, ent = score_logprobs(params, cfg, mb, loss_cfg.temperature, loss_cfg.backend)
        loss, metrics = loss_fn(lp, ent, mb, loss_cfg)
        return loss, metrics

    def step(state: TrainState, batch: TrainBatch, grad_scale=1.0):
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
        grads = jax.tree.map(lambda g, p: (grad_scale * g).astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = {k: jnp.sum(v * weights) if k != "logprob_diff_max" else jnp.max(v)
               for k, v in metrics.items()}
        out["loss"] = grad_scale * jnp.sum(losses * weights)
        out["grad_norm"] = optax.global_norm(grads)
        out["num_tokens"] = jnp.sum(batch.loss_mask)
        return TrainState(state.step + 1, params, opt_state), out

    return jax.jit(step, donate_argnums=(0,))


def _rows_with_signal(rows: Sequence[Row], aggregation: str) -> tuple[list[Row], float]:
    """Returns (the rows with a non-zero advantage on some policy token, or the first row when
    none has, and the gradient scale that keeps `aggregation`'s normalizer of all `rows`).
    Multi-host: the normalizer is summed over every process's rows."""
    def weight(r: Row) -> float:
        n = float(np.sum(np.asarray(r.policy_mask[1:], bool)))
        return n if aggregation == "token_mean" else float(n > 0)

    kept = [r for r in rows if r.has_signal] or list(rows[:1])
    local = np.asarray([[sum(map(weight, kept)), sum(map(weight, rows))]], np.float64)
    sums = distributed.gather_rows(local).sum(axis=0)
    return kept, float(sums[0] / sums[1]) if sums[1] > 0 else 1.0


def micro_count(positions: int, rows: int, base: int, budget: int) -> int:
    """Returns the number of micro-batches for a batch of `positions` padded token positions
    over `rows` rows (per mesh shard): the fewest of base, 2 * base, 4 * base, ... whose
    share of the positions is at most `budget`, without going past one row a micro-batch (a
    row is never split). budget <= 0: base."""
    n = base
    while budget > 0 and positions > budget * n and 2 * n <= rows:
        n *= 2
    return n


def batch_positions(batch: TrainBatch) -> int:
    """Returns the token positions a forward of the batch runs (rows and shared prefixes)."""
    n = batch.tokens.size
    return n + (0 if batch.prefix_tokens is None else batch.prefix_tokens.size)


def ppo_update(state, rows: Sequence[Row], step_fn, *, cfg: ModelConfig, mesh, num_micro: int,
               pad_id: int, temperature: float, ref_params=None, epochs: int = 1,
               num_minibatches: int = 1, rng: np.random.Generator | None = None,
               backend: str = "auto", score_old: bool = True, skip_no_signal: bool = False,
               aggregation: str = "token_mean", share_prefix: bool = False,
               micro_tokens: int = 0, step_for=None):
    """Returns (state, metrics) after `epochs` passes over `rows` in `num_minibatches` shuffled
    minibatches (PPO's reuse of one rollout batch). π_old (and the reference, when given) score
    every minibatch once, before the first update, so the clip ratio of later passes is taken
    against the policy that sampled. Metrics are the mean over updates; timings are summed.
    score_old=False (one update per batch, a step built with LossConfig.old_from_current)
    skips π_old's scoring pass: the update's own forward gives it.

    skip_no_signal: rows whose policy tokens all have advantage 0 (a group whose rollouts all
    scored alike) are left out of the forward and backward passes, and the gradient is scaled
    by the share of the loss's normalizer they held (`aggregation`: tokens for token_mean,
    sequences for seq_mean), so the update equals the one over every row. Valid only when the
    loss has no term besides the advantage-weighted one (no KL or entropy coefficient, no
    reference scored): the caller checks. At least one row is kept, so the optimizer still
    steps when none has a signal (Adam's moments then move the params as they would).

    share_prefix: rows that begin alike (a group's rollouts of one prompt) hold their common
    leading inputs once per minibatch (`pack_rows`): the same update over fewer tokens.

    micro_tokens (> 0, with step_for(n) -> the train step built for n micro-batches): a
    minibatch of more padded token positions than num_micro * micro_tokens is laid out for
    more micro-batches (`micro_count`), scored and updated one micro-batch at a time: the same
    update, with the activations (attention scores grow with rows x length^2) of a part. Long
    rollouts then do not blow up the step's memory."""
    if skip_no_signal and ref_params is not None:
        raise ValueError("ppo_update: skip_no_signal with a reference (KL) is not exact")
    if not score_old and (epochs > 1 or num_minibatches > 1):
        raise ValueError("ppo_update: score_old=False needs one update per batch "
                         "(epochs=1, num_minibatches=1)")
    rng = rng or np.random.default_rng(0)
    # Multi-host: every process splits its own rows; a process with none (all its episodes
    # failed) contributes one loss-free row per minibatch.
    order = rng.permutation(len(rows))
    parts = [[rows[j] for j in order[k::num_minibatches]] for k in range(num_minibatches)]
    t1 = time.time()
    batches = []
    if micro_tokens > 0 and step_for is None:
        raise ValueError("ppo_update: micro_tokens needs step_for (the step per micro count)")
    scales, micros, dropped, positions, shared = [], [], 0, 0, 0
    for part in parts:
        scale = 1.0
        if skip_no_signal:
            kept, scale = _rows_with_signal(part, aggregation)
            dropped += len(part) - len(kept)
            # Row counts vary step to step: pad to a power of two (few compiled shapes).
            part = pad_rows(kept, pad_id, num_micro)
        scales.append(scale)
        batch = global_batch(part, pad_id, mesh, num_micro, share_prefix=share_prefix)
        n = micro_count(batch_positions(batch),
                        batch.tokens.shape[0] // distributed.batch_shards(mesh), num_micro,
                        micro_tokens)
        if n != num_micro:  # the shapes are global: every process picks the same n
            batch = global_batch(part, pad_id, mesh, n, share_prefix=share_prefix)
        micros.append(n)
        positions += batch_positions(batch)
        shared += batch.prefix_tokens is not None
        old_lp = score_jit(state.params, batch, cfg=cfg, temperature=temperature,
                           backend=backend, num_micro=n)[0] if score_old else batch.old_logprobs
        ref_lp = old_lp if ref_params is None else score_jit(
            ref_params, batch, cfg=cfg, temperature=temperature, backend=backend,
            num_micro=n)[0]
        batches.append(batch._replace(old_logprobs=old_lp, ref_logprobs=ref_lp))
    jax.block_until_ready(batches)
    t2 = time.time()
    sums: dict[str, float] = {}
    updates = 0
    for _ in range(max(int(epochs), 1)):
        for k in rng.permutation(len(batches)):
            fn = step_fn if micros[k] == num_micro else step_for(micros[k])
            state, m = (fn(state, batches[k], scales[k]) if skip_no_signal
                        else fn(state, batches[k]))
            for name, v in jax.device_get(m).items():
                v = float(v)
                sums[name] = (max(sums.get(name, v), v) if name.endswith("_max")
                              else sums.get(name, 0.0) + v)
            updates += 1
    out = {k: v if k.endswith("_max") else v / updates for k, v in sums.items()}
    if ref_params is None:
        out.pop("kl", None)  # would be KL to the pre-update policy, not to the reference
    out.update({"time/scoring_s": t2 - t1, "time/update_s": time.time() - t2,
                "ppo/updates": float(updates),
                # Token positions a pass forwards (rows and shared prefixes, padding included)
                # and the share of minibatches laid out with shared prefixes.
                "batch/positions": positions / len(batches),
                "batch/shared_prefix_frac": shared / len(batches),
                "batch/num_micro": float(np.mean(micros))})
    if skip_no_signal:
        out["ppo/rows_skipped_frac"] = dropped / max(len(rows), 1)
    return state, out
