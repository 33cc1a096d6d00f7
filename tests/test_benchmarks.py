"""Benchmarks: FLOP formula by hand, matmul peak on a tiny size, all.py plumbing; quick runs (slow)."""

import json

import numpy as np
import pytest

from benchmarks import all as bench_all
from benchmarks import sampler, train_step
from toolverse_jax.models import ModelConfig


def test_train_step_flops_by_hand():
    cfg = ModelConfig(vocab_size=100, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=4, mlp_dim=16)
    # per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; mlp 3*8*16 = 384; unembedding 100*8
    n = 2 * (192 + 384) + 800
    f = train_step.train_step_flops(cfg, batch=3, length=5)
    assert f["matmul_params"] == n == 1952
    assert f["dense"] == 6 * 1952 * 15
    assert f["attention"] == 12 * 2 * 2 * 4 * 3 * 25
    assert f["total"] == f["dense"] + f["attention"]


def test_matmul_peak_tiny_is_positive_and_finite():
    peak = train_step.matmul_peak(64, 32, 16, repeats=2)
    assert np.isfinite(peak) and peak > 0


def test_all_plumbing(tmp_path):
    names = bench_all.discover()
    assert "sampler" in names and "train_step" in names
    assert "all" not in names and "logprob_gpu_check" not in names
    assert bench_all.quick_args("sampler") == ["--quick"]
    assert bench_all.quick_args("envs") == bench_all.QUICK_ARGS["envs"]
    assert bench_all.last_json_line('log\n{"a": 1}\nnot json\n') == {"a": 1}
    assert bench_all.last_json_line("no json here") is None
    fail = {"name": "x", "ok": False, "error": "exit 1: boom", "wall_s": 0.1}
    ok = {"name": "sampler", "ok": True, "wall_s": 1.0, "args": [], "result": {
        "ours_tokens_per_s": 10.0, "hf_tokens_per_s": 2.0, "ratio": 5.0, "compile_s": 1.0,
        "greedy_match": 1.0}}
    machine = {"date": "d", "platform": "p", "cpu_count": 2, "jax_version": "v", "loadavg": [1]}
    path = tmp_path / "r.md"
    bench_all.write_markdown([ok, fail], machine, str(path), quick=True)
    text = path.read_text()
    assert "| sampler |" in text and "FAILED: exit 1: boom" in text and "| 5 |" in text


@pytest.mark.slow
def test_sampler_quick_run():
    out = sampler.run(sampler.parse_args(["--quick"]))
    json.dumps(out)
    for k in ("ours_tokens_per_s", "hf_tokens_per_s", "ratio", "compile_s"):
        assert out[k] > 0, k
    assert 0.0 <= out["greedy_match"] <= 1.0
    assert out["threads"]["torch"] == out["threads"]["jax"]
    assert len(out["loadavg"]) == 3


@pytest.mark.slow
def test_train_step_quick_run():
    out = train_step.run(train_step.parse_args(["--quick"]))
    json.dumps(out)
    assert out["matmul_peak"]["flops_per_s"] > 0
    t = out["train_step"]
    for k in ("flops_per_step", "median_step_s", "flops_per_s", "utilization"):
        assert t[k] > 0, k
    rl = out["rl_step"]
    for k in ("rollout_s", "scoring_s", "update_s", "step_s"):
        assert rl[k] > 0, k
    assert rl["advantages_s"] >= 0
