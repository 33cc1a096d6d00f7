"""Pallas kernels for the fused log-prob: forward statistics, d hidden, d unembed.

One kernel body serves Triton (GPU), Mosaic and interpret mode (CPU tests). Forward and d hidden
use a grid over token blocks with an inner loop over vocab chunks; d unembed uses a grid over
vocab chunks with an inner loop over token blocks, so no kernel needs a cross-program reduction.
The wrapper pads N to the token block, V to the chunk and (for Triton) D to a power of two; padded
vocab columns are masked to a finite NEG so they add exactly zero, padded rows have zero
cotangent. unembed is given as one whole-array block and sliced inside the loop: on GPU that is
a pointer into HBM. (On TPU a whole-array block would be copied to VMEM; a TPU-tuned variant
would put vocab on an "arbitrary" grid axis instead — not done here. Cross-lowering for TPU from
a CPU host is refused by JAX: "Unsupported TPU device kind: cpu".)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from kernels.chunked import NEG, chunk_cotangent, fold_chunk, init_stats

F32 = jnp.float32
_NO_ID = jnp.iinfo(jnp.int32).max


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _chunk_ids(start, rows: int, c: int):
    return start + lax.broadcasted_iota(jnp.int32, (rows, c), 1)


def _masked_logits(h, w, start, c, v_valid, inv_t):
    z = jnp.dot(h, w, preferred_element_type=F32) * inv_t
    ids = _chunk_ids(start, z.shape[0], c)
    valid = ids < v_valid
    # Padded columns get an id no (shard-local) target can equal, so they never match a target.
    return jnp.where(valid, z, NEG), jnp.where(valid, ids, _NO_ID)


def _fwd_kernel(h_ref, w_ref, t_ref, m_ref, s_ref, tc_ref, tl_ref, *, c, n_chunks, v_valid,
                inv_t):
    h = h_ref[...]
    tgt = t_ref[...]

    def body(k, stats):
        start = pl.multiple_of(k * c, c)
        z, ids = _masked_logits(h, w_ref[:, pl.ds(start, c)], start, c, v_valid, inv_t)
        return fold_chunk(stats, z, ids, tgt)

    m, s, tc, tl = lax.fori_loop(0, n_chunks, body, init_stats(h.shape[0]))
    m_ref[...] = m
    s_ref[...] = s
    tc_ref[...] = tc
    tl_ref[...] = tl


def _dh_kernel(h_ref, w_ref, t_ref, lse_ref, ez_ref, glp_ref, gent_ref, dh_ref, *, c, n_chunks,
               v_valid, inv_t):
    h = h_ref[...]
    tgt, lse, ez, glp, gent = (r[...] for r in (t_ref, lse_ref, ez_ref, glp_ref, gent_ref))

    def body(k, dh):
        start = pl.multiple_of(k * c, c)
        w = w_ref[:, pl.ds(start, c)]
        z, ids = _masked_logits(h, w, start, c, v_valid, inv_t)
        dz = chunk_cotangent(z, ids, tgt, lse, ez, glp, gent, inv_t)
        return dh + lax.dot_general(dz, w.astype(F32), (((1,), (1,)), ((), ())),
                                    preferred_element_type=F32)

    dh_ref[...] = lax.fori_loop(0, n_chunks, body, jnp.zeros(h.shape, F32))


def _dw_kernel(h_ref, w_ref, t_ref, lse_ref, ez_ref, glp_ref, gent_ref, dw_ref, *, c, bn,
               n_blocks, v_valid, inv_t):
    w = w_ref[...]
    start = pl.program_id(0) * c

    def body(b, dw):
        rows = pl.ds(pl.multiple_of(b * bn, bn), bn)
        h = h_ref[rows, :]
        z, ids = _masked_logits(h, w, start, c, v_valid, inv_t)
        dz = chunk_cotangent(z, ids, t_ref[rows], lse_ref[rows], ez_ref[rows], glp_ref[rows],
                             gent_ref[rows], inv_t)
        return dw + lax.dot_general(h.astype(F32), dz, (((0,), (0,)), ((), ())),
                                    preferred_element_type=F32)

    dw_ref[...] = lax.fori_loop(0, n_blocks, body, jnp.zeros(w.shape, F32))


class _Layout:
    """Padded sizes and the padding/unpadding of operands for one call."""

    def __init__(self, n: int, d: int, v: int, block_n: int, chunk: int, pow2: bool):
        self.n, self.d, self.v = n, d, v
        self.bn = block_n
        self.c = min(chunk, pl.next_power_of_2(v)) if pow2 else min(chunk, v)
        self.np = _round_up(n, self.bn)
        self.vp = _round_up(v, self.c)
        self.dp = pl.next_power_of_2(d) if pow2 else d

    def hidden(self, h):
        return jnp.pad(h, ((0, self.np - self.n), (0, self.dp - self.d)))

    def unembed(self, w):
        return jnp.pad(w, ((0, self.dp - self.d), (0, self.vp - self.v)))

    def rows(self, x, fill=0):
        return jnp.pad(x, (0, self.np - self.n), constant_values=fill)


def _layout(hidden, unembed, block_n, chunk, interpret):
    n, d = hidden.shape
    # Triton wants power-of-two block shapes; interpret mode does not care.
    pow2 = not interpret
    bn = min(block_n, pl.next_power_of_2(n)) if pow2 else min(block_n, _round_up(n, 8))
    return _Layout(n, d, unembed.shape[1], bn, chunk, pow2)


def _compiler_params(interpret: bool):
    # On GPU pick Triton explicitly: the default Mosaic-GPU lowering copies every block (here the
    # whole unembed) into shared memory and fails. TPU takes its own defaults.
    if interpret or jax.default_backend() == "tpu":
        return None
    return pltriton.CompilerParams(num_warps=4, num_stages=2)


def _row_spec(bn):
    return pl.BlockSpec((bn,), lambda i: (i,))


def pallas_stats(hidden, unembed, targets, inv_t: float, chunk: int, *, block_n: int = 64,
                 interpret: bool = False):
    """Returns (m, s, tc, tl), each [N] f32, from the Pallas forward kernel."""
    lay = _layout(hidden, unembed, block_n, chunk, interpret)
    kernel = functools.partial(_fwd_kernel, c=lay.c, n_chunks=lay.vp // lay.c, v_valid=lay.v,
                               inv_t=inv_t)
    out = pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct((lay.np,), F32)] * 4,
        grid=(lay.np // lay.bn,),
        in_specs=[pl.BlockSpec((lay.bn, lay.dp), lambda i: (i, 0)),
                  pl.BlockSpec((lay.dp, lay.vp), lambda i: (0, 0)),
                  _row_spec(lay.bn)],
        out_specs=[_row_spec(lay.bn)] * 4,
        interpret=interpret,
        compiler_params=_compiler_params(interpret),
        name="token_logprobs_fwd",
    )(lay.hidden(hidden), lay.unembed(unembed), lay.rows(targets.astype(jnp.int32), -1))
    return tuple(x[:lay.n] for x in out)


def pallas_grads(hidden, unembed, targets, lse, ez, g_lp, g_ent, inv_t: float, chunk: int, *,
                 block_n: int = 64, interpret: bool = False):
    """Returns (d hidden [N, D] f32, d unembed [D, V] in unembed.dtype) from two Pallas kernels."""
    lay = _layout(hidden, unembed, block_n, chunk, interpret)
    h, w = lay.hidden(hidden), lay.unembed(unembed)
    # Padded rows: target -1 never matches, zero cotangents make their dz exactly 0.
    rows = [lay.rows(targets.astype(jnp.int32), -1), lay.rows(lse), lay.rows(ez),
            lay.rows(g_lp.astype(F32)), lay.rows(g_ent.astype(F32))]
    statics = dict(c=lay.c, v_valid=lay.v, inv_t=inv_t)
    dh = pl.pallas_call(
        functools.partial(_dh_kernel, n_chunks=lay.vp // lay.c, **statics),
        out_shape=jax.ShapeDtypeStruct((lay.np, lay.dp), F32),
        grid=(lay.np // lay.bn,),
        in_specs=[pl.BlockSpec((lay.bn, lay.dp), lambda i: (i, 0)),
                  pl.BlockSpec((lay.dp, lay.vp), lambda i: (0, 0))]
                 + [_row_spec(lay.bn)] * 5,
        out_specs=pl.BlockSpec((lay.bn, lay.dp), lambda i: (i, 0)),
        interpret=interpret,
        compiler_params=_compiler_params(interpret),
        name="token_logprobs_dhidden",
    )(h, w, *rows)
    full_row = pl.BlockSpec((lay.np,), lambda j: (0,))
    dw = pl.pallas_call(
        functools.partial(_dw_kernel, bn=lay.bn, n_blocks=lay.np // lay.bn, **statics),
        out_shape=jax.ShapeDtypeStruct((lay.dp, lay.vp), F32),
        grid=(lay.vp // lay.c,),
        in_specs=[pl.BlockSpec((lay.np, lay.dp), lambda j: (0, 0)),
                  pl.BlockSpec((lay.dp, lay.c), lambda j: (0, j))]
                 + [full_row] * 5,
        out_specs=pl.BlockSpec((lay.dp, lay.c), lambda j: (0, j)),
        interpret=interpret,
        compiler_params=_compiler_params(interpret),
        name="token_logprobs_dunembed",
    )(h, w, *rows)
    return dh[:lay.n, :lay.d], dw[:lay.d, :lay.v].astype(unembed.dtype)
