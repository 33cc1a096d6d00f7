"""Multi-turn sampling with a KV cache that persists across turns (append-only contexts).

A rollout's context only grows: prompt, sampled turn, tool responses, next turn. `KVSession`
keeps one cache row per rollout and, on each call, prefills only what was appended since the
row's last call (the env response and the next assistant header), then decodes. A T-turn
episode costs O(T) prefill instead of the O(T²) of re-prefilling every context from token 0.

Layout: all rows share one write index (the model's KVCache), so each call's new suffixes are
left-padded to a common bucket and the padding stays in the cache as masked holes (segment 0),
as do the slots a row did not use of its max_new_tokens. RoPE positions are per token (each
row counts its own real tokens), so holes change nothing the model computes. When the next call
would overflow the cache it is compacted (every row's real slots gathered, in order, against
one new write index; keys already carry their rotary positions) into a larger length bucket:
compiled shapes stay bucketed in (rows, suffix length, cache length).

A call whose prompts do not all extend a row of the session (a new batch of episodes) starts a
new session: the rows are re-prefilled from scratch, exactly what `sampler.generate` does.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.qwen3 import KVCache, init_cache
from toolverse_jax.sampling.sampler import (SampleOutput, SamplingParams, bucket_length,
                                            distinct_contexts, prefill_decode)


@functools.partial(jax.jit, static_argnames=("cfg", "sp"), donate_argnums=(1,))
def _extend(params, cache, tokens, seg, positions, rng, source=None, *, cfg: ModelConfig,
            sp: SamplingParams):
    return prefill_decode(params, cache, tokens, seg, positions, rng, cfg=cfg, sp=sp,
                          source=source)


@functools.partial(jax.jit, static_argnames=("slots",))
def _compact(cache: KVCache, src: jax.Array, keep: jax.Array, *, slots: int) -> KVCache:
    """Returns a cache of `slots` slots: row b's slot j holds old slot src[b, j] where keep[b, j]
    (else empty), with the write index at src.shape[1]."""
    used = src.shape[1]
    pad = slots - used

    def move(x):  # one layer's [batch, kv_heads, slots, head_dim]
        x = jnp.take_along_axis(x, src[:, None, :, None], axis=2)
        return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0)))

    k, v = tuple(map(move, cache.k)), tuple(map(move, cache.v))
    seg = jnp.where(keep, jnp.take_along_axis(cache.seg, src, axis=1), 0)
    seg = jnp.pad(seg, ((0, 0), (0, pad)))
    return KVCache(k, v, seg, jnp.asarray(used, jnp.int32))


class KVSession:
    """Samples continuations of growing contexts, keeping each one's KV cache between calls.

    `generate(prompts, rng)` has `sampler.generate`'s contract (same SampleOutput, prompts in
    any order); prompts that extend the contexts of the previous call reuse their cache rows."""

    def __init__(self, params: Any, cfg: ModelConfig, sp: SamplingParams,
                 min_suffix_bucket: int = 16, min_cache_bucket: int = 64):
        self.params, self.cfg, self.sp = params, cfg, sp
        self.min_suffix, self.min_cache = min_suffix_bucket, min_cache_bucket
        self.cache: KVCache | None = None
        self.rows: list[list[int]] = []      # the real tokens each cache row holds
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "sessions": 0, "compactions": 0}

    # -- bookkeeping -------------------------------------------------------------------------
    def _match(self, prompts: Sequence[Sequence[int]]) -> list[int] | None:
        """Returns the row each prompt extends (each row used once), or None if some prompt
        extends no row (then the caller starts a new session)."""
        if self.cache is None or len(prompts) > len(self.rows):
            return None
        free = set(range(len(self.rows)))
        out, after = [], 0
        for p in prompts:
            # Rollout loops pass the surviving contexts in their previous order: try the rows
            # after the last match first, and take the first (longest-held) that p extends.
            order = sorted(free, key=lambda r: (r < after, -len(self.rows[r]), r))
            best = next((r for r in order if 0 < len(self.rows[r]) <= len(p)
                         and p[len(self.rows[r]) - 1] == self.rows[r][-1]
                         and list(p[:len(self.rows[r])]) == self.rows[r]), None)
            if best is None:
                return None
            free.discard(best)
            out.append(best)
            after = best + 1
        return out

    def _capacity(self, need: int) -> int:
        return bucket_length(need, self.min_cache)

    def _new_session(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        b = 1 << (len(prompts) - 1).bit_length()
        self.rows = [[] for _ in range(b)]
        self.cache = init_cache(self.cfg, b, self._capacity(
            bucket_length(max(len(p) for p in prompts), 32) + self.sp.max_new_tokens))
        self.stats["sessions"] += 1
        return list(range(len(prompts)))

    def _compact_to(self, need_after: int) -> None:
        """Gathers every row's real slots against one write index, in a cache with room for
        `need_after` more slots."""
        seg = np.asarray(self.cache.seg)
        real = [np.nonzero(seg[b])[0] for b in range(seg.shape[0])]
        # A bucketed width, so compaction compiles for a handful of shapes.
        used = bucket_length(max(max((len(r) for r in real), default=0), 1), self.min_cache)
        src = np.zeros((seg.shape[0], used), np.int32)
        keep = np.zeros((seg.shape[0], used), bool)
        for b, r in enumerate(real):
            if len(r):
                src[b, used - len(r):] = r
                keep[b, used - len(r):] = True
        self.cache = _compact(self.cache, jnp.asarray(src), jnp.asarray(keep),
                              slots=self._capacity(used + need_after))
        self.stats["compactions"] += 1

    # -- sampling ----------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], rng: jax.Array) -> SampleOutput:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("KVSession.generate: every prompt needs at least one token")
        rows = self._match(prompts)
        new = rows is None
        if new:
            rows = self._new_session(prompts)
        b = len(self.rows)
        suffixes = [list(p[len(self.rows[r]):]) for p, r in zip(prompts, rows)]
        if any(len(s) == 0 for s in suffixes):
            raise ValueError("KVSession.generate: a prompt must extend its context by at least "
                             "one token (the next turn's header)")
        width = bucket_length(max(len(s) for s in suffixes), self.min_suffix)
        n = self.sp.max_new_tokens
        slots = self.cache.seg.shape[1]
        if int(self.cache.index) + width + n > slots:
            self._compact_to(width + n)
        # A new batch whose prompts repeat (a GRPO group's) prefills each distinct one once:
        # `tokens` then holds the distinct prompts and `source` maps cache rows to them.
        shared = distinct_contexts(suffixes, b) if new else None
        fill, source = list(zip(suffixes, rows)), None
        height = b
        if shared is not None:
            distinct, source = shared
            fill = [(d, j) for j, d in enumerate(distinct)]
            height = 1 << (len(distinct) - 1).bit_length()
            source = jnp.asarray(source)
        tokens = np.full((height, width), self.sp.pad_id, np.int32)
        seg = np.zeros((height, width), np.int32)
        pos = np.zeros((height, width), np.int32)
        for sfx, r in fill:
            tokens[r, width - len(sfx):] = sfx
            seg[r, width - len(sfx):] = 1
            start = 0 if shared is not None else len(self.rows[r])
            pos[r, width - len(sfx):] = np.arange(start, start + len(sfx))
            # Padding ahead of a suffix: positions just below it (masked; keeps RoPE finite).
            pos[r, :width - len(sfx)] = max(start - 1, 0)
            self.stats["prefill_tokens"] += len(sfx)
            self.stats["reused_tokens"] += start
        if int(pos.max()) + n >= self.cfg.max_seq_len:
            raise ValueError(f"context of {int(pos.max()) + 1} tokens + max_new_tokens {n} "
                             f"exceeds ModelConfig.max_seq_len={self.cfg.max_seq_len}")
        out_tok, out_lp, lengths, stopped, self.cache = _extend(
            self.params, self.cache, jnp.asarray(tokens), jnp.asarray(seg), jnp.asarray(pos),
            rng, source, cfg=self.cfg, sp=self.sp)
        out_tok, out_lp, lengths, stopped = (np.asarray(x) for x in
                                             (out_tok, out_lp, lengths, stopped))
        for p, r in zip(prompts, rows):
            self.rows[r] = list(p) + [int(t) for t in out_tok[r, :int(lengths[r])]]
        idx = np.asarray(rows)
        return SampleOutput(out_tok[idx], out_lp[idx], lengths[idx], stopped[idx])
