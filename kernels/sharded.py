"""token_logprobs_sharded: tokens over a `data` mesh axis, vocab over a `tensor` mesh axis.

Each shard streams its own vocab slice into (max, sumexp, centred sum, target logit) and the
shards combine with one pmax and three psums over `tensor`. The backward needs only the global
(lse, E_p[z]) per token, so each shard computes its own chunk cotangents; d hidden is summed over
`tensor`, d unembed over `data`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from kernels.dispatch import (DEFAULT_CHUNK, IMPLS, apply_mask, check_shapes, finalize,
                              mask_outputs, resolve_backend, static_temperature)


def combine_stats(m, s, tc, tl, axis: str):
    """Returns the stats of the union of vocab shards along mesh axis `axis` (inside shard_map)."""
    m_all = lax.pmax(m, axis)
    a = jnp.exp(m - m_all)
    s_all = lax.psum(a * s, axis)
    tc_all = lax.psum(a * (tc + (m - m_all) * s), axis)
    return m_all, s_all, tc_all, lax.psum(tl, axis)


@functools.lru_cache(maxsize=64)
def _sharded_op(mesh: Mesh, data: str, tensor: str, inv_t: float, chunk: int, impl_name: str):
    impl = IMPLS[impl_name]
    row, mat_h, mat_w = P(data), P(data, None), P(None, tensor)

    def local_targets(targets, v_local):
        return targets - lax.axis_index(tensor) * v_local

    def fwd_body(h, w, tg):
        stats = impl.stats(h, w, local_targets(tg, w.shape[1]), inv_t, chunk)
        return finalize(*combine_stats(*stats, tensor))

    fwd_map = jax.shard_map(fwd_body, mesh=mesh, in_specs=(mat_h, mat_w, row),
                            out_specs=(row,) * 4, check_vma=False)

    def bwd_body(h, w, tg, lse, ez, g_lp, g_ent):
        dh, dw = impl.grads(h, w, local_targets(tg, w.shape[1]), lse, ez, g_lp, g_ent, inv_t,
                            chunk)
        return lax.psum(dh, tensor), lax.psum(dw.astype(jnp.float32), data)

    bwd_map = jax.shard_map(bwd_body, mesh=mesh, in_specs=(mat_h, mat_w) + (row,) * 5,
                            out_specs=(mat_h, mat_w), check_vma=False)

    @jax.custom_vjp
    def op(hidden, unembed, targets):
        lp, ent, _, _ = fwd_map(hidden, unembed, targets)
        return lp, ent

    def op_fwd(hidden, unembed, targets):
        lp, ent, lse, ez = fwd_map(hidden, unembed, targets)
        return (lp, ent), (hidden, unembed, targets, lse, ez)

    def op_bwd(res, cts):
        hidden, unembed, targets, lse, ez = res
        g_lp, g_ent = (g.astype(jnp.float32) for g in cts)
        dh, dw = bwd_map(hidden, unembed, targets, lse, ez, g_lp, g_ent)
        return dh.astype(hidden.dtype), dw.astype(unembed.dtype), None

    op.defvjp(op_fwd, op_bwd)
    return op


def token_logprobs_sharded(hidden: jax.Array, unembed: jax.Array, targets: jax.Array,
                           mesh: Mesh, temperature: float = 1.0, *,
                           mask: jax.Array | None = None, chunk: int | None = None,
                           backend: str = "auto", data_axis: str = "data",
                           tensor_axis: str = "tensor") -> tuple[jax.Array, jax.Array]:
    """Returns (log p(target), entropy) float32 [N] like token_logprobs, computed on `mesh`.

    hidden [N, D] is split over `data_axis`, unembed [D, V] over `tensor_axis` (vocab), targets
    [N] over `data_axis`; N must divide by the data size and V by the tensor size.
    """
    check_shapes(hidden, unembed, targets, mask)
    for axis in (data_axis, tensor_axis):
        if axis not in mesh.shape:
            raise ValueError(f"token_logprobs_sharded mesh has axes {tuple(mesh.shape)}; no "
                             f"{axis!r} (pass data_axis=/tensor_axis=)")
    n, v = hidden.shape[0], unembed.shape[1]
    if n % mesh.shape[data_axis] or v % mesh.shape[tensor_axis]:
        raise ValueError(f"token_logprobs_sharded needs N={n} divisible by {data_axis}="
                         f"{mesh.shape[data_axis]} and V={v} by {tensor_axis}="
                         f"{mesh.shape[tensor_axis]}; pad the tokens or the vocab")
    backend = resolve_backend(backend)
    if backend == "reference":
        raise ValueError("token_logprobs_sharded has no 'reference' backend; call "
                         "token_logprobs_reference on the gathered arrays instead")
    t = static_temperature(temperature)
    op = _sharded_op(mesh, data_axis, tensor_axis, 1.0 / t, int(chunk or DEFAULT_CHUNK[backend]),
                     backend)
    h, tg = apply_mask(hidden, targets, mask)
    lp, ent = op(h, unembed, tg.astype(jnp.int32))
    return mask_outputs(lp, ent, mask)
