"""RL sanity suite (toolverse_jax/rl/sanity.py) through the real stack: the buttons MCP server in
a worker process, the jitted sampler, every registered estimator and the PPO step, no mocks.

Bandit criterion: the sampled success (temperature 1, the step's 64 rollouts), averaged over two
consecutive RL steps, reaches 0.9 within BANDIT.rl_steps updates. The flipped-sign update runs
the same budget and must stay below 0.5 at every step.
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from toolverse_jax.envs import Catalog
from toolverse_jax.envs.builtin.buttons import COLORS
from toolverse_jax.rl import sanity
from toolverse_jax.rl.registry import list_advantages
from toolverse_jax.rl.rollout import SamplerPolicy, run_rollouts
from toolverse_jax.sharding import sharding_context

BANDIT = sanity.SanityConfig(kind="bandit", rl_steps=16, stop_at=0.9)
MULTI = sanity.SanityConfig(kind="multi_turn", estimator="turn_aware", sft_steps=120,
                            tasks_per_step=4)


@pytest.fixture(scope="module")
def pool():
    with sanity.open_pool(BANDIT) as p:
        yield p


@pytest.fixture(scope="module")
def bandit_warm(pool):
    return sanity.warm_start(BANDIT, pool)


def test_buttons_server_hidden_seeded_and_grounded(pool):
    assert "buttons" not in Catalog.default()
    assert "buttons" in Catalog.default(kinds=("builtin",), include_hidden=True)
    a = sanity.gold_tasks(pool, "multi_turn", 8, seed=3)
    b = sanity.gold_tasks(pool, "multi_turn", 8, seed=3)
    assert [t.to_json() for t in a] == [t.to_json() for t in b]
    assert sorted(t.meta["target"] for t in a[:4]) == sorted(COLORS)  # balanced per k tasks
    for t in a:
        assert [[s.name for s in st] for st in t.stages] == [
            [f"press_{t.meta['target']}"], ["confirm"], ["submit"]]
        press = json.loads(t.stages[0][0].observation)
        assert press == {"button": t.meta["target"], "code": t.answer}
        assert t.check(t.answer) and not t.check(str((int(t.answer) + 1) % 10))
    demos = sanity.demo_tasks(pool, "bandit", 64, seed=0, follow_fraction=0.5)
    random = [d for d in demos if d.instruction.startswith("Call")]
    assert len(random) == 32
    # The RL wording's demonstrations press uniformly at random: every (target, pressed) pair
    # twice, so the pressed button carries no information about the target.
    pairs = [(d.meta["target"], d.meta["pressed"]) for d in random]
    assert all(pairs.count(p) == 2 for p in set(pairs)) and len(set(pairs)) == 16
    assert all(d.meta["target"] == d.meta["pressed"] for d in demos if d not in random)


@pytest.mark.parametrize("estimator", list_advantages())
def test_bandit_reaches_0_9(estimator, bandit_warm, pool):
    res = sanity.train_rl(dataclasses.replace(BANDIT, estimator=estimator), bandit_warm, pool)
    succ = [round(c["success"], 2) for c in res.curve]
    assert 0.1 <= res.initial_success <= 0.45, succ  # the warm start picks at chance (1/4)
    assert res.steps_to["0.9"] is not None, succ


def test_bandit_flipped_sign_fails(bandit_warm, pool):
    res = sanity.train_rl(dataclasses.replace(BANDIT, flip_sign=True), bandit_warm, pool)
    succ = [c["success"] for c in res.curve]
    assert len(succ) == BANDIT.rl_steps and res.steps_to["0.9"] is None
    assert max(succ) < 0.5 and np.mean(succ[-3:]) < 0.2, succ


def test_multi_turn_smoke(pool):
    warm = sanity.warm_start(MULTI, pool)
    tasks = sanity.gold_tasks(pool, "multi_turn", MULTI.tasks_per_step, MULTI.seed)
    rcfg = sanity.rollout_config("multi_turn")
    policy = SamplerPolicy(warm.params, warm.cfg, sanity.sampling_params(MULTI, warm.tokenizer))
    mesh = sanity.single_device_mesh()
    with sharding_context(mesh):
        again = run_rollouts(policy, tasks, MULTI.group_size, pool, warm.tokenizer, rcfg,
                             jax.random.fold_in(jax.random.key(MULTI.seed), 0),
                             seed=MULTI.seed * 1_000_003)
        state, step_fn = sanity.rl_setup(MULTI, warm)
        _, m, trajs = sanity.rl_step(MULTI, warm, state, step_fn, tasks, pool, 0, mesh)
    assert [t.tokens for t in trajs] == [t.tokens for t in again]  # deterministic under a seed
    shaped = [t for t in trajs if [u.kind for u in t.turns] == ["calls"] * 3 + ["answer"]]
    assert len(shaped) >= 0.8 * len(trajs)
    for t in shaped:
        names = [[c["name"] for c in u.calls] for u in t.turns[:3]]
        assert names[0][0].startswith("press_") and names[1:] == [["confirm"], ["submit"]]
        assert [u.gold_match for u in t.turns[1:3]] == [1.0, 1.0]
    # Turn 1 starts from the group's shared state; later turns' keys follow the press.
    for g in {t.group_id for t in shaped}:
        grp = [t for t in shaped if t.group_id == g]
        assert len({t.turns[0].state_key for t in grp}) == 1
        by_press = {t.turns[0].calls[0]["name"]: t.turns[1].state_key for t in grp}
        assert len(set(by_press.values())) == len(by_press)
    assert m["adv/nonzero_turns"] > 0 and m["adv/std"] > 0 and np.isfinite(m["loss"])


@pytest.mark.slow
def test_multi_turn_report(tmp_path):
    from experiments.rl_sanity import run

    out = tmp_path / "rl_sanity.md"
    report = run(str(out), seeds=[0, 1, 2], parts=["multi_turn"], multi_turn_steps=12,
                 overrides={"sft_steps": 120}, log=lambda s: None)
    rows = {r["estimator"]: r for r in report["multi_turn"]["summary"]}
    assert set(rows) == {"grpo", "turn_aware", "trace"}
    assert all(len(r["per_seed"]) == 3 for r in rows.values())
    text = out.read_text()
    assert "| turn_aware |" in text and ("± " in text or "not reached" in text)
    saved = json.loads((tmp_path / "rl_sanity.json").read_text())
    assert len(saved["multi_turn"]["runs"]) == 9
