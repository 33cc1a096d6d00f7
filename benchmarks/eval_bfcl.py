"""BFCL oracle throughput: `python -m benchmarks.eval_bfcl [--quick]` prints one JSON line.

Ours: the oracle policy replays the ground truth of BFCL multi-turn entries through the env pool
(MCP-wrapped BFCL servers over stdio, batched across episodes), then BFCL's checker scores each.
Baseline, same run and entries: BFCL's API classes called directly in-process (fresh instances
per entry, the same calls), then the same checker. The ratio is the price of the env layer
(processes, MCP, validation) per evaluation episode.
"""

import argparse
import json
import logging
import os
import time


def direct_episodes(entries) -> float:
    """Returns seconds to replay and check `entries` with BFCL's classes in this process."""
    from toolverse_jax.envs import bfcl as bfcl_env
    from toolverse_jax.eval import bfcl

    t0 = time.perf_counter()
    for e in entries:
        insts = {c: bfcl_env.new_instance(c, e.raw) for c in e.involved_classes}
        owner = {d["name"]: insts[c] for c in e.involved_classes for d in bfcl_env.func_docs(c)}
        steps = []
        for turn in e.ground_truth:
            calls = [bfcl.parse_call(c, e) for c in turn]
            for name, args in calls:
                bfcl_env.execute(owner[name], name, args)
            steps.append([[bfcl.call_string(n, a) for n, a in calls]] if calls else [])
        if not bfcl.check(e, steps)["valid"]:
            raise AssertionError(f"direct oracle replay of {e.id} failed BFCL's checker")
    return time.perf_counter() - t0


def pool_episodes(entries, num_workers: int, batch: int) -> tuple[float, int]:
    """Returns (seconds, number valid) to run `entries` with the oracle through the env pool
    (pool start and server warm-up excluded)."""
    from toolverse_jax.envs import Catalog, EnvPool
    from toolverse_jax.eval import bfcl

    with EnvPool(Catalog.default(kinds=("bfcl",)), num_workers=num_workers, call_timeout_s=60.0) as pool:
        servers = sorted({s for e in entries for s in e.servers})
        warm = [next(e for e in entries if s in e.servers) for s in servers]
        bfcl.run_dialogs(bfcl.OraclePolicy(), warm, pool)  # starts every server process
        t0 = time.perf_counter()
        valid = 0
        for i in range(0, len(entries), batch):
            valid += sum(d.verdict.get("valid", False)
                         for d in bfcl.run_dialogs(bfcl.OraclePolicy(), entries[i:i + batch], pool))
        return time.perf_counter() - t0, valid


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="10 entries per category")
    p.add_argument("--limit", type=int, default=50, help="entries per category")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="episodes in flight")
    a = p.parse_args(argv)
    logging.disable(logging.WARNING)
    from toolverse_jax.eval import bfcl

    entries = bfcl.load_entries(limit=10 if a.quick else a.limit)
    direct_s = direct_episodes(entries)
    pool_s, valid = pool_episodes(entries, a.workers, a.batch)
    calls = sum(len(t) for e in entries for t in e.ground_truth)
    print(json.dumps({
        "benchmark": "eval_bfcl",
        "episodes": len(entries),
        "calls": calls,
        "oracle_valid": valid,
        "pool_workers": a.workers,
        "pool_episodes_per_s": round(len(entries) / pool_s, 2),
        "direct_episodes_per_s": round(len(entries) / direct_s, 2),
        "ratio": round(direct_s / pool_s, 4),  # < 1: the pool is slower than in-process
        "pool_ms_per_call": round(1e3 * pool_s / calls, 3),
        "direct_ms_per_call": round(1e3 * direct_s / calls, 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
