import os

import pytest
from hypothesis import given, settings, strategies as st

from toolverse_jax.models.tokenizer import (
    BYTE_SPECIAL_TOKENS,
    QWEN3_SPECIAL_START_ID,
    QWEN3_SPECIAL_TOKENS,
    ByteTokenizer,
    HFTokenizer,
    IncrementalDecoder,
    decode_incremental,
    load_tokenizer,
    padded_vocab_size,
)

OUR_SPECIALS = list(BYTE_SPECIAL_TOKENS)


# ---------------------------------------------------------------- byte tokenizer


def test_byte_ids_and_specials():
    tok = ByteTokenizer()
    assert tok.encode("aé") == [97, 0xC3, 0xA9]
    assert tok.special_ids == {s: 256 + i for i, s in enumerate(BYTE_SPECIAL_TOKENS)}
    assert tok.pad_id == tok.token_to_id("<|endoftext|>") == 256
    assert tok.eos_id == tok.token_to_id("<|im_end|>") == 258
    assert tok.token_to_id("a") == 97
    with pytest.raises(KeyError):
        tok.token_to_id("ab")
    assert tok.num_ids == 265
    assert tok.vocab_size == 320 and tok.vocab_size % 64 == 0 and tok.vocab_size >= tok.num_ids
    ids = tok.encode("x<|im_start|>user\n<tool_call>{}</tool_call><|im_end|>")
    assert ids == [120, 257, 117, 115, 101, 114, 10, 259, 123, 125, 260, 258]
    assert tok.decode(ids) == "x<|im_start|>user\n<tool_call>{}</tool_call><|im_end|>"
    assert tok.encode("<|im_end|>", allow_special=False) == list(b"<|im_end|>")


def test_byte_decode_never_raises():
    tok = ByteTokenizer()
    assert tok.decode([0xFF, 97, 0xC3]) == "\ufffda\ufffd"
    assert tok.decode([300, 97]) == "\ufffda"  # embedding padding row


def test_stop_ids_for():
    tok = ByteTokenizer()
    assert tok.stop_ids_for(["<|im_end|>", "</tool_call>", "<|im_end|>"]) == [258, 260]
    with pytest.raises(ValueError, match="IncrementalDecoder"):
        tok.stop_ids_for(["<|im_end|>", "STOP"])
    assert tok.stop_ids_for(["STOP", "<|im_end|>"], strict=False) == [258]


def test_padded_vocab_size():
    assert [padded_vocab_size(n) for n in (1, 64, 65, 151669)] == [64, 64, 128, 151680]


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
_special_mix = st.lists(st.one_of(_text, st.sampled_from(OUR_SPECIALS + ["<|im_", "<think"])),
                        max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(_special_mix)
def test_byte_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, allow_special=False)) == text
    assert all(0 <= i < tok.num_ids for i in ids)


@settings(max_examples=200, deadline=None)
@given(_special_mix)
def test_byte_incremental_matches_full(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    pieces = decode_incremental(tok, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


def test_incremental_holds_back_split_character():
    tok = ByteTokenizer()
    dec = IncrementalDecoder(tok)
    b = "€".encode()  # 3 bytes
    assert dec.push([b[0]]) == ""
    assert dec.push([b[1]]) == ""
    assert dec.push([b[2], 33]) == "€!"
    assert dec.push([0xE2]) == ""
    assert dec.finish() == "\ufffd"
    assert dec.text == "€!\ufffd"


# ---------------------------------------------------------------- HF adapter


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=OUR_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "tool calls return json",
              '{"name": "get_order", "arguments": {"order_id": "A1"}}'] * 50
    tok.train_from_iterator(corpus, trainer=trainer)
    out = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>",
                            eos_token="<|im_end|>").save_pretrained(str(out))
    return str(out), tok


def test_hf_adapter_on_trained_bpe(trained_dir):
    path, raw = trained_dir
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer)
    for s in OUR_SPECIALS:
        assert tok.special_ids[s] == tok.token_to_id(s) == raw.token_to_id(s)
    assert tok.pad_id == raw.token_to_id("<|endoftext|>")
    assert tok.eos_id == raw.token_to_id("<|im_end|>")
    assert tok.num_ids == raw.get_vocab_size()
    assert tok.vocab_size % 64 == 0 and tok.vocab_size >= tok.num_ids
    text = "<|im_start|>user\nthe fox<|im_end|>\n<tool_call>\n{}\n</tool_call>"
    ids = tok.encode(text)
    # No BOS/EOS added, and the same ids the raw tokenizers object gives.
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert ids[0] == tok.special_ids["<|im_start|>"]
    assert tok.decode(ids) == text
    assert tok.special_ids["<|im_end|>"] not in tok.encode("<|im_end|>", allow_special=False)
    assert tok.decode([tok.num_ids + 5]) == "\ufffd"
    assert tok.stop_ids_for(["<|im_end|>"]) == [tok.eos_id]


def test_hf_without_pad_pads_with_eos(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.add_tokens(list(pre_tokenizers.ByteLevel.alphabet()))
    raw.add_special_tokens(["</s>"])
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>").save_pretrained(str(tmp_path))
    tok = HFTokenizer(tmp_path)
    assert tok.eos_id == tok.pad_id == raw.token_to_id("</s>")


@settings(max_examples=100, deadline=None)
@given(_special_mix)
def test_hf_round_trip_and_incremental(trained_dir, text):
    tok = HFTokenizer(trained_dir[0], hf_tokenizer=_cached_hf(trained_dir[0]))
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert "".join(decode_incremental(tok, ids)) == text


_HF = {}


def _cached_hf(path):
    if path not in _HF:
        from transformers import AutoTokenizer

        _HF[path] = AutoTokenizer.from_pretrained(path)
    return _HF[path]


# ---------------------------------------------------------------- Qwen3 offline


def test_qwen3_offline(tmp_path):
    from toolverse_jax.models.tokenizer import qwen3_tokenizer

    tok = qwen3_tokenizer(str(tmp_path))
    assert tok.num_ids == 151669
    assert tok.vocab_size == 151680
    assert len(QWEN3_SPECIAL_TOKENS) == 26
    for i, s in enumerate(QWEN3_SPECIAL_TOKENS):
        assert tok.special_ids[s] == QWEN3_SPECIAL_START_ID + i
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665,
                "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
    assert {s: tok.special_ids[s] for s in expected} == expected
    assert (tok.pad_id, tok.eos_id) == (151643, 151645)
    # Ids published for Qwen2/3 ("Hello"=9707, " world"=1879, "\n"=198, "user"=872).
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("<|im_start|>user\n") == [151644, 872, 198]
    texts = ["Grüße, 世界! 🎉 x=1234\n\ttabs", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 🧑‍🤝‍🧑",
             "<tool_call>\n{\"a\": 1}\n</tool_call><|im_end|>"]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
        pieces = decode_incremental(tok, tok.encode(text))
        assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    # Rendering a chat piecewise gives the ids of tokenizing the whole rendered text.
    from toolverse_jax.models.chat import render_chat

    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is order A1?"},
            {"role": "assistant", "content": "Checking.",
             "tool_calls": [{"name": "get_order", "arguments": {"order_id": "A1"}}]},
            {"role": "tool", "content": '{"status": "shipped"}'},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": "<answer>shipped</answer>"}]
    r = render_chat(chat, tok, tools=[{"name": "get_order", "description": "Get an order."}])
    assert r.tokens == tok.encode(tok.decode(r.tokens))
    assert tok.decode(r.tokens[r.turn_starts[1]:r.turn_ends[1]]) == \
        "<answer>shipped</answer><|im_end|>"
    assert os.path.isdir(tmp_path) and len(os.listdir(tmp_path)) == 1
    # A second load reads the cache.
    assert qwen3_tokenizer.__wrapped__(str(tmp_path)).encode("Hello world") == [9707, 1879]


def test_load_tokenizer_errors():
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    with pytest.raises(ValueError, match="'byte', 'qwen3'"):
        load_tokenizer("/no/such/dir")


def test_trained_bpe_round_trips_and_copies_literals_context_free(tmp_path):
    from toolverse_jax.models.tokenizer import train_bpe_tokenizer
    texts = [f'<|im_start|>user\nCreate note with title "Budget review {i}".<|im_end|>\n'
             f'<tool_call>\n{{"name": "create_note", "arguments": {{"title": "Budget review {i}"}}}}'
             f'\n</tool_call><|im_end|>' for i in range(200)]
    tok = train_bpe_tokenizer(texts, 400, tmp_path / "tok")
    assert tok.num_ids <= 400 and tok.vocab_size % 64 == 0
    for s in texts[:5] + ["ünïcode ✓ 𝔘 \t\n mixed_ids ev_0005", ""]:
        assert tok.decode(tok.encode(s)) == s
    assert len(tok.encode(texts[0])) < len(texts[0].encode()) / 2  # merges happened
    lit = tok.encode("Budget review 7")
    # The quoted literal is the same ids in the instruction and in the JSON argument.
    assert _contains(tok.encode('title "Budget review 7".'), lit)
    assert _contains(tok.encode('{"title": "Budget review 7"}}'), lit)
    assert tok.special_ids["<|im_end|>"] == tok.eos_id
    assert tok.encode("<tool_call>") == [tok.special_ids["<tool_call>"]]
    again = train_bpe_tokenizer(texts, 400, tmp_path / "tok2")
    assert again.encode(texts[3]) == tok.encode(texts[3])  # deterministic
    with pytest.raises(ValueError, match="below"):
        train_bpe_tokenizer(texts, 100, tmp_path / "tok3")
    with pytest.raises(ValueError, match="built by the training run"):
        load_tokenizer("trained")


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))
