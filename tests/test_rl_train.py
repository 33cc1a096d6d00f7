"""Train step, resume (bit-exact), corrupt/mismatched checkpoints, config overrides."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import get_preset, init_params
from toolverse_jax.rl.checkpoint import CheckpointMismatchError, CorruptCheckpointError
from toolverse_jax.rl.types import Row
from toolverse_jax.rl.batching import pack_rows
from toolverse_jax.rl.trainer import LossConfig, init_train_state, make_optimizer, make_train_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(n=4):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        L = 20 + 7 * i
        rows.append(Row(rng.integers(0, 256, L).tolist(), (rng.random(L) > 0.4).tolist(),
                        rng.normal(size=L).astype(np.float32),
                        -np.abs(rng.normal(size=L)).astype(np.float32)))
    return rows


def test_grad_accumulation_equals_one_big_batch():
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    opt = make_optimizer(1e-2, 1, 10)
    out = []
    for micro in (1, 2):
        batch = pack_rows(_rows(), 0, num_micro=micro)
        step = make_train_step(cfg, LossConfig(name="sft"), opt, num_micro=micro)
        state, m = step(init_train_state(jax.tree.map(jnp.copy, params), opt), batch)
        out.append((state.params, float(m["loss"])))
    assert out[0][1] == pytest.approx(out[1][1], rel=1e-5)
    for a, b in zip(jax.tree.leaves(out[0][0]), jax.tree.leaves(out[1][0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_bf16_params_train_step_keeps_dtypes_and_tracks_float32():
    # bf16 params give bf16 grads; the micro-batch accumulator is float32 (a bf16 scan carry
    # failed to trace: "carry input and carry output must have equal types").
    import dataclasses
    cfg32 = get_preset("tiny")
    cfg16 = dataclasses.replace(cfg32, param_dtype="bfloat16", dtype="bfloat16")
    params = init_params(cfg32, jax.random.key(0))
    opt = make_optimizer(1e-3, 1, 10)
    losses = {}
    for name, cfg in (("f32", cfg32), ("bf16", cfg16)):
        p = jax.tree.map(lambda x: jnp.array(x, dtype=cfg.jnp_param_dtype), params)  # a copy: donated
        step = make_train_step(cfg, LossConfig(name="sft"), opt, num_micro=2)
        state, m = step(init_train_state(p, opt), pack_rows(_rows(), 0, num_micro=2))
        assert all(x.dtype == cfg.jnp_param_dtype for x in jax.tree.leaves(state.params))
        assert np.isfinite(float(m["grad_norm"])) and float(m["grad_norm"]) > 0
        losses[name] = float(m["loss"])
    assert losses["bf16"] == pytest.approx(losses["f32"], rel=2e-2)


def test_sft_steps_reduce_loss():
    cfg = get_preset("tiny")
    opt = make_optimizer(3e-3, 1, 20)
    state = init_train_state(init_params(cfg, jax.random.key(1)), opt)
    step = make_train_step(cfg, LossConfig(name="sft"), opt)
    batch = pack_rows(_rows(), 0)
    losses = []
    for _ in range(8):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0] - 0.5


def _config(**over):
    from configs.quickstart import get_config
    c = get_config()
    c.model.preset = "tiny"
    c.tasks.num_tasks = 40
    c.tasks.eval_fraction = 0.1
    c.sft.steps, c.sft.batch_size = 2, 4
    c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 2, 2, 2
    c.rollout.max_new_tokens, c.rollout.max_turns, c.rollout.max_context = 24, 2, 768
    c.train.eval_every, c.train.checkpoint_every, c.train.progress = 0, 1, False
    for k, v in over.items():
        sub, key = k.split(".")
        c[sub][key] = v
    return c


def _losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r.get("loss") for r in map(json.loads, f)}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    from toolverse_jax.rl.driver import run_training
    wd = str(tmp_path_factory.mktemp("full"))
    run_training(_config(), wd)
    return wd


def test_resume_gives_bit_exact_next_step(full_run, tmp_path):
    from toolverse_jax.rl.driver import run_training
    wd = str(tmp_path / "resumed")
    run_training(_config(**{"rl.steps": 1}), wd)        # stops after step 3 (2 SFT + 1 RL)
    run_training(_config(), wd)                          # resumes, runs step 4
    a, b = _losses(full_run), _losses(wd)
    assert sorted(b) == [1, 2, 3, 4]
    assert a[4] == b[4] and a[3] == b[3]  # bit-exact on CPU
    assert os.path.exists(os.path.join(wd, "learning_curve.png"))


def test_inspect_rollouts_on_a_run_split(full_run):
    from experiments.inspect_rollouts import inspect, summarize
    from types import SimpleNamespace as T

    s = summarize([T(task_id="a", success=True), T(task_id="a", success=False),
                   T(task_id="b", success=False), T(task_id="b", success=False)])
    assert s == {"tasks": 2, "mean_success": 0.25, "pass_at_k": 0.5}
    summary, trajs, tok = inspect(_config(), full_run, "eval", n=2, k=2, temperature=1.0)
    assert summary["step"] == 4 and summary["tasks"] == 2 and len(trajs) == 4
    assert 0.0 <= summary["mean_success"] <= summary["pass_at_k"] <= 1.0
    assert tok.decode(trajs[0].tokens).startswith("<|im_start|>system")
    with pytest.raises(ValueError, match="temperature"):
        inspect(_config(), full_run, "eval", n=2, k=2, temperature=0.0)


def test_probe_tasks_are_one_fixed_set_sampled_at_every_eval(tmp_path):
    from toolverse_jax.rl.driver import run_training
    wd = str(tmp_path / "probe")
    # (Also runs the SFT phase with fresh literals per demonstration: tasks/augment.py.)
    run_training(_config(**{"train.eval_every": 1, "train.eval_tasks": 3,
                            "train.probe_tasks": 8, "rl.steps": 1,
                            "tasks.sft_fresh_literals": True}), wd)
    recs = [r for r in map(json.loads, open(os.path.join(wd, "metrics.jsonl")))
            if "probe/success_rate" in r]
    # The SFT end (2) and the RL step (3), not step 0 (the quickstart's train.eval_at_start is
    # False: a random init scores 0); capped at eval_tasks = 3 tasks.
    assert [r["step"] for r in recs] == [2, 3]
    assert all(0.0 <= r["probe/success_rate"] <= 1.0 and r["probe/time_s"] > 0 for r in recs)
    assert all(abs(r["probe/policy_tokens"]) > 0 for r in recs)


def test_sft_end_checkpoint_outlives_keep_checkpoints(full_run):
    # 2 SFT + 2 RL steps, checkpoint every step, keep 2: the latest two (3, 4) plus the SFT end
    # (2), which warm starts and `inspect_rollouts --step 2` read after RL moved on; 1 is gone.
    steps = sorted(int(d) for d in os.listdir(os.path.join(full_run, "checkpoints"))
                   if d.isdigit())
    assert steps == [2, 3, 4]
    from experiments.inspect_rollouts import inspect
    summary, _, _ = inspect(_config(), full_run, "eval", n=1, k=1, temperature=1.0, step=2)
    assert summary["step"] == 2


def test_mismatched_and_corrupt_checkpoints_fail_clearly(full_run, tmp_path):
    from toolverse_jax.rl.driver import run_training
    wd = str(tmp_path / "copy")
    shutil.copytree(full_run, wd)
    with pytest.raises(CheckpointMismatchError, match="model_config"):
        run_training(_config(**{"model.preset": "small"}), wd)
    latest = max(int(d) for d in os.listdir(os.path.join(wd, "checkpoints")) if d.isdigit())
    state_dir = os.path.join(wd, "checkpoints", str(latest), "state")
    for root, _, files in os.walk(state_dir):
        for f in files:
            with open(os.path.join(root, f), "wb") as fh:
                fh.write(b"garbage")
    with pytest.raises(CorruptCheckpointError, match="cannot be restored"):
        run_training(_config(), wd)


def test_checkpoint_written_before_a_config_field_existed_still_restores(tmp_path):
    # A ModelConfig field added after the checkpoint was written, at its default, must not
    # orphan the checkpoint; the same field at another value still refuses to resume.
    import jax.numpy as jnp
    from toolverse_jax.rl.checkpoint import RunCheckpointer
    state = {"w": jnp.ones((2,))}
    ck = RunCheckpointer(str(tmp_path))
    ck.save(1, state, None, {"model_config": {"d_model": 8}, "global_step": 1, "has_ref": False})
    ck.close()
    ck = RunCheckpointer(str(tmp_path))
    defaults = {"model_config": {"d_model": 64, "new_field": "x"}}
    _, _, meta = ck.restore(1, state, None, {"model_config": {"d_model": 8, "new_field": "x"}},
                            defaults=defaults)
    assert meta["global_step"] == 1
    with pytest.raises(CheckpointMismatchError, match="model_config"):
        ck.restore(1, state, None, {"model_config": {"d_model": 8, "new_field": "y"}},
                   defaults=defaults)
    with pytest.raises(CheckpointMismatchError, match="model_config"):
        ck.restore(1, state, None, {"model_config": {"d_model": 9, "new_field": "x"}},
                   defaults=defaults)
    ck.close()


def test_async_saves_survive_donation_and_params_restore_alone(tmp_path):
    # save() returns before orbax has written the step; the train step then donates the saved
    # buffers. Every step must still read back exactly, whole or params alone.
    from toolverse_jax.models import ModelConfig
    from toolverse_jax.rl.checkpoint import RunCheckpointer
    cfg = ModelConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, mlp_dim=32)
    params = init_params(cfg, jax.random.key(3))
    state = init_train_state(jax.tree.map(jnp.copy, params), make_optimizer(1e-3, 2, 10))
    bump = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
    ck = RunCheckpointer(str(tmp_path), keep=3)
    written = {}
    for step in (1, 2, 3):
        ck.save(step, state, params, {"model_config": {"d_model": 16}, "global_step": step,
                                      "has_ref": True})
        written[step] = jax.tree.map(np.array, state)
        state = bump(state)
    assert ck.latest_step() == 3
    for step, want in written.items():
        got, ref, meta = ck.restore(step, state, params, {"model_config": {"d_model": 16}})
        assert meta["global_step"] == step
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_array_equal(a, np.asarray(b))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        only = ck.restore_params(step)
        assert jax.tree.structure(only) == jax.tree.structure(params)
        for a, b in zip(jax.tree.leaves(want.params), jax.tree.leaves(only)):
            assert isinstance(b, jax.Array)
            np.testing.assert_array_equal(a, np.asarray(b))
    ck.close()
    with pytest.raises(CorruptCheckpointError, match="no readable policy params"):
        RunCheckpointer(str(tmp_path)).restore_params(9)


def _train_cmd(workdir, *extra):
    return [sys.executable, "-m", "experiments.train", "--config", "configs/quickstart.py",
            "--workdir", workdir, *extra]


def test_config_override_errors_name_the_key(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    p = subprocess.run(_train_cmd(str(tmp_path), "--config.rl.stepz=3"), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "stepz" in p.stderr
    p = subprocess.run(_train_cmd(str(tmp_path), "--config.rl.steps=abc"), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "steps" in p.stderr


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_matches_uninterrupted(full_run, tmp_path):
    wd = str(tmp_path / "killed")
    over = ["--config.model.preset=tiny", "--config.tasks.num_tasks=40",
            "--config.tasks.eval_fraction=0.1", "--config.sft.steps=2", "--config.sft.batch_size=4",
            "--config.rl.steps=2", "--config.rl.tasks_per_step=2", "--config.rl.group_size=2",
            "--config.rollout.max_new_tokens=24", "--config.rollout.max_turns=2",
            "--config.rollout.max_context=768", "--config.train.eval_every=0",
            "--config.train.checkpoint_every=1", "--config.train.progress=False"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(_train_cmd(wd, *over), cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = os.path.join(wd, "checkpoints", "3")
    deadline = time.time() + 600
    while not os.path.isdir(ck) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert os.path.isdir(ck)
    subprocess.run(_train_cmd(wd, *over), cwd=REPO, env=env, check=True, timeout=900,
                   capture_output=True)
    assert _losses(full_run)[4] == _losses(wd)[4]


def test_rl_step_logs_advantage_truncation_and_entropy_metrics(full_run):
    with open(os.path.join(full_run, "metrics.jsonl")) as f:
        rl = [r for r in map(json.loads, f) if r.get("phase") == "rl"]
    assert rl
    for r in rl:
        for k in ("adv/mean", "adv/std", "adv/zero_group_frac", "rollout/truncated_frac",
                  "rollout/rate_invalid_call", "entropy", "ppo/updates"):
            assert k in r, k
        assert 0.0 <= r["adv/zero_group_frac"] <= 1.0 and r["adv/std"] >= 0.0


def test_advantage_metrics_and_smoothing_by_hand():
    from toolverse_jax.rl.metrics import advantage_metrics, smooth
    # Group 0: tokens (1, 1, -1, -1) -> nonzero; group 1: all zero; one padding row.
    stats = np.array([[1, 0, 2.0, 2.0, 2], [1, 0, -2.0, 2.0, 2], [1, 1, 0.0, 0.0, 3],
                      [0, 9, 5.0, 5.0, 5]], np.float64)
    m = advantage_metrics(stats)
    assert m["adv/zero_group_frac"] == 0.5
    assert m["adv/mean"] == pytest.approx(0.0)
    assert m["adv/std"] == pytest.approx(np.sqrt(4 / 7))
    np.testing.assert_allclose(smooth([0, 1, 2, 3], window=2), [0, 0.5, 1.5, 2.5])


def test_ppo_update_one_pass_equals_a_plain_step_and_counts_epochs():
    from toolverse_jax.rl.trainer import ppo_update
    from toolverse_jax.rl.trainer import score_jit
    from toolverse_jax.sharding import make_mesh, sharding_context
    cfg = get_preset("tiny")
    opt = make_optimizer(1e-3, 1, 10)
    step = make_train_step(cfg, LossConfig(name="ppo_clip"), opt)
    fresh = lambda: init_params(cfg, jax.random.key(2))  # the step donates its state
    mesh = make_mesh((-1, 1, 1))
    with sharding_context(mesh):
        s1, m = ppo_update(init_train_state(fresh(), opt), _rows(), step, cfg=cfg, mesh=mesh,
                           num_micro=1, pad_id=0, temperature=1.0)
        assert m["ppo/updates"] == 1.0
        batch = pack_rows(_rows(), 0)
        lp, _ = score_jit(fresh(), batch, cfg=cfg, temperature=1.0)
        s2, _ = step(init_train_state(fresh(), opt), batch._replace(old_logprobs=lp,
                                                                    ref_logprobs=lp))
        for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
        s3, m3 = ppo_update(init_train_state(fresh(), opt), _rows(), step, cfg=cfg, mesh=mesh,
                            num_micro=1, pad_id=0, temperature=1.0, epochs=2, num_minibatches=2)
        assert m3["ppo/updates"] == 4.0 and int(s3.step) == 4


def test_micro_count_splits_by_positions_but_never_a_row():
    from toolverse_jax.rl.trainer import micro_count
    assert micro_count(20_000, 64, 1, 32768) == 1
    assert micro_count(65_536, 64, 1, 32768) == 2
    assert micro_count(65_537, 64, 1, 32768) == 4
    assert micro_count(65_536, 64, 2, 16384) == 4  # a multiple of the configured count
    assert micro_count(10 ** 9, 8, 1, 100) == 8    # at most one row a micro-batch
    assert micro_count(10 ** 9, 64, 1, 0) == 1     # off


def test_ppo_update_over_the_token_budget_runs_more_micro_batches_same_update():
    """micro_tokens: a minibatch above the budget is scored and updated in micro-batches; the
    params and loss equal the single-pass update's (with and without shared prefixes)."""
    from toolverse_jax.rl.trainer import ppo_update
    from toolverse_jax.sharding import make_mesh, sharding_context
    cfg = get_preset("tiny")
    opt = make_optimizer(1e-3, 1, 10)
    lc = LossConfig(name="ppo_clip")
    built = []

    def step_for(n):
        built.append(n)
        return make_train_step(cfg, lc, opt, num_micro=n)

    mesh = make_mesh((-1, 1, 1))
    rows = _rows(8)
    with sharding_context(mesh):
        for share in (False, True):
            out = []
            for budget in (0, 64):
                state = init_train_state(init_params(cfg, jax.random.key(2)), opt)
                s, m = ppo_update(state, rows, make_train_step(cfg, lc, opt), cfg=cfg, mesh=mesh,
                                  num_micro=1, pad_id=0, temperature=1.0, share_prefix=share,
                                  micro_tokens=budget, step_for=step_for)
                out.append((s, m))
            (s1, m1), (s2, m2) = out
            assert m1["batch/num_micro"] == 1.0 and m2["batch/num_micro"] == 8.0
            np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-5)
            for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert built == [8, 8]
    with pytest.raises(ValueError, match="step_for"):
        ppo_update(state, rows, None, cfg=cfg, mesh=mesh, num_micro=1, pad_id=0,
                   temperature=1.0, micro_tokens=64)


def test_score_jit_in_micro_batches_equals_one_pass():
    from toolverse_jax.rl.trainer import score_jit
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    batch = pack_rows(_rows(8), 0, num_micro=4)
    one = score_jit(params, batch, cfg=cfg)
    four = score_jit(params, batch, cfg=cfg, num_micro=4)
    for a, b in zip(one, four):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_warm_start_copies_the_sft_phase_and_matches_the_full_run(full_run, tmp_path):
    from toolverse_jax.rl.driver import run_training
    sft = str(tmp_path / "sft")
    run_training(_config(**{"rl.steps": 0}), sft)
    wd = str(tmp_path / "rl")
    run_training(_config(**{"rl.steps": 1, "train.warm_start": sft}), wd)
    a, b = _losses(full_run), _losses(wd)
    assert sorted(b) == [1, 2, 3] and a[3] == b[3]   # the RL step is the full run's
    assert os.path.isdir(os.path.join(wd, "tokenizer"))
    with pytest.raises(FileNotFoundError, match="no checkpoint at the SFT end"):
        run_training(_config(**{"sft.steps": 5, "train.warm_start": sft}), str(tmp_path / "x"))


def test_phase_pools_split_sft_and_rl_tasks():
    from toolverse_jax.rl.tool_use import phase_pools
    train = list(range(10))
    a, b = phase_pools(train, 1.0)
    assert a is train and b is train
    a, b = phase_pools(train, 0.3)
    assert a == [0, 1, 2] and b == list(range(3, 10))
    with pytest.raises(ValueError, match="sft_fraction"):
        phase_pools(train, 0.01)


def test_phase_pools_split_by_server():
    import types

    from toolverse_jax.rl.tool_use import phase_pools
    train = [types.SimpleNamespace(id=i, servers=(s,)) for i, s in enumerate(["notes", "shop", "notes", "mail"])]
    a, b = phase_pools(train, 1.0, ("notes",))
    assert [t.id for t in a] == [0, 2] and [t.id for t in b] == [1, 3]
    with pytest.raises(ValueError, match="sft_servers"):
        phase_pools(train, 1.0, ("calendar",))
    a, b = phase_pools(train, 1.0, ("notes",), unseen_demos=1)
    assert [t.id for t in a] == [0, 2, 1] and [t.id for t in b] == [3]


def test_async_rollouts_at_staleness_0_reproduce_the_synchronous_run(full_run, tmp_path):
    """rl.async_rollouts with max_staleness 0: the rollout thread waits for every update, so
    the run equals the synchronous one bit for bit; staleness 1 samples step s with version
    s - 1 at most (the TIS weight corrects) and still trains."""
    from toolverse_jax.rl.driver import run_training
    wd = str(tmp_path / "async0")
    run_training(_config(**{"rl.async_rollouts": True, "rl.max_staleness": 0}), wd)
    assert _losses(wd) == _losses(full_run)
    wd1 = str(tmp_path / "async1")
    run_training(_config(**{"rl.async_rollouts": True, "rl.max_staleness": 1,
                            "rl.steps": 3}), wd1)
    with open(os.path.join(wd1, "metrics.jsonl")) as f:
        rl = [r for r in map(json.loads, f) if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == [3, 4, 5]
    assert rl[0]["rollout/staleness"] == 0.0 and all(0 <= r["rollout/staleness"] <= 1 for r in rl)
    assert all(np.isfinite(r["loss"]) for r in rl)


def test_one_update_per_batch_needs_no_scoring_pass():
    """LossConfig.old_from_current (one update per rollout batch): π_old's log-probs come from
    the update's own forward, so ppo_update skips its scoring pass and lands on the same
    params as the scored update (ratio 1 either way)."""
    from toolverse_jax.rl.trainer import ppo_update
    from toolverse_jax.sharding import make_mesh, sharding_context
    cfg = get_preset("tiny")
    opt = make_optimizer(1e-3, 1, 10)
    fresh = lambda: init_params(cfg, jax.random.key(3))  # the step donates its state
    mesh = make_mesh((-1, 1, 1))
    out = {}
    with sharding_context(mesh):
        for fused in (False, True):
            step = make_train_step(cfg, LossConfig(name="ppo_clip", old_from_current=fused), opt)
            s, m = ppo_update(init_train_state(fresh(), opt), _rows(), step, cfg=cfg, mesh=mesh,
                              num_micro=1, pad_id=0, temperature=1.0, score_old=not fused)
            out[fused] = (s, m)
        for a, b in zip(jax.tree.leaves(out[False][0].params), jax.tree.leaves(out[True][0].params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
        with pytest.raises(ValueError, match="one update per batch"):
            ppo_update(init_train_state(fresh(), opt), _rows(), step, cfg=cfg, mesh=mesh,
                       num_micro=1, pad_id=0, temperature=1.0, score_old=False, epochs=2)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_skipping_rows_without_signal_gives_the_same_update(aggregation):
    """rl.skip_no_signal: rows whose advantages are all 0 (groups that scored alike) leave the
    forward/backward, and the rescaled gradient lands on the params of the update over every
    row: over two steps (momentum, global-norm clipping) and when no row has a signal.
    Without the rescale the params differ (so the comparison can fail). SGD: Adam's first
    steps are g/|g| per element, which turns float noise in near-zero gradients into
    lr-sized differences whatever the batch layout."""
    import optax
    from toolverse_jax.rl.trainer import ppo_update
    from toolverse_jax.sharding import make_mesh, sharding_context
    cfg = get_preset("tiny")
    opt = optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5, momentum=0.9))
    loss = LossConfig(name="ppo_clip", old_from_current=True, aggregation=aggregation)
    step = make_train_step(cfg, loss, opt)
    rows = _rows(6)
    rows = [r._replace(advantages=np.zeros_like(r.advantages)) if i in (1, 3, 4) else r
            for i, r in enumerate(rows)]
    silent = [r._replace(advantages=np.zeros_like(r.advantages)) for r in rows]
    mesh = make_mesh((-1, 1, 1))

    def run(batches, skip, unscaled=False):
        state = init_train_state(init_params(cfg, jax.random.key(4)), opt)
        for b in batches:
            fn = (lambda s, batch, scale=1.0: step(s, batch)) if unscaled else step
            state, m = ppo_update(state, b, fn, cfg=cfg, mesh=mesh, num_micro=1, pad_id=0,
                                  temperature=1.0, score_old=False, skip_no_signal=skip,
                                  aggregation=aggregation)
        return [np.asarray(x) for x in jax.tree.leaves(state.params)], m

    with sharding_context(mesh):
        for batches in ([rows, rows[::-1]], [silent, rows]):
            full, _ = run(batches, False)
            skipped, m = run(batches, True)
            for a, b in zip(full, skipped):
                np.testing.assert_allclose(a, b, atol=1e-6)
        assert m["ppo/rows_skipped_frac"] == pytest.approx(0.5)
        unscaled, _ = run([rows, rows[::-1]], True, unscaled=True)
        full, _ = run([rows, rows[::-1]], False)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(full, unscaled)) > 1e-4
