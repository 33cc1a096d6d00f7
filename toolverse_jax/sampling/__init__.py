"""Batched prefill + KV-cache decode sampler, and multi-turn sessions that keep the KV cache."""

from toolverse_jax.sampling.sampler import (SampleOutput, SamplingParams, bucket_length, generate,
                                            pad_prompts)
from toolverse_jax.sampling.session import KVSession

__all__ = ["KVSession", "SampleOutput", "SamplingParams", "bucket_length", "generate",
           "pad_prompts"]
