"""token_logprobs: one API over the chunked-jnp, Pallas and reference backends, with a custom VJP.

Residuals are (hidden, unembed, targets, lse [N], E_p[z] [N]); the backward recomputes each vocab
chunk's logits, so memory stays O(N * chunk) in both directions.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from kernels.chunked import chunked_grads, chunked_stats
from kernels.pallas_kernel import pallas_grads, pallas_stats
from kernels.reference import token_logprobs_reference
from toolverse_jax.registry import Registry

BACKENDS = ("auto", "chunked", "pallas", "pallas_interpret", "reference")
# CPU: the per-chunk matmul [N, D] x [D, chunk] must stay big for BLAS to be efficient.
# GPU (Triton): a block is a whole-D row tile [block_n, D] next to a [D, chunk] unembed tile, so
# shared memory grows with D. Measured on an H200 at D=1024 (benchmarks/gpu_check.py):
# 64 x 128 asks for 655 KB (fp32 1.3 MB) of the 227 KB there; 16 x 32 is the largest
# block_n x chunk that compiled in both bf16 and fp32.
DEFAULT_CHUNK = {"chunked": 2048, "pallas": 32, "pallas_interpret": 2048}
PALLAS_GPU_BLOCK_N = 16


class Impl(NamedTuple):
    """Local (per-shard) forward statistics and backward gradients of one backend."""
    stats: Callable
    grads: Callable


# The streamed backends behind the custom VJP ("reference" materializes the logits instead).
IMPLS: Registry[Impl] = Registry("token_logprobs implementation")
IMPLS.register("chunked", Impl(chunked_stats, chunked_grads))
IMPLS.register("pallas", Impl(
    functools.partial(pallas_stats, interpret=False, block_n=PALLAS_GPU_BLOCK_N),
    functools.partial(pallas_grads, interpret=False, block_n=PALLAS_GPU_BLOCK_N)))
IMPLS.register("pallas_interpret", Impl(functools.partial(pallas_stats, interpret=True),
                                        functools.partial(pallas_grads, interpret=True)))


def finalize(m, s, tc, tl):
    """Returns (lp, ent, lse, ez) [N] from the streamed stats (max, sumexp, centred sum, target)."""
    log_s = jnp.log(s)
    mean_c = tc / s
    lse = m + log_s
    return tl - lse, log_s - mean_c, lse, m + mean_c


def resolve_backend(backend: str) -> str:
    """Returns the concrete backend for `backend` ("auto" is "chunked" on every platform).

    Why not Pallas on GPU: on an H200 (V=151936, D=1024, N=4096, bf16; benchmarks/gpu_check.py)
    the chunked custom-VJP path ran fwd 4.7 ms / fwd+bwd 20 ms against the full-logits reference's
    3.8 / 15 ms, with 0.028 / 0.015 of its temp memory, while the Triton kernel's tiles that fit
    in shared memory ran fwd 9-19 ms and fwd+bwd 100+ ms. "pallas" stays selectable by name.
    """
    if backend not in BACKENDS:
        raise ValueError(f"token_logprobs backend {backend!r} is unknown; use one of {BACKENDS}")
    return "chunked" if backend == "auto" else backend


def static_temperature(temperature) -> float:
    """Returns temperature as a Python float; it shapes the kernel, so it cannot be traced."""
    try:
        t = float(temperature)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:
        raise TypeError("token_logprobs temperature must be a static Python number, not a traced "
                        "array; pass it via functools.partial or static_argnums") from e
    if not t > 0:
        raise ValueError(f"token_logprobs temperature must be > 0; got {t}")
    return t


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fused(hidden, unembed, targets, inv_t: float, chunk: int, impl: str):
    lp, ent, _, _ = finalize(*IMPLS[impl].stats(hidden, unembed, targets, inv_t, chunk))
    return lp, ent


def _fused_fwd(hidden, unembed, targets, inv_t, chunk, impl):
    lp, ent, lse, ez = finalize(*IMPLS[impl].stats(hidden, unembed, targets, inv_t, chunk))
    return (lp, ent), (hidden, unembed, targets, lse, ez)


def _fused_bwd(inv_t, chunk, impl, res, cts):
    hidden, unembed, targets, lse, ez = res
    g_lp, g_ent = (g.astype(jnp.float32) for g in cts)
    dh, dw = IMPLS[impl].grads(hidden, unembed, targets, lse, ez, g_lp, g_ent, inv_t, chunk)
    return dh.astype(hidden.dtype), dw.astype(unembed.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


def apply_mask(hidden, targets, mask):
    """Returns (hidden, targets) with masked rows zeroed, so garbage there cannot reach grads."""
    if mask is None:
        return hidden, targets
    keep = mask.astype(bool)
    return jnp.where(keep[:, None], hidden, 0), jnp.where(keep, targets, 0)


def mask_outputs(lp, ent, mask):
    """Returns (lp, ent) with masked positions set to 0 (their cotangents become 0 too)."""
    if mask is None:
        return lp, ent
    keep = mask.astype(bool)
    return jnp.where(keep, lp, 0.0), jnp.where(keep, ent, 0.0)


def check_shapes(hidden, unembed, targets, mask):
    """Raises ValueError naming the operand whose shape does not fit [N, D], [D, V], [N]."""
    if hidden.ndim != 2 or unembed.ndim != 2 or hidden.shape[1] != unembed.shape[0]:
        raise ValueError(f"token_logprobs needs hidden [N, D] and unembed [D, V]; got "
                         f"{hidden.shape} and {unembed.shape} (flatten batch dims first)")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"token_logprobs targets must be [N]={hidden.shape[:1]}; got "
                         f"{targets.shape}")
    if mask is not None and mask.shape != hidden.shape[:1]:
        raise ValueError(f"token_logprobs mask must be [N]={hidden.shape[:1]}; got {mask.shape}")


def token_logprobs(hidden: jax.Array, unembed: jax.Array, targets: jax.Array,
                   temperature: float = 1.0, *, mask: jax.Array | None = None,
                   chunk: int | None = None,
                   backend: str = "auto") -> tuple[jax.Array, jax.Array]:
    """Returns (log p(target), entropy), float32 [N] each, without materializing [N, V] logits.

    hidden [N, D], unembed [D, V] (fp32 or bf16; accumulation is fp32), targets int [N];
    logits = hidden @ unembed / temperature. mask [N] (bool or 0/1): masked positions give 0 and
    zero gradient. chunk: vocab chunk size (default per backend). backend: "auto" (chunked
    everywhere; see resolve_backend) | "chunked" | "pallas" | "pallas_interpret" | "reference".
    Differentiable wrt hidden and unembed (both outputs, exact streamed backward).
    """
    check_shapes(hidden, unembed, targets, mask)
    t = static_temperature(temperature)
    backend = resolve_backend(backend)
    if backend == "reference":
        return token_logprobs_reference(hidden, unembed, targets, t, mask)
    chunk = int(chunk or DEFAULT_CHUNK[backend])
    if chunk < 1:
        raise ValueError(f"token_logprobs chunk must be >= 1; got {chunk}")
    h, tg = apply_mask(hidden, targets, mask)
    lp, ent = _fused(h, unembed, tg.astype(jnp.int32), 1.0 / t, chunk, backend)
    return mask_outputs(lp, ent, mask)
