"""Continuous batching for multi-turn episodes: slots of one KV cache that progress on their own.

Each episode holds a slot (a row of the cache, layout as in `session.KVSession`: one shared
write index, per-token RoPE positions, masked holes, compaction into a larger length bucket).
The compiled decode step runs every slot that is mid-turn; a slot whose turn stops (a stop id or
sequence, or the per-turn token cap) hands its turn to the episode's `Agent`, whose work (the
tool calls) runs on a background thread while the other slots keep decoding. When the work is
back, the slot's appended tokens (tool responses and the next header) are prefilled, on the
slots that join only, and it decodes again. A slot whose episode ends takes the next pending
episode. No call waits for the slowest turn of a batch and decoding does not stop for env calls.

Determinism: when a slot joins depends on a logical clock (decode steps run), never on when its
work finished: a slot whose turn ended at step t resumes at the first call boundary at or after
t + resume_lag, and the host blocks there if the work is still running (counted as env-idle
time). Sampling keys are per episode and per token position, so a seed gives the same tokens
however the slots were interleaved, and the greedy tokens equal the synchronous loop's.

Compiled shapes: decode [slots, cache bucket] with a fixed chunk of steps (a call ends early at
the first stopped turn or at the next due resume); prefill [joining slots (power of two),
suffix bucket, cache bucket]. Nothing recompiles per turn.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.qwen3 import KVCache, forward, init_cache, unembedding_matrix
from toolverse_jax.sampling.sampler import (SamplingParams, StopTables, bucket_length,
                                            inverse_cdf, sample_tokens)
from toolverse_jax.sampling.session import _compact


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """slots: decode slots (0 = one per episode; fewer refill finished slots with pending
    episodes); chunk: most decode steps per compiled call; resume_lag: decode steps between a
    turn's end and its slot's resume (its env calls' head start; larger hides slower envs,
    smaller resumes sooner)."""

    slots: int = 0
    chunk: int = 16
    resume_lag: int = 8
    min_suffix_bucket: int = 16
    min_cache_bucket: int = 64

    def __post_init__(self):
        if self.slots < 0 or self.chunk < 1 or self.resume_lag < 0:
            raise ValueError(f"EngineConfig(slots={self.slots}, chunk={self.chunk}, "
                             f"resume_lag={self.resume_lag}): need slots >= 0, chunk >= 1, "
                             f"resume_lag >= 0")


class DecodeState(NamedTuple):
    """Device state of the slots. cache: the KV cache [layers, slots, cache_len, ...];
    logits [slots, vocab]: next-token logits of each slot; pos [slots]: the position of the
    token each slot generates next; tail [slots, M]: its last ids (stop sequences);
    count [slots]: tokens it generated this turn."""

    cache: KVCache
    logits: jax.Array
    pos: jax.Array
    tail: jax.Array
    count: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "sp"), donate_argnums=(1,))
def _prefill(params, state: DecodeState, rows, valid, fresh, tokens, seg, positions, *,
             cfg: ModelConfig, sp: SamplingParams) -> DecodeState:
    """Returns the state with suffixes tokens [n, w] (left-padded) written to slots rows [n]
    (distinct; rows with valid False are padding: their cache rows only gain holes), their
    next-token logits and positions set and their turn counters reset. Rows with fresh True
    start a new episode: the slot's previous episode is dropped first."""
    c = state.cache
    sub = KVCache(tuple(x[rows] for x in c.k), tuple(x[rows] for x in c.v),
                  jnp.where(fresh[:, None], 0, c.seg[rows]), c.index)
    hidden, sub = forward(params, cfg, tokens, positions, seg, sub)
    w = unembedding_matrix(params, cfg).astype(jnp.float32)
    new_logits = hidden[:, -1].astype(jnp.float32) @ w
    keep = valid[:, None]
    cache = KVCache(tuple(x.at[rows].set(y) for x, y in zip(c.k, sub.k)),
                    tuple(x.at[rows].set(y) for x, y in zip(c.v, sub.v)),
                    c.seg.at[rows].set(sub.seg), sub.index)
    return DecodeState(
        cache, state.logits.at[rows].set(jnp.where(keep, new_logits, state.logits[rows])),
        state.pos.at[rows].set(jnp.where(valid, positions[:, -1] + 1, state.pos[rows])),
        state.tail.at[rows].set(jnp.where(keep, StopTables.of(sp).empty_tail(rows.shape[0]),
                                          state.tail[rows])),
        state.count.at[rows].set(jnp.where(valid, 0, state.count[rows])))


@functools.partial(jax.jit, static_argnames=("cfg", "sp", "chunk"), donate_argnums=(1,))
def _decode(params, state: DecodeState, live, row_keys, max_steps, *, cfg: ModelConfig,
            sp: SamplingParams, chunk: int):
    """Returns (state, tokens [slots, chunk], logprobs [slots, chunk], generated [slots],
    ended [slots], stopped [slots], steps): decodes the live slots [slots] (bool) for at most
    max_steps (<= chunk) steps, ending early after the first step in which a slot's turn ended
    (a stop id / sequence: stopped; or sp.max_new_tokens tokens this turn)."""
    b = live.shape[0]
    w = unembedding_matrix(params, cfg).astype(jnp.float32)
    stops = StopTables.of(sp)
    keys = jax.random.wrap_key_data(row_keys)

    def cond(s):
        i, _, done, ended, *_ = s
        return (i < max_steps) & jnp.any(~done) & ~jnp.any(ended)

    def body(s):
        i, st, done, ended, stopped, out_tok, out_lp, n = s
        # A token's key depends on its episode and position only: the same samples however
        # the slots were interleaved.
        tok, lp = sample_tokens(st.logits, sp, lambda f: inverse_cdf(f, jax.vmap(
            lambda k, p: jax.random.uniform(jax.random.fold_in(k, p)))(keys, st.pos)))
        act = ~done
        out_tok = out_tok.at[:, i].set(jnp.where(act, tok, sp.pad_id))
        out_lp = out_lp.at[:, i].set(jnp.where(act, lp, 0.0))
        n = n + act.astype(jnp.int32)
        hit, tail = stops.hit(tok, st.tail)
        hit = act & hit
        count = st.count + act.astype(jnp.int32)
        end = hit | (act & (count >= sp.max_new_tokens))
        h, cache = forward(params, cfg, tok[:, None], st.pos[:, None],
                           act.astype(jnp.int32)[:, None], st.cache)
        logits = jnp.where(act[:, None], h[:, 0].astype(jnp.float32) @ w, st.logits)
        st = DecodeState(cache, logits, st.pos + act.astype(jnp.int32),
                         jnp.where(act[:, None], tail, st.tail), count)
        return (i + 1, st, done | end, ended | end, stopped | hit, out_tok, out_lp, n)

    s = (jnp.zeros((), jnp.int32), state, ~live, jnp.zeros((b,), bool), jnp.zeros((b,), bool),
         jnp.full((b, chunk), sp.pad_id, jnp.int32), jnp.zeros((b, chunk), jnp.float32),
         jnp.zeros((b,), jnp.int32))
    i, state, _, ended, stopped, out_tok, out_lp, n = jax.lax.while_loop(cond, body, s)
    return state, out_tok, out_lp, n, ended, stopped, i


class TurnOutput(NamedTuple):
    """One finished turn of an episode: tokens / logprobs [n] as sampled; stopped: it ended at
    a stop id or sequence (else at the per-turn cap, max_new_tokens)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    stopped: bool


class EnvCalls(NamedTuple):
    """Work `Agent.end_turn` may return instead of a callable: `run(items)` returns one result
    per item, in order. The env thread merges the EnvCalls of the same `run` that are queued
    together into one call (one `EnvPool.step` over several episodes' tool calls, which the
    pool spreads over its workers) and hands each work its own results, in order."""

    run: Callable[[list], list]
    items: list


class Agent(Protocol):
    """The episodes a `ContinuousEngine` runs. `prompt` and `resume` run on the engine's thread,
    the work `end_turn` returns on its env thread, in submission order: a callable runs alone;
    `EnvCalls` queued together with the same `run` run as one call."""

    def prompt(self, ep: int) -> Sequence[int] | None:
        """Returns episode ep's first context, or None if it ends before its first turn."""

    def end_turn(self, ep: int, out: TurnOutput) -> Callable[[], Any] | EnvCalls | None:
        """Records the turn; returns the work its result needs (env calls), or None: ended."""

    def resume(self, ep: int, result: Any) -> Sequence[int] | None:
        """Returns the whole context to continue from (it extends the last one), or None."""


class _EnvThread:
    """The engine's env thread: runs submitted work in order. Whatever queued while it was busy
    is taken at once, and runs of consecutive `EnvCalls` with the same `run` become one call
    (results split back per work: each item's result is what it gets alone, as long as `run`
    treats items independently, as EnvPool.step does for different episodes)."""

    def __init__(self):
        self.queue: list[tuple[Any, concurrent.futures.Future]] = []
        self.cond = threading.Condition()
        self.closed = False
        self.calls = 0  # calls made (merged EnvCalls count once)
        self.thread = threading.Thread(target=self._loop, name="engine-env", daemon=True)
        self.thread.start()

    def submit(self, work) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self.cond:
            if self.closed:
                raise RuntimeError("engine env thread is shut down")
            self.queue.append((work, fut))
            self.cond.notify()
        return fut

    def shutdown(self) -> None:
        """Cancels the work not started (a run that ends normally has none left), waits for
        the running one."""
        with self.cond:
            self.closed = True
            dropped, self.queue = self.queue, []
            self.cond.notify()
        for _, f in dropped:
            f.cancel()
        self.thread.join()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue:
                    return
                taken, self.queue = self.queue, []
            i = 0
            while i < len(taken):
                j = i + 1
                if isinstance(taken[i][0], EnvCalls):
                    while (j < len(taken) and isinstance(taken[j][0], EnvCalls)
                           and taken[j][0].run == taken[i][0].run):
                        j += 1
                self._run(taken[i:j])
                i = j

    def _run(self, group: list) -> None:
        self.calls += 1
        futs = [f for _, f in group]
        try:
            if not isinstance(group[0][0], EnvCalls):
                results = [group[0][0]()]
            else:
                merged = [x for w, _ in group for x in w.items]
                out = list(group[0][0].run(merged))
                if len(out) != len(merged):
                    raise RuntimeError(f"EnvCalls.run returned {len(out)} results for "
                                       f"{len(merged)} items")
                results, at = [], 0
                for w, _ in group:
                    results.append(out[at:at + len(w.items)])
                    at += len(w.items)
        except BaseException as e:  # every work of the call sees the failure
            for f in futs:
                f.set_exception(e)
            return
        for f, r in zip(futs, results):
            f.set_result(r)


class ContinuousEngine:
    """Runs an `Agent`'s episodes with continuous batching (module docstring) on one params
    pytree. `run(agent, keys)` returns its timing stats; `stats` accumulates over runs."""

    def __init__(self, params: Any, cfg: ModelConfig, sp: SamplingParams,
                 ecfg: EngineConfig = EngineConfig()):
        self.params, self.cfg, self.sp, self.ecfg = params, cfg, sp, ecfg
        self.stats = collections.Counter()

    def run(self, agent: Agent, keys: Sequence[jax.Array]) -> dict:
        """Runs episodes 0..len(keys)-1 (keys[i]: episode i's sampling key) to their ends."""
        n_ep = len(keys)
        if n_ep == 0:
            return {}
        want = n_ep if self.ecfg.slots <= 0 else min(self.ecfg.slots, n_ep)
        _Run(self, agent, [np.asarray(jax.random.key_data(k)) for k in keys],
             1 << (want - 1).bit_length()).loop()
        return dict(self.stats)


class _Run:
    """The state of one `ContinuousEngine.run`: slots, the logical clock, the env thread."""

    def __init__(self, eng: ContinuousEngine, agent: Agent, keys: list[np.ndarray], b: int):
        self.eng, self.agent, self.keys, self.b = eng, agent, keys, b
        self.sp, self.cfg, self.ecfg, self.st = eng.sp, eng.cfg, eng.ecfg, eng.stats
        self.row_keys = np.zeros((b,) + keys[0].shape, keys[0].dtype)
        self.pending = collections.deque(range(len(keys)))
        self.free = list(range(b))
        self.ep = [-1] * b                         # the episode each slot holds
        self.held = [0] * b                        # real tokens of each slot's context
        self.live = np.zeros(b, bool)              # slots mid-turn
        self.turn_tok: list[list[np.ndarray]] = [[] for _ in range(b)]
        self.turn_lp: list[list[np.ndarray]] = [[] for _ in range(b)]
        self.waiting: dict[int, tuple[int, concurrent.futures.Future]] = {}
        self.joins: list[tuple[int, Sequence[int]]] = []
        self.clock = 0
        self.state: DecodeState | None = None

    # -- slots -------------------------------------------------------------------------------
    def _release(self, s: int) -> None:
        self.ep[s], self.held[s] = -1, 0
        self.free.append(s)
        self.free.sort()

    def _admit(self) -> None:
        while self.free and self.pending:
            ep = self.pending.popleft()
            ctx = self.agent.prompt(ep)
            if ctx is None:
                continue
            s = self.free.pop(0)
            self.ep[s], self.held[s] = ep, 0
            self.row_keys[s] = self.keys[ep]
            self.joins.append((s, ctx))
            self.st["episodes"] += 1

    def _init_state(self, need: int) -> None:
        cap = bucket_length(need, self.ecfg.min_cache_bucket)
        self.state = DecodeState(init_cache(self.cfg, self.b, cap),
                                 jnp.zeros((self.b, self.cfg.vocab_size), jnp.float32),
                                 jnp.zeros((self.b,), jnp.int32),
                                 StopTables.of(self.sp).empty_tail(self.b),
                                 jnp.zeros((self.b,), jnp.int32))

    def _room(self, need: int) -> None:
        """Makes room for `need` more slots after the write index (compacting the cache)."""
        c = self.state.cache
        if int(c.index) + need <= c.seg.shape[1]:
            return
        seg = np.asarray(c.seg)
        # Free and newly admitted slots drop what their last episode left.
        real = [np.nonzero(seg[r])[0] if self.held[r] > 0 else np.zeros(0, np.int64)
                for r in range(self.b)]
        used = bucket_length(max(max((len(r) for r in real), default=0), 1),
                             self.ecfg.min_cache_bucket)
        src = np.zeros((self.b, used), np.int32)
        keep = np.zeros((self.b, used), bool)
        for r, idx in enumerate(real):
            if len(idx):
                src[r, used - len(idx):] = idx
                keep[r, used - len(idx):] = True
        # Head room for a few more calls, so compactions stay rare.
        slots = bucket_length(used + need + 4 * self.ecfg.chunk, self.ecfg.min_cache_bucket)
        cache = _compact(c, jnp.asarray(src), jnp.asarray(keep), slots=slots)
        self.state = self.state._replace(cache=cache)
        self.st["compactions"] += 1

    # -- device calls ------------------------------------------------------------------------
    def _prefill(self) -> None:
        joins, self.joins = self.joins, []
        suffixes = []
        for s, ctx in joins:
            suf = list(ctx[self.held[s]:])
            if not suf:
                raise ValueError(f"episode {self.ep[s]}: a resumed context must extend the last "
                                 f"one by at least one token (the next turn's header)")
            if len(ctx) + self.sp.max_new_tokens >= self.cfg.max_seq_len:
                raise ValueError(f"context of {len(ctx)} tokens + max_new_tokens "
                                 f"{self.sp.max_new_tokens} exceeds ModelConfig.max_seq_len="
                                 f"{self.cfg.max_seq_len}")
            suffixes.append(suf)
        width = bucket_length(max(len(x) for x in suffixes), self.ecfg.min_suffix_bucket)
        if self.state is None:
            self._init_state(bucket_length(width + self.sp.max_new_tokens + 4 * self.ecfg.chunk,
                                           self.ecfg.min_cache_bucket))
        self._room(width)
        n = 1 << (len(joins) - 1).bit_length()
        rows = [s for s, _ in joins]
        others = [s for s in range(self.b) if s not in rows]
        rows += others[:n - len(rows)]  # padding rows: distinct slots, holes only
        fresh = np.array([self.held[s] == 0 for s, _ in joins] + [False] * (n - len(joins)))
        tokens = np.full((n, width), self.sp.pad_id, np.int32)
        seg = np.zeros((n, width), np.int32)
        pos = np.zeros((n, width), np.int32)
        for j, ((s, ctx), suf) in enumerate(zip(joins, suffixes)):
            start = self.held[s]
            tokens[j, width - len(suf):] = suf
            seg[j, width - len(suf):] = 1
            pos[j, width - len(suf):] = np.arange(start, start + len(suf))
            pos[j, :width - len(suf)] = max(start - 1, 0)  # masked; keeps RoPE finite
            self.held[s] = len(ctx)
            self.live[s] = True
            self.st["prefill_tokens"] += len(suf)
            self.st["reused_tokens"] += start
        valid = np.arange(n) < len(joins)
        t0 = time.perf_counter()
        self.state = _prefill(self.eng.params, self.state, jnp.asarray(rows, jnp.int32),
                              jnp.asarray(valid), jnp.asarray(fresh), jnp.asarray(tokens),
                              jnp.asarray(seg),
                              jnp.asarray(pos), cfg=self.cfg, sp=self.sp)
        self.st["prefill_calls"] += 1
        self.st["prefill_s"] += time.perf_counter() - t0  # dispatch only; decode syncs

    def _decode(self) -> None:
        chunk = self.ecfg.chunk
        steps = chunk
        if self.waiting:  # end the call when the next slot is due to resume
            steps = min(chunk, min(due for due, _ in self.waiting.values()) - self.clock)
        self._room(chunk)
        t0 = time.perf_counter()
        self.state, tok, lp, n, ended, stopped, i = _decode(
            self.eng.params, self.state, jnp.asarray(self.live), jnp.asarray(self.row_keys),
            jnp.asarray(steps, jnp.int32), cfg=self.cfg, sp=self.sp, chunk=chunk)
        tok, lp, n, ended, stopped = (np.asarray(x) for x in (tok, lp, n, ended, stopped))
        i = int(i)
        self.st["decode_s"] += time.perf_counter() - t0
        self.st["decode_calls"] += 1
        self.st["decode_steps"] += i
        self.st["slot_steps"] += i * self.b
        self.st["generated_tokens"] += int(n.sum())
        self.clock += i
        for s in np.nonzero(self.live)[0]:
            k = int(n[s])
            self.turn_tok[s].append(tok[s, :k])
            self.turn_lp[s].append(lp[s, :k])
            if not ended[s]:
                continue
            self.live[s] = False
            self.held[s] += sum(len(x) for x in self.turn_tok[s])
            out = TurnOutput(np.concatenate(self.turn_tok[s]), np.concatenate(self.turn_lp[s]),
                             bool(stopped[s]))
            self.turn_tok[s], self.turn_lp[s] = [], []
            work = self.agent.end_turn(self.ep[s], out)
            if work is None:
                self._release(s)
            else:
                self.waiting[s] = (self.clock + self.ecfg.resume_lag, self.pool.submit(work))

    def _resume_due(self) -> None:
        for s in sorted(self.waiting):
            due, fut = self.waiting[s]
            if due > self.clock:
                continue
            del self.waiting[s]
            if not fut.done():
                t0 = time.perf_counter()
                concurrent.futures.wait([fut])
                self.st["env_wait_s"] += time.perf_counter() - t0
                self.st["env_waits"] += 1
            ctx = self.agent.resume(self.ep[s], fut.result())
            if ctx is None:
                self._release(s)
            else:
                self.joins.append((s, ctx))

    def loop(self) -> None:
        t_start = time.perf_counter()
        self.pool = _EnvThread()
        try:
            while True:
                self._resume_due()
                self._admit()
                if self.joins:
                    self._prefill()
                if self.live.any():
                    self._decode()
                elif self.waiting:  # nothing to decode: the clock jumps to the next resume
                    self.clock = max(self.clock, min(d for d, _ in self.waiting.values()))
                else:
                    break
        finally:
            self.pool.shutdown()
            self.st["env_calls"] += self.pool.calls
            self.st["wall_s"] += time.perf_counter() - t_start
