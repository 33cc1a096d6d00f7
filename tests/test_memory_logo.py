"""LoGo-GRPO: advantages on hand-worked examples, row placement, local groups from one bank state."""

import dataclasses

import jax
import numpy as np
import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.builtin.memory_bank import content_hash
from toolverse_jax.memory import rollout as mr
from toolverse_jax.memory.data import generate_conversations
from toolverse_jax.memory.logo import logo_advantages, trajectory_rows
from toolverse_jax.models import load_tokenizer
from toolverse_jax.models.chat import render_assistant


def test_logo_advantages_hand_worked():
    a_g, a_l = logo_advantages(
        [1.0, 0.0, 0.5, 0.5, 0.2, 0.2], [3, 3, 3, 3, 8, 8], [True] * 6,
        [1.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.3, 0.3, 5.0], [7, 7, 7, 7, 9, 9, 9, 9, 7],
        [True] * 8 + [False], local_coef=0.5, eps=0.0)
    # group 3: mean 0.5, population std sqrt(0.125); group 8 agrees -> exactly 0
    s = np.sqrt(0.125)
    np.testing.assert_allclose(a_g, [0.5 / s, -0.5 / s, 0, 0, 0, 0], rtol=1e-6)
    # local group 7 (the invalid 5.0 is left out): mean 0.25, std sqrt(0.1875); x 0.5
    t = np.sqrt(0.1875)
    np.testing.assert_allclose(a_l, 0.5 * np.array([0.75 / t, -0.25 / t, -0.25 / t, -0.25 / t,
                                                    0, 0, 0, 0, 0]), rtol=1e-6, atol=1e-7)
    a_g2, a_l2 = logo_advantages([1.0, 0.0], [0, 0], [True, True], [], [], [], 1.0)
    np.testing.assert_allclose(a_g2, [1.0, -1.0], atol=1e-5)
    assert a_l2.shape == (0,)


def _call(role, session, n_prompt, n_out):
    return mr.RoleCall(role, session, list(range(n_prompt + n_out)),
                       [False] * n_prompt + [True] * n_out, [0.0] * n_prompt + [-0.5] * n_out,
                       "x", True)


def test_rows_put_advantages_on_the_producing_role_tokens():
    tr = mr.MemoryTrajectory("c", 0, calls=[_call("extractor", 1, 3, 2), _call("manager", 1, 4, 3),
                                            _call("answerer", 0, 5, 1)])
    failed = dataclasses.replace(tr, infra_failed=True)
    rows = trajectory_rows([tr, failed], [2.0, 9.0], ("extractor", "manager", "answerer"))
    # one row per call of a trained role, in call order (token counts 5, 7, 6 tell them apart)
    assert [len(r.tokens) for r in rows] == [5, 7, 6]
    np.testing.assert_array_equal(rows[1].advantages, [0, 0, 0, 0, 2, 2, 2])
    np.testing.assert_array_equal(rows[0].sample_logprobs, [0, 0, 0, -0.5, -0.5])
    # local members: credit only on extractor / manager tokens; a role subset is respected
    local = trajectory_rows([tr], [1.5], ("manager", "answerer"), local=True)
    assert [len(r.tokens) for r in local] == [7]  # the manager's call only
    np.testing.assert_array_equal(local[0].advantages, [0, 0, 0, 0, 1.5, 1.5, 1.5])
    with pytest.raises(ValueError, match="unknown memory roles"):
        trajectory_rows([tr], [1.0], ("critic",))


@dataclasses.dataclass
class HalfNoopActor:
    """Gold everywhere, except that every other manager call in a batch answers NOOP."""

    tokenizer: object

    def complete(self, role, prompts, contexts, rng):
        gold = mr.GoldActor(self.tokenizer).complete(role, prompts, contexts, rng)
        if role != "manager":
            return gold
        noop = render_assistant({"role": "assistant", "content": "NOOP"}, self.tokenizer)
        return [mr.Completion(noop, [0.0] * len(noop), True) if i % 2 else g
                for i, g in enumerate(gold)]


class TamperingPool:
    """Forwards to a pool but drops one entry from every restored state."""

    def __init__(self, pool):
        self.pool = pool

    def step(self, calls):
        out = []
        for ep, name, args in calls:
            if name == "restore":
                entries = dict(args["state"]["entries"])
                entries.pop(sorted(entries)[0])
                args = {"state": {**args["state"], "entries": entries}}
            out.append((ep, name, args))
        return self.pool.step(out)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def test_local_groups_start_from_one_bank_state():
    tok = load_tokenizer("byte")
    convs = generate_conversations(2, 8, seed=4)
    cfg = mr.MemoryRolloutConfig()
    gold = mr.GoldActor(tok)
    plan = [(c, c * 2 + 1, s) for c in range(2) for s in (3, 6)]
    with EnvPool(Catalog.default(kinds=("builtin",), include_hidden=True), num_workers=0) as pool:
        trajs, snaps = mr.rollout_conversations(gold, convs, 2, pool, tok, cfg, jax.random.key(0),
                                                snapshot_at=[(r, s) for _, r, s in plan])
        (empty,) = pool.reset([EpisodeSpec(("memory_bank",), 0)])
        (empty_hash,) = mr.bank_hashes(pool, [empty])
        pool.close([empty])
        members = mr.rollout_local(HalfNoopActor(tok), gold, convs, plan, snaps, 4, pool, tok,
                                   cfg, jax.random.key(1), group_offset=100)
        with pytest.raises(RuntimeError, match="restore is not exact"):
            mr.rollout_local(gold, gold, convs, plan, snaps, 2, TamperingPool(pool), tok, cfg,
                             jax.random.key(2))
    assert len(members) == len(plan) * 4
    for p, (c, r, s) in enumerate(plan):
        group = members[p * 4:(p + 1) * 4]
        snap = snaps[(r, s)]
        assert snap["hash"] == content_hash(snap["state"]) != empty_hash
        # the hash each member's bank reported right after its restore
        assert {m.start_hash for m in group} == {snap["hash"]}
        assert {m.group_id for m in group} == {100 + p} and {m.session for m in group} == {s}
        assert all([cl.session for cl in m.calls] == [s, s] for m in group)
    rewards = np.array([m.reward for m in members])
    groups = np.array([m.group_id for m in members])
    _, a_l = logo_advantages([0.0], [0], [True], rewards, groups, [True] * len(members))
    sessions_with_facts = [p for p, (c, _, s) in enumerate(plan) if convs[c].sessions[s - 1].facts]
    assert sessions_with_facts
    for p in sessions_with_facts:  # gold members (even) beat NOOP members (odd)
        em = [m.qa_em for m in members[p * 4:(p + 1) * 4]]
        assert em[0] == em[2] == 1.0 and em[1] < 1.0 and em[3] < 1.0
        assert a_l[p * 4] > 0 > a_l[p * 4 + 1]
