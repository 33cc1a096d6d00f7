"""Env pool throughput and per-call overhead: `python -m benchmarks.envs` prints one JSON line.

Throughput: batched `pool.step` over many episodes on built-in servers (stdio subprocesses), with
1 and 2 workers, for each backend asked for (`--backends process,ray`: the spawned worker
processes and the Ray actors, side by side in one run; Ray on a local cluster of this machine's
cores). Overhead: median latency of one call through the pool minus the median time of calling
the same tool function in-process (same run, same arguments).
"""

import argparse
import json
import logging
import statistics
import time

CALLS = [("mail", "list_folders", {}), ("bank", "get_balance", {"account_id": "acc_0001"}),
         ("notes", "get_note", {"note_id": "nt_0001"}), ("contacts", "get_contact", {"contact_id": "ct_0001"})]


def inprocess_call_s(reps: int = 2000) -> float:
    """Returns the median seconds of calling the tool functions directly (state set, no MCP)."""
    from toolverse_jax.envs.builtin import base
    from toolverse_jax.envs.builtin.run import load_domain

    times = []
    for server, tool, args in CALLS:
        d = load_domain(server)
        fn = next(f for f in d.tools if f.__name__ == tool)
        with base.episode_state(d.fresh_state(0)):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(**args)
            times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def _proc_cpu_s(pid: int) -> float:
    import os

    f = open(f"/proc/{pid}/stat").read().split(") ", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _worker_pids(pool) -> list[int]:
    if pool.backend == "ray":
        workers = pool._ray[0]
        return [workers.actor_pid(w) for w in range(len(workers.actors))]
    return [p.pid for p in pool._procs]


def pool_numbers(num_workers: int, episodes: int, rounds: int, backend: str = "process") -> dict:
    from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec

    cat = Catalog.default(kinds=("builtin",))
    servers = tuple(sorted({c[0] for c in CALLS}))
    with EnvPool(cat, num_workers=num_workers, call_timeout_s=30.0, backend=backend) as pool:
        eps = pool.reset([EpisodeSpec(servers, seed=i) for i in range(episodes)])
        batch = [(ep, CALLS[i % len(CALLS)][1], CALLS[i % len(CALLS)][2]) for i, ep in enumerate(eps)]
        for _ in range(3):  # warm up every server and connection
            obs = pool.step(batch)
        assert all(o.status == "ok" for o in obs), [o.content for o in obs if o.status != "ok"][:2]
        pids = _worker_pids(pool) + sorted({pool.server_pid(ep, s) for ep in eps[:num_workers * 2]
                                                      for s in servers})
        cpu0, own0 = sum(_proc_cpu_s(p) for p in pids), time.process_time()
        t0 = time.perf_counter()
        for _ in range(rounds):
            pool.step(batch)
        dt = time.perf_counter() - t0
        cpu = sum(_proc_cpu_s(p) for p in pids) - cpu0 + time.process_time() - own0
        lat = []
        for i in range(200):
            server, tool, args = CALLS[i % len(CALLS)]
            t1 = time.perf_counter()
            pool.step([(eps[0], tool, args)])
            lat.append(time.perf_counter() - t1)
    return {"calls_per_s": rounds * len(batch) / dt, "latency_s": statistics.median(lat),
            "cpu_s_per_call": cpu / (rounds * len(batch))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--backends", default="process",
                   help="comma-separated EnvPool backends to measure side by side: process,ray")
    a = p.parse_args(argv)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    logging.disable(logging.WARNING)
    base_s = inprocess_call_s()
    out = {"benchmark": "envs_pool", "servers": "builtin mail/bank/notes/contacts over stdio",
           "episodes": a.episodes, "backends": backends, "inprocess_call_us": round(base_s * 1e6, 2)}
    for backend in backends:
        if backend == "ray":
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            key = "" if backend == "process" else f"{backend}_"
            out.update({key + k: v for k, v in _backend_row(a, base_s, backend).items()})
        finally:
            if backend == "ray":
                ray.shutdown()
    out["load_average_1min"] = round(__import__("os").getloadavg()[0], 2)
    print(json.dumps(out))


def _backend_row(a, base_s: float, backend: str) -> dict:
    one = pool_numbers(1, a.episodes, a.rounds, backend)
    two = pool_numbers(2, a.episodes, a.rounds, backend)
    return {
        "calls_per_s_1_worker": round(one["calls_per_s"], 1),
        "calls_per_s_2_workers": round(two["calls_per_s"], 1),
        "pool_call_latency_ms_1_worker": round(one["latency_s"] * 1e3, 3),
        "overhead_per_call_ms": round((one["latency_s"] - base_s) * 1e3, 3),
        "amortized_ms_per_call_2_workers": round(1e3 / two["calls_per_s"], 3),
        # CPU seconds per call, all processes (trainer + workers + servers): independent of how
        # busy the machine is; calls/s on C free cores is at most C / cpu_s_per_call. Under Ray,
        # the raylet's and GCS's own CPU is not counted (only the driver, actors and servers).
        "cpu_ms_per_call_1_worker": round(one["cpu_s_per_call"] * 1e3, 3),
        "cpu_ms_per_call_2_workers": round(two["cpu_s_per_call"] * 1e3, 3),
    }


if __name__ == "__main__":
    main()
