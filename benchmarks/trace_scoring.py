"""TRACE readiness scoring: single pass (appended answers) vs one sequence per state, one JSON line.

    python -m benchmarks.trace_scoring            # tiny preset, B=4 rollouts, T in {10, 40}
    python -m benchmarks.trace_scoring --quick    # T in {4}, seconds

Both run in the same process on the same random trajectories: the single pass scores all B·(T+1)
states in one call; the baseline scores one state at a time (for k = 0..T, the B sequences
S_k ⊕ prefix ⊕ answer through `score_readiness_naive`, one compiled shape). Reported: states per
second (compile excluded, best of --repeats), tokens pushed through the model, and the max
|difference| of their ℓ̄ (the same numbers up to float summation order).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from toolverse_jax.models import get_preset, init_params
from toolverse_jax.rl import trace_scoring


def _case(rng, b, turns, turn_len, prompt_len, answer_len):
    length = prompt_len + turns * turn_len
    seq = rng.integers(5, 300, size=(b, length)).astype(np.int32)
    bnd = (prompt_len + turn_len * np.arange(turns + 1))[None].repeat(b, 0).astype(np.int32)
    ans = rng.integers(5, 300, size=(b, 1, answer_len)).astype(np.int32)
    return seq, bnd, ans, np.array([60, 61, 62], np.int32)


def _time(fn, args, repeats):
    out = jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return out, best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--turn-len", type=int, default=24)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--answer-len", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    cfg = get_preset(a.preset)
    params = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    single = jax.jit(lambda *x: trace_scoring.score_readiness(params, cfg, *x))
    naive = jax.jit(lambda *x: trace_scoring.score_readiness_naive(params, cfg, *x))

    def per_state(seq, bnd, ans, prefix):
        # each state's sequences cropped to S_k (64-token buckets bound the compiled shapes)
        crop = lambda k: min(seq.shape[1], -(-int(bnd[:, k].max()) // 64) * 64)  # noqa: E731
        cols = [naive(seq[:, :crop(k)], bnd[:, k:k + 1], ans, prefix)
                for k in range(bnd.shape[1])]
        return np.concatenate([np.asarray(c) for c in cols], axis=1)
    report = {"benchmark": "trace_scoring", "preset": a.preset, "backend": jax.default_backend(),
              "batch": a.batch, "results": {}}
    for turns in ((4,) if a.quick else (10, 40)):
        args = _case(rng, a.batch, turns, a.turn_len, a.prompt_len, a.answer_len)
        states = a.batch * (turns + 1)
        w = len(args[3]) + a.answer_len
        r1, t1 = _time(single, args, a.repeats)
        r2, t2 = _time(per_state, args, a.repeats)
        length = args[0].shape[1]
        report["results"][f"T={turns}"] = {
            "states": states,
            "single_pass_states_per_s": round(states / t1, 2),
            "per_state_states_per_s": round(states / t2, 2),
            "speedup": round(t2 / t1, 2),
            "single_pass_tokens": a.batch * (length + (turns + 1) * w),
            "per_state_tokens": int(sum(a.batch * (min(length, -(-int(b) // 64) * 64) + w)
                                        for b in args[1][0])),
            "max_abs_diff": float(np.max(np.abs(np.asarray(r1) - np.asarray(r2)))),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
