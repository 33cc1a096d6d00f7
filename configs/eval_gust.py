"""GUST held-out evaluation: greedy rollouts on tasks whose tool set never appears in training.

    python -m experiments.evaluate --config configs/eval_gust.py --workdir DIR \
        --config.checkpoint=TRAIN_WORKDIR [--config.gust.path=GUST_DIR]

Without gust.path it uses the quickstart tasks (the quickstart's servers and sizes). The split is
`tasks.split_tasks(by="toolset")`: for a truly held-out number, train with
`--config.tasks.split_by=toolset` and the same seed/fractions, so these tool sets were never
trained on (the quickstart's default split is by task).
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "gust"
    c.policy = "sampler"
    c.checkpoint = ""               # HF dir | training workdir (orbax) | "" = random init preset
    c.seed = 0
    c.batch_size = 16

    c.model = ConfigDict()
    c.model.preset = "tiny"
    c.model.tokenizer = ""          # "" = the checkpoint's own, else byte
    c.model.dtype = "float32"

    c.gust = ConfigDict()
    c.gust.path = ""                # GUST shard dir; "" = quickstart tasks
    c.gust.num_tasks = 600
    c.gust.horizons = (1,)
    c.gust.servers = ("calendar", "tickets", "notes", "shop")  # () = all built-in servers
    c.gust.gen_seed = 0
    c.gust.split_by = "toolset"     # "toolset" | "server"
    c.gust.fractions = (0.85, 0.0, 0.15)
    c.gust.limit = 0                # first N held-out tasks (0 = all)
    c.gust.max_turns = 3
    c.gust.tool_format = "minimal"
    c.gust.prompt_tools = "gold"
    c.gust.max_observation_chars = 200

    c.sampling = ConfigDict()
    c.sampling.max_new_tokens = 80
    c.sampling.temperature = 0.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.max_context = 1024

    c.env = ConfigDict()
    c.env.num_workers = 1
    c.env.call_timeout_s = 10.0

    c.report = ConfigDict()
    c.report.num_failures = 5
    return c
