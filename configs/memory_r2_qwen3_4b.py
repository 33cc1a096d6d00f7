"""Memory-R2 at real scale: Qwen3-4B from a local HF checkpoint, LoGo-GRPO, 8 -> 16 -> 32 sessions.

    python -m experiments.train --config configs/memory_r2_qwen3_4b.py \
        --config.model.checkpoint=/models/Qwen3-4B --workdir DIR

Not runnable on the CPU machines (no weights); a test builds its mesh and first step on 8 fake
CPU devices with a tiny stand-in model.
"""

from ml_collections import ConfigDict

from configs import memory_r2


def get_config() -> ConfigDict:
    c = memory_r2.get_config()
    c.model.preset = "qwen3-4b"
    c.model.checkpoint = ""          # required: local HF Qwen3-4B directory (safetensors)
    c.model.tokenizer = "qwen3"
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.mesh.shape = (-1, 4, 2)        # data x fsdp x tensor; one 8-GPU node: (1, 4, 2)
    c.env.num_workers = 8            # bank servers as stdio subprocesses
    c.env.call_timeout_s = 30.0
    c.data.max_questions = 8
    c.memory.max_new_tokens = ConfigDict({"extractor": 256, "manager": 384, "answerer": 64})
    c.memory.manager_k = 5
    c.memory.answer_k = 10
    c.memory.max_facts = 16
    c.memory.max_ops = 16
    c.logo.local_coef = 1.0
    c.logo.local_fraction = 0.5
    c.logo.inner_n = 4
    c.curriculum.threshold = 0.6
    c.sft.steps = 0                  # a pretrained instruct model needs no warm start
    c.rl.steps = 300
    c.rl.convs_per_step = 8
    c.rl.group_size = 16             # DESIGN §5: n = 16 rollouts per conversation chunk
    c.rl.lr = 1e-6
    c.rl.warmup_steps = 10
    c.rl.kl_coef = 0.001
    c.eval.num_convs = 64
    c.eval.horizons = (8, 16, 32)
    c.train.num_micro = 8
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    return c
