import json
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from toolverse_jax.models.chat import render_tool_call
from toolverse_jax.models.toolcall import (
    ERROR_KINDS,
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    parse_tool_calls_lenient,
)


def _call(name, args):
    return "<tool_call>\n" + render_tool_call(name, args) + "\n</tool_call>"


def test_no_calls_plain_content():
    t = parse_tool_calls("  just talking  ")
    assert t.content == "just talking"
    assert t.calls == []
    assert t.final_answer is None


def test_calls_content_and_answer():
    text = ("Let me look.\n" + _call("get_order", {"order_id": "A1"}) + "\n"
            + _call("list_items", {}) + "\nDone. <answer> 42 </answer><|im_end|>")
    t = parse_tool_calls(text)
    assert t.calls == [ToolCall("get_order", {"order_id": "A1"}), ToolCall("list_items", {})]
    assert t.content == "Let me look.\n\n\nDone. <answer> 42 </answer>"
    assert t.final_answer == "42"


def test_last_answer_wins_and_answers_inside_calls_ignored():
    text = ('<answer>a</answer><tool_call>{"name": "f", "arguments": {"x": "<answer>no'
            '</answer>"}}</tool_call><answer>\nb\n</answer>')
    t = parse_tool_calls(text)
    assert t.final_answer == "b"
    assert t.calls[0].arguments == {"x": "<answer>no</answer>"}


def test_unicode_arguments_round_trip():
    args = {"city": "Zürich", "note": "日本語", "nested": {"a": [1, 2.5, None, True]}}
    t = parse_tool_calls(_call("weather", args))
    assert t.calls == [ToolCall("weather", args)]


def _err(text):
    with pytest.raises(ToolCallError) as ei:
        parse_tool_calls(text)
    assert isinstance(ei.value, ValueError)
    return ei.value


def test_malformed_json_message_names_call_and_char():
    bad = '{"name": "f" "arguments": {}}'
    e = _err(_call("ok", {}) + "<tool_call>" + bad + "</tool_call>")
    assert e.kind == "malformed_json"
    assert e.index == 2
    # char 13 of the body: json's own position for the missing comma
    with pytest.raises(json.JSONDecodeError) as je:
        json.loads(bad)
    assert str(e) == f"tool call 2: JSON error at char {je.value.pos}: Expecting ',' delimiter"
    assert je.value.pos == 13


def test_unknown_keys_message():
    e = _err('<tool_call>{"name": "f", "args": {}}</tool_call>')
    assert e.kind == "unknown_keys"
    assert str(e) == "tool call 1: unknown keys ['args']; expected 'name' and 'arguments'"


@pytest.mark.parametrize("text,kind", [
    ('<tool_call>{"name": "f", "arguments": {}}', "unclosed_tag"),
    ('x</tool_call>', "unclosed_tag"),
    ('<answer>half', "unclosed_tag"),
    ('<tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>', "nested_tag"),
    ('<tool_call>{"arguments": {}}</tool_call>', "missing_name"),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "missing_name"),
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "missing_name"),
    ('<tool_call>{"name": "f"}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "bad_arguments"),
    ('<tool_call>[1, 2]</tool_call>', "malformed_json"),
    ('<tool_call>  </tool_call>', "malformed_json"),
    ('<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>', "malformed_json"),
    ('<tool_call>' + "[" * 100000 + '</tool_call>', "malformed_json"),
])
def test_error_kinds(text, kind):
    assert _err(text).kind == kind


def test_bad_arguments_message_names_tool():
    e = _err('<tool_call>{"name": "get_order", "arguments": [1]}</tool_call>')
    assert str(e) == ("tool call 1 ('get_order'): 'arguments' must be a JSON object; "
                      "got a JSON array")


def test_lenient_keeps_good_calls_and_records_errors():
    text = (_call("a", {"x": 1}) + '<tool_call>{"name": "b", "args": 1}</tool_call>'
            + '<tool_call>{bad</tool_call>' + _call("c", {}) + "<answer>y</answer>")
    t = parse_tool_calls_lenient(text)
    assert [c.name for c in t.calls] == ["a", "c"]
    assert [(e.kind, e.index) for e in t.errors] == [("unknown_keys", 2), ("malformed_json", 3)]
    assert t.final_answer == "y"


def test_lenient_nested_recovers_inner_call():
    t = parse_tool_calls_lenient('<tool_call>{"name": <tool_call>{"name": "g", "arguments": {}}'
                                 '</tool_call>')
    assert [e.kind for e in t.errors] == ["nested_tag"]
    assert t.calls == [ToolCall("g", {})]


def test_error_pickles():
    e = pickle.loads(pickle.dumps(ToolCallError("missing_name", "tool call 1: x", 1)))
    assert (e.kind, str(e), e.index) == ("missing_name", "tool call 1: x", 1)
    with pytest.raises(ValueError):
        ToolCallError("nope", "x")


_FRAGMENTS = st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool_call", "tool_call>", "</tool_call", "<answer>",
    "</answer>", "<|im_end|>", "<think>", "</think>", '{"name": "f", "arguments": {}}',
    '{"name": ', '"arguments": ',
    "{", "}", "[", "]", '"', ",", ":", "null", "1e999", "\n", " ", '{"name": "f"}',
    '"args"', "\\", "\\u12", "NaN",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=8)), max_size=25))
def test_fuzz_only_toolcallerror(pieces):
    text = "".join(pieces)
    try:
        t = parse_tool_calls(text)
    except ToolCallError as e:
        assert e.kind in ERROR_KINDS
    else:
        assert all(isinstance(c.arguments, dict) and c.name for c in t.calls)
    lenient = parse_tool_calls_lenient(text)
    assert all(e.kind in ERROR_KINDS for e in lenient.errors)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.text(min_size=1, max_size=10),
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5),
                                                   st.booleans(), st.none()), max_size=3),
), max_size=4))
def test_rendered_calls_parse_back(calls):
    calls = [(n, a) for n, a in calls if n.strip() and "<tool_call>" not in n
             and "</tool_call>" not in n]
    text = "\n".join(_call(n, a) for n, a in calls)
    assert parse_tool_calls(text).calls == [ToolCall(n, a) for n, a in calls]


# ------------------------------------------------------------------ <think> blocks
# tests/test_chat_template.py checks the same cases against transformers' response parser.


def test_call_and_answer_inside_think_are_not_executed_or_scored():
    text = ("<think>\nMaybe " + _call("g", {}) + " or <answer>7</answer>.\n</think>\n\n"
            "Sure. " + _call("f", {"a": 1}) + "<|im_end|>")
    t = parse_tool_calls(text)
    assert t.calls == [ToolCall("f", {"a": 1})]
    assert t.final_answer is None and t.content == "Sure."
    assert t.reasoning == "Maybe " + _call("g", {}) + " or <answer>7</answer>."
    t = parse_tool_calls("<think>it is <answer>7</answer></think>\n<answer>8</answer>")
    assert (t.final_answer, t.content, t.reasoning) == ("8", "<answer>8</answer>",
                                                        "it is <answer>7</answer>")


def test_unclosed_think_runs_to_the_end():
    text = "<think>\nI should " + _call("g", {}) + " then <answer>1</answer><|im_end|>"
    for t in (parse_tool_calls(text), parse_tool_calls_lenient(text)):
        assert t.calls == [] and t.final_answer is None and t.content == ""
        assert t.reasoning == "I should " + _call("g", {}) + " then <answer>1</answer>"
    assert parse_tool_calls_lenient(text).errors == []


def test_think_open_prefilled_by_the_template():
    text = "plan: " + _call("g", {}) + "\n</think>\n\n" + _call("f", {})
    assert parse_tool_calls(text, think_open=True).calls == [ToolCall("f", {})]
    assert parse_tool_calls(text, think_open=True).reasoning == "plan: " + _call("g", {})
    # Without the prefill the stray </think> is plain content (as transformers' parser does).
    t = parse_tool_calls(text)
    assert t.calls == [ToolCall("g", {}), ToolCall("f", {})] and t.content == "plan: \n</think>"
    assert parse_tool_calls("no close " + _call("g", {}), think_open=True).calls == []


def test_think_tag_inside_a_call_is_part_of_the_call():
    # Regions are read left to right: inside <tool_call> only </tool_call> ends it.
    text = _call("search", {"q": "<think>"}) + "<think>x</think>" + _call("f", {})
    t = parse_tool_calls(text)
    assert t.calls == [ToolCall("search", {"q": "<think>"}), ToolCall("f", {})]
    assert t.reasoning == "x"
    bad = parse_tool_calls_lenient('<tool_call>{"name": <think></tool_call>')
    assert [e.kind for e in bad.errors] == ["malformed_json"] and bad.reasoning == ""


def test_several_think_blocks_and_errors_inside_think_are_ignored():
    text = ("<think>a " + _call("g", {}) + "</think>mid<think>b <tool_call>{oops</think>"
            "end " + _call("f", {}))
    t = parse_tool_calls(text)
    assert t.calls == [ToolCall("f", {})] and t.content == "midend"
    assert t.reasoning == "a " + _call("g", {}) + "\nb <tool_call>{oops"
