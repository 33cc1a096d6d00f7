"""Our jitted KV-cache sampler vs HF transformers `generate` (torch CPU): tokens/s, one JSON line.

    python -m benchmarks.sampler            # 4 layers, d=512, vocab 4096, B=8, 128 + 128 tokens
    python -m benchmarks.sampler --quick    # 2 layers, d=128, vocab 512, B=2, 32 + 16 tokens

Both decode greedily (temperature 0 / `do_sample=False`) from the same random weights: a random
HF `Qwen3ForCausalLM` is saved and loaded into ours with `load_hf_checkpoint`. The vocab is 4096,
not Qwen3's 151936, so the unembedding does not dominate a model this small. torch gets as many
threads as the cores XLA's CPU client uses. Repeats alternate ours / HF in one process (the
machine is shared) and the medians are reported; our compile time is excluded from tokens/s and
reported as compile_s. greedy_match is the fraction of the first sequence's tokens that agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def _log(msg: str) -> None:
    print(f"[sampler] {msg}", file=sys.stderr, flush=True)


def jax_cpu_threads() -> int:
    """Returns the number of cores XLA's CPU client runs on (its thread pool is one per core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_hf_model(a: argparse.Namespace, seed: int = 0):
    """Returns a random HF Qwen3ForCausalLM (eval mode, fp32) with the benchmark's shapes."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.mlp_dim,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                      rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      max_position_embeddings=max(4096, a.prompt_len + a.new_tokens))
    return Qwen3ForCausalLM(cfg).eval()


def run(args: argparse.Namespace) -> dict:
    """Returns the benchmark's JSON record for parsed `args` (see `parse_args`)."""
    import jax
    import jax.numpy as jnp
    import torch

    from toolverse_jax.models import load_hf_checkpoint
    from toolverse_jax.sampling import SamplingParams, generate

    threads = jax_cpu_threads()
    torch.set_num_threads(threads)
    hf = build_hf_model(args)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        cfg, params = load_hf_checkpoint(d, dtype=jnp.float32)
    prompts = np.random.default_rng(args.seed).integers(
        0, args.vocab, size=(args.batch, args.prompt_len)).astype(np.int64)
    prompt_lists = [list(map(int, p)) for p in prompts]
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, stop_token_ids=())
    rng = jax.random.key(0)

    def ours():
        return np.asarray(generate(params, cfg, prompt_lists, sp, rng).tokens)

    torch_prompts = torch.tensor(prompts)

    def theirs(new_tokens: int = args.new_tokens):
        with torch.no_grad():
            out = hf.generate(torch_prompts, attention_mask=torch.ones_like(torch_prompts),
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[:, args.prompt_len:].numpy()

    t0 = time.perf_counter()
    ours_tokens = ours()  # compiles prefill + decode loop for this (batch, length) bucket
    compile_s = time.perf_counter() - t0
    theirs(2)  # HF warm-up (allocator, kernels' first touch); eager, so nothing to compile
    t_ours, t_hf, hf_tokens = [], [], None
    for i in range(args.repeats):
        for name, times in (("ours", t_ours), ("hf", t_hf)):
            t0 = time.perf_counter()
            if name == "ours":
                ours()
            else:
                hf_tokens = theirs()
            times.append(time.perf_counter() - t0)
            _log(f"repeat {i} {name}: {times[-1]:.3f} s")
    n_tokens = args.batch * args.new_tokens
    ours_tps = n_tokens / float(np.median(t_ours))
    hf_tps = n_tokens / float(np.median(t_hf))
    return {
        "benchmark": "sampler",
        "ours_tokens_per_s": round(ours_tps, 1),
        "hf_tokens_per_s": round(hf_tps, 1),
        "ratio": round(ours_tps / hf_tps, 3),
        "target_ratio": 3.0,
        "compile_s": round(compile_s, 3),
        "ours_median_s": round(float(np.median(t_ours)), 4),
        "hf_median_s": round(float(np.median(t_hf)), 4),
        "greedy_match": float(np.mean(ours_tokens[0] == hf_tokens[0])),
        "config": {"layers": args.layers, "d_model": args.d_model, "heads": args.heads,
                   "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                   "mlp_dim": args.mlp_dim, "vocab": args.vocab, "batch": args.batch,
                   "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                   "repeats": args.repeats, "dtype": "float32",
                   "note": f"vocab {args.vocab} (not Qwen3's 151936) so the unembedding does "
                           "not dominate; greedy; tokens/s = batch*new_tokens / median wall time"},
        "threads": {"jax": threads, "torch": torch.get_num_threads(),
                    "note": "torch.set_num_threads = cores of XLA's CPU client"},
        "versions": {"jax": jax.__version__, "torch": torch.__version__},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(args.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp-dim", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="2 layers, d=128, B=2, 32 + 16 tokens, 2 repeats")
    a = p.parse_args(argv)
    if a.quick:
        a.layers, a.d_model, a.heads, a.kv_heads, a.head_dim, a.mlp_dim = 2, 128, 4, 2, 32, 256
        a.vocab, a.batch, a.prompt_len, a.new_tokens, a.repeats = 512, 2, 32, 16, 2
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
