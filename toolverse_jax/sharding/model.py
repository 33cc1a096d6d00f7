"""Sharded parameter initialization and placement for the model."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.qwen3 import init_params, logical_axes
from toolverse_jax.sharding.mesh import DEFAULT_RULES, param_shardings


def model_param_shardings(cfg: ModelConfig, mesh: Mesh, rules=DEFAULT_RULES):
    """Returns the NamedSharding pytree of the model's params on `mesh`."""
    abstract = jax.eval_shape(lambda r: init_params(cfg, r), jax.random.key(0))
    return param_shardings(abstract, logical_axes(cfg), mesh, rules)


def init_sharded_params(cfg: ModelConfig, rng: jax.Array, mesh: Mesh, rules=DEFAULT_RULES):
    """Returns params initialized directly in their shards (no full copy on one device)."""
    shardings = model_param_shardings(cfg, mesh, rules)
    return jax.jit(lambda r: init_params(cfg, r), out_shardings=shardings)(rng)


def shard_params(params, cfg: ModelConfig, mesh: Mesh, rules=DEFAULT_RULES):
    """Returns `params` (e.g. loaded from an HF checkpoint) placed onto `mesh`."""
    return jax.device_put(params, model_param_shardings(cfg, mesh, rules))
