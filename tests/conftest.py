import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are reused across test processes and runs (CI compiles once per shape).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.expanduser("~"), ".cache", "toolverse_jax", "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
