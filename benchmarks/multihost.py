"""The multi-host train step (2 local CPU processes, jax.distributed + gloo) vs one process.

    python -m benchmarks.multihost            # "small" preset, global batch 16 x 256 tokens
    python -m benchmarks.multihost --quick    # "tiny" preset, global batch 4 x 64 tokens

Both sides run the same jitted PPO-clip train step (`rl.trainer.make_train_step`) on the same
global batch of random rows: the baseline is one process holding every row on its one device;
the multi-host side is two processes, each building `rl.batching.global_batch` from its half of
the rows (the path `experiments.train` takes with TOOLVERSE_NUM_PROCESSES=2), data-parallel over
the two processes' devices, gradients all-reduced by XLA's gloo collectives. Reported: the median
step time after one compile step, tokens/s, and the loss of the first step on both sides (they
must agree: same rows, same params). On a single machine the two processes share its cores, so
the ratio measures the distributed path's overhead, not scaling across hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log(msg: str) -> None:
    print(f"[multihost] {msg}", file=sys.stderr, flush=True)


def random_rows(rng: np.random.Generator, batch: int, length: int, vocab: int) -> list[dict]:
    """Returns `batch` training rows of `length` + 1 random tokens (first eighth not in the loss)."""
    from toolverse_jax.rl.types import Row
    rows = []
    for _ in range(batch):
        n = length + 1
        mask = np.ones(n, bool)
        mask[: n // 8] = False
        rows.append(Row(rng.integers(3, vocab, n).tolist(), mask.tolist(),
                        rng.standard_normal(n).astype(np.float32),
                        (-rng.random(n)).astype(np.float32)))
    return rows


def worker(a: argparse.Namespace) -> dict:
    """Runs a.steps train steps in this process (one of TOOLVERSE_NUM_PROCESSES); returns times."""
    from toolverse_jax.sharding import distributed
    nproc = distributed.initialize()
    import jax

    from toolverse_jax.models import get_preset, init_params
    from toolverse_jax.rl.batching import global_batch
    from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                          make_train_step, score_jit)
    from toolverse_jax.sharding import make_mesh, shard_params, sharding_context

    cfg = get_preset(a.preset)
    rows = random_rows(np.random.default_rng(a.seed), a.batch, a.length, cfg.vocab_size)
    mesh = make_mesh((-1, 1, 1))
    opt = make_optimizer(1e-4, 1, a.steps)
    times, losses = [], []
    params = init_params(cfg, jax.random.key(a.seed))  # outside the context: init's dummy batch is 1
    with sharding_context(mesh):
        state = init_train_state(shard_params(params, cfg, mesh), opt)
        batch = global_batch(distributed.process_slice(rows), 0, mesh)
        old, _ = score_jit(state.params, batch, cfg=cfg)
        batch = batch._replace(old_logprobs=old, ref_logprobs=old)
        step = make_train_step(cfg, LossConfig(), opt)
        for _ in range(a.steps):
            t0 = time.perf_counter()
            state, m = step(state, batch)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
            losses.append(float(m["loss"]))
    return {"processes": nproc, "devices": jax.device_count(), "times": times,
            "losses": losses, "batch_shape": list(batch.tokens.shape)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(a: argparse.Namespace, out: str, env_extra: dict) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_extra,
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)  # one CPU device per process on both sides
    cmd = [sys.executable, "-m", "benchmarks.multihost", "--worker", out,
           "--preset", a.preset, "--batch", str(a.batch), "--length", str(a.length),
           "--steps", str(a.steps), "--seed", str(a.seed)]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait(procs: list[subprocess.Popen], timeout: float) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"worker exited {p.returncode}: {out[-2000:]}")


def run(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        single_out = os.path.join(tmp, "single.json")
        t0 = time.perf_counter()
        _wait([_spawn(a, single_out, {})], a.timeout)  # one after the other: they share the cores
        single_wall = time.perf_counter() - t0
        port = _free_port()
        outs = [os.path.join(tmp, f"multi{i}.json") for i in range(2)]
        t0 = time.perf_counter()
        _wait([_spawn(a, outs[i], {"TOOLVERSE_COORDINATOR": f"127.0.0.1:{port}",
                                   "TOOLVERSE_NUM_PROCESSES": "2",
                                   "TOOLVERSE_PROCESS_ID": str(i)}) for i in range(2)],
              a.timeout)
        multi_wall = time.perf_counter() - t0
        with open(single_out) as f:
            single = json.load(f)
        multi = []
        for o in outs:
            with open(o) as f:
                multi.append(json.load(f))
    s_med = float(np.median(single["times"][1:]))
    # A step ends when the slower process finishes it.
    m_times = np.max([m["times"] for m in multi], axis=0)
    m_med = float(np.median(m_times[1:]))
    tokens = a.batch * a.length
    return {
        "benchmark": "multihost",
        "single_process": {"step_s": round(s_med, 4), "tokens_per_s": round(tokens / s_med, 1),
                           "first_step_s": round(single["times"][0], 3),
                           "wall_s": round(single_wall, 2), "devices": single["devices"]},
        "two_processes": {"step_s": round(m_med, 4), "tokens_per_s": round(tokens / m_med, 1),
                          "first_step_s": round(float(m_times[0]), 3),
                          "wall_s": round(multi_wall, 2), "devices": multi[0]["devices"]},
        "ratio": round(s_med / m_med, 3),  # > 1: two processes are faster
        "first_loss": {"single": single["losses"][0], "two_processes": multi[0]["losses"][0]},
        "first_loss_abs_diff": abs(single["losses"][0] - multi[0]["losses"][0]),
        "batch_shape": single["batch_shape"],
        "config": {"preset": a.preset, "global_batch": a.batch, "length": a.length,
                   "steps": a.steps, "loss": "ppo_clip", "mesh": "data-parallel (-1, 1, 1)",
                   "note": "both sides on one machine: the processes share its cores"},
        "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(a.quick),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--batch", type=int, default=16, help="global rows (even)")
    p.add_argument("--length", type=int, default=256, help="tokens per row (a length bucket)")
    p.add_argument("--steps", type=int, default=5, help="train steps (the first is excluded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per side")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: JSON out path
    p.add_argument("--quick", action="store_true", help="tiny preset, 4 x 64 tokens, 3 steps")
    a = p.parse_args(argv)
    if a.quick:
        a.preset, a.batch, a.length, a.steps = "tiny", 4, 64, 3
    if a.batch % 2 or a.steps < 2:
        p.error("--batch must be even and --steps >= 2")
    return a


def main(argv=None) -> dict | None:
    a = parse_args(argv)
    if a.worker:
        rec = worker(a)
        import jax
        with open(a.worker, "w") as f:
            json.dump(rec, f)
        _log(f"process {jax.process_index()}: steps {[round(t, 3) for t in rec['times']]}")
        return None
    out = run(a)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
