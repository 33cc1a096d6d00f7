"""Mesh construction, logical axis rules, param/activation shardings, multi-host init."""

from toolverse_jax.sharding.mesh import (DEFAULT_RULES, MESH_AXES, batch_sharding,
                                         logical_to_spec, make_mesh, param_shardings,
                                         sharding_context)
from toolverse_jax.sharding.model import init_sharded_params, shard_params

__all__ = ["DEFAULT_RULES", "MESH_AXES", "batch_sharding", "logical_to_spec", "make_mesh",
           "param_shardings", "sharding_context", "init_sharded_params", "shard_params"]
