"""GRPO vs Turn-Aware (with and without future credit) on the quickstart: the launcher's CI sweep.

    python -m experiments.launch --config configs/quickstart.py --sweep sweeps/quickstart_smoke.py \
        --root runs/qs_smoke --max_parallel 2 --config.sft.steps=2 --config.rl.steps=2
"""

from toolverse_jax.launch import chain, product


def get_sweep():
    return chain([{"rl.advantage": "grpo"}],
                 product(**{"rl.advantage": ["turn_aware"], "rl.adv.lam": [0.0, 0.5]}))
