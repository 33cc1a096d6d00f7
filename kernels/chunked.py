"""Vocab-chunked pure-jnp forward statistics and backward gradients (the CPU default backend).

Each chunk computes z = hidden @ unembed[:, chunk] * inv_t in fp32 and folds it into running
per-row statistics; the full [N, V] logits never exist. The last chunk is a static-size tail
slice, so V need not divide by the chunk and unembed is never padded (no copy of [D, V]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# A finite "minus infinity": exp(NEG - m) == 0 and NEG * 0 == 0, so padding never makes NaN.
NEG = -1e30


def init_stats(n: int) -> tuple[jax.Array, ...]:
    """Returns the empty (max, sumexp, centred-sum, target-logit) accumulators, each [n] f32."""
    f = jnp.float32
    return (jnp.full((n,), NEG, f), jnp.zeros((n,), f), jnp.zeros((n,), f), jnp.zeros((n,), f))


def fold_chunk(stats, z, col_ids, targets):
    """Returns stats updated with one chunk of logits z [n, c] whose vocab ids are col_ids [1|n, c].

    Keeps m = max z, s = sum exp(z - m), tc = sum exp(z - m) (z - m) (centred so entropy does not
    cancel at extreme logits), tl = z[target] (0 if the target is not in this chunk).
    """
    m, s, tc, tl = stats
    tl = tl + jnp.sum(jnp.where(col_ids == targets[:, None], z, 0.0), axis=1)
    m_new = jnp.maximum(m, jnp.max(z, axis=1))
    alpha = jnp.exp(m - m_new)
    e = jnp.exp(z - m_new[:, None])
    s_new = alpha * s + jnp.sum(e, axis=1)
    tc_new = alpha * (tc + (m - m_new) * s) + jnp.sum(e * (z - m_new[:, None]), axis=1)
    return m_new, s_new, tc_new, tl


def chunk_cotangent(z, col_ids, targets, lse, ez, g_lp, g_ent, inv_t):
    """Returns d loss / d raw-logits [n, c] for one chunk (raw = before the temperature).

    With p = softmax(z): d lp/dz_j = [j == y] - p_j and d ent/dz_j = -p_j (z_j - E_p[z]).
    """
    p = jnp.exp(z - lse[:, None])
    onehot = (col_ids == targets[:, None]).astype(jnp.float32)
    dz = g_lp[:, None] * (onehot - p) - g_ent[:, None] * p * (z - ez[:, None])
    return dz * inv_t


def _logits(hidden, w_chunk, inv_t):
    return jnp.dot(hidden, w_chunk, preferred_element_type=jnp.float32) * inv_t


def _split(v: int, chunk: int) -> tuple[int, int, int]:
    c = max(1, min(chunk, v))
    return c, v // c, v - (v // c) * c


def chunked_stats(hidden, unembed, targets, inv_t: float, chunk: int):
    """Returns (m, s, tc, tl), each [N] f32, streaming over vocab chunks of unembed [D, V]."""
    n, d = hidden.shape
    v = unembed.shape[1]
    c, n_full, tail = _split(v, chunk)
    targets = targets.astype(jnp.int32)

    def body(i, stats):
        start = i * c
        w = lax.dynamic_slice(unembed, (0, start), (d, c))
        ids = start + lax.broadcasted_iota(jnp.int32, (1, c), 1)
        return fold_chunk(stats, _logits(hidden, w, inv_t), ids, targets)

    stats = lax.fori_loop(0, n_full, body, init_stats(n))
    if tail:
        start = n_full * c
        ids = start + lax.broadcasted_iota(jnp.int32, (1, tail), 1)
        stats = fold_chunk(stats, _logits(hidden, unembed[:, start:], inv_t), ids, targets)
    return stats


def chunked_grads(hidden, unembed, targets, lse, ez, g_lp, g_ent, inv_t: float, chunk: int):
    """Returns (d hidden [N, D] f32, d unembed [D, V] in unembed.dtype), recomputing each chunk."""
    n, d = hidden.shape
    v = unembed.shape[1]
    c, n_full, tail = _split(v, chunk)
    targets = targets.astype(jnp.int32)
    f32 = jnp.float32

    hidden32 = hidden.astype(f32)

    def one(start, w, width, dh):
        w32 = w.astype(f32)
        ids = start + lax.broadcasted_iota(jnp.int32, (1, width), 1)
        dz = chunk_cotangent(_logits(hidden, w, inv_t), ids, targets, lse, ez, g_lp, g_ent, inv_t)
        dh = dh + lax.dot_general(dz, w32, (((1,), (1,)), ((), ())), preferred_element_type=f32)
        dw = lax.dot_general(hidden32, dz, (((0,), (0,)), ((), ())), preferred_element_type=f32)
        return dh, dw.astype(unembed.dtype)

    def body(i, carry):
        dh, dw_all = carry
        start = i * c
        dh, dw = one(start, lax.dynamic_slice(unembed, (0, start), (d, c)), c, dh)
        # Written in place into the [D, V] carry: no stacked [chunks, D, c] copy.
        return dh, lax.dynamic_update_slice(dw_all, dw, (0, start))

    carry = (jnp.zeros((n, d), f32), jnp.zeros((d, v), unembed.dtype))
    dh, dw_all = lax.fori_loop(0, n_full, body, carry)
    if tail:
        start = n_full * c
        dh, dw = one(start, unembed[:, start:], tail, dh)
        dw_all = lax.dynamic_update_slice(dw_all, dw, (0, start))
    return dh, dw_all
