"""Mesh construction and logical-axis sharding rules: the one place sharding is decided."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes. Batch is split over data and fsdp (FSDP shards params over the same
# devices that hold different examples); weights are split over fsdp on `embed` and over tensor
# on heads / mlp / vocab (Megatron-style).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", "tensor"),
    ("head_dim", None),
    ("vocab", "tensor"),
    # Qwen3-MoE: experts are split over the tensor axis (expert parallelism); each expert's own
    # hidden dim stays whole on its device.
    ("expert", "tensor"),
    ("moe_mlp", None),
)


def make_mesh(shape: Sequence[int] | dict[str, int] = (-1, 1, 1),
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Returns a Mesh with axes ("data", "fsdp", "tensor"); one -1 entry takes what is left."""
    devices = list(devices if devices is not None else jax.devices())
    if isinstance(shape, dict):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"mesh shape has unknown axes {sorted(unknown)}; use {MESH_AXES}")
        shape = [shape.get(a, 1) for a in MESH_AXES]
    shape = list(shape)
    if len(shape) != 3:
        raise ValueError(f"mesh shape {shape} must have 3 entries (data, fsdp, tensor)")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one axis may be -1")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if len(devices) % rest:
            raise ValueError(f"mesh shape {shape} does not divide {len(devices)} devices")
        shape[shape.index(-1)] = len(devices) // rest
    if math.prod(shape) != len(devices):
        raise ValueError(
            f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, have {len(devices)} "
            f"(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def _axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules=DEFAULT_RULES) -> P:
    """Returns the PartitionSpec for an array; dims the mesh axes do not divide stay replicated
    (e.g. 2 KV heads on a tensor axis of 4)."""
    table = dict(rules)
    spec, used = [], set()
    for name, dim in zip(logical, shape):
        axes = table.get(name) if name is not None else None
        if isinstance(axes, str):
            axes = (axes,)
        if axes is not None:
            axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        if not axes or dim % _axis_size(mesh, axes):
            spec.append(None)
            continue
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    return P(*spec)


def param_shardings(abstract_params, logical_axes, mesh: Mesh, rules=DEFAULT_RULES):
    """Returns a NamedSharding pytree for params from their logical axis names."""
    return jax.tree.map(
        lambda a, names: NamedSharding(mesh, logical_to_spec(tuple(names), a.shape, mesh, rules)),
        abstract_params, logical_axes, is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, ndim: int, rules=DEFAULT_RULES) -> NamedSharding:
    """Returns the sharding of a [batch, ...] array: batch over data x fsdp, the rest replicated."""
    batch_axes = tuple(a for a in dict(rules)["batch"] if mesh.shape[a] > 1)
    first = batch_axes if batch_axes else None
    return NamedSharding(mesh, P(first, *([None] * (ndim - 1))))


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules=DEFAULT_RULES) -> Iterator[None]:
    """Activates `mesh` and the logical rules so nn.with_logical_constraint resolves inside jit."""
    with jax.set_mesh(mesh):
        with nn.logical_axis_rules(rules):
            yield
