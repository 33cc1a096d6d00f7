"""Shared prefixes (`pack_rows(share_prefix=True)`): a GRPO group's rollouts hold their common
prompt once, each row attends to its keys and values, and log-probs, loss and gradients equal
the plain rows'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.multidevice import run_with_devices
from toolverse_jax.models import get_preset, init_params
from toolverse_jax.rl.batching import pack_rows
from toolverse_jax.rl.losses import get_loss
from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                      make_train_step, score_logprobs)
from toolverse_jax.rl.types import Row


def group_rows(rng, prompts=3, group=4, prompt_len=80, vocab=256, single=True):
    """Returns rows of `prompts` groups: each row = its group's prompt (no policy tokens) then a
    completion of its own length whose first tokens sometimes coincide within the group."""
    rows = []
    for g in range(prompts):
        prompt = rng.integers(3, vocab, prompt_len + g).tolist()
        first = rng.integers(3, vocab, 3).tolist()
        for j in range(group):
            comp = (first if j % 2 == 0 else []) + rng.integers(3, vocab, 20 + 3 * j).tolist()
            toks = prompt + comp
            mask = [False] * len(prompt) + [True] * len(comp)
            rows.append(Row(toks, mask, rng.normal(size=len(toks)).astype(np.float32),
                            -np.abs(rng.normal(size=len(toks))).astype(np.float32)))
    if single:  # shares nothing
        rows.append(Row(rng.integers(3, vocab, 9).tolist(), [False] * 4 + [True] * 5,
                        np.ones(9, np.float32), np.zeros(9, np.float32)))
    order = rng.permutation(len(rows))  # ppo_update shuffles rows: groups are not contiguous
    return [rows[i] for i in order]


def _inputs(batch, k):
    """Returns slot k's full input ids (its prefix's, then its own)."""
    seg = np.asarray(batch.segment_ids[k]) != 0
    own = np.asarray(batch.tokens[k])[seg].tolist()
    if batch.prefix_index is None:
        return own
    p = int(batch.prefix_index[k])
    pseg = np.asarray(batch.prefix_segment_ids[p]) != 0
    return np.asarray(batch.prefix_tokens[p])[pseg].tolist() + own


def _slot_of_row(batch, rows):
    """Returns, per row, the batch slot holding it (matched by its input ids)."""
    slots = {tuple(_inputs(batch, k)): k for k in range(batch.tokens.shape[0])}
    return [slots[tuple(int(t) for t in r.tokens[:-1])] for r in rows]


def test_layout_holds_each_prompt_once_and_keeps_every_row_whole():
    rows = group_rows(np.random.default_rng(0))
    plain = pack_rows(rows, 0)
    shared = pack_rows(rows, 0, share_prefix=True)
    assert plain.prefix_tokens is None
    # 3 groups + a blank prefix for the row that shares nothing
    assert shared.prefix_tokens.shape[0] == 4 and shared.tokens.shape[0] == len(rows)
    held = np.sum(shared.segment_ids != 0) + np.sum(shared.prefix_segment_ids != 0)
    assert held < 0.6 * np.sum(plain.segment_ids != 0)
    slots = _slot_of_row(shared, rows)
    assert sorted(slots) == list(range(len(rows)))
    for r, k in zip(rows, slots):
        s = len(r.tokens) - 1 - int(np.sum(shared.segment_ids[k] != 0))
        # RoPE positions continue the prefix; every loss token keeps its fields
        np.testing.assert_array_equal(shared.positions[k][:len(r.tokens) - 1 - s],
                                      np.arange(s, len(r.tokens) - 1))
        n = len(r.tokens) - 1 - s
        np.testing.assert_array_equal(shared.loss_mask[k][:n], np.asarray(r.policy_mask[s + 1:]))
        np.testing.assert_array_equal(shared.advantages[k][:n], r.advantages[s + 1:])
        # the prefix stops before the row's first policy target
        assert not any(r.policy_mask[1:s + 1])


def _loss_fn(cfg, lc):
    def loss(p, batch):
        lp, ent = score_logprobs(p, cfg, batch)
        return get_loss("ppo_clip")(lp, ent, batch, lc)[0], lp
    return loss


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_shared_prefix_logprobs_loss_and_grads_equal_plain(aggregation):
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    rows = group_rows(np.random.default_rng(1))
    plain, shared = pack_rows(rows, 0), pack_rows(rows, 0, share_prefix=True)
    assert shared.prefix_tokens is not None
    loss = _loss_fn(cfg, LossConfig(aggregation=aggregation, old_from_current=True))
    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))  # eager op-by-op took ~35 s
    (l0, lp0), g0 = grad(params, jax.tree.map(jnp.asarray, plain))
    (l1, lp1), g1 = grad(params, jax.tree.map(jnp.asarray, shared))
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
    # token by token: each row's log-probs in its slot equal its plain row's (a context leak
    # between rows, a wrong prefix or wrong RoPE positions would move them)
    lp0, lp1 = np.asarray(lp0), np.asarray(lp1)
    for i, k in enumerate(_slot_of_row(shared, rows)):
        n = int(np.sum(shared.segment_ids[k] != 0))
        s = len(rows[i].tokens) - 1 - n
        np.testing.assert_allclose(lp1[k, :n], lp0[i, s:s + n], atol=2e-5)


def test_micro_batches_read_their_own_prefixes():
    """num_micro = 2 with a group split across the two micro-batches: one train step on the
    shared layout moves the params as the plain batch's step does (token_mean)."""
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    rows = group_rows(np.random.default_rng(5), prompts=3, group=4, single=False)
    shared = pack_rows(rows, 0, num_micro=2, share_prefix=True)
    assert shared.prefix_tokens is not None
    per_micro = shared.prefix_tokens.shape[0] // 2
    assert np.all(shared.prefix_index[:shared.tokens.shape[0] // 2] < per_micro)
    assert np.all(shared.prefix_index[shared.tokens.shape[0] // 2:] >= per_micro)
    opt = make_optimizer(1e-2, 1, 10)
    lc = LossConfig(aggregation="token_mean", old_from_current=True)
    out = []
    for batch, micro in ((pack_rows(rows, 0), 1), (shared, 2)):
        step = make_train_step(cfg, lc, opt, num_micro=micro)
        state, m = step(init_train_state(jax.tree.map(jnp.copy, params), opt),
                        jax.tree.map(jnp.asarray, batch))
        out.append((state.params, float(m["loss"])))
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(out[0][0]), jax.tree.leaves(out[1][0])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_batches_where_sharing_does_not_pay_stay_plain():
    """A 17-token prompt before ~47-token completions: the rows' own inputs pad to the same
    64-token bucket as the whole rows, so the batch is exactly the plain one."""
    rng = np.random.default_rng(4)
    prompt = rng.integers(3, 256, 17).tolist()
    rows = [Row(prompt + (c := rng.integers(3, 256, 44 + j).tolist()),
                [False] * 17 + [True] * len(c), np.ones(61 + j, np.float32),
                np.zeros(61 + j, np.float32)) for j in range(4)]
    plain, shared = pack_rows(rows, 0), pack_rows(rows, 0, share_prefix=True)
    assert shared.prefix_tokens is None
    for a, b in zip(plain, shared):
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_global_batch_on_a_mesh_equals_one_device():
    """On 8 devices the rows split over the mesh and the prefixes are replicated: the loss
    and gradient norm of one train step equal the plain batch's on the same mesh."""
    out = run_with_devices("""
        import jax, jax.numpy as jnp, numpy as np
        from tests.test_shared_prefix import group_rows
        from toolverse_jax.models import get_preset, init_params
        from toolverse_jax.rl.batching import global_batch
        from toolverse_jax.rl.trainer import (LossConfig, init_train_state, make_optimizer,
                                              make_train_step)
        from toolverse_jax.sharding import make_mesh, shard_params, sharding_context
        cfg = get_preset("tiny")
        rows = group_rows(np.random.default_rng(1), group=8)  # the 8 shards pad the prefixes
        mesh = make_mesh((-1, 1, 1))
        opt = make_optimizer(1e-2, 1, 10)
        lc = LossConfig(aggregation="token_mean", old_from_current=True)
        res = []
        init = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0)))
        with sharding_context(mesh):
            for share in (False, True):
                params = shard_params(init, cfg, mesh)
                batch = global_batch(rows, 0, mesh, share_prefix=share)
                assert (batch.prefix_tokens is not None) == share
                state, m = make_train_step(cfg, lc, opt)(init_train_state(params, opt), batch)
                res.append((float(m["loss"]), float(m["grad_norm"])))
        np.testing.assert_allclose(res[0], res[1], rtol=1e-4)
        print("ok", batch.tokens.shape, batch.prefix_index.sharding.spec)
    """)
    assert "ok (32, 64)" in out


def test_ppo_update_reports_the_layout_it_ran():
    """ppo_update with share_prefix: the same loss over fewer forwarded positions, and the
    metrics say which layout ran (batch/positions, batch/shared_prefix_frac)."""
    from toolverse_jax.rl.trainer import ppo_update
    from toolverse_jax.sharding import make_mesh, sharding_context
    cfg = get_preset("tiny")
    rows = group_rows(np.random.default_rng(3))
    opt = make_optimizer(1e-3, 1, 10)
    step = make_train_step(cfg, LossConfig(aggregation="token_mean"), opt)
    mesh = make_mesh((-1, 1, 1))
    out = {}
    with sharding_context(mesh):
        for share in (False, True):
            state = init_train_state(init_params(cfg, jax.random.key(0)), opt)
            _, out[share] = ppo_update(state, rows, step, cfg=cfg, mesh=mesh, num_micro=1,
                                       pad_id=0, temperature=1.0, share_prefix=share)
    plain, shared = out[False], out[True]
    np.testing.assert_allclose(shared["loss"], plain["loss"], rtol=1e-4)
    assert plain["batch/shared_prefix_frac"] == 0.0 and shared["batch/shared_prefix_frac"] == 1.0
    assert plain["batch/positions"] == pack_rows(rows, 0).tokens.size
    laid = pack_rows(rows, 0, share_prefix=True)
    assert shared["batch/positions"] == laid.tokens.size + laid.prefix_tokens.size
    assert shared["batch/positions"] < plain["batch/positions"]

    # Over a token budget the same shared-prefix minibatch is scored (pi_old) and updated in
    # micro-batches, each reading its own prefixes: the same loss.
    with sharding_context(mesh):
        state = init_train_state(init_params(cfg, jax.random.key(0)), opt)
        _, micro = ppo_update(state, rows, step, cfg=cfg, mesh=mesh, num_micro=1, pad_id=0,
                              temperature=1.0, share_prefix=True, micro_tokens=400,
                              step_for=lambda n: make_train_step(
                                  cfg, LossConfig(aggregation="token_mean"), opt, num_micro=n))
    assert micro["batch/num_micro"] == 4.0 and micro["batch/shared_prefix_frac"] == 1.0
    np.testing.assert_allclose(micro["loss"], shared["loss"], rtol=1e-4)
