"""RL-phase recipe search, second round: every arm from one 600-step SFT warm start (32.3%
held-out greedy on 130 tasks; pass@8 at T=1 41.7% on the first 48, mean sample 23.2%).

    python -m experiments.train --config configs/quickstart.py --workdir runs/qs_sft600 \
        --config.tasks.num_tasks=2000 --config.train.eval_tasks=130 --config.sft.steps=600 \
        --config.rl.steps=0                                   # the shared warm start, once
    python -m experiments.launch --config configs/quickstart.py --sweep sweeps/quickstart_rl_w600.py \
        --root runs/qs_rl_w600 --max_parallel 2 --config.train.warm_start=runs/qs_sft600 \
        --config.tasks.num_tasks=2000 --config.train.eval_tasks=130 --config.sft.steps=600

The first round (sweeps/quickstart_rl.py, a 16% warm start) found lr 5e-4 raises entropy and
truncation at temperature 1; this round asks whether a warm start that copies some literals
(pass@8 well above greedy) leaves RL room, at lower lr, with more updates per batch, and with
positive-only or down-weighted negative advantages (self-imitation) at an SFT-like lr.
The README's table lists what each arm measured.
"""

from toolverse_jax.launch import chain

BASE = {"rl.tasks_per_step": 8, "rl.group_size": 8, "rl.arg_match_bonus": 0.5}


def get_sweep():
    return chain(
        [{**BASE, "rl.lr": 2e-4, "rl.steps": 60},
         {**BASE, "rl.lr": 1e-4, "rollout.temperature": 0.7, "rl.steps": 60}],
        [{**BASE, "rl.lr": 2e-4, "rl.ppo_epochs": 4, "rl.num_minibatches": 2, "rl.kl_coef": 0.05,
          "rl.steps": 40},
         {**BASE, "rl.lr": 5e-4, "rl.ppo_epochs": 2, "rl.neg_adv_scale": 0.0, "rl.steps": 40}],
        [{**BASE, "rl.lr": 2e-3, "rl.neg_adv_scale": 0.0, "rl.steps": 40},
         {**BASE, "rl.lr": 2e-3, "rl.neg_adv_scale": 0.1, "rl.steps": 40}],
    )
