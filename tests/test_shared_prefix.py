"""Shared-prefix packing (`pack_rows(share_prefix=True)`): a GRPO group's rollouts packed
behind one copy of their prompt give the same log-probs, loss and gradient as unpacked rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import get_preset, init_params
from toolverse_jax.models.qwen3 import SHARED_SEGMENT
from toolverse_jax.rl.batching import pack_rows
from toolverse_jax.rl.trainer import LossConfig, score_logprobs
from toolverse_jax.rl.losses import get_loss
from toolverse_jax.rl.types import Row


def group_rows(rng, prompts=3, group=4, prompt_len=24, vocab=256):
    """Returns rows of `prompts` groups: each row = its group's prompt (no policy tokens) then a
    completion of its own length whose first turns sometimes coincide within the group."""
    rows = []
    for g in range(prompts):
        prompt = rng.integers(3, vocab, prompt_len + g).tolist()
        first = rng.integers(3, vocab, 3).tolist()
        for j in range(group):
            comp = (first if j % 2 == 0 else []) + rng.integers(3, vocab, 5 + 3 * j).tolist()
            toks = prompt + comp
            mask = [False] * len(prompt) + [True] * len(comp)
            rows.append(Row(toks, mask, rng.normal(size=len(toks)).astype(np.float32),
                            -np.abs(rng.normal(size=len(toks))).astype(np.float32)))
    rows.append(Row(rng.integers(3, vocab, 9).tolist(), [False] * 4 + [True] * 5,
                    np.ones(9, np.float32), np.zeros(9, np.float32)))  # shares nothing
    order = rng.permutation(len(rows))  # ppo_update shuffles rows: groups are not contiguous
    return [rows[i] for i in order]


def _per_row_logprobs(batch, lp):
    """Returns the batch's loss-token log-probs, rounded and sorted (order-free comparison)."""
    lp, mask = np.asarray(lp), np.asarray(batch.loss_mask) > 0
    return sorted(np.round(lp[mask], 5).tolist())


def test_layout_shares_each_prompt_once_and_keeps_every_loss_token():
    rows = group_rows(np.random.default_rng(0))
    plain = pack_rows(rows, 0)
    shared = pack_rows(rows, 0, share_prefix=True)
    assert shared.tokens.shape[0] == 4 and plain.tokens.shape[0] == 13  # 3 groups + 1 single
    assert np.sum(shared.segment_ids != 0) < 0.6 * np.sum(plain.segment_ids != 0)
    assert np.sum(shared.segment_ids == SHARED_SEGMENT) > 0
    # every loss token keeps its target, advantage and sampler log-prob
    for f in ("targets", "advantages", "sample_logprobs"):
        a = np.asarray(getattr(plain, f))[plain.loss_mask > 0]
        b = np.asarray(getattr(shared, f))[shared.loss_mask > 0]
        assert sorted(a.tolist()) == sorted(b.tolist()), f
    # the shared prefix stops before the first policy token of any row of the group
    assert not np.any(shared.loss_mask[shared.segment_ids == SHARED_SEGMENT])


def test_shared_prefix_logprobs_loss_and_grads_equal_unpacked():
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    rows = group_rows(np.random.default_rng(1))
    plain, shared = pack_rows(rows, 0), pack_rows(rows, 0, share_prefix=True)
    lc = LossConfig(aggregation="token_mean", old_from_current=True)

    def loss(p, batch):
        lp, ent = score_logprobs(p, cfg, batch)
        return get_loss("ppo_clip")(lp, ent, batch, lc)[0], lp

    (l0, lp0), g0 = jax.value_and_grad(loss, has_aux=True)(params, jax.tree.map(jnp.asarray, plain))
    (l1, lp1), g1 = jax.value_and_grad(loss, has_aux=True)(params, jax.tree.map(jnp.asarray, shared))
    a, b = _per_row_logprobs(plain, lp0), _per_row_logprobs(shared, lp1)
    np.testing.assert_allclose(a, b, atol=2e-4)
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_shared_prefix_is_exact_token_by_token():
    """The packed row's log-prob at each loss token equals the unpacked row's at that token
    (matched by position in the row, not by value): a context leak between continuations or
    a wrong RoPE position would move them."""
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(2)
    prompt = rng.integers(3, 256, 30).tolist()
    rows = [Row(prompt + c, [False] * 30 + [True] * len(c), np.ones(30 + len(c), np.float32),
                np.zeros(30 + len(c), np.float32))
            for c in (rng.integers(3, 256, 7).tolist(), rng.integers(3, 256, 12).tolist())]
    shared = pack_rows(rows, 0, share_prefix=True)
    assert shared.tokens.shape[0] == 1
    lp = np.asarray(score_logprobs(params, cfg, jax.tree.map(jnp.asarray, shared))[0])[0]
    seg = shared.segment_ids[0]
    for j, r in enumerate(rows):
        one = pack_rows([r], 0)
        ref = np.asarray(score_logprobs(params, cfg, jax.tree.map(jnp.asarray, one))[0])[0]
        got = lp[(seg == j + 1) & (shared.loss_mask[0] > 0)]
        np.testing.assert_allclose(got, ref[one.loss_mask[0] > 0], atol=2e-5)


def test_groups_longer_than_the_cap_split_into_rows_that_each_hold_the_prefix():
    from toolverse_jax.rl import batching
    rows = group_rows(np.random.default_rng(3), prompts=1, group=6)
    layout = batching._shared_layout(rows, 16, max_len=60)
    shared = [(s, ps) for s, ps in layout if s]
    assert len(shared) >= 2 and all(s + sum(p.end - p.start for p in ps) <= 60 or len(ps) == 1
                                    for s, ps in shared)
    assert sorted(p.row for _, ps in layout for p in ps) == list(range(len(rows)))


def test_batches_where_sharing_does_not_pay_stay_plain():
    """A 20-token prompt before ~60-token completions saves too few tokens for the longer
    packed rows' attention: the batch is exactly the plain one."""
    rng = np.random.default_rng(4)
    prompt = rng.integers(3, 256, 20).tolist()
    rows = [Row(prompt + (c := rng.integers(3, 256, 60 + j).tolist()),
                [False] * 20 + [True] * len(c), np.ones(80 + j, np.float32),
                np.zeros(80 + j, np.float32)) for j in range(8)]
    plain, shared = pack_rows(rows, 0), pack_rows(rows, 0, share_prefix=True)
    for a, b in zip(plain, shared):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
