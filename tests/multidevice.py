"""Runs a snippet in a fresh interpreter with N fake CPU devices (XLA_FLAGS must precede jax import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_devices(code: str, num_devices: int = 8, timeout: float = 600.0) -> str:
    """Returns the stdout of `code` run with `num_devices` fake CPU devices; raises on failure."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise AssertionError(
            f"multi-device subprocess failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout
