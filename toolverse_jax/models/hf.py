"""HF transformers Qwen3 checkpoints <-> our params pytree, without torch (safetensors + JSON)."""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.flax import save_file

from toolverse_jax.models.config import ModelConfig

_SUPPORTED_TYPES = ("qwen3",)
_DTYPE_NAMES = {jnp.float32: "float32", jnp.bfloat16: "bfloat16", jnp.float16: "float16"}


class CheckpointError(ValueError):
    """A checkpoint directory is missing, malformed, or does not match the model."""


def config_from_hf(hf: dict[str, Any], dtype=jnp.float32) -> ModelConfig:
    """Returns a ModelConfig from an HF Qwen3 `config.json` dict."""
    model_type = hf.get("model_type")
    if model_type not in _SUPPORTED_TYPES:
        raise CheckpointError(
            f"config.json model_type={model_type!r} is not supported; expected one of "
            f"{_SUPPORTED_TYPES} (Qwen3 dense)")
    rope = hf.get("rope_parameters") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
    name = _DTYPE_NAMES.get(dtype, "float32")
    heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
        rope_theta=float(theta), rms_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=hf.get("max_position_embeddings", 4096), param_dtype=name, dtype=name)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Returns an HF `config.json` dict for `cfg` (loadable by Qwen3ForCausalLM)."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "use_sliding_window": False, "torch_dtype": cfg.param_dtype, "dtype": cfg.param_dtype,
    }


def _weight_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not weight_map:
            raise CheckpointError(f"{index} has no 'weight_map'")
        return sorted({os.path.join(path, v) for v in weight_map.values()})
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise CheckpointError(
        f"no model.safetensors or model.safetensors.index.json in {path!r} (PyTorch .bin "
        f"checkpoints are not supported: re-save with safe_serialization=True)")


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    tensors: dict[str, Any] = {}
    for file in _weight_files(path):
        if not os.path.exists(file):
            raise CheckpointError(f"checkpoint shard {file!r} listed in the index is missing")
        try:
            with safe_open(file, framework="flax") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except Exception as e:  # safetensors raises several types for corrupt headers
            raise CheckpointError(f"cannot read {file!r}: {e}") from e
    return tensors


def load_hf_checkpoint(path: str, dtype=jnp.float32) -> tuple[ModelConfig, dict]:
    """Returns (ModelConfig, params) read from a local HF Qwen3 directory; needs no torch."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        raise CheckpointError(f"{path!r} has no config.json; expected an HF model directory")
    with open(cfg_file) as f:
        cfg = config_from_hf(json.load(f), dtype)
    t = _read_tensors(path)

    def take(name: str, shape: tuple[int, ...]):
        if name not in t:
            raise CheckpointError(f"tensor {name!r} missing from checkpoint at {path!r}")
        x = t.pop(name)
        if tuple(x.shape) != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(x.shape)}, config implies {shape}")
        return jnp.asarray(x, dtype)

    d, h, kv, hd, m = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    params: dict[str, Any] = {"embedding": take("model.embed_tokens.weight", (cfg.vocab_size, d))}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        params[f"layers_{i}"] = {
            "attn": {
                "q_proj": take(p + "self_attn.q_proj.weight", (h * hd, d)).T.reshape(d, h, hd),
                "k_proj": take(p + "self_attn.k_proj.weight", (kv * hd, d)).T.reshape(d, kv, hd),
                "v_proj": take(p + "self_attn.v_proj.weight", (kv * hd, d)).T.reshape(d, kv, hd),
                "o_proj": take(p + "self_attn.o_proj.weight", (d, h * hd)).T.reshape(h, hd, d),
                "q_norm": {"scale": take(p + "self_attn.q_norm.weight", (hd,))},
                "k_norm": {"scale": take(p + "self_attn.k_norm.weight", (hd,))},
            },
            "input_norm": {"scale": take(p + "input_layernorm.weight", (d,))},
            "post_attn_norm": {"scale": take(p + "post_attention_layernorm.weight", (d,))},
            "mlp": {
                "gate_proj": take(p + "mlp.gate_proj.weight", (m, d)).T,
                "up_proj": take(p + "mlp.up_proj.weight", (m, d)).T,
                "down_proj": take(p + "mlp.down_proj.weight", (d, m)).T,
            },
        }
    params["final_norm"] = {"scale": take("model.norm.weight", (d,))}
    if cfg.tie_embeddings:
        t.pop("lm_head.weight", None)  # some exporters write the tied copy anyway
    else:
        params["lm_head"] = take("lm_head.weight", (cfg.vocab_size, d)).T
    leftover = sorted(k for k in t if "rotary_emb" not in k)
    if leftover:
        raise CheckpointError(f"checkpoint has tensors this model does not use: {leftover[:8]}")
    return cfg, params


def save_hf_checkpoint(params, cfg: ModelConfig, path: str) -> None:
    """Writes config.json + model.safetensors that transformers' Qwen3ForCausalLM loads."""
    os.makedirs(path, exist_ok=True)
    d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dtype = cfg.jnp_param_dtype
    out = {"model.embed_tokens.weight": params["embedding"]}
    for i in range(cfg.num_layers):
        lp, p = params[f"layers_{i}"], f"model.layers.{i}."
        a = lp["attn"]
        out[p + "self_attn.q_proj.weight"] = a["q_proj"].reshape(d, h * hd).T
        out[p + "self_attn.k_proj.weight"] = a["k_proj"].reshape(d, kv * hd).T
        out[p + "self_attn.v_proj.weight"] = a["v_proj"].reshape(d, kv * hd).T
        out[p + "self_attn.o_proj.weight"] = a["o_proj"].reshape(h * hd, d).T
        out[p + "self_attn.q_norm.weight"] = a["q_norm"]["scale"]
        out[p + "self_attn.k_norm.weight"] = a["k_norm"]["scale"]
        out[p + "input_layernorm.weight"] = lp["input_norm"]["scale"]
        out[p + "post_attention_layernorm.weight"] = lp["post_attn_norm"]["scale"]
        out[p + "mlp.gate_proj.weight"] = lp["mlp"]["gate_proj"].T
        out[p + "mlp.up_proj.weight"] = lp["mlp"]["up_proj"].T
        out[p + "mlp.down_proj.weight"] = lp["mlp"]["down_proj"].T
    out["model.norm.weight"] = params["final_norm"]["scale"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    out = {k: jnp.asarray(v, dtype) for k, v in out.items()}
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_hf(cfg), f, indent=2)
