"""Tasks: tool dependency graph, DUSA generation, GUST dataset (DESIGN §4)."""

from toolverse_jax.tasks.dusa import (DusaConfig, dusa_generate, dusa_stages, observations_of,
                                      task_seed)
from toolverse_jax.tasks.executor import CallResult, Executor, PoolExecutor, run_programs
from toolverse_jax.tasks.graph import (build_tool_graph, graph_stats, longest_dependency_paths,
                                       refine_with_observations, tools_unlocked_by)
from toolverse_jax.tasks.gust import (GustFormatError, GustSource, generate_gust,
                                      load_or_generate_quickstart_tasks, make_dataset, read_tasks,
                                      split_tasks, write_shards)
from toolverse_jax.tasks.replay import verify_task, verify_tasks
from toolverse_jax.tasks.task import GoldStep, Task

__all__ = [
    "CallResult", "DusaConfig", "Executor", "GoldStep", "GustFormatError", "GustSource", "PoolExecutor", "Task",
    "build_tool_graph", "dusa_generate", "dusa_stages", "generate_gust", "graph_stats",
    "load_or_generate_quickstart_tasks", "longest_dependency_paths", "make_dataset",
    "observations_of", "read_tasks", "refine_with_observations", "run_programs", "split_tasks",
    "task_seed", "tools_unlocked_by", "verify_task", "verify_tasks", "write_shards",
]
