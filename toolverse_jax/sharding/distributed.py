"""Multi-host: `jax.distributed.initialize` from config/env, per-process slices, and generic
collectives (global max, gather, any, barrier, and global arrays from per-process local ones).

Env vars win over `config.distributed`: TOOLVERSE_COORDINATOR (host:port),
TOOLVERSE_NUM_PROCESSES, TOOLVERSE_PROCESS_ID. On CPU the collectives are gloo.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from toolverse_jax.sharding.mesh import batch_sharding


def distributed_settings(settings: Any = None) -> dict[str, Any] | None:
    """Returns {coordinator_address, num_processes, process_id} or None for a single process,
    from the env vars or else `settings` (a run config's `distributed` block, a mapping)."""
    d = dict(settings or {})
    addr = os.environ.get("TOOLVERSE_COORDINATOR", d.get("coordinator_address", ""))
    n = int(os.environ.get("TOOLVERSE_NUM_PROCESSES", d.get("num_processes", 1) or 1))
    pid = int(os.environ.get("TOOLVERSE_PROCESS_ID", d.get("process_id", 0) or 0))
    if n <= 1:
        return None
    if not addr:
        raise ValueError(f"num_processes={n} needs a coordinator address: set "
                         "TOOLVERSE_COORDINATOR=host:port or config.distributed.coordinator_address")
    if not 0 <= pid < n:
        raise ValueError(f"process_id={pid} is outside [0, {n}); set TOOLVERSE_PROCESS_ID")
    return {"coordinator_address": addr, "num_processes": n, "process_id": pid}


def initialize(settings: Any = None) -> int:
    """Initializes jax.distributed when configured (call before any JAX computation); returns
    the process count. Idempotent."""
    s = distributed_settings(settings)
    if s is None:
        return 1
    if jax.distributed.is_initialized():
        return jax.process_count()
    if os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**s)
    return jax.process_count()


def process_slice(items: Sequence, index: int | None = None, count: int | None = None) -> list:
    """Returns this process's contiguous slice of `items` (len must divide by the count)."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if len(items) % count:
        raise ValueError(f"{len(items)} items do not split over {count} processes; make the "
                         f"per-step task count a multiple of {count}")
    per = len(items) // count
    return list(items[index * per:(index + 1) * per])


def _global_max(x: int) -> int:
    if jax.process_count() == 1:
        return int(x)
    from jax.experimental import multihost_utils
    return int(np.max(multihost_utils.process_allgather(np.asarray(x, np.int32))))


def gather_rows(x: np.ndarray) -> np.ndarray:
    """Returns every process's rows of `x` [n_p, ...] stacked (process order); processes may
    hold different n_p: padding rows are zeros, so give `x` a presence column to drop them."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    from jax.experimental import multihost_utils
    n = _global_max(x.shape[0])
    padded = np.zeros((n,) + x.shape[1:], x.dtype)
    padded[:x.shape[0]] = x
    out = np.asarray(multihost_utils.process_allgather(padded))
    return out.reshape((-1,) + x.shape[1:])


def global_any(flag: bool) -> bool:
    """Returns whether `flag` holds on any process."""
    return _global_max(int(bool(flag))) > 0


def barrier(name: str) -> None:
    """Blocks until every process reaches the barrier `name` (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def batch_shards(mesh: Mesh) -> int:
    """Returns how many shards the mesh splits a batch's rows into."""
    spec = batch_sharding(mesh, 2).spec[0]
    axes = () if spec is None else (spec if isinstance(spec, tuple) else (spec,))
    return int(np.prod([mesh.shape[a] for a in axes]))


def global_arrays(local: Any, mesh: Mesh, row_multiple: int = 1,
                  fills: dict[str, Any] | None = None) -> Any:
    """Returns global arrays on `mesh`, batch-sharded on their leading axis, from this process's
    NamedTuple `local` of [rows, length] numpy arrays (None fields stay None). All processes
    agree on the length (the max over processes) and pad to the same row count, a multiple of
    `row_multiple` and of this process's share of the batch shards; padding takes
    `fills[field]` (default 0)."""
    fields = type(local)._fields
    present = [x for x in local if x is not None]
    length = _global_max(max(x.shape[1] for x in present))
    unit = row_multiple * max(1, batch_shards(mesh) // jax.process_count())
    nrows = -(-_global_max(max(x.shape[0] for x in present)) // unit) * unit
    fills = fills or {}

    def pad(x, fill):
        return np.pad(np.asarray(x), ((0, nrows - x.shape[0]), (0, length - x.shape[1])),
                      constant_values=fill)

    local = type(local)(*(None if x is None else pad(x, fills.get(f, 0))
                          for f, x in zip(fields, local)))
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        batch_sharding(mesh, x.ndim), x), local)


def local_params(tree):
    """Returns a process-local copy of (replicated or sharded) global params, for sampling."""
    from jax.experimental import multihost_utils
    def one(x):
        if x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return jax.device_put(x.addressable_data(0), jax.local_devices()[0])
        return jax.device_put(multihost_utils.process_allgather(x, tiled=True),
                              jax.local_devices()[0])
    return jax.tree.map(one, tree)
