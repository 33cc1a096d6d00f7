"""RL-phase recipe search for the quickstart: arms share one SFT warm start.

    python -m experiments.train --config configs/quickstart.py --workdir runs/qs_sft \
        --config.rl.steps=0                                   # the shared warm start, once
    python -m experiments.launch --config configs/quickstart.py --sweep sweeps/quickstart_rl.py \
        --root runs/qs_rl --max_parallel 2 --config.train.warm_start=runs/qs_sft

Every arm resumes from the warm start's SFT checkpoint (config.train.warm_start), so the arms
differ only in their RL settings and the table compares RL gains from one start. The README's
sweep table lists the arms run so far and what each measured.
"""

from toolverse_jax.launch import chain, product

BASE = {"rl.lr": 5e-4, "rl.tasks_per_step": 6, "rl.group_size": 6, "rl.ppo_epochs": 1,
        "rollout.temperature": 1.0, "rl.arg_match_bonus": 0.0}


def get_sweep():
    return chain(
        [BASE,
         {**BASE, "rl.lr": 1e-3, "rl.tasks_per_step": 8, "rl.group_size": 8, "rl.ppo_epochs": 2}],
        product(**{"rollout.temperature": [0.5], "rl.arg_match_bonus": [0.0, 0.5]}),
        # Held-out calls stopped executing under RL (invalid 2% -> 15-19% after 20 steps):
        # hold the policy near the warm start, or push failures down less.
        [{"rollout.temperature": 0.5, "rl.arg_match_bonus": 0.5, "rl.kl_coef": 0.1},
         {"rollout.temperature": 0.5, "rl.arg_match_bonus": 0.5, "rl.neg_adv_scale": 0.2}],
        # Both keep held-out calls executing; learn faster inside that leash.
        [{"rollout.temperature": 0.7, "rl.arg_match_bonus": 0.5, "rl.kl_coef": 0.1,
          "rl.neg_adv_scale": 0.2, "rl.lr": 1e-3},
         {"rollout.temperature": 0.5, "rl.arg_match_bonus": 0.5, "rl.kl_coef": 0.1,
          "rl.lr": 2e-3}],
    )
