"""MCP environment layer: catalog, built-in and synthesized servers, the env pool."""

from toolverse_jax.envs.catalog import Catalog, ServerEntry
from toolverse_jax.envs.pool import EnvPool, Episode, EpisodeSpec, Observation, episode_tools

__all__ = ["Catalog", "ServerEntry", "EnvPool", "Episode", "EpisodeSpec", "Observation", "episode_tools"]
