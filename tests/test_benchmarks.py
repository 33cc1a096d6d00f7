"""Benchmarks: FLOP formula by hand, matmul peak on a tiny size, all.py plumbing; quick runs (slow)."""

import json
import sys

import numpy as np
import pytest

from benchmarks import all as bench_all
from benchmarks import gpu_check, grpo_trl, multihost, sampler, search_index, smollm2_sampler, train_step
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
    assert bench_all.parse_extra(['logprob=--tokens 1024 "4096"', "logprob=--repeats 1"],
                                 names) == {"logprob": ["--tokens", "1024", "4096",
                                                        "--repeats", "1"]}
    with pytest.raises(ValueError, match="NAME=FLAGS"):
        bench_all.parse_extra(["nosuch=--x"], names)
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


def test_smollm2_sampler_prefix_count_and_flags():
    assert smollm2_sampler.common_prefix([1, 2, 3, 4], np.array([1, 2, 9, 4])) == 2
    assert smollm2_sampler.common_prefix([5, 6], [5, 6, 7]) == 2
    q = smollm2_sampler.parse_args(["--quick"])
    assert (q.batches, q.new_tokens, q.repeats) == ([1, 2], 16, 1)
    assert smollm2_sampler.parse_args([]).batches == [1, 4]


@pytest.mark.slow  # loads the 135M-param GGUF twice (ours, transformers'): minutes on 2 cores
def test_smollm2_sampler_quick_run():
    pytest.importorskip("gguf")
    out = smollm2_sampler.run(smollm2_sampler.parse_args(["--quick"]))
    json.dumps(out)
    if "skipped" in out:
        pytest.skip(out["skipped"])
    assert out["ours_tokens_per_s"] > 0 and out["hf_tokens_per_s"] > 0
    assert set(out["batches"]) == {"1", "2"}
    # the same dequantized weights read by two GGUF readers: greedy tokens agree
    assert out["greedy_equal_tokens"] == out["greedy_checked"] == 16
    assert out["ours_text"] == out["hf_text"]


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


def test_grpo_trl_prompts_have_one_length_and_round_trip():
    from toolverse_jax.models.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    prompts = grpo_trl.fixed_length_prompts(tok, 5, 24)
    assert len(prompts) == 5
    assert all(len(tok.encode(p)) == 24 for p in prompts)
    with pytest.raises(ValueError, match="need 100000"):
        grpo_trl.fixed_length_prompts(tok, 100000, 24)
    assert 0.0 <= grpo_trl.reward_text("abc e") <= 1.0 and grpo_trl.reward_text("") == 0.0


@pytest.mark.slow
def test_grpo_trl_quick_run():
    pytest.importorskip("trl")
    out = grpo_trl.run(grpo_trl.parse_args(["--quick"]))
    json.dumps(out)
    assert out["ours"]["step_s"] > 0 and out["trl"]["step_s"] > 0
    assert out["ours_plain"]["step_s"] > 0 and out["speedup_vs_trl_plain"] > 0
    assert out["trl"]["completion_mean_length"] == 16.0
    assert out["trl"]["tokens_per_step"] == out["ours"]["tokens_per_step"]


def test_headlines_for_trl_and_multihost_records():
    trl = {"name": "grpo_trl", "ok": True, "result": {
        "ours": {"step_no_scoring_s": 0.04, "rollout_s": 0.03, "update_s": 0.01, "scoring_s": 0.005},
        "trl": {"step_s": 0.06}, "speedup_vs_trl": 1.5}}
    ours, base, ratio = bench_all.headline(trl)
    assert "0.04 s/step" in ours and "TRL GRPOTrainer 0.06" in base and ratio == "1.5"
    trl["result"]["ours_plain"] = {"step_no_scoring_s": 0.05, "update_s": 0.02}
    trl["result"]["speedup_vs_trl_plain"] = 1.2
    assert "rl.share_prefix=False 0.05 s/step (update 0.02, 1.2x TRL)" in bench_all.headline(trl)[0]
    trl["result"]["trl"] = {"skipped": "trl not installed"}
    assert "TRL skipped: trl not installed" in bench_all.headline(trl)[1]
    mh = {"name": "multihost", "ok": True, "result": {
        "single_process": {"step_s": 0.01, "tokens_per_s": 100.0},
        "two_processes": {"step_s": 0.1, "tokens_per_s": 10.0},
        "ratio": 0.1, "first_loss_abs_diff": 1e-10}}
    ours, base, ratio = bench_all.headline(mh)
    assert "2 processes" in ours and "1.0e-10" in ours and "1 process: 0.01" in base
    assert ratio == "0.1"


def test_multihost_args_and_rows():
    a = multihost.parse_args(["--quick"])
    assert (a.preset, a.batch, a.length, a.steps) == ("tiny", 4, 64, 3)
    with pytest.raises(SystemExit):
        multihost.parse_args(["--batch", "3"])
    rows = multihost.random_rows(np.random.default_rng(0), 3, 16, 50)
    assert len(rows) == 3 and all(len(r.tokens) == 17 for r in rows)
    assert all(3 <= t < 50 for r in rows for t in r.tokens)
    assert not any(rows[0].policy_mask[:2]) and all(rows[0].policy_mask[2:])


@pytest.mark.slow
def test_multihost_quick_run():
    out = multihost.run(multihost.parse_args(["--quick"]))
    json.dumps(out)
    assert out["two_processes"]["devices"] == 2 and out["single_process"]["devices"] == 1
    assert out["first_loss_abs_diff"] < 1e-5
    assert out["batch_shape"] == [4, 64]


def test_gpu_check_summary_and_group_kill():
    res = {"env": {"jax": {"device_kind": "NVIDIA H200", "backend": "gpu"}},
           "logprob_kernel": {
               "naive": {"configs": {"bfloat16_N4096": {"fwd": {"median_s": 2.0, "temp_bytes": 100},
                                                         "fwd_bwd": {"median_s": 4.0}}}},
               "pallas": {"configs": {"bfloat16_N4096": {
                   "fwd": {"median_s": 1.0, "temp_bytes": 5},
                   "fwd_bwd": {"error": {"type": "XlaRuntimeError", "message": "smem"}},
                   "rel_err_vs_naive": {"ok": True}}},
                   "pallas_tile_sweep": {"bfloat16": {
                       "16x32": {"fwd": {"median_s": 0.5}, "bwd_only": {"median_s": 1.0}},
                       "64x64": {"fwd": {"error": {"type": "ValueError"}}, "bwd_only": {}}}}}},
           "train_step": {"auto": {"step": {"median_step_s": 0.5, "compile_s": 30.0}},
                          "pallas": {"skipped": "x"}},
           "tests": {"skipped": "no hypothesis"}}
    s = gpu_check.summarize(res)
    row = s["logprob_pallas_vs_naive_bfloat16_N4096"]
    assert row["time_ratio_fwd"] == 0.5 and row["temp_bytes_ratio_fwd"] == 0.05
    assert row["fwd_bwd_error"] == "XlaRuntimeError" and row["errors_ok"] is True
    assert s["pallas_tiles_bfloat16"] == {"fastest_ok": ["16x32: fwd 0.5 s, bwd 1.0 s"],
                                          "ok": 1, "failed": 1}
    assert s["train_step_auto"]["median_step_s"] == 0.5 and s["tests"] == "no hypothesis"
    assert "error" in gpu_check.summarize({"env": []})  # a malformed record does not raise
    # A part past its cap is killed with its whole process group, and its output is kept.
    rc, out, timed_out = gpu_check.run_group(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 3)
    assert timed_out and rc == -9 and "started" in out


def test_gpu_check_env_section_runs_in_a_child(tmp_path):
    out = gpu_check.main(["--sections", "env", "--out", str(tmp_path / "g.json")])
    assert json.loads((tmp_path / "g.json").read_text())["env"]["our_imports"] == \
        out["env"]["our_imports"]
    env = out["env"]
    assert env["_child"]["rc"] == 0 and env["jax"]["device_count"] >= 1
    assert env["our_imports"]["toolverse_jax.rl.trainer"] == "ok"
    assert env["kernel_dispatch"]["auto_resolves_to"] == "chunked"
    assert "logprob_kernel" not in out and out["summary"]["device"] == env["jax"]["device_kind"]


@pytest.mark.slow
def test_gpu_check_quick_run():
    out = gpu_check.main(["--quick"])
    json.dumps(out)
    lp = out["logprob_kernel"]
    for impl in ("naive", "chunked", "pallas"):
        assert lp[impl]["_child"]["rc"] == 0, lp[impl]
        for c in lp[impl]["configs"].values():
            assert c["fwd"]["median_s"] > 0 and c["fwd_bwd"]["median_s"] > 0
    assert all(c["rel_err_vs_naive"]["ok"] for c in lp["pallas"]["configs"].values())
    assert out["train_step"]["auto"]["step"]["mfu_vs_measured_bf16_matmul"] > 0
    assert out["sampler"]["ours"]["ours"]["tokens_per_s"] > 0
    assert "passed" in out["tests"]["summary"]


def test_search_index_pieces_and_workers(tmp_path, monkeypatch):
    from toolverse_jax.envs.builtin import search as srv
    docs = search_index.make_corpus(300, 2000, seed=1)
    assert docs == search_index.make_corpus(300, 2000, seed=1) and len(docs) == 300
    queries = search_index.make_queries(docs, 12, seed=1)
    assert len(queries) == 12 and all(2 <= len(q.split()) <= 4 for q in queries)
    with open(tmp_path / "corpus.jsonl", "w") as f:
        f.write("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "queries.json").write_text(json.dumps(queries))
    monkeypatch.setenv(srv.INDEX_ENV, str(tmp_path / "index"))
    srv.ensure_index(str(tmp_path))
    new = search_index.worker("bm25s", str(tmp_path), 5)
    old = search_index.worker("rank_bm25", str(tmp_path), 5)
    for w in (new, old):
        assert w["query_ms_median"] > 0 and w["search_ms_median"] > 0 and w["peak_rss_mb"] > 0
        assert len(w["results"]) == 12 and all(1 <= len(r) <= 5 for r in w["results"])
    # every query's words come from a document: both servers find that document's terms
    assert sum(a[0] == b[0] for a, b in zip(new["results"], old["results"])) >= 6
    with pytest.raises(SystemExit):
        search_index.parse_args(["--docs", "5", "--k", "10"])


@pytest.mark.slow
def test_search_index_quick_run():
    pytest.importorskip("rank_bm25")
    out = search_index.run(search_index.parse_args(["--quick"]))
    json.dumps(out)
    assert out["config"]["docs"] == 5000 and out["quick"]
    for lib in ("bm25s", "rank_bm25"):
        assert out[lib]["build_s"] > 0 and out[lib]["query_ms_median"] > 0, lib
    assert out["bm25s"]["load_mmap_s"] > 0 and out["bm25s"]["index_mb"] > 0
    assert out["worker_start_speedup"] > 1 and out["query_speedup"] > 1
    assert 0.0 <= out["top1_agreement"] <= out["old_top1_in_new_top10"] <= 1.0
