"""Batched prefill + KV-cache decode sampler."""

from toolverse_jax.sampling.sampler import (SampleOutput, SamplingParams, bucket_length, generate,
                                            pad_prompts)

__all__ = ["SampleOutput", "SamplingParams", "bucket_length", "generate", "pad_prompts"]
