"""Trainer-side scoring of whole contexts for tests: one jitted forward per (model, width).

Eager `logprobs_of` on contexts of many lengths compiles once per length (minutes on CPU);
right-padding every context to a fixed width cannot change a causal model's log-probs at the
real positions, so one compile serves them all."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.models import logits, logprobs_of


@functools.lru_cache(maxsize=None)
def _scorer(cfg, width: int):
    return jax.jit(lambda params, toks: logprobs_of(params, cfg, toks[:, :-1], toks[:, 1:])[0])


def context_logprobs(params, cfg, ids, width: int = 0) -> np.ndarray:
    """Returns log p(ids[t + 1] | ids[:t + 1]) for t < len(ids) - 1 (the trainer's scoring of
    the whole context), computed at a padded width (the next multiple of 128 by default)."""
    n = len(ids)
    width = width or -(-n // 128) * 128
    row = np.zeros((1, width + 1), np.int32)
    row[0, :n] = ids
    return np.asarray(_scorer(cfg, width)(params, jnp.asarray(row)))[0, :n - 1]


@functools.lru_cache(maxsize=None)
def _forward(cfg, width: int):
    return jax.jit(lambda params, toks: logits(params, cfg, toks))


def last_logits(params, cfg, ids, width: int = 32) -> np.ndarray:
    """Returns the logits after the last of `ids` (a full forward at a padded width)."""
    assert len(ids) <= width
    row = np.zeros((1, width), np.int32)
    row[0, :len(ids)] = ids
    return np.asarray(_forward(cfg, width)(params, jnp.asarray(row)))[0, len(ids) - 1]
