"""Defaults every training config starts from: one place for each knob's default and meaning.

`tool_use()` is the ToolVerse / TRACE run (`experiments.train`'s default method) and
`memory_r2()` the Memory-R2 run; both share `_base()` (model, mesh, env pool, the SFT and PPO
optimizers, the loop's schedule). Config files take one of them and set what differs;
`toolverse_jax.rl.spec.RunSpec.from_config` fills any key a config leaves out from here, so an
older config file keeps working when a knob is added.
"""

from __future__ import annotations

from ml_collections import ConfigDict, config_dict

METHODS = ("toolverse", "memory_r2")


def _base(method: str) -> ConfigDict:
    c = ConfigDict()
    c.method = method               # which program experiments.train runs (see METHODS)
    c.seed = 0

    c.model = ConfigDict()
    c.model.preset = "tiny"
    c.model.checkpoint = ""         # HF dir / .gguf / package shipping one, instead of a preset
    # "trained": a byte-level BPE trained on the train split's gold chains (WORKDIR/tokenizer);
    # or "byte" | "qwen3" | a local HF tokenizer dir | a GGUF's.
    c.model.tokenizer = "byte"
    c.model.tokenizer_vocab = 1024  # ids of the "trained" tokenizer
    c.model.dtype = "float32"
    c.model.remat = False

    c.mesh = ConfigDict()
    c.mesh.shape = (-1, 1, 1)       # (data, fsdp, tensor); -1 takes the remaining devices

    c.env = ConfigDict()
    c.env.num_workers = 1           # MCP server worker processes (0 = in-process servers)
    c.env.call_timeout_s = 10.0
    c.env.include_hidden = False    # serve opt-in (hidden) catalog servers too
    c.env.corpus_env = "TOOLVERSE_SEARCH_CORPUS"  # env var the search server reads its corpus from
    c.env.backend = "process"       # "process" (this machine) | "ray" (actors in a Ray cluster)
    c.env.isolation = "auto"        # server processes: "auto" | "require" | "off" (envs/isolate.py)
    c.env.server_mem_mb = 4096      # address-space limit of each isolated server process

    c.sft = ConfigDict()
    c.sft.steps = 0
    c.sft.batch_size = 16
    c.sft.lr = 3e-3
    c.sft.warmup_steps = 10
    c.sft.schedule = "constant"     # after warmup: "constant" | "cosine" (to 0.1 x lr at sft.steps)

    c.rl = ConfigDict()
    c.rl.steps = 0
    c.rl.group_size = 8
    c.rl.loss = "ppo_clip"          # registered policy loss
    c.rl.clip_eps_low = 0.2
    c.rl.clip_eps_high = 0.28
    c.rl.kl_coef = 0.0              # k3 KL to the frozen reference (the policy at RL start)
    c.rl.entropy_coef = 0.0
    c.rl.tis_cap = 2.0              # truncated importance weight against the sampler
    c.rl.neg_adv_scale = 1.0        # weight of negative advantages in the PPO loss
    c.rl.aggregation = "token_mean"  # "token_mean" | "seq_mean"
    # Rows whose advantage is 0 on every policy token (groups that all scored alike) skip the
    # forward/backward; the gradient is rescaled to the full batch's normalizer, so the update
    # is the same. Applies to ppo_clip without KL or entropy terms (else every row is used).
    c.rl.skip_no_signal = True
    # Run each group's common prompt once in the update, as a shared prefix whose keys and
    # values the group's rows attend to (rl/batching.py:pack_rows; same loss and gradient, any
    # aggregation). A batch uses it only where it cuts the forwarded tokens (else the plain
    # layout). GRPO at 32-token prompts and 64-token completions: the update ~30% shorter
    # (benchmarks/grpo_trl.py). The quickstart, where rows are mostly not prompt: the same
    # 11 train-step compiles with a warm cache, RL updates 81 s vs 95 s, 5:46 vs 6:23 in all.
    # Several processes: the plain layout (logged once).
    c.rl.share_prefix = True
    c.rl.ppo_epochs = 1             # passes over each rollout batch
    c.rl.num_minibatches = 1        # updates per pass (rows shuffled into this many minibatches)
    c.rl.lr = 2e-4
    c.rl.warmup_steps = 2
    c.rl.weight_decay = 0.0
    c.rl.max_grad_norm = 1.0
    c.rl.kernel_backend = "auto"    # token log-prob kernel: kernels.BACKENDS ("auto" = Pallas
                                    # on GPU, chunked jnp elsewhere)
    # Seed of the RL phase's sampling keys, task order and minibatch shuffles; -1 = `seed`.
    # Not part of the checkpoint's identity, so RL seeds can share one warm start.
    c.rl.seed = -1

    c.train = ConfigDict()
    c.train.num_micro = 1           # gradient accumulation micro-batches per step
    # An RL minibatch of more padded token positions (rows x length, plus shared prefixes)
    # than num_micro * micro_tokens runs in 2, 4, ... times as many micro-batches: the same
    # update, with a part's activations (attention scores grow with rows x length^2). The
    # quickstart model's step on 64 x 1024 positions: peak RSS 9.4 GB in one pass, 5.1 GB in
    # two (and 22 -> 15.5 s a step). 0 = off.
    c.train.micro_tokens = 32768
    c.train.eval_every = 20         # RL steps between held-out evals (0 = never)
    c.train.sft_eval_every = 0      # SFT steps between held-out evals (0 = only at SFT's end)
    c.train.eval_at_start = True    # also evaluate the initial params (step 0 of the curve)
    c.train.checkpoint_every = 10
    c.train.keep_checkpoints = 2
    c.train.progress = True
    # Compiled programs persist here across runs (JAX's compilation cache): a rerun, another
    # seed or a sweep point skips the train step's compiles of the shapes already seen (the
    # quickstart compiles ~20 batch shapes in its RL phase). "" = off.
    c.train.compilation_cache_dir = "~/.cache/toolverse_jax/jax_cache"
    return c


def tool_use() -> ConfigDict:
    """Returns the defaults of a tool-use run (SFT on gold chains, RL over live MCP rollouts)."""
    c = _base("toolverse")
    c.model.tokenizer = "trained"

    c.tasks = ConfigDict()
    c.tasks.source = "quickstart"   # "quickstart" (built-in servers) | "gust" (shards) | "search"
    c.tasks.path = ""               # GUST shard dir when source == "gust"
    c.tasks.num_tasks = 2000
    c.tasks.horizons = (1,)
    c.tasks.servers = ("calendar", "tickets", "notes", "shop")
    c.tasks.split_by = "task"       # "task" | "toolset" | "server"
    c.tasks.eval_fraction = 0.15
    c.tasks.gen_seed = 0
    # Fraction of the train split whose gold chains are SFT demonstrations; the rest are the RL
    # tasks (unseen by the warm start, like the held-out ones). 1.0 = both phases use it all.
    c.tasks.sft_fraction = 1.0
    # Non-empty: SFT demonstrates only tasks on these servers and RL trains on the tasks of the
    # others (environments the warm start has never seen a demonstration of).
    c.tasks.sft_servers = ()
    c.tasks.unseen_demos = 0        # with sft_servers: this many demonstrations of the others too
    # GUST instruction level: "recipe" (every call spelled out; the shipped quickstart set),
    # "stage" (each stage's goal) or "goal" (what the user wants; the agent finds the calls).
    c.tasks.instruction_level = "recipe"
    c.tasks.whole_chain = config_dict.placeholder(bool)  # None: level != "recipe"
    c.tasks.max_literal_chars = 0   # > 0: keep tasks whose gold literals are at most this long
    # Each SFT demonstration rendered with fresh literals: the values the instruction states
    # are replaced everywhere in the demonstration by new ones of the same shape
    # (tasks/augment.py), so SFT teaches copying them instead of memorizing them.
    c.tasks.sft_fresh_literals = False
    c.tasks.search_kinds = ()       # source == "search": question templates (() = all)
    c.tasks.corpus_dir = ""         # source == "search": a BrowseComp-Plus dir ("" = synthetic)

    c.rollout = ConfigDict()
    c.rollout.max_turns = 3
    c.rollout.max_context = 1024
    c.rollout.max_new_tokens = 80
    c.rollout.tool_format = "minimal"
    # "auto": the tokenizer's own Jinja chat template when it has one (a real checkpoint's:
    # SmolLM2's ChatML, Qwen3's), else chat.py's Qwen3 format (byte, trained BPE); "qwen3":
    # chat.py's Qwen3 format always (models/template.py: select_chat_template).
    c.rollout.chat_template = "auto"
    c.rollout.prompt_tools = "gold"  # "gold" (+ num_distractors) | "all" of the episode's servers
    c.rollout.num_distractors = 2
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.max_observation_chars = 200
    c.rollout.max_invalid_streak = 0  # end a rollout after N turns of only invalid calls (0 = off)
    c.rollout.max_episode_s = 0.0   # end rollouts whose episode ran this long (0 = off)
    # Success needs a final answer for every verifier kind; False lets "state" tasks pass on
    # the env state even when the rollout rambled until max_new_tokens (RL then rewards that).
    c.rollout.require_answer = True
    # "sync": every turn of the batch in lockstep (KV kept across turns); "continuous": episodes
    # decode in slots that progress independently, env calls overlapped with decoding
    # (rl/engine.py). engine_slots: decode slots (0 = one per rollout of the step);
    # engine_chunk: decode steps per compiled call; engine_resume_lag: decode steps a turn's
    # env calls get before its slot waits for them (keeps runs deterministic).
    c.rollout.engine = "sync"
    c.rollout.engine_slots = 0
    c.rollout.engine_chunk = 16
    c.rollout.engine_resume_lag = 8

    c.rl.tasks_per_step = 8
    # Bounded-staleness async RL: a rollout thread runs ahead of the trainer by at most
    # max_staleness policy versions (0 = waits for every update: the synchronous loop's
    # rollouts); its env calls and sampling overlap the update and the eval. Single process.
    c.rl.async_rollouts = False
    c.rl.max_staleness = 1
    c.rl.advantage = "grpo"         # registered estimator: grpo | turn_aware | trace | ...
    c.rl.adv = ConfigDict({"lam": 0.5, "gamma": 0.5, "eps": 1e-6})
    c.rl.ok_call_bonus = 0.0        # dense shaping: + bonus x fraction of calls that executed ok
    c.rl.gold_turn_bonus = 0.0      # + bonus x fraction of turns matching the gold stage
    c.rl.arg_match_bonus = 0.0      # + bonus x fraction of gold argument values reproduced

    c.trace = ConfigDict()          # read when rl.advantage == "trace"
    c.trace.answer_prefix = "<answer>"  # text before the gold answer when scoring ℓ̄ (>= 1 token)
    c.trace.scorer = "single_pass"  # "single_pass" | "naive" (per-state reference)
    c.trace.pad_to = 64             # sequence-length bucket for the scorer (recompiles)

    # A run DIR whose SFT phase (same model, tasks, sft.steps, seed) this run starts from: its
    # checkpoint at the SFT end, tokenizer and task cache are copied. "" = train SFT here.
    c.train.warm_start = ""
    # RL tasks sampled at the rollout temperature at every eval (probe/*): train-rollout success
    # on one fixed set, which the per-step success (a new draw of tasks) is not. Capped at
    # train.eval_tasks; 0 = no probe.
    c.train.probe_tasks = 0
    c.train.eval_tasks = 128        # held-out tasks evaluated greedily
    c.train.log_ref_kl = False      # score the reference every RL step even with kl_coef 0
    return c


def memory_r2() -> ConfigDict:
    """Returns the defaults of a Memory-R2 run (SFT on gold memory operations, LoGo-GRPO)."""
    c = _base("memory_r2")
    c.env.num_workers = 0           # the bank server in-process (MCP in-memory transport)

    c.data = ConfigDict()
    c.data.train_seed = 1           # train / eval conversations come from disjoint seed ranges
    c.data.eval_seed = 2
    c.data.max_questions = 4        # final questions per conversation
    c.data.locomo_path = ""         # LoCoMo-format JSON file/dir: also evaluated when set
    c.data.locomo_limit = 0

    c.memory = ConfigDict()
    c.memory.roles = ("extractor", "manager", "answerer")   # roles that are trained
    c.memory.max_new_tokens = ConfigDict({"extractor": 24, "manager": 40, "answerer": 12})
    c.memory.temperature = 1.0
    c.memory.top_p = 1.0
    c.memory.max_facts = 4
    c.memory.manager_k = 2
    c.memory.answer_k = 3
    c.memory.max_ops = 4
    c.memory.qa_metric = "f1"       # per-answer reward: token F1 ("em" = exact match)
    c.memory.comp_coef = 0.2        # λ_comp (DESIGN §5; 0.3 at 32 sessions in the paper)
    c.memory.comp_theta = 0.7

    c.logo = ConfigDict()
    c.logo.local_coef = 1.0         # λ_local; 0 = global-only GRPO
    c.logo.local_fraction = 0.5     # fraction of sessions re-rolled locally
    c.logo.inner_n = 4              # K re-rollouts per local group

    c.curriculum = ConfigDict()
    c.curriculum.stages = (8, 16, 32)
    c.curriculum.threshold = 0.6    # greedy QA exact match at the current horizon to advance
    c.curriculum.min_evals = 1

    c.sft.convs_per_step = 4
    c.sft.num_sessions = 8
    c.sft.rows_per_step = 64

    c.rl.convs_per_step = 2
    c.rl.adv_eps = 1e-6

    c.eval = ConfigDict()
    c.eval.num_convs = 16
    c.eval.horizons = (8, 16)
    return c


def defaults(method: str) -> ConfigDict:
    """Returns the defaults of `method` (one of METHODS)."""
    if method not in METHODS:
        raise ValueError(f"config.method={method!r}; use one of {METHODS}")
    return tool_use() if method == "toolverse" else memory_r2()
