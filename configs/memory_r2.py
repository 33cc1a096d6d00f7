"""Memory-R2 on CPU: tiny byte-level model, generated multi-session histories, LoGo-GRPO.

SFT warm-start on gold memory operations (all three roles), then LoGo-GRPO (global trajectory
groups + local re-rollouts from snapshotted memory states) with the 8 -> 16 -> 32 session
curriculum. `python -m experiments.train --config configs/memory_r2.py --workdir DIR`;
global-only GRPO: `--config.logo.local_coef=0`.
"""

from ml_collections import ConfigDict

from configs import common


def get_config() -> ConfigDict:
    c = common.memory_r2()          # every knob and its default; the run's own values below
    c.model.preset = "tiny"
    c.model.tokenizer = "byte"
    c.sft.steps = 400
    c.sft.warmup_steps = 20
    c.rl.steps = 40
    c.rl.group_size = 4
    c.rl.lr = 3e-4
    c.train.eval_every = 10
    c.train.checkpoint_every = 20
    c.train.progress = False
    return c
