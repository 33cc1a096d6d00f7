"""DUSA throughput: verified GUST tasks/s at horizon 10 with 1 and 2 generator processes.

`python -m benchmarks.dusa` prints one JSON line. Both runs use the same seeds, so they produce
the same task set; worker startup (imports, env pool, graph) is excluded from tasks/s and
reported as startup_s. `--backends process,ray` adds the same 2-generator run on Ray actors
(a local cluster of this machine's cores) in the same run, with `same_set_ray_vs_process`.
"""

import argparse
import json
import statistics

from toolverse_jax.tasks.gust import generate_gust


def run(num_tasks: int, horizon: int, processes: int, seed: int, backend: str = "process",
        level: str = "goal") -> dict:
    # level "recipe" is the generator before issue 24 (recipe instructions, no whole-chain
    # trimming); "goal" / "stage" generate whole-chain tasks (the configs/gust.py default).
    cfg = {"num_tasks": num_tasks, "horizons": (horizon,), "seed": seed,
           "num_processes": processes, "max_per_stage": 2, "num_servers": (1, 2),
           "chunk_size": 8, "max_concurrent": 8, "backend": backend,
           "instruction_level": level, "whole_chain": level != "recipe"}
    tasks, man = generate_gust(cfg, out_dir=None, progress=False)
    return {"tasks": tasks, "manifest": man}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num_tasks", type=int, default=48)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--level", default="goal", choices=("recipe", "stage", "goal"),
                    help="instruction level; recipe = the generator without whole-chain tasks")
    ap.add_argument("--backends", default="process",
                    help="comma-separated: process (always run) and optionally ray")
    args = ap.parse_args()
    one = run(args.num_tasks, args.horizon, 1, args.seed, level=args.level)
    two = run(args.num_tasks, args.horizon, 2, args.seed, level=args.level)
    m1, m2 = one["manifest"], two["manifest"]
    tasks = two["tasks"]
    out = {
        "benchmark": "dusa",
        "horizon": args.horizon,
        "instruction_level": args.level,
        "num_tasks": m2["num_tasks"],
        "verified_tasks_per_s_1proc": m1["tasks_per_s"],
        "verified_tasks_per_s_2proc": m2["tasks_per_s"],
        "speedup_2_vs_1": round(m2["tasks_per_s"] / m1["tasks_per_s"], 3)
        if m1["tasks_per_s"] else None,
        "mean_dependency_depth": round(statistics.mean(t.stats["depth"] for t in tasks), 3)
        if tasks else None,
        "mean_calls_per_task": round(statistics.mean(t.stats["num_calls"] for t in tasks), 3)
        if tasks else None,
        "fraction_dropped": round(m2["num_dropped"] / max(m2["attempts"], 1), 3),
        "dropped": m2["dropped"],
        "same_set_1_vs_2": [t.id for t in one["tasks"]] == [t.id for t in tasks],
        "startup_s_2proc": m2["startup_s"],
        # share of generator-process time spent inside the env pool (MCP calls, resets)
        "env_time_fraction": round(m1["generation_info"].get("env_ms", 0)
                                   / max(m1["generation_info"].get("worker_ms", 1), 1), 3),
        "env_ops_per_attempt": round(m1["generation_info"].get("env_ops", 0)
                                     / max(m1["attempts"], 1), 1),
        "target_tasks_per_s": 20,
    }
    if "ray" in args.backends.split(","):
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            r = run(args.num_tasks, args.horizon, 2, args.seed, backend="ray", level=args.level)
        finally:
            ray.shutdown()
        out.update({"ray_verified_tasks_per_s_2actors": r["manifest"]["tasks_per_s"],
                    "ray_startup_s_2actors": r["manifest"]["startup_s"],
                    "same_set_ray_vs_process": [t.id for t in r["tasks"]] == [t.id for t in tasks]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
