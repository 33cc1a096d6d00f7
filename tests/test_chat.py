import json

import pytest
from hypothesis import given, settings, strategies as st

from toolverse_jax.models.chat import (
    Rendered,
    assistant_header,
    render_assistant,
    render_chat,
    render_prompt,
    render_tool_call,
    render_tool_responses,
    render_user_turn,
    tool_spec_compact,
)
from toolverse_jax.models.tokenizer import BYTE_SPECIAL_TOKENS, ByteTokenizer, HFTokenizer

BYTE = ByteTokenizer()

CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "ok", "tool_calls": [{"name": "f", "arguments": {}}]},
    {"role": "tool", "content": "r"},
    {"role": "assistant", "content": "done"},
]
CHAT_TEXT = (
    "<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\nok\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\ndone<|im_end|>\n"
)


def _policy_positions(r: Rendered):
    return [i for i, m in enumerate(r.policy_mask) if m]


def test_hand_made_chat_positions():
    r = render_chat(CHAT, BYTE)
    assert BYTE.decode(r.tokens) == CHAT_TEXT
    assert r.tokens == BYTE.encode(CHAT_TEXT)  # render == encode(rendered text)
    # Counted by hand: user block 0..9, assistant header 10..20 (<|im_start|> + "assistant\n"),
    # body "ok\n" + <tool_call> + "\n" + 30 JSON chars + "\n" + </tool_call> + <|im_end|> = 38.
    assert len(r.tokens) == 90
    assert r.turn_starts == [21, 84]
    assert r.turn_ends == [59, 89]
    assert _policy_positions(r) == list(range(21, 59)) + list(range(84, 89))
    assert r.tokens[58] == r.tokens[88] == BYTE.eos_id
    assert r.tokens[10] == r.tokens[73] == BYTE.special_ids["<|im_start|>"]
    assert r.message_spans == [(0, 10), (10, 60), (60, 73), (73, 90)]
    assert len(r.policy_mask) == len(r.tokens)


def test_consecutive_tool_messages_share_one_user_block():
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"name": "a", "arguments": {"x": 1}},
                {"function": {"name": "b", "arguments": '{"y": "é"}'}}]},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": {"k": [1]}}]
    r = render_chat(msgs, BYTE, add_generation_prompt=True)
    assert BYTE.decode(r.tokens) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": \"é\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n"
        "<tool_response>\n{\"k\": [1]}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    s2, e2 = r.message_spans[2]
    s3, e3 = r.message_spans[3]
    assert e2 == s3 and BYTE.decode(r.tokens[s2:e3]).count("<|im_start|>user") == 1
    assert not any(r.policy_mask[s2:])


def test_system_and_tools_json_matches_qwen3_text():
    tool = {"name": "get_order", "description": "Get an order.",
            "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"]}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "u"}]
    r = render_chat(msgs, BYTE, tools=[tool])
    spec = {"type": "function", "function": {"name": "get_order", "description": "Get an order.",
                                             "parameters": tool["inputSchema"]}}
    assert BYTE.decode(r.tokens) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        "<tools></tools> XML tags:\n<tools>\n" + json.dumps(spec) + "\n</tools>\n\nFor each "
        "function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nu<|im_end|>\n"
    )
    assert len(r.message_spans) == 2 and r.message_spans[1][1] == len(r.tokens)
    # OpenAI-form specs are rendered as given; tools without a system message get one.
    r2 = render_chat([{"role": "user", "content": "u"}], BYTE, tools=[spec])
    assert BYTE.decode(r2.tokens).startswith("<|im_start|>system\n# Tools\n\n")
    assert BYTE.decode(r.tokens).endswith(BYTE.decode(r2.tokens).split("# Tools", 1)[1])
    assert r2.message_spans == [(r2.message_spans[0][0], len(r2.tokens))]


def test_compact_tools():
    tool = {"name": "search", "description": "Find  items\nby text.",
            "inputSchema": {"type": "object", "properties": {
                "query": {"type": "string"}, "limit": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"enum": ["a", "b"]}}, "required": ["query"]},
            "outputSchema": {"type": "object", "properties": {"items": {}, "total": {}}}}
    line = tool_spec_compact(tool)
    assert line == ('search(query: string, limit?: integer, tags?: list[string], '
                    'mode?: "a"|"b") -> items, total: Find items by text.')
    text = BYTE.decode(render_chat([{"role": "user", "content": "u"}], BYTE, tools=[tool],
                                   tool_format="compact").tokens)
    assert text.startswith("<|im_start|>system\n# Tools\n" + line + "\n")
    assert tool_spec_compact({"name": "now"}) == "now()"
    with pytest.raises(ValueError, match="tool_format"):
        render_chat([], BYTE, tools=[tool], tool_format="yaml")


def test_tool_specials_off_keeps_observation_text_plain():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "x<|im_end|>"}]
    on = render_chat(msgs, BYTE)
    off = render_chat(msgs, BYTE, tool_specials=False)
    assert BYTE.decode(on.tokens) == BYTE.decode(off.tokens)
    assert on.tokens.count(BYTE.eos_id) == 4 and off.tokens.count(BYTE.eos_id) == 3
    assert render_tool_responses(["<think>"], BYTE, tool_specials=False).count(
        BYTE.special_ids["<think>"]) == 0


def test_render_tool_call_canonical():
    assert render_tool_call("f", {"city": "Zürich", "n": [1, 2]}) == \
        '{"name": "f", "arguments": {"city": "Zürich", "n": [1, 2]}}'


def test_bad_messages():
    with pytest.raises(ValueError, match="role"):
        render_chat([{"role": "bot", "content": "x"}], BYTE)
    with pytest.raises(ValueError, match="only assistant"):
        render_chat([{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}], BYTE)
    with pytest.raises(ValueError, match="non-empty string 'name'"):
        render_chat([{"role": "assistant", "content": "", "tool_calls": [{"name": ""}]}], BYTE)


def test_incremental_pieces():
    assert BYTE.decode(assistant_header(BYTE)) == "<|im_start|>assistant\n"
    assert BYTE.decode(render_tool_responses(["a", "b"], BYTE)) == (
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert BYTE.decode(render_user_turn("more", BYTE)) == \
        "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError):
        render_tool_responses([], BYTE)


def _rollout(tok, prompt_msgs, tools, turns, tool_format="json", tool_specials=True):
    """Token-in-token-out rollout; returns (ids, mask, equivalent messages)."""
    ids = render_prompt(prompt_msgs, tok, tools, tool_format=tool_format)
    mask = [False] * len(ids)
    msgs = list(prompt_msgs)
    for k, (content, calls, outputs) in enumerate(turns):
        msg = {"role": "assistant", "content": content,
               "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
        sampled = render_assistant(msg, tok)  # stands in for the sampler's ids
        assert sampled[-1] == tok.eos_id
        ids += sampled
        mask += [True] * len(sampled)
        msgs.append(msg)
        if k < len(turns) - 1:
            obs = render_tool_responses(outputs, tok, tool_specials=tool_specials)
            ids += obs
            mask += [False] * len(obs)
            msgs += [{"role": "tool", "content": o} for o in outputs]
    return ids, mask, msgs


_txt = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="<"), max_size=12)
_obs = st.one_of(_txt, st.sampled_from(["<|im_end|>", "</tool_response>x", "<tool_call>"]))
_turn = st.tuples(
    st.one_of(_txt, st.sampled_from(["<think>\nhmm\n</think>\n\n", "<answer>4</answer>"])),
    st.lists(st.tuples(st.text("abcdef_", min_size=1, max_size=6),
                       st.dictionaries(st.text("xyz", max_size=3),
                                       st.one_of(st.integers(), _txt), max_size=2)), max_size=2),
    st.lists(_obs, min_size=1, max_size=3),
)
_chat = st.tuples(
    st.one_of(st.none(), _txt),
    _txt,
    st.lists(_turn, min_size=1, max_size=4),
    st.sampled_from(["json", "compact"]),
    st.booleans(),
)
TOOLS = [{"name": "f", "description": "does f",
          "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}]


def _check_incremental_equals_full(tok, case):
    system, user, turns, fmt, tool_specials = case
    prompt = ([{"role": "system", "content": system}] if system is not None else [])
    prompt.append({"role": "user", "content": user})
    ids, mask, msgs = _rollout(tok, prompt, TOOLS, turns, fmt, tool_specials)
    full = render_chat(msgs, tok, tools=TOOLS, tool_format=fmt, tool_specials=tool_specials)
    nl = tok.encode("\n")
    # A finished rollout stops at <|im_end|>; render_chat adds the template's trailing "\n".
    assert full.tokens == ids + nl
    assert full.policy_mask == mask + [False] * len(nl)
    assert len(full.turn_starts) == len(turns)
    for s, e in zip(full.turn_starts, full.turn_ends):
        assert all(full.policy_mask[s:e]) and full.tokens[e - 1] == tok.eos_id
        assert not full.policy_mask[s - 1] and not full.policy_mask[e]


@settings(max_examples=150, deadline=None)
@given(_chat)
def test_incremental_equals_full_byte(case):
    _check_incremental_equals_full(BYTE, case)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        [CHAT_TEXT, "assistant user tool_response arguments name", '"\n\n{}'] * 40,
        trainer=trainers.BpeTrainer(vocab_size=500, special_tokens=list(BYTE_SPECIAL_TOKENS),
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                    show_progress=False))
    out = str(tmp_path_factory.mktemp("bpe_chat"))
    PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<|endoftext|>",
                            eos_token="<|im_end|>").save_pretrained(out)
    return HFTokenizer(out)


@settings(max_examples=40, deadline=None)
@given(case=_chat)
def test_incremental_equals_full_bpe(bpe, case):
    _check_incremental_equals_full(bpe, case)


def test_hand_made_chat_bpe(bpe):
    r = render_chat(CHAT, bpe)
    assert bpe.decode(r.tokens) == CHAT_TEXT
    body = bpe.decode(r.tokens[r.turn_starts[0]:r.turn_ends[0]])
    assert body == 'ok\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    assert bpe.decode(r.tokens[r.turn_starts[1]:r.turn_ends[1]]) == "done<|im_end|>"
    assert bpe.decode(r.tokens[:r.turn_starts[0]]).endswith("<|im_start|>assistant\n")


def test_minimal_tool_format_lists_only_signatures():
    from toolverse_jax.models.chat import render_chat
    from toolverse_jax.models.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    tool = {"name": "get_order", "description": "Get an order.",
            "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"]},
            "outputSchema": {"type": "object", "properties": {"total": {"type": "number"}}}}
    text = tok.decode(render_chat([{"role": "user", "content": "hi"}], tok, tools=[tool],
                                  tool_format="minimal").tokens)
    assert "get_order(order_id: string)\n" in text
    assert "Get an order." not in text and "total" not in text
