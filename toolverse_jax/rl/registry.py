"""Advantage estimators registered by name, behind one adapter signature (tunix style).

    fn = get_advantage(config.rl.advantage)       # "grpo" | "turn_aware" | "trace" | ...
    turn_adv = fn(AdvantageInputs(...), config.rl.advantage_kwargs)   # -> [B, T]

Every adapter returns per-turn advantages [B, T] (0 on padded turns and invalid rows); turn ->
token broadcasting is host-side numpy, in `rl.batching.trajectory_rows`. `cfg` is a dict or
ConfigDict of constants; missing keys take the DESIGN.md §5 defaults. Adapters are pure and
jittable with `cfg` static (close over it, or pass it through `functools.partial`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp

from toolverse_jax.rl import advantages as adv
from toolverse_jax.registry import Registry
from toolverse_jax.rl import trace as trace_lib

Array = jax.Array


class AdvantageInputs(NamedTuple):
    """What any estimator may read; optional fields are None when the rollout did not make them.

    rewards [B] outcome reward; group_ids [B] int (rollouts of one task share an id);
    valid [B] bool (False = infrastructure failure); turn_rewards [B, T] (TARA r_{i,t});
    turn_mask [B, T] bool (turn exists); answer_mask [B, T] bool (the terminal turn without an
    observation: final answer, or cut at max_new_tokens);
    readiness [B, T+1] (TRACE ℓ̄ of S_0..S_T); state_keys [B, T] int (GiGPO state hashes).
    """
    rewards: Array
    group_ids: Array
    valid: Array
    turn_mask: Array
    turn_rewards: Optional[Array] = None
    answer_mask: Optional[Array] = None
    readiness: Optional[Array] = None
    state_keys: Optional[Array] = None


AdvantageFn = Callable[[AdvantageInputs, Any], Array]
ADVANTAGES: Registry[AdvantageFn] = Registry(
    "advantage", hint="(register one with @register_advantage({name!r}))")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Returns a decorator registering `fn(batch: AdvantageInputs, cfg) -> [B, T]` as `name`."""
    return ADVANTAGES.register(name)


def get_advantage(name: str) -> AdvantageFn:
    """Returns the adapter registered as `name`; an unknown name raises listing the known ones."""
    return ADVANTAGES.get(name)


def jitted_advantage(name: str, cfg: Optional[Mapping] = None
                     ) -> Callable[[AdvantageInputs], Array]:
    """Returns `batch -> get_advantage(name)(batch, cfg)` jitted, compiled once per (adapter,
    constants, input shapes): called eagerly an adapter dispatches its few dozen small ops one
    by one (GRPO over 32 rollouts: 5-9 ms on 2 CPU cores, 0.03 ms jitted). Constants that are
    not hashable (a list) fall back to the eager call."""
    fn = get_advantage(name)
    items = tuple(sorted(dict(cfg or {}).items()))
    try:
        return _jit_adapter(fn, items)
    except TypeError:  # an unhashable constant
        return lambda batch: fn(batch, cfg)


@functools.lru_cache(maxsize=64)
def _jit_adapter(fn: AdvantageFn, items: tuple) -> Callable[[AdvantageInputs], Array]:
    consts = dict(items)
    return jax.jit(lambda batch: fn(batch, consts))


def list_advantages() -> list:
    """Returns the registered names, sorted."""
    return ADVANTAGES.names()


def _get(cfg: Optional[Mapping], key: str, default):
    if cfg is None:
        return default
    try:
        val = cfg.get(key, default)
    except AttributeError:
        val = getattr(cfg, key, default)
    return default if val is None else val


def _need(batch: AdvantageInputs, field: str, name: str) -> Array:
    val = getattr(batch, field)
    if val is None:
        raise ValueError(f"advantage {name!r} needs AdvantageInputs.{field}; the rollout did "
                         f"not provide it (enable it in the rollout/scoring config)")
    return val


@register_advantage("grpo")
def _grpo(batch: AdvantageInputs, cfg=None) -> Array:
    a = adv.grpo(batch.rewards, batch.group_ids, eps=_get(cfg, "eps", 1e-6), valid=batch.valid)
    m = jnp.asarray(batch.turn_mask, bool)
    return jnp.where(m, a[:, None], 0.0)


@register_advantage("turn_aware")
def _turn_aware(batch: AdvantageInputs, cfg=None) -> Array:
    return adv.turn_aware(
        batch.rewards, _need(batch, "turn_rewards", "turn_aware"), batch.turn_mask,
        batch.group_ids, lam=_get(cfg, "lam", 0.5), gamma=_get(cfg, "gamma", 0.5),
        eps=_get(cfg, "eps", 1e-6), gate=_get(cfg, "gate", True),
        local_only=_get(cfg, "local_only", False), valid=batch.valid,
        outcome_coef=_get(cfg, "outcome_coef", 1.0))


@register_advantage("state_grouped")
def _state_grouped(batch: AdvantageInputs, cfg=None) -> Array:
    return adv.state_grouped(
        batch.rewards, _need(batch, "turn_rewards", "state_grouped"), batch.turn_mask,
        batch.group_ids, _need(batch, "state_keys", "state_grouped"),
        gamma=_get(cfg, "gamma", 0.95), step_coef=_get(cfg, "step_coef", 1.0),
        outcome_coef=_get(cfg, "outcome_coef", 1.0), eps=_get(cfg, "eps", 1e-6),
        valid=batch.valid)


@register_advantage("trace")
def _trace(batch: AdvantageInputs, cfg=None) -> Array:
    return trace_lib.trace_advantages(
        _need(batch, "readiness", "trace"), batch.turn_mask, batch.rewards, batch.group_ids,
        answer_mask=batch.answer_mask, valid=batch.valid,
        eps=_get(cfg, "trace_eps", 0.1), mode=_get(cfg, "mode", "log_ratio"),
        k_steps=_get(cfg, "k_steps", 3), gamma_td=_get(cfg, "gamma_td", 0.8),
        fill=_get(cfg, "fill", 2.0), alpha_out=_get(cfg, "alpha_out", 1.0),
        alpha_turn=_get(cfg, "alpha_turn", 0.2), grpo_eps=_get(cfg, "eps", 1e-6))
