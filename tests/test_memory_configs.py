"""Memory-R2 configs load; the Qwen3-4B config builds its mesh and first step on 8 fake devices."""

import pytest

from tests.multidevice import run_with_devices

_CODE = """
import json, tempfile
from configs.memory_r2_qwen3_4b import get_config
from toolverse_jax.rl.driver import run_training
c = get_config()
# Tiny stand-in for the 4B model; mesh, remat, micro-batching, LoGo settings are the config's.
c.model.preset, c.model.tokenizer, c.model.dtype = "tiny", "byte", "float32"
c.mesh.shape = (2, 2, 2)
c.env.num_workers = 1
c.memory.max_new_tokens.extractor = 16
c.memory.max_new_tokens.manager = 16
c.memory.max_new_tokens.answerer = 8
c.rl.steps, c.rl.convs_per_step, c.rl.group_size, c.logo.inner_n = 1, 1, 2, 2
c.train.num_micro, c.train.eval_every, c.train.progress = 2, 0, False
wd = tempfile.mkdtemp()
run_training(c, wd)
rows = [json.loads(l) for l in open(wd + "/metrics.jsonl")]
print("RESULT", json.dumps(rows[-1]))
"""


@pytest.mark.slow  # ~2 min on 2 free cores: compiles sampler + RL step on a 2x2x2 mesh
@pytest.mark.multidevice
def test_memory_r2_qwen3_4b_config_first_step_on_8_devices():
    import json
    out = run_with_devices(_CODE, 8)
    rec = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT"))[len("RESULT "):])
    assert rec["step"] == 1 and rec["phase"] == "rl" and rec["rollout/rows"] > 0
    assert rec["curriculum/sessions"] == 8.0


def test_memory_configs_load():
    from configs import memory_r2, memory_r2_qwen3_4b
    q, b = memory_r2.get_config(), memory_r2_qwen3_4b.get_config()
    assert q.method == b.method == "memory_r2"
    assert q.model.preset == "tiny" and b.model.preset == "qwen3-4b"
    assert set(q.keys()) == set(b.keys()) and tuple(b.curriculum.stages) == (8, 16, 32)
    assert b.rl.group_size == 16 and b.logo.inner_n == 4 and b.logo.local_fraction == 0.5
