"""Turn-level credit on long horizons: GRPO vs TARA vs TRACE on GUST tasks of horizons 2-5.

The quickstart's servers, model and tokenizer, with multi-step tasks (each stage's calls must
run before the next stage's arguments exist) and one advantage-constant block that serves all
three estimators, so a sweep switches `rl.advantage` alone. RL seeds (`rl.seed`) share one SFT
warm start (`train.warm_start`); `sweeps/credit_horizons.py` holds the arms.

    python -m experiments.train --config configs/credit_horizons.py --workdir runs/ch_sft \
        --config.rl.steps=0
    python -m experiments.launch --config configs/credit_horizons.py \
        --sweep sweeps/credit_horizons.py --root runs/ch --config.train.warm_start=runs/ch_sft
"""

from ml_collections import ConfigDict

from configs import quickstart, trace_search


def get_config() -> ConfigDict:
    c = quickstart.get_config()
    c.tasks.horizons = (2, 3, 4, 5)
    c.tasks.num_tasks = 1200
    c.rollout.max_turns = 6          # horizon 5 + one turn of slack
    c.rollout.max_context = 1536
    c.sft.steps = 600
    c.rl.steps = 20
    c.rl.tasks_per_step = 8
    c.rl.group_size = 8
    c.rl.adv = ConfigDict({**trace_search.trace_constants().to_dict(),
                           "lam": 0.5, "gamma": 0.5})
    c.train.eval_every = 20
    c.train.eval_tasks = 128
    c.train.probe_tasks = 0
    return c
