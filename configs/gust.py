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
    c.backend = "process"               # "process" | "ray": num_processes Ray actors (RAY_ADDRESS)
    c.ray_options = ml_collections.ConfigDict({"num_cpus": 1})  # ray: actor .options() (any key)
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
    # Issue 24 (README "GUST instruction levels"): what the instruction says and what the
    # verifier needs.
    c.instruction_level = "goal"        # goal: what the user wants, discovery left to the agent
                                        # stage: each stage's goal, no tools; recipe: each call
    c.whole_chain = True                # every gold call on the verifier's dependency closure
                                        # (False: the generator of the shipped quickstart sets)
    c.answer_with_checks = True         # an asked value also checks the chain's effects
    # Optional instruction writer (off): rewrites the template in natural prose; a rewrite that
    # drops a stated value or gives away one to discover falls back to the template.
    c.writer = ""                       # "" | "openai" | "sampler" | "module:function"
    c.writer_model = ""                 # openai: model name at the endpoint
    c.writer_base_url = ""              # openai: e.g. http://localhost:8000/v1
    c.writer_api_key_env = "OPENAI_API_KEY"  # openai: env variable holding the key ("" none)
    c.writer_checkpoint = ""            # sampler: HF dir or training workdir (num_processes=0)
    c.writer_tokenizer = ""             # sampler: "" = the checkpoint's own
    return c
