"""toolverse_jax: RL for long-horizon tool-using LLM agents in JAX (ToolVerse, TRACE, Memory-R2)."""

__version__ = "0.1.0"
