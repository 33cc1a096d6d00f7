"""RL-phase recipe search on the scarce-demonstration quickstart (the default config): arms share
one SFT warm start (300 steps on 15% of the train tasks) and differ in their RL settings.

    python -m experiments.train --config configs/quickstart.py --workdir runs/ws \
        --config.rl.steps=0                                   # the shared warm start, once
    python -m experiments.launch --config configs/quickstart.py \
        --sweep sweeps/quickstart_rl_scarce.py --root runs/scarce --max_parallel 2 \
        --config.train.warm_start=runs/ws

Question: what lifts held-out success beyond the default's +10 in 100 RL steps? 55-75% of the
default's groups have zero advantage (all 8 rollouts scored alike), so more rollouts per task,
and more updates per rollout batch, are the first levers. docs/results/rl_scarce_sweep.md
holds the table.
"""


def get_sweep():
    return [
        {},                                                   # the default (reference)
        {"rl.group_size": 16},                                # 8 tasks x 16: fewer silent groups
        {"rl.tasks_per_step": 4, "rl.group_size": 16},        # same rollouts, larger groups
        {"rl.lr": 2e-3},
        {"rl.ppo_epochs": 2, "rl.num_minibatches": 2},        # 4 updates per rollout batch
    ]
