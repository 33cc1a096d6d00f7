"""KVSession: multi-turn sampling that keeps each context's KV cache equals re-prefilling."""

import jax
import numpy as np
import pytest

from benchmarks.rollout import episode_plan, run_episodes
from toolverse_jax.models import get_preset, init_params
from toolverse_jax.sampling import KVSession, SamplingParams, generate
from tests.scoring import context_logprobs


@pytest.fixture(scope="module")
def tiny():
    cfg = get_preset("tiny")
    return cfg, init_params(cfg, jax.random.key(0))


def test_greedy_turns_equal_full_reprefill_with_compaction_and_dropouts(tiny):
    cfg, params = tiny
    # Stop ids make turns of varying length (holes in the cache); episodes end at different
    # turns (the batch shrinks); 6 turns overflow the first cache bucket (compaction).
    sp = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(5, 17, 33))
    plan = episode_plan(np.random.default_rng(0), 6, 6, 24, cfg.vocab_size)
    ref, n_ref = run_episodes(lambda p, t: generate(params, cfg, p, sp, jax.random.key(t)),
                              plan, 6)
    session = KVSession(params, cfg, sp)
    got, n_got = run_episodes(lambda p, t: session.generate(p, jax.random.key(t)), plan, 6)
    assert got == ref and n_got == n_ref
    s = session.stats
    assert s["sessions"] == 1 and s["compactions"] >= 1
    # Only the appended tokens were prefilled after the first turn.
    assert s["reused_tokens"] > s["prefill_tokens"] > sum(len(p) for p in plan["prompts"])


def test_sampled_logprobs_match_reprefill_and_unrelated_prompts_start_a_new_session(tiny):
    cfg, params = tiny
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(7,))
    rng = np.random.default_rng(1)
    ctx = [rng.integers(3, cfg.vocab_size, 20 + 5 * i).tolist() for i in range(3)]
    session = KVSession(params, cfg, sp)
    for turn in range(3):
        out = session.generate(ctx, jax.random.key(turn))
        for r in range(len(ctx)):
            n = int(out.lengths[r])
            ctx[r] = ctx[r] + out.tokens[r, :n].tolist()
            # The sampled tokens' log-probs equal the trainer's scoring of the whole context.
            lp = context_logprobs(params, cfg, ctx[r])
            np.testing.assert_allclose(lp[-n:], out.logprobs[r, :n], atol=1e-5)
            ctx[r] = ctx[r] + rng.integers(3, cfg.vocab_size, 9).tolist()
    assert session.stats["sessions"] == 1
    session.generate([rng.integers(3, cfg.vocab_size, 15).tolist()], jax.random.key(9))
    assert session.stats["sessions"] == 2
    with pytest.raises(ValueError, match="at least one token"):
        session.generate([[]], jax.random.key(0))


def test_repeated_prompts_share_one_prefill_and_then_diverge(tiny):
    """A new batch of repeated prompts (a GRPO group) prefills each once; the rows then grow
    apart turn by turn and still equal re-prefilling each context (greedy)."""
    cfg, params = tiny
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(5,))
    rng = np.random.default_rng(3)
    base = [rng.integers(3, cfg.vocab_size, 30).tolist() for _ in range(2)]
    ctx = [list(base[i // 3]) for i in range(6)]
    session = KVSession(params, cfg, sp)
    for turn in range(3):
        out = session.generate(ctx, jax.random.key(turn))
        ref = generate(params, cfg, ctx, sp, jax.random.key(turn))
        for r in range(6):
            n = int(out.lengths[r])
            assert n == int(ref.lengths[r])
            assert out.tokens[r, :n].tolist() == ref.tokens[r, :n].tolist()
            # each row gets its own env response: the group's contexts diverge
            ctx[r] = ctx[r] + out.tokens[r, :n].tolist() + [3 + r, 4 + turn]
        if turn == 0:  # two distinct prompts prefilled, not six
            assert session.stats["prefill_tokens"] == 60
    assert session.stats["sessions"] == 1
