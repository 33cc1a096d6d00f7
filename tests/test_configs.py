"""Real-scale configs build their mesh and run a first step on 8 fake CPU devices (tiny model)."""

import pytest

from tests.multidevice import run_with_devices

_CODE = """
import json, sys, tempfile
from configs.toolverse_qwen3_4b import get_config
from toolverse_jax.rl.driver import run_training
c = get_config()
# Tiny stand-in for the 4B model and the GUST shards; everything else (mesh, optimizer, remat,
# micro-batching, the estimator) is the real config's.
c.model.preset, c.model.tokenizer, c.model.dtype = "tiny", "byte", "float32"
c.mesh.shape = (2, 2, 2)
c.tasks.source, c.tasks.num_tasks, c.tasks.split_by, c.tasks.eval_fraction = "quickstart", 24, "task", 0.2
c.env.num_workers = 1
c.rollout.max_turns, c.rollout.max_new_tokens, c.rollout.max_context = 2, 16, 4096
c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 1, 2, 2
c.train.num_micro, c.train.eval_every, c.train.progress = 2, 0, False
wd = tempfile.mkdtemp()
run_training(c, wd)
rows = [json.loads(l) for l in open(wd + "/metrics.jsonl")]
print("RESULT", json.dumps(rows[-1]))
"""


@pytest.mark.slow  # ~2 min on 2 free cores: compiles the full RL step on a 2x2x2 mesh
@pytest.mark.multidevice
def test_toolverse_qwen3_4b_config_first_step_on_8_devices():
    out = run_with_devices(_CODE, 8)
    line = next(l for l in out.splitlines() if l.startswith("RESULT"))
    assert '"step": 1' in line and '"phase": "rl"' in line


def test_configs_load():
    from configs import quickstart, toolverse_qwen3_4b
    q, b = quickstart.get_config(), toolverse_qwen3_4b.get_config()
    assert q.model.preset == "tiny" and b.model.preset == "qwen3-4b"
    assert set(q.keys()) == set(b.keys())


def test_training_records_its_config_in_the_workdir(tmp_path):
    """WORKDIR/config.json is the latest invocation's resolved config; config_history.jsonl
    keeps one line per invocation, so a resumed run with other flags shows what changed."""
    import json

    from configs import quickstart
    from toolverse_jax.rl.driver import record_config

    c = quickstart.get_config()
    record_config(c, str(tmp_path))
    c.rl.steps = 7
    record_config(c, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["rl"]["steps"] == 7
    with open(tmp_path / "config_history.jsonl") as f:
        hist = [json.loads(line) for line in f]
    assert [h["config"]["rl"]["steps"] for h in hist] == [quickstart.get_config().rl.steps, 7]
    q = quickstart.get_config().tasks
    assert hist[0]["config"]["tasks"]["sft_fraction"] == q.sft_fraction
    assert hist[0]["config"]["tasks"]["instruction_level"] == q.instruction_level
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".config")]


@pytest.mark.parametrize("schedule,end_ratio", [("constant", 1.0), ("cosine", 0.1)])
def test_sft_schedule_is_read(schedule, end_ratio):
    """config.sft.schedule picks the SFT learning-rate schedule after warmup: Adam's step on a
    constant gradient is ~lr, so the last step's size reads the schedule's end value."""
    import jax.numpy as jnp
    import optax

    from configs import quickstart
    from toolverse_jax.rl.spec import RunSpec

    c = quickstart.get_config()
    c.sft.steps, c.sft.warmup_steps, c.sft.schedule = 40, 2, schedule
    opt = RunSpec.from_config(c).sft.optimizer
    params = {"w": jnp.zeros(())}
    state = opt.init(params)
    for _ in range(40):
        upd, state = opt.update({"w": jnp.ones(())}, state, params)
    assert abs(float(upd["w"])) == pytest.approx(end_ratio * c.sft.lr, rel=0.05)
    c.sft.schedule = "linear"
    with pytest.raises(ValueError, match="schedule"):
        RunSpec.from_config(c)


def test_compilation_cache_dir_is_read_and_set(tmp_path, monkeypatch):
    """train.compilation_cache_dir reaches JAX's persistent cache (an env var wins; "" = off)."""
    import os
    import jax
    from configs.quickstart import get_config
    from toolverse_jax.rl.driver import use_compilation_cache
    from toolverse_jax.rl.spec import RunSpec
    c = get_config()
    assert RunSpec.from_config(c).compilation_cache_dir == os.path.expanduser(
        "~/.cache/toolverse_jax/jax_cache")
    c.train.compilation_cache_dir = ""
    assert RunSpec.from_config(c).compilation_cache_dir == ""
    before = jax.config.jax_compilation_cache_dir
    try:
        use_compilation_cache(str(tmp_path / "env_wins"))  # conftest sets the env var
        assert jax.config.jax_compilation_cache_dir == before
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
        use_compilation_cache(str(tmp_path / "cache"))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert (tmp_path / "cache").is_dir()
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
