"""Naive full-logits log-prob and entropy: the ground truth every backend is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs_reference(hidden: jax.Array, unembed: jax.Array, targets: jax.Array,
                             temperature: float = 1.0,
                             mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Returns (log p(target), entropy), both float32 [N], from full [N, V] fp32 logits.

    hidden [N, D], unembed [D, V], targets int [N]; logits = hidden @ unembed / temperature.
    Masked positions (mask [N] false/0) give 0 and no gradient.
    """
    logits = jnp.dot(hidden, unembed, preferred_element_type=jnp.float32) / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(logp, targets[:, None].astype(jnp.int32), axis=-1)[:, 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    if mask is not None:
        keep = mask.astype(bool)
        lp = jnp.where(keep, lp, 0.0)
        ent = jnp.where(keep, ent, 0.0)
    return lp, ent
