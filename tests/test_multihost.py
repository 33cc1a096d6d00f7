"""Two local CPU processes (jax.distributed + gloo): one PPO train step on the global batch
assembled from each process's slice equals the single-process step on all rows."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from toolverse_jax.sharding.distributed import distributed_settings, process_slice

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CODE = r"""
import os, sys
import numpy as np
from toolverse_jax.sharding import distributed
n = distributed.initialize()
import jax, jax.numpy as jnp
from toolverse_jax.models import get_preset, init_params
from toolverse_jax.rl.batching import global_batch
from toolverse_jax.rl.types import Row
from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                      make_train_step, score_jit)
from toolverse_jax.sharding import make_mesh, shard_params, sharding_context
cfg = get_preset("tiny")
rng = np.random.default_rng(0)
rows = []
for i in range(4):   # different lengths, so the processes must agree on the padded length
    L = 20 + 9 * i
    toks = rng.integers(3, cfg.vocab_size, L).tolist()
    mask = [False] * 6 + [True] * (L - 6)
    rows.append(Row(toks, mask,
                    rng.normal(size=L).astype(np.float32),
                    (-rng.random(L)).astype(np.float32)))
mesh = make_mesh((-1, 1, 1))
opt = make_optimizer(1e-2, 1, 10)
params = init_params(cfg, jax.random.key(0))
with sharding_context(mesh):
    params = shard_params(params, cfg, mesh)
    state = init_train_state(params, opt)
    # share_prefix as the RL default asks: two processes run the plain layout (logged).
    batch = global_batch(distributed.process_slice(rows), 0, mesh, share_prefix=True)
    old, _ = score_jit(state.params, batch, cfg=cfg)
    batch = batch._replace(old_logprobs=old - 0.05, ref_logprobs=old)
    step = make_train_step(cfg, LossConfig(kl_coef=0.01), opt)
    state, m = step(state, batch)
    leaves = [np.asarray(distributed.local_params(x)) for x in jax.tree.leaves(state.params)]
if jax.process_index() == 0:
    np.savez(sys.argv[1], loss=float(m["loss"]), grad_norm=float(m["grad_norm"]),
             batch=np.asarray(batch.tokens.shape), procs=n, *leaves)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out, env_extra):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_extra,
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen([sys.executable, "-c", _CODE, str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_settings_and_slices(monkeypatch):
    assert distributed_settings(None) is None
    monkeypatch.setenv("TOOLVERSE_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="needs a coordinator address"):
        distributed_settings(None)
    monkeypatch.setenv("TOOLVERSE_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("TOOLVERSE_PROCESS_ID", "1")
    assert distributed_settings(None) == {"coordinator_address": "127.0.0.1:1234",
                                          "num_processes": 2, "process_id": 1}
    assert process_slice(list(range(6)), 1, 2) == [3, 4, 5]
    with pytest.raises(ValueError, match="multiple of 2"):
        process_slice(list(range(5)), 0, 2)


def test_two_process_train_step_equals_single_process(tmp_path):
    port = _free_port()
    multi = [_spawn(tmp_path / "multi.npz", {"TOOLVERSE_COORDINATOR": f"127.0.0.1:{port}",
                                            "TOOLVERSE_NUM_PROCESSES": "2",
                                            "TOOLVERSE_PROCESS_ID": str(i)}) for i in range(2)]
    single = _spawn(tmp_path / "single.npz", {})
    for p in multi + [single]:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    a, b = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    assert int(a["procs"]) == 2 and int(b["procs"]) == 1
    assert a["batch"].tolist() == b["batch"].tolist() == [4, 64]
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-5)
    keys = [k for k in a.files if k.startswith("arr_")]
    assert len(keys) > 5
    worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in keys)
    assert worst <= 1e-5, worst
    print("MULTIHOST", float(a["loss"]), float(b["loss"]), worst)


def _train_cmd(workdir):
    return [sys.executable, "-m", "experiments.train", "--config", "configs/quickstart.py",
            "--workdir", str(workdir), "--config.model.tokenizer=byte",
            "--config.tasks.num_tasks=40", "--config.sft.steps=2", "--config.sft.batch_size=4",
            "--config.rl.steps=1", "--config.rl.tasks_per_step=2", "--config.rl.group_size=2",
            "--config.rollout.max_new_tokens=12", "--config.train.eval_tasks=2",
            "--config.train.eval_every=1", "--config.train.eval_at_start=True",
            "--config.train.progress=False"]


def _records(workdir):
    import json
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_two_process_training_run_matches_single_process(tmp_path):
    """`experiments.train` on 2 processes: each samples its slice of the tasks against its own
    env pool; SFT losses on the global batch equal the single-process run's; process 0 logs."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen(_train_cmd(tmp_path / "multi"), cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**env, "TOOLVERSE_COORDINATOR": f"127.0.0.1:{port}",
                                   "TOOLVERSE_NUM_PROCESSES": "2",
                                   "TOOLVERSE_PROCESS_ID": str(i)}) for i in range(2)]
    procs.append(subprocess.Popen(_train_cmd(tmp_path / "single"), cwd=REPO, text=True, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
    multi, single = _records(tmp_path / "multi"), _records(tmp_path / "single")
    assert [r["step"] for r in multi] == [r["step"] for r in single] == [0, 1, 2, 3]
    for a, b in zip(multi[1:3], single[1:3]):
        assert a["phase"] == "sft"
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
        assert a["num_tokens"] == b["num_tokens"]
    rl = multi[3]
    assert rl["phase"] == "rl" and np.isfinite(rl["loss"])
    # Rollout metrics cover both processes' groups: 2 tasks x 2 rollouts.
    assert rl["rollout/infra_failed"] == 0 and 0 < rl["rollout/policy_tokens"] <= 3 * 12 + 1
    # Held-out eval after init, at the end of SFT and at the end; 2 tasks split over 2 processes.
    evals = [r for r in multi if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all(r["eval/success_rate"] in (0.0, 0.5, 1.0) for r in evals)
    assert os.path.exists(tmp_path / "multi" / "learning_curve.png")
    assert os.path.isdir(tmp_path / "multi" / "checkpoints" / "3")
