"""XManager-style experiment launcher: a config plus a sweep of overrides, run as work units."""

from toolverse_jax.launch.experiment import (Experiment, LocalExecutor, WorkUnit, final_metrics)
from toolverse_jax.launch.sweep import (chain, check_overrides, load_config, load_sweep, product,
                                        to_flags)

__all__ = ["Experiment", "LocalExecutor", "WorkUnit", "final_metrics", "chain",
           "check_overrides", "load_config", "load_sweep", "product", "to_flags"]
