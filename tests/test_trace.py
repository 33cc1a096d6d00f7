"""TRACE credit math on hand-worked examples; single-pass scorer vs per-state forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import forward, get_preset, init_params, logprobs_of
from toolverse_jax.rl import advantages as adv
from toolverse_jax.rl import registry
from toolverse_jax.rl import trace
from toolverse_jax.rl import trace_scoring as ts


def test_telescoping_and_redundant_call():
    lb = jnp.array([[-3.0, -2.0, -2.0, -0.5, -0.1], [-1.0, -0.7, -9.0, -9.0, -9.0]])
    m = jnp.array([[True] * 4, [True, False, False, False]])
    d = trace.trace_rewards(lb, m, eps=0.1)
    d0, dn = 3.1, 0.2
    np.testing.assert_allclose(jnp.sum(d[0]), np.log(d0 / dn), rtol=1e-6)
    np.testing.assert_allclose(jnp.sum(d[1]), np.log(1.1 / 0.8), rtol=1e-6)
    assert float(d[0, 1]) == 0.0  # the redundant call that left ℓ̄ unchanged
    assert np.all(np.asarray(d[1, 1:]) == 0.0)
    np.testing.assert_allclose(d[0], np.log([3.1 / 2.1, 1.0, 2.1 / 0.6, 0.6 / 0.2]), rtol=1e-6)


def test_modes():
    lb = jnp.array([[-3.0, -1.0, -0.5]])
    m = jnp.ones((1, 2), bool)
    np.testing.assert_allclose(trace.trace_rewards(lb, m, mode="raw"), [[2.0, 0.5]])
    np.testing.assert_allclose(trace.trace_rewards(lb, m, mode="gap_normalized", eps=0.1),
                               [[2.0 / 3.1, 0.5 / 1.1]], rtol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        trace.trace_rewards(lb, m, mode="nope")
    with pytest.raises(ValueError, match="T\\+1"):
        trace.trace_rewards(lb[:, :2], m)


def test_kstep_backup_and_fill_hand_example():
    # one row, n = 4 tool turns, K = 3, γ = 0.8, fill 2.0, A_out = 0.5
    d = jnp.array([[1.0, 2.0, 3.0, 4.0, 0.0]])
    m = jnp.array([[True, True, True, True, False]])
    c = trace.kstep_backup(d, m, jnp.array([0.5]), k_steps=3, gamma_td=0.8, fill=2.0)
    g = 0.8
    c0 = (1 + g * 2 + g * g * 3) / (1 + g + g * g)             # window 0..2: no fill
    c1 = (2 + g * 3 + g * g * 4) / (1 + g + g * g) + 2 * g ** 3 * 0.5  # window 1..3 reaches end
    c2 = (3 + g * 4) / (1 + g) + 2 * g ** 2 * 0.5
    c3 = 4.0 + 2 * g * 0.5
    np.testing.assert_allclose(c, [[c0, c1, c2, c3, 0.0]], rtol=1e-6)


def test_trace_advantages_mix_answer_turn_and_masks():
    # group of 2: rollout 0 has 2 tool turns + answer; rollout 1 one tool turn + answer;
    # rollout 2 (another group) invalid.
    lb = jnp.array([[-2.0, -1.0, -0.2, 0.0], [-2.0, -2.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    tm = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
    am = jnp.array([[0, 0, 1], [0, 1, 0], [0, 0, 1]], bool)
    R = jnp.array([1.0, 0.0, 1.0])
    g = jnp.array([0, 0, 1])
    valid = jnp.array([True, True, False])
    a = trace.trace_advantages(lb, tm, R, g, answer_mask=am, valid=valid)
    a_out = np.asarray(adv.grpo(R, g, valid=valid))
    dl = np.log([2.1 / 1.1, 1.1 / 0.3])
    gm = 0.8
    c0 = (dl[0] + gm * dl[1]) / (1 + gm) + 2 * gm ** 2 * a_out[0]
    c1 = dl[1] + 2 * gm * a_out[0]
    want0 = [a_out[0] + 0.2 * c0, a_out[0] + 0.2 * c1, a_out[0]]
    want1 = [a_out[1] + 0.2 * (0.0 + 2 * gm * a_out[1]), a_out[1], 0.0]
    np.testing.assert_allclose(a[0], want0, rtol=1e-5)
    np.testing.assert_allclose(a[1], want1, rtol=1e-5)
    assert np.all(np.asarray(a[2]) == 0.0)
    batch = registry.AdvantageInputs(rewards=R, group_ids=g, valid=valid, turn_mask=tm,
                                     answer_mask=am, readiness=lb)
    got = jax.jit(lambda b: registry.get_advantage("trace")(b, {}))(batch)
    np.testing.assert_allclose(got, a, rtol=1e-6)


# ----------------------------------------------------------------------------- scorer
@pytest.fixture(scope="module")
def tiny():
    cfg = get_preset("tiny")
    return cfg, init_params(cfg, jax.random.key(0))


def _np_readiness(params, cfg, seq, bnd, aliases, prefix):
    """Per-state reference: one unpadded forward per (rollout, state, alias)."""
    b, t1 = bnd.shape
    out = np.zeros((b, t1))
    for i in range(b):
        for k in range(t1):
            if bnd[i, k] < 0:
                continue
            best = -np.inf
            for ans in aliases[i]:
                toks = np.concatenate([seq[i, :bnd[i, k]], prefix, ans]).astype(np.int32)
                tg = np.concatenate([toks[1:], [0]]).astype(np.int32)
                mask = np.zeros(len(toks), bool)
                start = bnd[i, k] + len(prefix) - 1
                mask[start:start + len(ans)] = True
                lp, _ = logprobs_of(params, cfg, toks[None], tg[None], mask=mask[None])
                best = max(best, float(np.asarray(lp)[0][mask].mean()))
            out[i, k] = best
    return out


def _case():
    rng = np.random.default_rng(0)
    b, l = 2, 24
    seq = rng.integers(5, 300, size=(b, l)).astype(np.int32)
    bnd = np.array([[4, 9, 15, 22], [6, 11, -1, -1]], np.int32)
    aliases = [[[10, 11, 12], [40, 41]], [[7, 8, 9, 10]]]
    return seq, bnd, aliases, np.array([60, 61], np.int32)


def test_single_pass_equals_naive(tiny):
    cfg, params = tiny
    seq, bnd, aliases, prefix = _case()
    ans = ts.pack_answers(aliases)
    sp = jax.jit(lambda *x: ts.score_readiness(params, cfg, *x))(seq, bnd, ans, prefix)
    nv = jax.jit(lambda *x: ts.score_readiness_naive(params, cfg, *x))(seq, bnd, ans, prefix)
    np.testing.assert_allclose(sp, nv, atol=1e-5)
    assert np.all(np.asarray(sp)[1, 2:] == 0.0) and np.all(np.asarray(sp)[0] < 0)


@pytest.mark.slow
def test_single_pass_equals_unpadded_per_state_forward(tiny):
    cfg, params = tiny
    seq, bnd, aliases, prefix = _case()
    sp = ts.score_readiness(params, cfg, seq, bnd, ts.pack_answers(aliases), prefix)
    ref = _np_readiness(params, cfg, seq, bnd, aliases, prefix)
    np.testing.assert_allclose(sp, ref, atol=1e-5)


def test_attn_mask_default_is_unchanged(tiny):
    cfg, params = tiny
    toks = jnp.arange(12, dtype=jnp.int32)[None] + 3
    h0, _ = forward(params, cfg, toks)
    h1, _ = forward(params, cfg, toks, attn_mask=jnp.ones((1, 12, 12), bool))
    np.testing.assert_array_equal(h0, h1)


def test_empty_prefix_is_rejected(tiny):
    cfg, params = tiny
    with pytest.raises(ValueError, match="answer_prefix_ids"):
        ts.score_readiness(params, cfg, np.zeros((1, 4), np.int32), np.array([[2]]),
                           np.array([[1, 2]]), np.zeros((0,), np.int32))


def test_state_boundaries_and_packing():
    #           prompt    turn0  obs   turn1 obs   (stopped after 2 tool turns, no answer)
    tt = [-1, -1, -1, 0, 0, -1, -1, 1, 1, -1]
    assert ts.state_boundaries(tt, 2, 4) == [3, 7, 10, -1]
    tt2 = [-1, -1, 0, -1, 1, 1]  # one tool turn, then the answer turn 1
    assert ts.state_boundaries(tt2, 1, 4) == [2, 4, -1, -1]
    seq, bnd, ans = ts.readiness_inputs([list(range(10)), list(range(6))], [tt, tt2], [2, 1],
                                        [[[5, 6]], [[7], [8, 9, 1]]], num_turns=3,
                                        answer_pad_to=1)
    assert seq.shape == (2, 16) and bnd.tolist() == [[3, 7, 10, -1], [2, 4, -1, -1]]
    assert ans.tolist() == [[[5, 6, -1], [-1, -1, -1]], [[7, -1, -1], [8, 9, 1]]]
    _, _, padded = ts.readiness_inputs([list(range(10))], [tt], [2], [[[5, 6]]], num_turns=3)
    assert padded.tolist() == [[[5, 6] + [-1] * 6]]  # La rounded up to 8: one compile per bucket


def test_readiness_for_trajectories_matches_direct_scoring(tiny):
    from types import SimpleNamespace

    from toolverse_jax.models import ByteTokenizer

    cfg, params = tiny
    tok = ByteTokenizer()
    task = SimpleNamespace(answer="Paris", meta={"aliases": ["Paris", "paris"]})
    tr = SimpleNamespace(task_id="t", tokens=list(range(20, 32)),
                         token_turn=[-1] * 3 + [0] * 3 + [-1] * 3 + [1] * 3, num_call_turns=1)
    got = ts.readiness_for_trajectories(params, cfg, [tr], {"t": task}, tok, num_turns=2,
                                        pad_to=8)
    prefix = np.asarray(tok.encode("<answer>", allow_special=False), np.int32)
    ans = ts.pack_answers([[tok.encode("Paris", allow_special=False),
                            tok.encode("paris", allow_special=False)]])
    seq = np.zeros((1, 16), np.int32)
    seq[0, :12] = tr.tokens
    want = ts.score_readiness(params, cfg, seq, np.array([[3, 9, -1]]), ans, prefix)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert got[0, 2] == 0.0 and got[0, 0] < 0


def test_readiness_metrics_use_each_rows_last_state():
    r = np.array([[-2.0, -1.0, -0.5, 0.0], [-3.0, -3.0, 0.0, 0.0]])
    m = ts.readiness_metrics(r, [2, 5])  # row 1 has more turns than states: clipped to S_3
    assert m["trace/readiness_s0"] == pytest.approx(-2.5)
    assert m["trace/readiness_last"] == pytest.approx((-0.5 + 0.0) / 2)
    assert m["trace/readiness_gain"] == pytest.approx(((-0.5 + 2.0) + 3.0) / 2)


def test_trace_search_config_runs_an_rl_step_end_to_end(tmp_path):
    # configs/trace_search.py through experiments' run_training: search tasks, the hidden BM25
    # server, readiness under the frozen reference, TRACE advantages and one PPO update.
    import json

    from configs.trace_search import get_config
    from toolverse_jax.rl.driver import run_training

    c = get_config()
    c.tasks.num_tasks, c.tasks.eval_fraction = 16, 0.25
    c.model.tokenizer = "byte"
    c.sft.steps, c.sft.batch_size = 2, 4
    c.rl.steps, c.rl.tasks_per_step, c.rl.group_size = 1, 2, 2
    c.rollout.max_new_tokens, c.rollout.max_turns = 24, 2
    c.train.eval_every, c.train.progress = 0, False
    run_training(c, str(tmp_path))
    rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    rl = [r for r in rows if r.get("phase") == "rl"]
    assert len(rl) == 1 and np.isfinite(rl[0]["loss"])
    m = rl[0]
    assert m["trace/readiness_s0"] < 0 and m["trace/readiness_last"] < 0
    assert m["trace/readiness_gain"] == pytest.approx(m["trace/readiness_last"] -
                                                      m["trace/readiness_s0"], abs=1e-6)
