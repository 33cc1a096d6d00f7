"""Fused (hidden @ unembed) -> log-prob of the target token + entropy, never materializing logits.

    from kernels import token_logprobs, token_logprobs_reference
    lp, ent = token_logprobs(hidden, unembed, targets, temperature=1.0)  # [N,D],[D,V],[N] -> [N],[N]
"""

from kernels.dispatch import BACKENDS, token_logprobs
from kernels.reference import token_logprobs_reference
from kernels.sharded import token_logprobs_sharded

__all__ = ["BACKENDS", "token_logprobs", "token_logprobs_reference", "token_logprobs_sharded"]
