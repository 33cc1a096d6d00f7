"""Multi-turn rollout decoding: KV kept across turns (`sampling.KVSession`) vs re-prefilling every
context from token 0 each turn (`sampling.generate`, the synchronous loop's sampler). One JSON line.

    python -m benchmarks.rollout            # tiny and d512 models, horizons 5 / 10 / 20
    python -m benchmarks.rollout --quick    # tiny and a 2-layer d512, horizons 5 / 10, B=8

Each episode is a prompt, then per turn: the policy's sampled turn (up to --new-tokens, ending
early at a stop id) and an environment response appended to the context (lengths drawn like
the shipped GUST observations: 20-80 tokens), as `rl/rollout.py:run_rollouts` builds contexts.
Episodes drop out as the horizon nears (a quarter of them end at each of the last turns), so the
batch shrinks like a real rollout batch does. Both engines decode greedily from the same random
weights and see the same appended tokens; `greedy_equal` says whether every turn of every
episode came out token-for-token equal. Timed runs follow a full warm-up run (compiles) and
alternate engines; medians are reported. The env calls themselves are not in the timed loop
(this isolates the sampler's cost; `benchmarks.train_step --rl` times a whole RL step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _log(msg: str) -> None:
    print(f"[rollout] {msg}", file=sys.stderr, flush=True)


def episode_plan(rng: np.random.Generator, batch: int, horizon: int, prompt_len: int,
                 vocab: int) -> dict:
    """Returns the fixed inputs of one benchmark case: prompts, per-turn env responses and the
    turn at which each episode ends."""
    prompts = [rng.integers(3, vocab, prompt_len + int(rng.integers(0, 32))).tolist()
               for _ in range(batch)]
    env = [[rng.integers(3, vocab, int(rng.integers(20, 81))).tolist() for _ in range(horizon)]
           for _ in range(batch)]
    ends = np.full(batch, horizon)
    tail = max(1, horizon // 4)
    for i in range(batch):
        if i % 4:
            ends[i] = horizon - int(rng.integers(0, tail + 1))
    return {"prompts": prompts, "env": env, "ends": ends.tolist()}


def run_episodes(call, plan: dict, horizon: int) -> tuple[list[list[list[int]]], int]:
    """Returns (per episode, per turn: the generated ids; generated-token count) of running the
    plan with `call(prompts, turn) -> SampleOutput`."""
    ctx = [list(p) for p in plan["prompts"]]
    outs = [[] for _ in ctx]
    n_tok = 0
    for turn in range(horizon):
        live = [i for i in range(len(ctx)) if turn < plan["ends"][i]]
        if not live:
            break
        out = call([ctx[i] for i in live], turn)
        for row, i in enumerate(live):
            gen = [int(t) for t in out.tokens[row, :int(out.lengths[row])]]
            outs[i].append(gen)
            n_tok += len(gen)
            ctx[i] += gen + plan["env"][i][turn]
    return outs, n_tok


def bench_case(params, cfg, sp, plan: dict, horizon: int, repeats: int) -> dict:
    """Returns timings of both engines on one (model, horizon) case."""
    import jax

    from toolverse_jax.sampling import KVSession, generate

    def sync():
        return run_episodes(lambda p, t: generate(params, cfg, p, sp, jax.random.key(t)),
                            plan, horizon)

    def kv():
        session = KVSession(params, cfg, sp)
        res = run_episodes(lambda p, t: session.generate(p, jax.random.key(t)), plan, horizon)
        return res, session.stats

    (ref, n_tok), ((got, _), stats) = sync(), kv()  # warm-up: compiles every bucket
    times = {"sync": [], "kv": []}
    for _ in range(repeats):
        for name in ("sync", "kv"):
            t0 = time.perf_counter()
            sync() if name == "sync" else kv()
            times[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"horizon": horizon, "sync_s": round(med["sync"], 4), "kv_s": round(med["kv"], 4),
            "speedup_vs_sync": round(med["sync"] / med["kv"], 3),
            "greedy_equal": got == ref, "generated_tokens": n_tok,
            "sync_tokens_per_s": round(n_tok / med["sync"], 1),
            "kv_tokens_per_s": round(n_tok / med["kv"], 1),
            "kv_prefill_tokens": stats["prefill_tokens"],
            "kv_reused_tokens": stats["reused_tokens"], "kv_compactions": stats["compactions"]}


MODELS = {
    "tiny": {"preset": "tiny"},
    "d512": {"d_model": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4, "head_dim": 64,
             "mlp_dim": 1536, "vocab_size": 1024},
}


def run(a: argparse.Namespace) -> dict:
    import jax

    from toolverse_jax.models import get_preset, init_params
    from toolverse_jax.models.config import ModelConfig
    from toolverse_jax.sampling import SamplingParams

    cases = []
    for name in a.models:
        spec = dict(MODELS[name])
        if a.quick and name == "d512":
            spec["num_layers"] = 2
        cfg = (get_preset("tiny") if spec.get("preset") == "tiny" else
               ModelConfig(max_seq_len=8192, **spec))
        cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, 8192))
        params = init_params(cfg, jax.random.key(0))
        # ~1 in 40 sampled ids stops a turn: turns of varying length, as real ones are.
        stops = tuple(range(3, 3 + max(cfg.vocab_size // 40, 1)))
        sp = SamplingParams(max_new_tokens=a.new_tokens, temperature=0.0, stop_token_ids=stops)
        for h in a.horizons:
            plan = episode_plan(np.random.default_rng(h), a.batch, h, a.prompt_len,
                                cfg.vocab_size)
            t0 = time.perf_counter()
            c = bench_case(params, cfg, sp, plan, h, a.repeats)
            c["model"] = name
            c["wall_s"] = round(time.perf_counter() - t0, 1)
            _log(json.dumps(c))
            cases.append(c)
    at10 = [c for c in cases if c["horizon"] == 10]
    head = at10[0] if at10 else cases[-1]
    return {
        "benchmark": "rollout", "horizon": head["horizon"], "model": head["model"],
        "speedup_vs_sync": head["speedup_vs_sync"],
        "greedy_equal": all(c["greedy_equal"] for c in cases),
        "tokens_per_s": {"kv": head["kv_tokens_per_s"], "sync": head["sync_tokens_per_s"]},
        "cases": cases,
        "config": {"batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                   "env_tokens": "20-80 per turn", "repeats": a.repeats,
                   "note": "greedy; sampler cost only (env calls excluded); episodes end over "
                           "the last quarter of the horizon"},
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(a.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["tiny", "d512"], choices=sorted(MODELS))
    p.add_argument("--horizons", nargs="+", type=int, default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="horizons 5 and 10, 2-layer d512, "
                   "batch 8, 32 new tokens, 128-token prompts, 1 repeat")
    a = p.parse_args(argv)
    if a.horizons is None:
        a.horizons = [5, 10] if a.quick else [5, 10, 20]
    if a.quick:
        a.repeats = 1
        a.batch, a.new_tokens, a.prompt_len = min(a.batch, 8), min(a.new_tokens, 32), 128
    if a.batch < 1 or any(h < 1 for h in a.horizons):
        p.error("--batch and --horizons must be >= 1")
    return a


def main(argv=None) -> dict:
    out = run(parse_args(argv))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
