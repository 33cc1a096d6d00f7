"""GUST task generation over the built-in catalog (`python -m experiments.generate_tasks`).

Override on the command line, e.g. `--config.num_tasks=50 --config.horizons='(2,3)'`.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.num_tasks = 200
    c.seed = 0
    c.horizons = (2, 3, 5, 10)          # task i gets horizons[i % len(horizons)] stages
    c.min_horizon = config_dict.placeholder(int)   # None: exactly the drawn horizon
    c.max_per_stage = 2                 # N: tool calls per stage (assistant turn)
    c.num_servers = (1, 2)              # servers per task (min, max)
    c.servers = config_dict.placeholder(tuple)     # None: every available server
    c.kinds = ("builtin",)              # catalog kinds to draw servers from
    c.num_processes = 2                 # generator processes (0: in this process)
    c.chunk_size = 16                   # task seeds per work item
    c.max_concurrent = 16               # tasks in flight per process (batched env calls)
    c.num_env_workers = 0               # EnvPool workers per generator process (0: in-process)
    c.shard_size = 1000                 # tasks per JSONL shard
    c.attempts_factor = 4.0             # stop after num_tasks * factor seeds
    c.verify = True                     # replay every task in a fresh episode
    c.refine_warmup = 0                 # unverified warm-up tasks per worker that refine the
                                        # tool graph with observed outputs (0: off)
    c.executor_factory = config_dict.placeholder(str)  # "module:fn" -> Executor (tests)
    c.worker_start_timeout_s = 300.0    # fail (not hang) if generator workers cannot start
    return c
