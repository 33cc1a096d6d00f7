"""MCP environment layer: catalog, built-in and synthesized servers, the env pool."""

from toolverse_jax.envs.catalog import Catalog, ServerEntry
from toolverse_jax.envs.episode import Episode, EpisodeSpec, Observation, episode_tools
from toolverse_jax.envs.pool import EnvPool

__all__ = ["Catalog", "ServerEntry", "EnvPool", "Episode", "EpisodeSpec", "Observation", "episode_tools"]
