"""Tasks: tool dependency graph, DUSA generation, GUST dataset (DESIGN §4)."""

from toolverse_jax.tasks.dusa import DusaConfig, dusa_generate, dusa_stages, task_seed
from toolverse_jax.tasks.executor import CallResult, Executor, PoolExecutor, run_programs
from toolverse_jax.tasks.graph import (build_tool_graph, graph_stats, longest_dependency_paths,
                                       refine_with_observations, tools_unlocked_by)
from toolverse_jax.tasks.replay import verify_task, verify_tasks
from toolverse_jax.tasks.task import GoldStep, Task

__all__ = [
    "CallResult", "DusaConfig", "Executor", "GoldStep", "PoolExecutor", "Task",
    "build_tool_graph", "dusa_generate", "dusa_stages", "graph_stats",
    "longest_dependency_paths", "refine_with_observations", "run_programs", "task_seed",
    "tools_unlocked_by", "verify_task", "verify_tasks",
]
