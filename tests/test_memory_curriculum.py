"""Session curriculum: transitions on the validation threshold, JSON round trip, resume in a run."""

import json
import os

import pytest

from toolverse_jax.memory.curriculum import Curriculum


def test_transitions():
    c = Curriculum((8, 16, 32), threshold=0.5, min_evals=2)
    assert c.num_sessions == 8
    assert not c.observe(10, 0.9)          # first eval at the stage: min_evals=2 not reached
    assert not c.observe(20, 0.4)          # below threshold
    assert c.observe(30, 0.5) and c.num_sessions == 16   # threshold is inclusive
    assert not c.observe(40, 1.0) and c.num_sessions == 16  # the eval counter restarted
    assert c.observe(50, 0.7) and c.num_sessions == 32 and c.final
    assert not c.observe(60, 1.0) and c.num_sessions == 32
    assert c.transitions == [{"step": 30, "from": 8, "to": 16, "accuracy": 0.5},
                             {"step": 50, "from": 16, "to": 32, "accuracy": 0.7}]


def test_json_round_trip_and_errors():
    c = Curriculum((8, 16, 32), 0.6)
    c.observe(5, 0.1)
    c.observe(7, 0.8)
    d = json.loads(json.dumps(c.to_json()))
    r = Curriculum.from_json(d, (8, 16, 32))
    assert r.to_json() == c.to_json() and r.num_sessions == 16
    with pytest.raises(ValueError, match="differ from the config"):
        Curriculum.from_json(d, (8, 32))
    with pytest.raises(ValueError, match="increasing"):
        Curriculum((16, 8))


_OVERRIDES = ["--config.sft.steps=2", "--config.sft.convs_per_step=1",
              "--config.sft.rows_per_step=8", "--config.rl.convs_per_step=1",
              "--config.rl.group_size=2", "--config.logo.inner_n=2", "--config.eval.num_convs=2",
              "--config.eval.horizons=(8,)", "--config.curriculum.threshold=0.0",
              "--config.train.eval_every=1", "--config.memory.max_new_tokens.manager=16"]


@pytest.mark.slow  # ~1-2 min: compiles the sampler and the train step
def test_run_advances_and_resumes_at_the_stage(tmp_path):
    import subprocess
    import sys

    from tests.multidevice import REPO_ROOT

    wd = str(tmp_path / "run")

    def run(rl_steps):
        subprocess.run([sys.executable, "-m", "experiments.train", "--config",
                        "configs/memory_r2.py", "--workdir", wd, f"--config.rl.steps={rl_steps}",
                        *_OVERRIDES], cwd=REPO_ROOT, check=True, capture_output=True)
        return [json.loads(l) for l in open(f"{wd}/metrics.jsonl")]

    recs = run(1)
    # threshold 0: the eval after the first RL step advances 8 -> 16
    assert recs[-1]["step"] == 3 and recs[-1]["curriculum/advanced"] == 1.0
    assert recs[-1]["curriculum/stage"] == 1.0 and recs[-1]["rollout/rows"] > 0
    recs = run(2)
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    # the resumed step trains on 16-session histories and the stage advances once more
    assert recs[-1]["curriculum/sessions"] == 16.0 and recs[-1]["curriculum/stage"] == 2.0
    summary = json.load(open(f"{wd}/summary.json"))
    assert [t["to"] for t in summary["curriculum"]["transitions"]] == [16, 32]


def test_memory_program_runs_through_the_driver(tmp_path):
    """The fast variant of the run above: 1 SFT + 1 LoGo-GRPO step in-process through
    rl.driver (config.method picks the Memory-R2 program), no evals."""
    from configs.memory_r2 import get_config
    from toolverse_jax.rl.driver import run_training
    c = get_config()
    c.sft.steps, c.sft.convs_per_step, c.sft.rows_per_step = 1, 1, 8
    c.rl.steps, c.rl.convs_per_step, c.rl.group_size, c.logo.inner_n = 1, 1, 2, 2
    c.memory.max_new_tokens.extractor = c.memory.max_new_tokens.manager = 8
    c.memory.max_new_tokens.answerer = 4
    c.train.eval_every = 0
    summary = run_training(c, str(tmp_path))
    recs = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert summary["final_step"] == 2 and [r["phase"] for r in recs] == ["sft", "rl"]
    assert recs[1]["curriculum/sessions"] == 8.0 and recs[1]["rollout/rows"] > 0
    assert os.path.isdir(tmp_path / "checkpoints" / "2")
