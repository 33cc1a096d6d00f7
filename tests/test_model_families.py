"""Llama (SmolLM2-style, llama3 rope), Qwen2 (q/k/v bias) and Qwen3-MoE: HF PyTorch parity of fp32
logits, greedy decoding, save -> transformers round trip, and clear errors for what we lack."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import (CheckpointError, load_hf_checkpoint, logits, save_hf_checkpoint)
from toolverse_jax.models.qwen3 import router_logits

torch = pytest.importorskip("torch")

_COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _hf_config(family: str):
    import transformers as tf
    if family == "llama":  # SmolLM2-like: tied, no biases; llama3 rope so every band is hit
        return tf.LlamaConfig(intermediate_size=96, rms_norm_eps=1e-5, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 10_000.0,
                                               "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64},
                              **_COMMON)
    if family == "qwen2":
        return tf.Qwen2Config(intermediate_size=96, rms_norm_eps=1e-6, tie_word_embeddings=False,
                              rope_theta=1_000_000.0, **_COMMON)
    if family.startswith("qwen3_moe"):  # qwen3_moe_raw: top-k probabilities not renormalized
        return tf.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                                 num_experts_per_tok=2, norm_topk_prob=family == "qwen3_moe",
                                 rms_norm_eps=1e-6,
                                 tie_word_embeddings=False, rope_theta=1_000_000.0, **_COMMON)
    raise ValueError(family)


def _hf_model(family: str, seed: int = 0):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_hf_config(family)).eval()
    with torch.no_grad():  # random norms, biases and router so parity checks their layouts too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "bias" in name or name.endswith("gate.weight"):
                p.copy_(0.5 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3_moe", "qwen3_moe_raw"])
def hf_dir(request, tmp_path_factory):
    model = _hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path, safe_serialization=True)
    return request.param, model, path


def _hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


def test_logits_parity(hf_dir):
    family, model, path = hf_dir
    cfg, params = load_hf_checkpoint(path, dtype=jnp.float32)
    assert cfg.model_type == family.removesuffix("_raw")
    assert (cfg.qk_norm, cfg.qkv_bias) == {"llama": (False, False), "qwen2": (False, True),
                                           "qwen3_moe": (True, False)}[cfg.model_type]
    assert cfg.norm_topk_prob == (family != "qwen3_moe_raw")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 80)).astype(np.int32)
    ours = np.asarray(logits(params, cfg, jnp.asarray(tokens)))
    ref = _hf_logits(model, tokens)
    assert ours.shape == ref.shape
    err = float(np.max(np.abs(ours - ref)))
    assert err <= 1e-4, f"{family}: max |logit diff| {err:.2e}"


def test_greedy_parity(hf_dir):
    from toolverse_jax.sampling import SamplingParams, generate
    family, model, path = hf_dir
    cfg, params = load_hf_checkpoint(path, dtype=jnp.float32)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 9)).astype(np.int64)
    with torch.no_grad():
        ref = model.generate(torch.tensor(prompt), max_new_tokens=10, do_sample=False,
                             eos_token_id=None, pad_token_id=0).numpy()[:, 9:]
    out = generate(params, cfg, [list(p) for p in prompt], SamplingParams(max_new_tokens=10),
                   rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :10], ref)


def test_save_round_trip_loads_in_transformers(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    family, model, path = hf_dir
    cfg, params = load_hf_checkpoint(path)
    save_hf_checkpoint(params, cfg, str(tmp_path))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert type(reloaded) is type(model)
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(2, 11)).astype(np.int32)
    np.testing.assert_allclose(_hf_logits(reloaded, tokens), _hf_logits(model, tokens), atol=1e-6)
    cfg2, params2 = load_hf_checkpoint(str(tmp_path))
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_moe_router_logits_match_transformers(hf_dir):
    family, model, path = hf_dir
    if not family.startswith("qwen3_moe"):
        pytest.skip("MoE only")
    cfg, params = load_hf_checkpoint(path)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 7)).astype(np.int32)
    _, ours = router_logits(params, cfg, jnp.asarray(tokens))
    assert ours.shape == (cfg.num_layers, 2, 7, cfg.num_experts)
    with torch.no_grad():
        ref = model(torch.tensor(tokens, dtype=torch.long), output_router_logits=True).router_logits
    ref = np.stack([r.float().numpy().reshape(2, 7, -1) for r in ref])
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4)


def test_unsupported_settings_fail_clearly(tmp_path):
    from toolverse_jax.models.hf import config_from_hf
    base = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 64}
    with pytest.raises(CheckpointError, match="model_type='mistral' is not supported"):
        config_from_hf(dict(base, model_type="mistral"))
    with pytest.raises(CheckpointError, match="attention_bias"):
        config_from_hf(dict(base, model_type="llama", attention_bias=True))
    with pytest.raises(CheckpointError, match="rope type 'yarn'"):
        config_from_hf(dict(base, model_type="qwen3",
                            rope_parameters={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        config_from_hf(dict(base, model_type="qwen2", use_sliding_window=True))
    cfg = config_from_hf(dict(base, model_type="qwen2"))
    (tmp_path / "config.json").write_text(json.dumps(dict(base, model_type="qwen2")))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="no HF equivalent"):
        save_hf_checkpoint({}, cfg.replace(qk_norm=True), str(tmp_path / "out"))
