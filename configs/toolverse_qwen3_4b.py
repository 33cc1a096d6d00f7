"""ToolVerse at real scale: Qwen3-4B from a local HF checkpoint, GUST tasks, sharded mesh.

    python -m experiments.train --config configs/toolverse_qwen3_4b.py \
        --config.model.checkpoint=/models/Qwen3-4B --config.tasks.path=/data/gust --workdir DIR

Not runnable on the CPU machines (no weights); tests build its mesh and first step on 8 fake
CPU devices with a tiny stand-in model.
"""

from ml_collections import ConfigDict

from configs import quickstart


def scale_up(c: ConfigDict) -> ConfigDict:
    """Returns `c` with the real-scale Qwen3-4B model, env, rollout and optimizer settings."""
    c.model.preset = "qwen3-4b"
    c.model.checkpoint = ""          # required: local HF Qwen3-4B directory (safetensors)
    c.model.tokenizer = "qwen3"      # offline Qwen3 BPE (or the checkpoint's tokenizer dir)
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.env.num_workers = 8
    c.env.call_timeout_s = 30.0
    c.rollout.max_turns = 16
    c.rollout.max_context = 16384
    c.rollout.max_new_tokens = 1024
    c.sft.steps = 0                  # a pretrained instruct model needs no warm start
    c.rl.steps = 300
    c.rl.tasks_per_step = 32
    c.rl.group_size = 8
    c.rl.lr = 1e-6
    c.rl.warmup_steps = 10
    c.rl.kl_coef = 0.001
    c.rl.arg_match_bonus = 0.0        # outcome reward (+ the gold-turn bonus)
    c.train.num_micro = 8
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    return c


def get_config() -> ConfigDict:
    c = scale_up(quickstart.get_config())
    c.mesh.shape = (-1, 4, 2)        # data x fsdp x tensor; one 8-GPU node: (1, 4, 2)
    c.tasks.source = "gust"
    c.tasks.path = ""                # GUST shards from experiments.generate_tasks
    c.tasks.split_by = "toolset"
    c.tasks.eval_fraction = 0.05
    c.rollout.tool_format = "json"
    c.rollout.prompt_tools = "all"
    c.rollout.max_observation_chars = 4000
    c.rl.advantage = "turn_aware"
    c.rl.clip_eps_high = 0.28
    c.train.eval_tasks = 200
    return c
