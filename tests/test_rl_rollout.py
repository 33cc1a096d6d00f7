"""Rollout engine with a scripted policy against real built-in MCP servers; batching."""

import jax
import numpy as np
import pytest

from toolverse_jax.envs import Catalog, EnvPool
from toolverse_jax.models import ByteTokenizer
from toolverse_jax.models.chat import render_tool_call
from toolverse_jax.rl.batching import compute_advantages, trajectory_rows, turn_arrays
from toolverse_jax.rl.rollout import RolloutConfig, run_rollouts
from toolverse_jax.rl.batching import pack_rows
from toolverse_jax.sampling import SampleOutput
from toolverse_jax.tasks import load_or_generate_quickstart_tasks

TOK = ByteTokenizer()
END = "<|im_end|>"


class ScriptedPolicy:
    """Returns, for each prompt, the next text of its script (keyed by the prompt's first-turn
    prefix order in the batch); records the prompts it saw."""

    def __init__(self, scripts):
        self.scripts = scripts  # list (one per rollout) of lists of turn texts
        self.turn = 0
        self.seen = []

    def __call__(self, prompts, rng):
        self.seen.append([list(p) for p in prompts])
        rows = [s[self.turn] if self.turn < len(s) else "<answer>x</answer>" + END
                for s in self.active_scripts(len(prompts))]
        self.turn += 1
        ids = [TOK.encode(t) for t in rows]
        n = max(len(i) for i in ids)
        toks = np.zeros((len(ids), n), np.int32)
        for j, i in enumerate(ids):
            toks[j, :len(i)] = i
        return SampleOutput(toks, -np.ones((len(ids), n), np.float32) * 0.5,
                            np.array([len(i) for i in ids]), np.array([t.endswith(END) for t in rows]))

    def active_scripts(self, n):
        return [s for s in self.scripts if self._alive(s)][:n]

    def _alive(self, s):
        # A rollout stays active until its script has produced an answer turn.
        return not any("<answer>" in t or not t.endswith(END) or "<tool_call>" not in t
                       for t in s[:self.turn])


@pytest.fixture(scope="module")
def tasks():
    ts = load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2, 3), seed=0)
    return ts


def _gold_script(task, answer):
    turns = ["".join(f"<tool_call>\n{render_tool_call(s.name, s.arguments)}\n</tool_call>"
                     for s in stage) + END for stage in task.stages]
    return turns + [f"<answer>{answer}</answer>{END}"]


def _answer(task):
    v = task.verifier
    return v.get("value", ", ".join(map(str, v.get("values", [])))) if v["kind"] != "state" else "ok"


def test_gold_script_succeeds_and_records_everything(tasks):
    task = next(t for t in tasks if len(t.stages) == 2 and t.verifier["kind"] == "exact")
    bad = ["<tool_call>\n{\"name\": \"x\", \"arguments\": [1]}\n</tool_call>" + END,
           "<answer>wrong</answer>" + END]
    policy = ScriptedPolicy([_gold_script(task, _answer(task)), bad])
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
        good_tr, bad_tr = run_rollouts(policy, [task], 2, pool, TOK, RolloutConfig(max_turns=4, max_context=8192),
                                       rng=jax.random.key(0))
    assert good_tr.success and good_tr.reward == 1.0 and good_tr.finished
    assert [t.gold_match for t in good_tr.turns] == [1.0, 1.0, 0.0]
    assert [t.kind for t in good_tr.turns] == ["calls", "calls", "answer"]
    # State keys: turn 0 acts from the initial state (same for the group), later turns from
    # the state their executed calls made; invalid calls leave the state as it was.
    assert good_tr.turns[0].state_key == bad_tr.turns[0].state_key == bad_tr.turns[1].state_key
    assert len({t.state_key for t in good_tr.turns}) == 3
    assert all(s == "ok" for turn in good_tr.turn_statuses for s in turn)
    assert good_tr.group_id == bad_tr.group_id
    assert not bad_tr.success and bad_tr.turn_statuses[0] == ["invalid_call"]
    assert [t.gold_match for t in bad_tr.turns] == [0.0, 0.0]
    for tr in (good_tr, bad_tr):
        assert len(tr.tokens) == len(tr.policy_mask) == len(tr.sample_logprobs) == len(tr.token_turn)
        # Policy tokens are exactly the sampled ids, in order (token in, token out).
        sampled = [t for t, m in zip(tr.tokens, tr.policy_mask) if m]
        script = _gold_script(task, _answer(task)) if tr is good_tr else bad
        assert TOK.decode(sampled) == "".join(script)
        assert all(lp == -0.5 for lp, m in zip(tr.sample_logprobs, tr.policy_mask) if m)
        assert all(lp == 0.0 for lp, m in zip(tr.sample_logprobs, tr.policy_mask) if not m)
    # The observation the policy saw in turn 2 is the env's real reply to its turn-1 call.
    text = TOK.decode(good_tr.tokens)
    assert "<tool_response>" in text and task.stages[0][0].name in text


def test_truncated_turn_ends_rollout_and_state_tasks_read_final_state(tasks):
    task = next(t for t in tasks if len(t.stages) == 1 and t.verifier["kind"] == "state")
    policy = ScriptedPolicy([_gold_script(task, "done"), ["<tool_call>\n{\"na"]])
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
        ok, cut = run_rollouts(policy, [task], 2, pool, TOK, RolloutConfig(max_context=8192), rng=jax.random.key(0))
    assert ok.success, ok.turn_statuses
    assert cut.end_reason == "max_new_tokens" and not cut.success
    assert [t.kind for t in cut.turns] == ["truncated"] and cut.token_turn[-1] == 0


def test_state_task_needs_an_answer_unless_require_answer_is_off(tasks):
    """The right calls, then an answer turn cut at max_new_tokens: the env state passes the
    verifier, but the rollout never answered, so it is a failure (rollout.require_answer);
    with require_answer=False the state alone decides (the older behaviour)."""
    task = next(t for t in tasks if len(t.stages) == 1 and t.verifier["kind"] == "state")
    rambling = _gold_script(task, "done")[:-1] + ["<answer>--9--9-"]
    out = {}
    for require in (True, False):
        policy = ScriptedPolicy([_gold_script(task, "done"), rambling])
        with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
            out[require] = run_rollouts(policy, [task], 2, pool, TOK,
                                        RolloutConfig(max_context=8192, require_answer=require),
                                        rng=jax.random.key(0))
    for require, (ok, cut) in out.items():
        assert ok.success and ok.finished
        assert cut.end_reason == "max_new_tokens" and not cut.finished
        assert [t.kind for t in cut.turns] == ["calls", "truncated"]
        assert cut.success is (not require)


def _traj(group, reward, kinds, gold=None, failed=False):
    """A hand-made trajectory: a 2-token prompt, then per turn 2 policy tokens and 1 env token."""
    from toolverse_jax.rl.rollout import Trajectory, Turn
    toks, mask, tt = [1, 2], [False, False], [-1, -1]
    for t, _ in enumerate(kinds):
        toks += [3, 4, 5]
        mask += [True, True, False]
        tt += [t, t, -1]
    gold = gold or [0.0] * len(kinds)
    tr = Trajectory("t", group, toks, mask, [0.0] * len(toks), tt, 2,
                    turns=[Turn(k, [{}] if k != "answer" else [], [], g, 0)
                           for k, g in zip(kinds, gold)])
    tr.reward, tr.infra_failed, tr.finished = reward, failed, kinds[-1] == "answer"
    return tr


def test_batching_advantages_and_rows(tasks):
    trajs = [_traj(0, 1.0, ["calls", "answer"], [1.0, 0]), _traj(0, 0.0, ["calls", "answer"]),
             _traj(0, 0.0, ["calls"], [1.0], failed=True),
             _traj(1, 1.0, ["calls", "answer"], [1.0, 0]),
             _traj(1, 1.0, ["calls", "answer"], [1.0, 0])]
    r, m, last, _ = turn_arrays(trajs, 3)
    assert r[0].tolist() == [1, 1, 0] and m[2].tolist() == [True, False, False]
    assert last[0].tolist() == [False, True, False]
    adv = compute_advantages(trajs, "grpo", {}, 3)
    np.testing.assert_allclose(adv[:2, :2], [[1.0, 1.0], [-1.0, -1.0]], atol=1e-5)
    assert np.all(adv[2] == 0) and np.all(adv[3:] == 0)  # failed row and all-equal group
    rows = trajectory_rows(trajs, adv)
    assert len(rows) == 4  # the infra failure is dropped
    assert rows[0].advantages.tolist() == pytest.approx([0, 0, 1, 1, 0, 1, 1, 0], abs=1e-5)
    batch = pack_rows(rows, pad_id=0, num_micro=3)
    assert batch.tokens.shape[0] == 6 and batch.tokens.shape[1] == 64
    assert batch.loss_mask[0, :7].tolist() == [0, 1, 1, 0, 1, 1, 0]  # mask of the *target*
    assert batch.targets[0, :5].tolist() == [2, 3, 4, 5, 3]
    assert batch.loss_mask[4:].sum() == 0
    ta = compute_advantages(trajs, "turn_aware", {"lam": 0.5, "gamma": 0.5}, 3)
    assert ta.shape == (5, 3) and np.all(ta[2] == 0)
    with pytest.raises(KeyError, match="not registered"):
        compute_advantages(trajs, "nope", {}, 3)
    with pytest.raises(ValueError, match="has 2 turns"):
        turn_arrays(trajs, 1)


@pytest.mark.parametrize("estimator", ["grpo", "turn_aware", "state_grouped", "trace"])
def test_truncated_rollout_gets_negative_advantage_on_every_policy_token(estimator):
    """A rollout cut at max_new_tokens in its second turn, in a group with a successful one:
    every one of its policy tokens (the call turn and the truncated turn) is pushed down."""
    from toolverse_jax.rl.registry import list_advantages
    assert estimator in list_advantages()
    ok = _traj(0, 1.0, ["calls", "answer"], [1.0, 0.0])
    cut = _traj(0, 0.0, ["calls", "truncated"], [0.0, 0.0])
    cut.end_reason = "max_new_tokens"
    trajs = [ok, cut]
    # TRACE readiness [B, T+1]: a reference that is equally unsure in every state (no turn
    # credit), so only the outcome term decides the sign.
    readiness = np.full((2, 4), -2.0, np.float32) if estimator == "trace" else None
    adv = compute_advantages(trajs, estimator, {}, 3, readiness)
    rows = trajectory_rows(trajs, adv)
    cut_adv = rows[1].advantages[np.asarray(cut.policy_mask)]
    ok_adv = rows[0].advantages[np.asarray(ok.policy_mask)]
    assert cut_adv.size == 4 and np.all(cut_adv < 0), cut_adv
    assert np.all(ok_adv > 0), ok_adv


def test_shaped_reward_adds_call_and_gold_turn_bonuses():
    from toolverse_jax.rl.rollout import Trajectory, Turn, shaped_reward
    t = Trajectory("t", 0, [], [], [], [], 0, turns=[
        Turn("calls", [{}, {}], ["ok", "invalid_call"], 1.0), Turn("calls", [{}, {}], ["ok", "ok"]),
        Turn("answer")])
    assert shaped_reward(t, RolloutConfig()) == 0.0
    cfg = RolloutConfig(ok_call_bonus=0.2, gold_turn_bonus=0.4)
    assert shaped_reward(t, cfg) == pytest.approx(0.2 * 0.75 + 0.4 * 0.5)
    t.success = True
    assert shaped_reward(t, cfg) == pytest.approx(1.0 + 0.15 + 0.2)
    # A truncated turn is a turn that missed its stage.
    t.turns[-1] = Turn("truncated", [], ["truncated"])
    t.success = False
    assert shaped_reward(t, RolloutConfig(gold_turn_bonus=0.6)) == pytest.approx(0.6 / 3)


def test_quickstart_filter_drops_unanswerable_and_long_literal_tasks():
    import dataclasses
    from configs.quickstart import get_config
    from toolverse_jax.rl.tool_use import answer_visible, filter_tasks, max_literal_chars
    from toolverse_jax.tasks.task import GoldStep
    base = load_or_generate_quickstart_tasks()[0]
    step = GoldStep(server="calendar", tool="get_event", name="get_event",
                    arguments={"event_id": "ev_0007"},
                    observation={"attendees": ["a" * 80], "title": "Customer call"})
    hidden = dataclasses.replace(base, stages=[[step]],
                                 verifier={"kind": "exact", "value": "Customer call"})
    long_arg = dataclasses.replace(hidden, stages=[[dataclasses.replace(
        step, arguments={"event_id": "ev_0007", "note": "x" * 40})]])
    assert max_literal_chars(hidden) == len('"ev_0007"') and max_literal_chars(long_arg) == 42
    assert answer_visible(hidden, RolloutConfig(max_observation_chars=1000))
    assert not answer_visible(hidden, RolloutConfig(max_observation_chars=60))  # title cut off
    wide, narrow = RolloutConfig(max_observation_chars=1000), RolloutConfig(max_observation_chars=60)
    assert get_config().tasks.max_literal_chars == 24
    assert filter_tasks([hidden, long_arg], wide, 24) == [hidden]
    assert filter_tasks([hidden, long_arg], narrow, 24) == []
    assert filter_tasks([hidden, long_arg], wide, 0) == [hidden, long_arg]


def test_arg_overlap_gives_partial_credit_per_value_and_bonus():
    from types import SimpleNamespace as S
    from toolverse_jax.rl.rollout import Trajectory, Turn, arg_overlap, shaped_reward
    gold = [S(name="set_priority", arguments={"priority": "urgent", "ticket_id": "tk_0003"}),
            S(name="list_tickets", arguments={})]
    call = lambda n, **a: {"name": n, "arguments": a}
    assert arg_overlap(gold, [call("set_priority", priority="urgent", ticket_id="tk_0003"),
                              call("list_tickets")]) == 1.0
    assert arg_overlap(gold, [call("set_priority", priority="urgent", ticket_id="tk_0004"),
                              call("list_tickets")]) == pytest.approx(2 / 3)
    # The best of two same-name calls is paired; a wrong tool name earns nothing.
    assert arg_overlap(gold, [call("set_priority", ticket_id="tk_0003"),
                              call("set_priority", priority="urgent", ticket_id="tk_0003")]) == \
        pytest.approx(2 / 3)
    assert arg_overlap(gold, [call("get_ticket", ticket_id="tk_0003")]) == 0.0
    assert arg_overlap([], [call("x")]) == 0.0
    t = Trajectory("t", 0, [], [], [], [], 0, turns=[Turn("calls", arg_match=0.5), Turn("answer")])
    assert shaped_reward(t, RolloutConfig(arg_match_bonus=0.4)) == pytest.approx(0.2)


def test_sampler_policy_keeps_kv_across_turns_and_matches_reprefill(tasks):
    """run_rollouts with the default SamplerPolicy (KV kept across turns) gives the greedy
    trajectories of the re-prefilling sampler; multi-turn equality is tested on the session
    itself (tests/test_sampling_session.py)."""
    from toolverse_jax.models import get_preset, init_params
    from toolverse_jax.rl.rollout import SamplerPolicy
    from toolverse_jax.sampling import SamplingParams
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(1))
    sp = SamplingParams(max_new_tokens=24, temperature=0.0,
                        stop_token_ids=tuple(TOK.stop_ids_for([END])), pad_id=TOK.pad_id)
    rcfg = RolloutConfig(max_turns=3, max_context=4096, tool_format="minimal")
    out = {}
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
        for reuse in (True, False):
            policy = SamplerPolicy(params, cfg, sp, kv_reuse=reuse)
            trajs = run_rollouts(policy, tasks[:3], 2, pool, TOK, rcfg, jax.random.key(0))
            out[reuse] = [(t.tokens, t.end_reason) for t in trajs]
    assert out[True] == out[False]


def test_waste_control_ends_invalid_streaks_and_long_episodes(tasks):
    task = next(t for t in tasks if len(t.stages) >= 1 and t.verifier["kind"] == "state")
    bad = "<tool_call>\n{\"name\": \"x\", \"arguments\": [1]}\n</tool_call>" + END
    with EnvPool(Catalog.default(kinds=("builtin",)), num_workers=0) as pool:
        (tr,) = run_rollouts(ScriptedPolicy([[bad] * 5]), [task], 1, pool, TOK,
                             RolloutConfig(max_turns=5, max_context=8192, max_invalid_streak=2),
                             rng=jax.random.key(0))
        assert tr.end_reason == "invalid_calls" and len(tr.turns) == 2
        assert all(t.statuses == ["invalid_call"] for t in tr.turns)
        (tr,) = run_rollouts(ScriptedPolicy([[bad] * 5]), [task], 1, pool, TOK,
                             RolloutConfig(max_turns=5, max_context=8192, max_episode_s=1e-9),
                             rng=jax.random.key(0))
        assert tr.end_reason == "wall_time" and not tr.turns and not tr.success
