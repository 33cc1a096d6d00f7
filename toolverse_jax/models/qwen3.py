"""The decoder of every family in config.py (Qwen3, Qwen2.5, Llama/SmolLM2, Qwen3-MoE) as a
pure-functional flax.linen module with logical axis annotations.

Params are a plain pytree; `apply` is pure. Attention masking is driven by segment ids: tokens
attend causally to earlier tokens of the same non-zero segment, so one code path serves packed
sequences, left-padded batches (padding = segment 0) and decoding against a KV cache.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from toolverse_jax.models.config import ModelConfig

# Finite "minus infinity": a fully masked row (a padding query) stays finite instead of NaN.
_MASK_VALUE = -1e30


class KVCache(NamedTuple):
    """Decoding state. k, v: one array per layer, each [batch, kv_heads, slots, head_dim]; seg:
    [batch, slots] (segment id of the token in each slot, 0 = empty); index: [] next slot to
    write.

    Per-layer arrays with slots next to head_dim are what both attention dots read as they lie:
    a stacked [layers, batch, slots, kv_heads, head_dim] cache cost a slice + transposing copy
    of every layer's keys and values per decode step (a quarter of the tiny model's step)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    seg: jax.Array
    index: jax.Array


def init_cache(cfg: ModelConfig, batch: int, slots: int, dtype=None) -> KVCache:
    """Returns an empty KV cache with `slots` positions per sequence."""
    dtype = dtype or cfg.jnp_dtype
    shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
    return KVCache(k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
                   v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
                   seg=jnp.zeros((batch, slots), jnp.int32), index=jnp.zeros((), jnp.int32))


def _param(module: nn.Module, name: str, init, shape, names, dtype):
    return module.param(name, nn.with_logical_partitioning(init, names), shape, dtype)


class RMSNorm(nn.Module):
    eps: float
    param_dtype: jnp.dtype
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), (self.axis_name,),
                       self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Returns the float32 RoPE inverse frequencies [head_dim // 2] with cfg's scaling applied."""
    dim = cfg.head_dim
    inv = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / dim)))
    inv = inv.astype(np.float32)
    if cfg.rope_type == "linear":
        inv = inv / np.float32(cfg.rope_factor)
    elif cfg.rope_type == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
        # interpolated smoothly (HF `_compute_llama3_parameters`, same float32 arithmetic).
        factor, old = np.float32(cfg.rope_factor), np.float32(cfg.rope_original_max_len)
        lo, hi = np.float32(cfg.rope_low_freq_factor), np.float32(cfg.rope_high_freq_factor)
        wavelen = np.float32(2 * np.pi) / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def rope(x: jax.Array, positions: jax.Array, inv_freq) -> jax.Array:
    """Returns x [batch, length, heads, head_dim] rotated by positions [batch, length] (HF layout,
    rotate-half) with inverse frequencies inv_freq [head_dim // 2]."""
    half = x.shape[-1] // 2
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention_mask(q_seg: jax.Array, q_slot: jax.Array, k_seg: jax.Array,
                   k_slot: jax.Array) -> jax.Array:
    """Returns bool [batch, q_len, k_len]: causal in slot order within the same non-zero
    segment."""
    same = (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] != 0)
    causal = k_slot[:, None, :] <= q_slot[:, :, None]
    return same & causal


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, kv_cache=None, index=None):
        cfg = self.cfg
        pd = cfg.jnp_param_dtype
        init = nn.initializers.normal(stddev=cfg.d_model ** -0.5)
        wq = _param(self, "q_proj", init, (cfg.d_model, cfg.num_heads, cfg.head_dim),
                    ("embed", "heads", "head_dim"), pd)
        wk = _param(self, "k_proj", init, (cfg.d_model, cfg.num_kv_heads, cfg.head_dim),
                    ("embed", "kv", "head_dim"), pd)
        wv = _param(self, "v_proj", init, (cfg.d_model, cfg.num_kv_heads, cfg.head_dim),
                    ("embed", "kv", "head_dim"), pd)
        wo = _param(self, "o_proj", nn.initializers.normal(stddev=(cfg.num_heads * cfg.head_dim) ** -0.5),
                    (cfg.num_heads, cfg.head_dim, cfg.d_model), ("heads", "head_dim", "embed"), pd)
        dt = cfg.jnp_dtype
        q = jnp.einsum("bld,dhk->blhk", x, wq.astype(dt))
        k = jnp.einsum("bld,dhk->blhk", x, wk.astype(dt))
        v = jnp.einsum("bld,dhk->blhk", x, wv.astype(dt))
        if cfg.qkv_bias:  # Qwen2: biases on q/k/v only, none on o
            zeros = nn.initializers.zeros
            q = q + _param(self, "q_bias", zeros, (cfg.num_heads, cfg.head_dim),
                           ("heads", "head_dim"), pd).astype(dt)
            k = k + _param(self, "k_bias", zeros, (cfg.num_kv_heads, cfg.head_dim),
                           ("kv", "head_dim"), pd).astype(dt)
            v = v + _param(self, "v_bias", zeros, (cfg.num_kv_heads, cfg.head_dim),
                           ("kv", "head_dim"), pd).astype(dt)
        if cfg.qk_norm:  # Qwen3: RMSNorm over head_dim before RoPE
            q = RMSNorm(cfg.rms_eps, pd, "head_dim", name="q_norm")(q)
            k = RMSNorm(cfg.rms_eps, pd, "head_dim", name="k_norm")(k)
        inv_freq = rope_inv_freq(cfg)
        q = rope(q, positions, inv_freq)
        k = rope(k, positions, inv_freq)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))
        k = nn.with_logical_constraint(k, ("batch", "length", "kv", "head_dim"))
        b, l, h, hd = q.shape
        groups = cfg.num_heads // cfg.num_kv_heads
        qg = q.reshape(b, l, cfg.num_kv_heads, groups, hd)
        if kv_cache is None:
            new_kv = None
            scores = jnp.einsum("blkgd,bskd->bkgls", qg, k)
        else:
            # This layer's cache [b, kv, slots, hd], written in place at slot `index`.
            k_c, v_c = kv_cache
            at = (0, 0, index, 0)
            k_c = jax.lax.dynamic_update_slice(k_c, jnp.swapaxes(k, 1, 2).astype(k_c.dtype), at)
            v_c = jax.lax.dynamic_update_slice(v_c, jnp.swapaxes(v, 1, 2).astype(v_c.dtype), at)
            new_kv = (k_c, v_c)
            k, v = k_c.astype(dt), v_c.astype(dt)
            scores = jnp.einsum("blkgd,bksd->bkgls", qg, k)
        scores = scores.astype(jnp.float32) * (hd ** -0.5)
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        if kv_cache is None:
            out = jnp.einsum("bkgls,bskd->blkgd", probs, v)
        else:  # [b, kv, g, l, hd] -> [b, l, kv, g, hd]: a bitcast when decoding (l = 1)
            out = jnp.moveaxis(jnp.einsum("bkgls,bksd->bkgld", probs, v), 3, 1)
        out = out.reshape(b, l, h, hd)
        out = nn.with_logical_constraint(out, ("batch", "length", "heads", "head_dim"))
        return jnp.einsum("blhk,hkd->bld", out, wo.astype(dt)), new_kv


class MLP(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        pd, dt = cfg.jnp_param_dtype, cfg.jnp_dtype
        init = nn.initializers.normal(stddev=cfg.d_model ** -0.5)
        wg = _param(self, "gate_proj", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), pd)
        wu = _param(self, "up_proj", init, (cfg.d_model, cfg.mlp_dim), ("embed", "mlp"), pd)
        wd = _param(self, "down_proj", nn.initializers.normal(stddev=cfg.mlp_dim ** -0.5),
                    (cfg.mlp_dim, cfg.d_model), ("mlp", "embed"), pd)
        return swiglu(x, wg.astype(dt), wu.astype(dt), wd.astype(dt))


@jax.custom_vjp
def swiglu(x, wg, wu, wd):
    """Returns the SwiGLU MLP (silu(x @ wg) * (x @ wu)) @ wd of x [batch, length, d_model].

    The backward is written out (`_swiglu_bwd`): with autodiff's, XLA on CPU fuses the silu
    gradient into the transposing copy that feeds the gate's weight-gradient matmul, a strided
    pass over four [tokens, mlp] arrays that took ~18 ms of a 240 ms GRPO update per layer.
    Here the gate and up gradients are plain elementwise arrays and the weight gradients
    contract the token axes directly (mlp fwd + bwd at 2048 x 256 x 768: 70 -> 50 ms)."""
    return _swiglu_fwd(x, wg, wu, wd)[0]


def _swiglu_fwd(x, wg, wu, wd):
    g, u = x @ wg, x @ wu
    h = nn.with_logical_constraint(jax.nn.silu(g) * u, ("batch", "length", "mlp"))
    return h @ wd, (x, g, u, wg, wu, wd)


def _swiglu_bwd(res, dy):
    x, g, u, wg, wu, wd = res
    s = jax.nn.sigmoid(g)
    a = g * s  # silu(g)
    dh = nn.with_logical_constraint(dy @ wd.T, ("batch", "length", "mlp"))
    dwd = jnp.einsum("...m,...d->md", a * u, dy)
    du = dh * a
    dg = dh * u * s * (1 + g * (1 - s))  # silu'(g) = s (1 + g (1 - s))
    dx = dg @ wg.T + du @ wu.T
    dwg = jnp.einsum("...d,...m->dm", x, dg)
    dwu = jnp.einsum("...d,...m->dm", x, du)
    return dx, dwg, dwu, dwd


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class MoE(nn.Module):
    """Qwen3-MoE sparse block: softmax router, top-k experts per token (renormalized when
    cfg.norm_topk_prob), each a SwiGLU MLP; the router logits are sown as
    intermediates/router_logits ([batch, length, experts]) for a load-balancing loss."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        pd, dt = cfg.jnp_param_dtype, cfg.jnp_dtype
        e, k, d, m = cfg.num_experts, cfg.num_experts_per_tok, cfg.d_model, cfg.moe_mlp_dim
        init = nn.initializers.normal(stddev=d ** -0.5)
        router = _param(self, "router", init, (d, e), ("embed", "expert"), pd)
        wg = _param(self, "gate_proj", init, (e, d, m), ("expert", "embed", "moe_mlp"), pd)
        wu = _param(self, "up_proj", init, (e, d, m), ("expert", "embed", "moe_mlp"), pd)
        wd = _param(self, "down_proj", nn.initializers.normal(stddev=m ** -0.5), (e, m, d),
                    ("expert", "moe_mlp", "embed"), pd)
        b, l, _ = x.shape
        logits = x @ router.astype(dt)  # [b, l, e]
        self.sow("intermediates", "router_logits", logits)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        weights, experts = jax.lax.top_k(probs, k)  # [b, l, k]
        if cfg.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        # Sort the (token, slot) pairs by expert so each expert's rows are contiguous, then one
        # grouped matmul per projection (jax.lax.ragged_dot): compute is k/e of the dense mix.
        flat = experts.reshape(-1)  # [n * k]
        order = jnp.argsort(flat, stable=True)
        rows = x.reshape(b * l, d)[order // k]  # [n * k, d]
        sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        h = (jax.nn.silu(jax.lax.ragged_dot(rows, wg.astype(dt), sizes))
             * jax.lax.ragged_dot(rows, wu.astype(dt), sizes))
        y = jax.lax.ragged_dot(h, wd.astype(dt), sizes)  # [n * k, d], sorted order
        y = jnp.zeros_like(y).at[order].set(y).reshape(b, l, k, d)
        return jnp.einsum("blkd,blk->bld", y, weights.astype(dt))


class Qwen3Block(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, kv_cache=None, index=None):
        cfg = self.cfg
        pd = cfg.jnp_param_dtype
        h, new_kv = Attention(cfg, name="attn")(
            RMSNorm(cfg.rms_eps, pd, name="input_norm")(x), positions, mask, kv_cache, index)
        x = x + h
        mlp = MoE(cfg, name="moe") if cfg.is_moe else MLP(cfg, name="mlp")
        x = x + mlp(RMSNorm(cfg.rms_eps, pd, name="post_attn_norm")(x))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, new_kv


class Qwen3(nn.Module):
    """Decoder: tokens [batch, length] -> final hidden states [batch, length, d_model]."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        pd = cfg.jnp_param_dtype
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model ** -0.5),
                                                      ("vocab", "embed")),
            (cfg.vocab_size, cfg.d_model), pd)
        block = nn.remat(Qwen3Block) if cfg.remat else Qwen3Block
        self.layers = [block(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(cfg.rms_eps, pd, name="final_norm")
        if not cfg.tie_embeddings:
            self.lm_head = self.param(
                "lm_head", nn.with_logical_partitioning(
                    nn.initializers.normal(stddev=cfg.d_model ** -0.5), ("embed", "vocab")),
                (cfg.d_model, cfg.vocab_size), pd)

    def __call__(self, tokens, positions=None, segment_ids=None, cache: KVCache | None = None,
                 attn_mask=None):
        """Returns (hidden [batch, length, d_model], new cache or None).

        positions: [batch, length] RoPE positions (default: 0..length-1).
        segment_ids: [batch, length] int, 0 marks padding (default: all ones).
        cache: when given, tokens are written at slots cache.index.. and attend to the cache.
        attn_mask: optional bool [batch, length, length], ANDed with the segment mask (no-cache
            path only), e.g. TRACE's appended answer copies that each see only their own prefix.
        """
        cfg = self.cfg
        b, l = tokens.shape
        if segment_ids is None:
            segment_ids = jnp.ones((b, l), jnp.int32)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
        x = jnp.take(self.embedding, tokens, axis=0).astype(cfg.jnp_dtype)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        if cache is None:
            slots = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
            mask = attention_mask(segment_ids, slots, segment_ids, slots)
            if attn_mask is not None:
                mask = mask & attn_mask.astype(bool)
            for layer in self.layers:
                x, _ = layer(x, positions, mask, None, None)
            return self.final_norm(x), None
        if attn_mask is not None:
            raise ValueError("attn_mask is only supported without a KV cache (cache=None)")
        index = cache.index
        seg_all = jax.lax.dynamic_update_slice(cache.seg, segment_ids.astype(jnp.int32), (0, index))
        s = cache.seg.shape[1]
        q_slot = jnp.broadcast_to(index + jnp.arange(l, dtype=jnp.int32), (b, l))
        k_slot = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        mask = attention_mask(segment_ids, q_slot, seg_all, k_slot)
        ks, vs = list(cache.k), list(cache.v)
        for i, layer in enumerate(self.layers):
            x, (ks[i], vs[i]) = layer(x, positions, mask, (ks[i], vs[i]), index)
        new_cache = KVCache(tuple(ks), tuple(vs), seg_all, index + l)
        return self.final_norm(x), new_cache

    def unembedding(self):
        """Returns the [d_model, vocab] output projection (tied: embedding transposed)."""
        return self.embedding.T if self.cfg.tie_embeddings else self.lm_head


def unembedding_matrix(params, cfg: ModelConfig) -> jax.Array:
    """Returns the [d_model, vocab] output projection from a params pytree."""
    return params["embedding"].T if cfg.tie_embeddings else params["lm_head"]


def init_params(cfg: ModelConfig, rng: jax.Array):
    """Returns a freshly initialized params pytree (plain arrays, logical boxes removed)."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    boxed = Qwen3(cfg).init(rng, tokens)["params"]
    return nn.unbox(boxed)


def logical_axes(cfg: ModelConfig):
    """Returns a pytree matching params whose leaves are logical axis-name tuples."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    abstract = jax.eval_shape(lambda r: Qwen3(cfg).init(r, tokens)["params"], jax.random.key(0))
    return nn.get_partition_spec(abstract)


def forward(params, cfg: ModelConfig, tokens, positions=None, segment_ids=None,
            cache: KVCache | None = None, attn_mask=None):
    """Returns (hidden [batch, length, d_model], new cache) — the pure model function."""
    return Qwen3(cfg).apply({"params": params}, tokens, positions, segment_ids, cache, attn_mask)


def prefix_cache(params, cfg: ModelConfig, prefix_tokens, prefix_segment_ids, prefix_index,
                 extra_slots: int) -> KVCache:
    """Returns a KV cache [rows, ..., Lp + extra_slots] holding each row's shared prefix.

    prefix_tokens / prefix_segment_ids: [P, Lp] inputs 0.. of P shared prefixes (segment 1,
    0 = padding; RoPE positions 0..Lp-1). prefix_index: [rows] int, the prefix of each row.
    The prefixes run once; their keys and values are gathered per row (the gradient sums back
    over the rows that read them), and the cache's next slot is Lp: a forward of each row's
    own tokens (segment 1, positions continuing its prefix) against it sees exactly the context
    it has unsplit. GRPO's G rollouts of one prompt run the prompt once, not G times."""
    p, lp = prefix_tokens.shape
    _, cache = forward(params, cfg, prefix_tokens, None, prefix_segment_ids,
                       init_cache(cfg, p, lp))

    def per_row(x):  # k, v [P, kv, Lp, hd] / seg [P, Lp] -> rows, Lp + extra_slots slots
        widths = [(0, 0)] * x.ndim
        widths[1 if x.ndim == 2 else 2] = (0, extra_slots)
        return jnp.pad(jnp.take(x, prefix_index, axis=0), widths)

    return KVCache(tuple(map(per_row, cache.k)), tuple(map(per_row, cache.v)),
                   per_row(cache.seg), cache.index)


def logits(params, cfg: ModelConfig, tokens, positions=None, segment_ids=None) -> jax.Array:
    """Returns float32 logits [batch, length, vocab] for int32 tokens [batch, length]."""
    hidden, _ = forward(params, cfg, tokens, positions, segment_ids)
    w = unembedding_matrix(params, cfg)
    return jnp.einsum("bld,dv->blv", hidden.astype(jnp.float32), w.astype(jnp.float32))


def router_logits(params, cfg: ModelConfig, tokens, positions=None, segment_ids=None):
    """Returns (hidden [batch, length, d_model], router logits [layers, batch, length, experts])
    of a Qwen3-MoE model (cfg.num_experts > 0), for a load-balancing loss."""
    if not cfg.is_moe:
        raise ValueError("router_logits needs a MoE config (num_experts > 0)")
    (hidden, _), state = Qwen3(cfg).apply({"params": params}, tokens, positions, segment_ids,
                                          mutable=["intermediates"])
    inter = state["intermediates"]
    per_layer = [inter[f"layers_{i}"]["moe"]["router_logits"][0] for i in range(cfg.num_layers)]
    return hidden, jnp.stack(per_layer)


def logprobs_of(params, cfg: ModelConfig, tokens, targets, positions=None, segment_ids=None,
                mask=None, temperature: float = 1.0, backend: str = "auto", attn_mask=None,
                prefix=None):
    """Returns (logprob, entropy) [batch, length] of `targets` given `tokens`, never building
    [tokens, vocab] logits (fused vocab-chunked kernel). mask: [batch, length], 0 -> output 0.
    attn_mask: optional bool [batch, length, length] ANDed with the segment mask.
    prefix: optional (tokens [P, Lp], segment_ids [P, Lp], index [batch]): each row continues
    shared prefix `index` (`prefix_cache`); its positions are the prefix's length on."""
    from kernels import token_logprobs  # top-level package; imported lazily to keep deps one-way
    cache = None if prefix is None else prefix_cache(params, cfg, *prefix, tokens.shape[1])
    hidden, _ = forward(params, cfg, tokens, positions, segment_ids, cache=cache,
                        attn_mask=attn_mask)
    b, l, d = hidden.shape
    flat_mask = None if mask is None else mask.reshape(b * l)
    lp, ent = token_logprobs(hidden.reshape(b * l, d), unembedding_matrix(params, cfg),
                             targets.reshape(b * l), temperature=temperature, mask=flat_mask,
                             backend=backend)
    return lp.reshape(b, l), ent.reshape(b, l)
