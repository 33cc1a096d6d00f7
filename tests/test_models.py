"""Qwen3 model: HF PyTorch parity (logits, greedy, save round-trip), KV cache vs no cache, masks."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import (CheckpointError, forward, get_preset, init_cache, init_params,
                                  load_hf_checkpoint, logits, save_hf_checkpoint)

torch = pytest.importorskip("torch")


def _hf_model(tie: bool, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                      max_position_embeddings=256)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # random norms so parity also checks the norm weights' layout
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_dir(request, tmp_path_factory):
    model = _hf_model(tie=request.param)
    path = str(tmp_path_factory.mktemp("hf"))
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def _hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


def test_hf_logits_parity(hf_dir):
    model, path = hf_dir
    cfg, params = load_hf_checkpoint(path, dtype=jnp.float32)
    assert cfg.rope_theta == 1_000_000.0 and cfg.num_kv_heads == 2
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(3, 17)).astype(np.int32)
    ours = np.asarray(logits(params, cfg, jnp.asarray(tokens)))
    ref = _hf_logits(model, tokens)
    assert ours.shape == ref.shape == (3, 17, cfg.vocab_size)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_hf_greedy_parity(hf_dir):
    from toolverse_jax.sampling import SamplingParams, generate
    model, path = hf_dir
    cfg, params = load_hf_checkpoint(path, dtype=jnp.float32)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 9)).astype(np.int64)
    with torch.no_grad():
        ref = model.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0).numpy()[:, 9:]
    out = generate(params, cfg, [list(p) for p in prompt], SamplingParams(max_new_tokens=12),
                   rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :12], ref)


def test_save_round_trip_loads_in_transformers(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    model, path = hf_dir
    cfg, params = load_hf_checkpoint(path)
    save_hf_checkpoint(params, cfg, str(tmp_path))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(2, 11)).astype(np.int32)
    np.testing.assert_allclose(_hf_logits(reloaded, tokens), _hf_logits(model, tokens), atol=1e-6)
    cfg2, params2 = load_hf_checkpoint(str(tmp_path))
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_corrupt_and_mismatched_checkpoints_fail_clearly(hf_dir, tmp_path):
    _, path = hf_dir
    cfg, params = load_hf_checkpoint(path)
    save_hf_checkpoint(params, cfg, str(tmp_path))
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_hf_checkpoint(str(tmp_path))
    save_hf_checkpoint(params, cfg, str(tmp_path))
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["intermediate_size"] += 1
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match="mlp.gate_proj.weight.*shape"):
        load_hf_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf_checkpoint(str(tmp_path / "nope"))
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf_checkpoint(str(tmp_path))


def _tiny():
    cfg = get_preset("tiny")
    return cfg, init_params(cfg, jax.random.key(0))


def test_kv_cache_prefill_and_decode_match_full_forward():
    cfg, params = _tiny()
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    full, _ = forward(params, cfg, tokens)
    cache = init_cache(cfg, batch=2, slots=16)
    h_pre, cache = forward(params, cfg, tokens[:, :7], cache=cache)
    steps = [h_pre]
    for t in range(7, 12):
        pos = jnp.full((2, 1), t, jnp.int32)
        h, cache = forward(params, cfg, tokens[:, t:t + 1], positions=pos, cache=cache)
        steps.append(h)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, 1)), np.asarray(full), atol=1e-5)
    assert int(cache.index) == 12


def test_left_padding_and_packing_match_unpadded():
    cfg, params = _tiny()
    a = jax.random.randint(jax.random.key(2), (1, 5), 0, cfg.vocab_size)
    b = jax.random.randint(jax.random.key(3), (1, 8), 0, cfg.vocab_size)
    ha, _ = forward(params, cfg, a)
    hb, _ = forward(params, cfg, b)
    # Left-padded: 3 pad tokens (segment 0) then a, positions restart at 0.
    padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), a], 1)
    seg = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1]])
    pos = jnp.array([[0, 0, 0, 0, 1, 2, 3, 4]])
    hp, _ = forward(params, cfg, padded, positions=pos, segment_ids=seg)
    np.testing.assert_allclose(np.asarray(hp[:, 3:]), np.asarray(ha), atol=1e-5)
    assert np.isfinite(np.asarray(hp)).all()
    # Packed: a then b in one row, segments 1 and 2.
    packed = jnp.concatenate([a, b], 1)
    seg = jnp.array([[1] * 5 + [2] * 8])
    pos = jnp.array([list(range(5)) + list(range(8))])
    hk, _ = forward(params, cfg, packed, positions=pos, segment_ids=seg)
    np.testing.assert_allclose(np.asarray(hk[:, :5]), np.asarray(ha), atol=1e-5)
    np.testing.assert_allclose(np.asarray(hk[:, 5:]), np.asarray(hb), atol=1e-5)


def test_bf16_model_runs_and_is_close_to_fp32():
    cfg, params = _tiny()
    cfg16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    tokens = jax.random.randint(jax.random.key(4), (2, 10), 0, cfg.vocab_size)
    l32 = logits(params, cfg, tokens)
    l16 = logits(p16, cfg16, tokens)
    assert l16.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(l16 - l32))) < 0.25 * float(jnp.max(jnp.abs(l32)))


def test_moe_preset_shrunk_runs_and_counts_params():
    # Qwen3-30B-A3B's layout at toy size (HF parity lives in test_model_families.py).
    cfg = get_preset("qwen3-30b-a3b").replace(
        num_layers=1, d_model=32, vocab_size=64, num_heads=4, num_kv_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, moe_mlp_dim=16, dtype="float32",
        param_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    assert params["layers_0"]["moe"]["gate_proj"].shape == (4, 32, 16)
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()
    out = logits(params, cfg, jnp.zeros((2, 5), jnp.int32))
    assert out.shape == (2, 5, 64) and np.isfinite(np.asarray(out)).all()


def test_logprobs_of_matches_log_softmax_of_logits():
    from toolverse_jax.models import logprobs_of
    cfg, params = _tiny()
    tokens = jax.random.randint(jax.random.key(5), (2, 9), 0, cfg.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    mask = jnp.ones((2, 9)).at[1, 5:].set(0)
    lp, ent = logprobs_of(params, cfg, tokens, targets, mask=mask, temperature=0.8)
    full = jax.nn.log_softmax(logits(params, cfg, tokens) / 0.8, axis=-1)
    ref = jnp.take_along_axis(full, targets[..., None], axis=-1)[..., 0] * mask
    ref_ent = -jnp.sum(jnp.exp(full) * full, axis=-1) * mask
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(ref_ent), atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_swiglu_backward_matches_autodiff(dtype, tol):
    """The MLP's written-out backward (`qwen3.swiglu`) equals autodiff of its plain expression,
    for the input and all three weights."""
    from toolverse_jax.models.qwen3 import swiglu
    ks = jax.random.split(jax.random.key(3), 5)
    x = jax.random.normal(ks[0], (3, 7, 16), dtype)
    wg, wu = (jax.random.normal(k, (16, 24), dtype) * 0.5 for k in ks[1:3])
    wd = jax.random.normal(ks[3], (24, 16), dtype) * 0.5
    ct = jax.random.normal(ks[4], (3, 7, 16), dtype)

    def plain(x, wg, wu, wd):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    def loss(f):
        return lambda *a: jnp.sum((f(*a) * ct).astype(jnp.float32))

    args = (x, wg, wu, wd)
    np.testing.assert_array_equal(np.asarray(swiglu(*args), np.float32),
                                  np.asarray(plain(*args), np.float32))
    got = jax.grad(loss(swiglu), argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(loss(plain), argnums=(0, 1, 2, 3))(*args)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        scale = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   atol=tol * scale, rtol=0)
