"""GRPO vs TARA (turn_aware) vs TRACE on horizons 2-5 (configs/credit_horizons.py): three RL
seeds per estimator, every arm from the same SFT warm start. See that config's docstring for the
commands; `experiments.launch`'s table gives held-out success at the warm start and after RL."""

from toolverse_jax.launch import product


def get_sweep():
    return product(**{"rl.seed": [0, 1, 2], "rl.advantage": ["grpo", "turn_aware", "trace"]})
