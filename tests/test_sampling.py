"""Sampler: greedy == step-by-step argmax of the full forward, stops, filtering, buckets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import get_preset, init_params
from toolverse_jax.sampling import SamplingParams, bucket_length, generate, pad_prompts
from toolverse_jax.sampling.sampler import filter_logits
from tests.scoring import last_logits


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("tiny")
    return cfg, init_params(cfg, jax.random.key(0))


def _argmax_reference(params, cfg, prompt, n, width=32):
    """Greedy decoding by full forwards (one jitted fixed-width forward: tests/scoring.py)."""
    seq = list(prompt)
    out, lps = [], []
    for _ in range(n):
        lg = last_logits(params, cfg, seq, width).astype(np.float64)
        tok = int(np.argmax(lg))
        lse = np.log(np.sum(np.exp(lg - lg.max()))) + lg.max()
        out.append(tok)
        lps.append(lg[tok] - lse)
        seq.append(tok)
    return out, lps


def test_greedy_equals_full_forward_argmax(model):
    cfg, params = model
    prompts = [[5, 9, 17, 3], [100, 2, 7, 7, 7, 250, 1], [42]]
    out = generate(params, cfg, prompts, SamplingParams(max_new_tokens=10), jax.random.key(1))
    for i, p in enumerate(prompts):
        ref_tok, ref_lp = _argmax_reference(params, cfg, p, 10)
        assert out.tokens[i].tolist() == ref_tok
        np.testing.assert_allclose(out.logprobs[i], ref_lp, atol=1e-4)
    assert out.lengths.tolist() == [10, 10, 10]
    assert not out.stopped.any()


def test_chunked_prefill_equals_one_pass(model):
    """Prompts past `prefill_chunk` are prefilled in chunks; the continuation is the same."""
    cfg, params = model
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 250, n).tolist() for n in (700, 333, 20)]  # bucket 768
    sample = dict(max_new_tokens=12, temperature=1.0, top_p=0.9)
    one = generate(params, cfg, prompts, SamplingParams(prefill_chunk=0, **sample), jax.random.key(3))
    for chunk in (256, 200):  # 200 -> the largest divisor of 768 below it, 192
        out = generate(params, cfg, prompts, SamplingParams(prefill_chunk=chunk, **sample),
                       jax.random.key(3))
        assert out.tokens.tolist() == one.tokens.tolist()
        np.testing.assert_allclose(out.logprobs, one.logprobs, atol=1e-5)
    from toolverse_jax.sampling.sampler import prefill_chunk_size
    assert [prefill_chunk_size(768, c) for c in (0, 1024, 256, 200)] == [768, 768, 256, 192]
    with pytest.raises(ValueError, match="prefill_chunk"):
        SamplingParams(prefill_chunk=-1)


def test_stop_token_and_stop_sequence_end_each_row_independently(model):
    cfg, params = model
    prompts = [[5, 9, 17, 3], [100, 2, 7, 7, 7, 250, 1]]
    free = generate(params, cfg, prompts, SamplingParams(max_new_tokens=8), jax.random.key(1))
    stop_tok = int(free.tokens[0, 2])  # row 0 emits this at step 2
    sp = SamplingParams(max_new_tokens=8, stop_token_ids=(stop_tok,), pad_id=0)
    out = generate(params, cfg, prompts, sp, jax.random.key(1))
    first = list(free.tokens[0]).index(stop_tok)
    assert out.lengths[0] == first + 1 and out.stopped[0]
    assert (out.tokens[0, first + 1:] == 0).all() and (out.logprobs[0, first + 1:] == 0).all()
    row1 = list(free.tokens[1])
    expect1 = row1.index(stop_tok) + 1 if stop_tok in row1 else 8
    assert out.lengths[1] == expect1
    seq = tuple(int(t) for t in free.tokens[1, 3:5])
    out2 = generate(params, cfg, prompts, SamplingParams(max_new_tokens=8, stop_sequences=(seq,)),
                    jax.random.key(1))
    assert out2.lengths[1] <= 5 and out2.stopped[1]
    assert tuple(out2.tokens[1, out2.lengths[1] - 2:out2.lengths[1]]) == seq


def test_sampling_is_seeded_and_respects_top_k(model):
    cfg, params = model
    sp = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=3)
    a = generate(params, cfg, [[1, 2, 3]] * 4, sp, jax.random.key(7))
    b = generate(params, cfg, [[1, 2, 3]] * 4, sp, jax.random.key(7))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    seq = [1, 2, 3]
    for t in a.tokens[0]:
        lg = last_logits(params, cfg, seq)
        assert int(t) in np.argsort(lg)[-3:]
        seq.append(int(t))


def test_filter_top_p_keeps_smallest_prefix():
    lg = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = np.isfinite(np.asarray(filter_logits(lg, 0, 0.7))) & (
        np.asarray(filter_logits(lg, 0, 0.7)) > -1e30)
    assert kept.tolist() == [[True, True, False, False]]
    kept = np.asarray(filter_logits(lg, 0, 0.4)) > -1e30
    assert kept.tolist() == [[True, False, False, False]]


def test_filter_top_p_bisection_equals_full_sort():
    # the nucleus found by bisection on the cutoff keeps exactly the set a sort of the whole
    # vocabulary keeps: sharp rows (small nuclei), flat rows (nuclei of nearly every token),
    # ties at the cutoff, and a row whose top token alone reaches top_p
    rng = np.random.default_rng(0)
    sharp = rng.normal(size=(5, 300)) * 6.0      # small nuclei: the candidates suffice
    flat = rng.normal(size=(3, 300)) * 0.1       # nuclei of ~all tokens: the fallback sort
    ties = np.repeat(rng.normal(size=(2, 30)), 10, axis=1)   # every value 10 times
    one = np.array([[9.0] + [0.0] * 299])
    for lg in (sharp, flat, ties, one, np.concatenate([sharp, flat])):
        for top_p in (0.3, 0.9, 0.99):
            p = np.exp(lg - lg.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            want = np.zeros(lg.shape, bool)
            for r in range(lg.shape[0]):
                order = np.argsort(-lg[r])
                n = int(np.searchsorted(np.cumsum(p[r, order]), top_p) + 1)
                want[r] = lg[r] >= lg[r, order[n - 1]]   # ties at the cutoff are kept
            got = np.asarray(filter_logits(jnp.asarray(lg, jnp.float32), 0, top_p)) > -1e30
            np.testing.assert_array_equal(got, want, err_msg=f"top_p={top_p}")


def test_buckets_bound_shapes():
    assert [bucket_length(n) for n in (1, 32, 33, 100, 300, 1025)] == [32, 32, 64, 128, 512, 1280]
    # The trainer's quarter-octave buckets (pack_rows): at most 1/4 padding above min_bucket.
    fine = [bucket_length(n, 64, 512, per_octave=4) for n in (64, 65, 95, 97, 187, 300, 513)]
    assert fine == [64, 80, 96, 112, 192, 320, 640]
    for n in range(65, 2000, 7):
        b = bucket_length(n, 64, 512, per_octave=4)
        assert n <= b and b % 16 == 0 and (b - n) < max(b // 4, 128)
    with pytest.raises(ValueError, match="per_octave"):
        bucket_length(100, per_octave=0)
    tok, seg = pad_prompts([[1, 2], [3, 4, 5]], pad_id=0)
    assert tok.shape == (2, 32) and seg[0].sum() == 2 and tok[1, -3:].tolist() == [3, 4, 5]
    tok, _ = pad_prompts([[1]] * 3, pad_id=0)
    assert tok.shape[0] == 4
    with pytest.raises(ValueError, match="at least one token"):
        pad_prompts([[]], pad_id=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


def test_inverse_cdf_draws_the_softmax_distribution():
    """One uniform a row, inverted through the CDF: the empirical frequencies of 40k draws over
    a 300-id vocabulary match softmax(logits) (total variation < 0.03, where sampling noise
    alone gives ~0.015), and a flipped comparison (the mirrored ids) would not."""
    from toolverse_jax.sampling.sampler import inverse_cdf
    v, n = 300, 40_000
    logits = jax.random.normal(jax.random.key(1), (v,)) * 2.0
    p = np.asarray(jax.nn.softmax(logits))
    u = jax.random.uniform(jax.random.key(2), (n,))
    ids = np.asarray(inverse_cdf(jnp.broadcast_to(logits, (n, v)), u))
    freq = np.bincount(ids, minlength=v) / n
    assert 0.5 * np.abs(freq - p).sum() < 0.03
    assert 0.5 * np.abs(freq[::-1] - p).sum() > 0.3


def test_inverse_cdf_never_draws_filtered_ids():
    """Ids set to -inf or the dtype's min (top-k / top-p) have no mass: not drawn at u = 0, at
    the largest float below 1, in between, or at u = 1 (every CDF value <= u * total: the draw
    is clamped to the last id with mass, not the last id)."""
    from toolverse_jax.sampling.sampler import inverse_cdf
    neg = jnp.finfo(jnp.float32).min
    logits = jnp.array([[neg, 1.0, neg, 3.0, neg, neg],
                        [-jnp.inf, -jnp.inf, 0.5, -jnp.inf, 2.0, -jnp.inf]], jnp.float32)
    top = np.nextafter(np.float32(1.0), np.float32(0.0))
    for u in (0.0, 0.3, 0.9, top, 1.0):
        ids = np.asarray(inverse_cdf(logits, jnp.full((2,), u, jnp.float32)))
        assert ids[0] in (1, 3) and ids[1] in (2, 4), (u, ids)
    for u in (top, 1.0):
        assert list(np.asarray(inverse_cdf(logits, jnp.full((2,), u, jnp.float32)))) == [3, 4]


def test_repeated_prompts_prefill_once_and_sample_on_their_own(model):
    """A GRPO group's prompt given G times is prefilled once (`distinct_contexts`): greedy
    rows equal the full-forward reference, stop early as single rows do, and sampled rows of
    one prompt are independent draws, not copies."""
    from toolverse_jax.sampling.sampler import distinct_contexts
    cfg, params = model
    prompts = [[5, 9, 17, 3], [100, 2, 7, 7, 7, 250, 1]]
    rep = [p for p in prompts for _ in range(3)]  # 6 rows -> a batch of 8
    distinct, source = distinct_contexts(rep, 8)
    assert distinct == [tuple(p) for p in prompts]
    assert source.tolist()[:6] == [0, 0, 0, 1, 1, 1] and min(source[6:]) >= 2
    assert distinct_contexts(prompts, 2) is None
    sp = SamplingParams(max_new_tokens=8, stop_token_ids=(17,))
    out = generate(params, cfg, rep, sp, jax.random.key(1))
    for i, p in enumerate(rep):
        one = generate(params, cfg, [p], sp, jax.random.key(1))
        n = int(one.lengths[0])
        assert out.tokens[i, :n].tolist() == one.tokens[0, :n].tolist()
        assert int(out.lengths[i]) == n and bool(out.stopped[i]) == bool(one.stopped[0])
        np.testing.assert_allclose(out.logprobs[i, :n], one.logprobs[0, :n], atol=1e-5)
    hot = generate(params, cfg, [prompts[0]] * 8,
                   SamplingParams(max_new_tokens=6, temperature=1.0), jax.random.key(2))
    assert len({tuple(t) for t in hot.tokens.tolist()}) > 1
