"""Decoder (qwen3 / qwen2 / llama / qwen3_moe), presets, HF and GGUF checkpoint import, tokenizers
and chat format."""

from toolverse_jax.models.config import PRESETS, ModelConfig, get_preset
from toolverse_jax.models.hf import CheckpointError, load_hf_checkpoint, save_hf_checkpoint
from toolverse_jax.models.gguf_import import load_gguf_checkpoint
from toolverse_jax.models.qwen3 import (KVCache, Qwen3, forward, init_cache, init_params,
                                        logical_axes, logits, logprobs_of, router_logits,
                                        unembedding_matrix)

__all__ = [
    "PRESETS", "ModelConfig", "get_preset", "CheckpointError", "load_hf_checkpoint",
    "save_hf_checkpoint", "load_gguf_checkpoint", "KVCache", "Qwen3", "forward", "init_cache", "init_params",
    "logical_axes", "logits", "logprobs_of", "router_logits", "unembedding_matrix",
]

from toolverse_jax.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer  # noqa: E402

__all__ += ["ByteTokenizer", "HFTokenizer", "load_tokenizer"]
