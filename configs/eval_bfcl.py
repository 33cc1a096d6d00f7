"""BFCL-v3 multi-turn evaluation (bfcl-eval's data, API classes and checker, our env pool).

    python -m experiments.evaluate --config configs/eval_bfcl.py --workdir DIR \
        --config.checkpoint=/path/to/qwen3_hf_dir          # or a training --workdir (orbax)
    python -m experiments.evaluate --config configs/eval_bfcl.py --workdir DIR --config.policy=oracle

Writes DIR/results.json, DIR/results.md (table per category + failure transcripts) and
DIR/episodes.jsonl. Defaults suit a real Qwen3 checkpoint (its tokenizer, Qwen3's JSON tool
format, long contexts); `get_config("tiny")` is the CPU smoke setting.
"""

from ml_collections import ConfigDict


def get_config(arg: str | None = None) -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "bfcl"            # a name in toolverse_jax.eval.registry.EVALUATIONS
    c.policy = "sampler"            # "sampler" (our KV-cache sampler on a checkpoint) | "oracle"
    c.checkpoint = ""               # HF dir | training workdir (orbax) | "" = random init preset
    c.seed = 0
    c.batch_size = 16               # episodes in flight (one sampler batch)

    c.model = ConfigDict()
    c.model.preset = "tiny"         # used only when checkpoint == ""
    c.model.tokenizer = ""          # "" = the checkpoint's own, else byte; or "byte" | "qwen3" | dir
    c.model.chat_template = "auto"  # "auto": the tokenizer's own template if any; "qwen3"
    c.model.dtype = "bfloat16"

    c.bfcl = ConfigDict()
    c.bfcl.categories = ("base", "miss_func", "miss_param", "long_context")
    c.bfcl.limit = 0                # first N entries per category (0 = all 200)
    c.bfcl.ids = ()                 # or just these entry ids
    c.bfcl.k = 1                    # average@k over k samples per entry (k > 1 needs temperature)
    c.bfcl.max_steps = 20           # BFCL's per-turn step limit (force-terminates past it)
    c.bfcl.tool_format = "json"     # "json" (Qwen3's) | "compact" | "minimal" (tiny models)
    c.bfcl.verify_state = False     # also compare MCP server state with in-process BFCL replay

    c.sampling = ConfigDict()
    c.sampling.max_new_tokens = 512
    c.sampling.temperature = 0.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.max_context = 16384
    # Each step prefills only what the dialog appended since its last step (KV kept across
    # steps); False re-prefills every context from token 0. Greedy outputs are equal.
    c.sampling.kv_session = True

    c.env = ConfigDict()
    c.env.num_workers = 2
    c.env.call_timeout_s = 30.0

    c.report = ConfigDict()
    c.report.num_failures = 5

    if arg == "tiny":  # CPU smoke: tiny random/quickstart model, byte tokenizer
        c.model.dtype = "float32"
        c.model.tokenizer = "byte"
        c.bfcl.tool_format = "minimal"
        c.sampling.max_new_tokens = 48
        c.sampling.max_context = 4096
        c.env.num_workers = 1
    elif arg:
        raise ValueError(f"configs/eval_bfcl.py: unknown variant {arg!r}; use 'tiny' or none")
    return c
