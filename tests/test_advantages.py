"""Advantage estimators vs hand-worked numbers and a float64 numpy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.rl import advantages as adv
from toolverse_jax.rl import registry


# ---------------------------------------------------------------- float64 numpy references
def np_z(x, members, eps):
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    if len(members) == 0:
        return out
    vals = x[members]
    if vals.max() == vals.min():
        return out
    out[members] = (vals - vals.mean()) / (vals.std() + eps)
    return out


def np_grpo(r, g, eps=1e-6, valid=None):
    r = np.asarray(r, np.float64)
    valid = np.ones(len(r), bool) if valid is None else np.asarray(valid)
    out = np.zeros_like(r)
    for gid in set(np.asarray(g).tolist()):
        idx = np.where((np.asarray(g) == gid) & valid)[0]
        out += np_z(r, idx, eps)
    return out


def np_turn_aware(R, r, m, g, lam, gamma, eps, gate, local_only, valid, outcome_coef):
    r = np.where(m, np.asarray(r, np.float64), 0.0)
    b, t = r.shape
    valid = np.ones(b, bool) if valid is None else np.asarray(valid)
    m = np.asarray(m, bool) & valid[:, None]
    fut = np.zeros_like(r)
    for i in range(b):
        for s in range(t):
            fut[i, s] = sum(gamma ** (k - 1) * r[i, s + k] for k in range(1, t - s))
    val = r * fut if gate else fut
    out = np.zeros_like(r)
    for gid in set(np.asarray(g).tolist()):
        rows = np.asarray(g) == gid
        for s in range(t):
            idx = np.where(rows & m[:, s])[0]
            out[:, s] += np_z(r[:, s], idx, eps)
            if not local_only:
                out[:, s] += lam * np_z(val[:, s], idx, eps)
    out += outcome_coef * np_grpo(R, g, eps, valid)[:, None]
    return np.where(m, out, 0.0)


# ---------------------------------------------------------------- GRPO
def test_grpo_hand_example():
    r = jnp.array([1.0, 0.0, 1.0, 0.0, 3.0, 3.0])
    g = jnp.array([7, 7, 7, 7, 42, 42])  # any ints, not 0..n-1
    a = adv.grpo(r, g)
    # group 7: mean .5, population std .5 -> +-1/(.5+1e-6)*.5
    e = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(a, [e, -e, e, -e, 0.0, 0.0], rtol=1e-6)
    assert float(a[4]) == 0.0 and float(a[5]) == 0.0  # all-equal group: exactly 0


def test_grpo_valid_rows_excluded():
    r = jnp.array([1.0, 0.0, 0.0, 5.0])
    g = jnp.array([0, 0, 0, 0])
    valid = jnp.array([True, True, True, False])
    a = adv.grpo(r, g, valid=valid)
    np.testing.assert_allclose(a, np_grpo(r, g, valid=np.asarray(valid)), rtol=1e-5)
    assert float(a[3]) == 0.0
    # the invalid reward 5.0 must not enter the mean: same as the 3 valid rows alone
    np.testing.assert_allclose(a[:3], adv.grpo(r[:3], g[:3]), rtol=1e-6)


def test_grpo_random_vs_numpy_and_jit():
    rng = np.random.default_rng(0)
    r = rng.normal(size=24)
    g = rng.integers(0, 5, size=24) * 1000 + 3
    valid = rng.random(24) > 0.2
    got = jax.jit(adv.grpo)(jnp.asarray(r, jnp.float32), jnp.asarray(g), valid=valid)
    np.testing.assert_allclose(got, np_grpo(r, g, valid=valid), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- TARA
def test_turn_aware_hand_example():
    # one group of 2 rollouts, 3 turns; rollout 1 has only 2 turns.
    r = jnp.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    m = jnp.array([[True, True, True], [True, True, False]])
    R = jnp.array([1.0, 0.0])
    g = jnp.array([0, 0])
    a = adv.turn_aware(R, r, m, g, lam=0.5, gamma=0.5, eps=0.0, outcome_coef=0.0)
    # turn 0: r = (1, 0) -> z = (+1, -1); V = r0*(r1 + .5 r2) = (1.5, 0) -> z = (+1, -1)
    # turn 1: r = (1, 1) all agree -> 0; V = (1*1, 1*0) -> (+1, -1)
    # turn 2: only rollout 0 -> 0
    np.testing.assert_allclose(a, [[1.5, 0.5, 0.0], [-1.5, -0.5, 0.0]], atol=1e-6)
    a_out = adv.turn_aware(R, r, m, g, lam=0.5, gamma=0.5, eps=0.0, outcome_coef=1.0)
    np.testing.assert_allclose(a_out, [[2.5, 1.5, 1.0], [-2.5, -1.5, 0.0]], atol=1e-6)


def test_turn_aware_all_agree_is_zero():
    r = jnp.ones((4, 3))
    m = jnp.ones((4, 3), bool)
    a = adv.turn_aware(jnp.ones(4), r, m, jnp.zeros(4, jnp.int32))
    assert np.all(np.asarray(a) == 0.0)


def test_turn_aware_single_turn_equals_grpo_of_turn_reward():
    r = jnp.array([[1.0], [0.0], [0.0], [1.0]])
    m = jnp.ones((4, 1), bool)
    g = jnp.array([0, 0, 1, 1])
    a = adv.turn_aware(jnp.zeros(4), r, m, g, outcome_coef=0.0)
    np.testing.assert_allclose(a[:, 0], adv.grpo(r[:, 0], g), rtol=1e-6)


@pytest.mark.parametrize("gate,local_only", [(True, False), (False, False), (True, True)])
def test_turn_aware_random_vs_numpy(gate, local_only):
    rng = np.random.default_rng(1)
    b, t = 12, 6
    lens = rng.integers(1, t + 1, size=b)
    m = np.arange(t)[None, :] < lens[:, None]
    r = (rng.random((b, t)) > 0.5).astype(np.float64)
    R = rng.random(b)
    g = np.repeat([5, 9, 11], 4)
    valid = rng.random(b) > 0.15
    kw = dict(lam=0.5, gamma=0.5, eps=1e-6, gate=gate, local_only=local_only)
    fn = jax.jit(functools.partial(adv.turn_aware, outcome_coef=1.0, **kw))
    got = fn(jnp.asarray(R, jnp.float32), jnp.asarray(r, jnp.float32), m, g, valid=valid)
    want = np_turn_aware(R, r, m, g, valid=valid, outcome_coef=1.0, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.all(np.asarray(got)[~valid] == 0) and np.all(np.asarray(got)[~m] == 0)


# ---------------------------------------------------------------- GiGPO-style
def test_state_grouped_hand_example():
    # 3 rollouts of one task; turn 0 from the same state (key 1); at turn 1, rollouts 0 and 1
    # reach state 2, rollout 2 reaches state 3 (alone -> 0).
    r = jnp.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    m = jnp.ones((3, 2), bool)
    keys = jnp.array([[1, 2], [1, 2], [1, 3]])
    a = adv.state_grouped(jnp.zeros(3), r, m, jnp.zeros(3, jnp.int32), keys, gamma=1.0,
                          outcome_coef=0.0, eps=0.0)
    # turn-0 returns (1, 0, 1): mean 2/3, std sqrt(2)/3
    s = np.sqrt(2) / 3
    want = [[(1 - 2 / 3) / s, 1.0], [(0 - 2 / 3) / s, -1.0], [(1 - 2 / 3) / s, 0.0]]
    np.testing.assert_allclose(a, want, rtol=1e-5)


# ---------------------------------------------------------------- registry
def test_registry_adapters_and_errors():
    assert {"grpo", "turn_aware", "trace", "state_grouped"} <= set(registry.list_advantages())
    b = registry.AdvantageInputs(
        rewards=jnp.array([1.0, 0.0]), group_ids=jnp.array([0, 0]),
        valid=jnp.array([True, True]), turn_mask=jnp.array([[True, False], [True, True]]),
        turn_rewards=jnp.array([[1.0, 0.0], [0.0, 1.0]]))
    g = jax.jit(lambda x: registry.get_advantage("grpo")(x, {}))(b)
    e = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(g, [[e, 0.0], [-e, -e]], rtol=1e-6)
    ta = registry.get_advantage("turn_aware")(b, {"outcome_coef": 0.0, "eps": 0.0})
    np.testing.assert_allclose(ta, adv.turn_aware(b.rewards, b.turn_rewards, b.turn_mask,
                                                  b.group_ids, eps=0.0, outcome_coef=0.0))
    with pytest.raises(ValueError, match="readiness"):
        registry.get_advantage("trace")(b, {})
    with pytest.raises(KeyError, match="known"):
        registry.get_advantage("nope")

    @registry.register_advantage("test_zero")
    def zero(batch, cfg):
        return jnp.zeros(batch.turn_mask.shape)

    assert registry.get_advantage("test_zero") is zero


def test_jitted_advantage_matches_eager_and_is_cached():
    b = registry.AdvantageInputs(
        rewards=jnp.array([1.0, 0.0, 0.5]), group_ids=jnp.array([0, 0, 0]),
        valid=jnp.array([True, True, True]),
        turn_mask=jnp.array([[True, False], [True, True], [True, True]]),
        turn_rewards=jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    for name, consts in (("grpo", {}), ("turn_aware", {"outcome_coef": 0.5, "lam": 0.25})):
        f = registry.jitted_advantage(name, consts)
        assert f is registry.jitted_advantage(name, dict(reversed(consts.items())))
        np.testing.assert_allclose(f(b), registry.get_advantage(name)(b, consts), rtol=1e-6)
    # Other constants are another program (they are baked into it).
    lam_a = registry.jitted_advantage("turn_aware", {"lam": 0.0})(b)
    lam_b = registry.jitted_advantage("turn_aware", {"lam": 1.0})(b)
    assert not np.allclose(lam_a, lam_b)
    with pytest.raises(ValueError, match="readiness"):
        registry.jitted_advantage("trace", {})(b)

    @registry.register_advantage("test_list_const")
    def first_weight(batch, cfg):
        return jnp.where(batch.turn_mask, cfg["w"][0], 0.0)

    # An unhashable constant runs eagerly, with the same result.
    out = registry.jitted_advantage("test_list_const", {"w": [2.0]})(b)
    np.testing.assert_allclose(out, np.where(np.asarray(b.turn_mask), 2.0, 0.0))
