"""Memory-R2 on CPU: tiny byte-level model, generated multi-session histories, LoGo-GRPO.

SFT warm-start on gold memory operations (all three roles), then LoGo-GRPO (global trajectory
groups + local re-rollouts from snapshotted memory states) with the 8 -> 16 -> 32 session
curriculum. `python -m experiments.train --config configs/memory_r2.py --workdir DIR`;
global-only GRPO: `--config.logo.local_coef=0`.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.method = "memory_r2"          # experiments.train dispatches on this
    c.seed = 0

    c.model = ConfigDict()
    c.model.preset = "tiny"
    c.model.checkpoint = ""
    c.model.tokenizer = "byte"
    c.model.dtype = "float32"
    c.model.remat = False

    c.mesh = ConfigDict()
    c.mesh.shape = (-1, 1, 1)

    c.env = ConfigDict()
    c.env.num_workers = 0           # the bank server in-process (MCP in-memory transport)
    c.env.call_timeout_s = 10.0

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

    c.sft = ConfigDict()
    c.sft.steps = 400
    c.sft.convs_per_step = 4
    c.sft.num_sessions = 8
    c.sft.rows_per_step = 64
    c.sft.lr = 3e-3
    c.sft.warmup_steps = 20

    c.rl = ConfigDict()
    c.rl.steps = 40
    c.rl.convs_per_step = 2
    c.rl.group_size = 4
    c.rl.adv_eps = 1e-6
    c.rl.loss = "ppo_clip"
    c.rl.clip_eps_low = 0.2
    c.rl.clip_eps_high = 0.28
    c.rl.kl_coef = 0.0
    c.rl.entropy_coef = 0.0
    c.rl.tis_cap = 2.0
    c.rl.aggregation = "token_mean"
    c.rl.lr = 3e-4
    c.rl.warmup_steps = 2
    c.rl.weight_decay = 0.0
    c.rl.max_grad_norm = 1.0

    c.eval = ConfigDict()
    c.eval.num_convs = 16
    c.eval.horizons = (8, 16)

    c.train = ConfigDict()
    c.train.num_micro = 1
    c.train.eval_every = 10
    c.train.checkpoint_every = 20
    c.train.keep_checkpoints = 2
    c.train.progress = False
    return c
