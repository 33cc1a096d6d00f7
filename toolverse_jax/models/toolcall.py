"""Parses generated assistant text into content, tool calls and a final answer.

Convention (the one `chat.render_chat` writes):
  - a tool call is `<tool_call>{"name": str, "arguments": {...}}</tool_call>`; whitespace
    around the JSON is ignored; a turn may hold zero or more calls;
  - the final answer is the text of the last `<answer>...</answer>` outside tool calls,
    whitespace-trimmed (None when there is none); the task's verifier scores it;
  - content is the text outside tool calls, trimmed, `<answer>` tags left in place;
  - a trailing `<|im_end|>` / `<|endoftext|>` (decoded stop token) is dropped;
  - reasoning: text inside `<think>...</think>`, and after an unclosed `<think>` to the end, is
    the model's reasoning (`.reasoning`), never executed or scored: a tool call or `<answer>`
    written there is no call and no answer. With think_open=True the text starts inside a
    think block (a template whose generation prompt ends with `<think>\\n`), so everything up
    to the first `</think>` is reasoning. Regions are read left to right, as transformers'
    response parser does with Qwen3's response template: a `<think>` inside a tool call's JSON
    is part of the call, and a `</think>` with no open block is plain content.

`parse_tool_calls` raises the first problem as a `ToolCallError`; the rollout uses
`parse_tool_calls_lenient`, which keeps the calls that parse and records each problem, so an
invalid call is an observation for the model, never a crash.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_STOP_SUFFIXES = ("<|im_end|>", "<|endoftext|>")
_ALLOWED_KEYS = ("name", "arguments")

ERROR_KINDS = (
    "malformed_json",
    "unclosed_tag",
    "missing_name",
    "bad_arguments",
    "unknown_keys",
    "nested_tag",
)


class ToolCallError(ValueError):
    """A tool call that cannot be executed; `.kind` is one of ERROR_KINDS.

    `.index` is the 1-based number of the `<tool_call>` block (None for answer-tag errors).
    """

    def __init__(self, kind: str, message: str, index: int | None = None):
        if kind not in ERROR_KINDS:
            raise ValueError(f"ToolCallError kind must be one of {ERROR_KINDS}; got {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.index = index

    def __reduce__(self):  # picklable across the env-pool process boundary
        return (ToolCallError, (self.kind, str(self), self.index))


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    content: str
    calls: list[ToolCall]
    final_answer: str | None
    reasoning: str = ""  # the think blocks' text, trimmed, joined by "\n"


@dataclasses.dataclass(frozen=True)
class LenientTurn:
    """What parses, plus every problem found (in text order)."""

    content: str
    calls: list[ToolCall]
    final_answer: str | None
    errors: list[ToolCallError]
    reasoning: str = ""


def _type_name(x: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            type(None): "null"}.get(type(x), "number")


def parse_call_body(body: str, index: int) -> ToolCall:
    """Returns the ToolCall in one `<tool_call>` body; raises ToolCallError."""
    where = f"tool call {index}"
    src = body.strip()
    if not src:
        raise ToolCallError("malformed_json", f'{where}: empty; expected {{"name": ..., '
                            '"arguments": {...}} between the tags', index)
    try:
        obj = json.loads(src)
    except json.JSONDecodeError as e:
        raise ToolCallError("malformed_json", f"{where}: JSON error at char {e.pos}: {e.msg}",
                            index) from None
    except (ValueError, RecursionError) as e:  # huge ints, absurd nesting
        raise ToolCallError("malformed_json", f"{where}: JSON error: {e}", index) from None
    if not isinstance(obj, dict):
        raise ToolCallError("malformed_json", f"{where}: expected a JSON object with 'name' and "
                            f"'arguments'; got a JSON {_type_name(obj)}", index)
    unknown = sorted(k for k in obj if k not in _ALLOWED_KEYS)
    if unknown:
        raise ToolCallError("unknown_keys", f"{where}: unknown keys {unknown}; expected 'name' "
                            "and 'arguments'", index)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        got = "no 'name'" if "name" not in obj else f"name {json.dumps(name)}"
        raise ToolCallError("missing_name", f"{where}: needs a non-empty string 'name'; got "
                            f"{got}", index)
    if "arguments" not in obj:
        raise ToolCallError("bad_arguments", f"{where} ({name!r}): needs 'arguments' (a JSON "
                            "object, {} when the tool takes none)", index)
    args = obj["arguments"]
    if not isinstance(args, dict):
        raise ToolCallError("bad_arguments", f"{where} ({name!r}): 'arguments' must be a JSON "
                            f"object; got a JSON {_type_name(args)}", index)
    return ToolCall(name, args)


def _strip_stop(text: str) -> str:
    t = text.rstrip()
    for s in _STOP_SUFFIXES:
        if t.endswith(s):
            return t[: -len(s)]
    return text


_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)


def _scan(text: str, think_open: bool = False) -> LenientTurn:
    text = _strip_stop(text)
    outside: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    pos = 0
    index = 0
    if think_open:
        c = text.find(THINK_CLOSE)
        reasoning.append(text if c == -1 else text[:c])
        pos = len(text) if c == -1 else c + len(THINK_CLOSE)
    while pos < len(text):
        o = text.find(OPEN, pos)
        stray = text.find(CLOSE, pos)
        think = text.find(THINK_OPEN, pos)
        first = min((i for i in (o, stray, think) if i != -1), default=-1)
        if first == -1:
            outside.append(text[pos:])
            break
        outside.append(text[pos:first])
        if first == think:
            start = think + len(THINK_OPEN)
            c = text.find(THINK_CLOSE, start)
            reasoning.append(text[start:] if c == -1 else text[start:c])
            if c == -1:
                break  # an unclosed think block runs to the end
            pos = c + len(THINK_CLOSE)
            continue
        if first == stray:
            errors.append(ToolCallError(
                "unclosed_tag", f"stray {CLOSE!r} at char {stray} with no {OPEN!r} before it",
                index + 1))
            pos = stray + len(CLOSE)
            continue
        index += 1
        start = o + len(OPEN)
        c = text.find(CLOSE, start)
        o2 = text.find(OPEN, start)
        if o2 != -1 and (c == -1 or o2 < c):
            errors.append(ToolCallError(
                "nested_tag", f"tool call {index}: {OPEN!r} at char {o2} opens before the call "
                f"at char {o} is closed; close each call with {CLOSE!r}", index))
            pos = o2  # the inner tag starts the next call
            continue
        if c == -1:
            errors.append(ToolCallError(
                "unclosed_tag", f"tool call {index}: {OPEN!r} at char {o} is never closed; end "
                f"the call with {CLOSE!r}", index))
            break
        try:
            calls.append(parse_call_body(text[start:c], index))
        except ToolCallError as e:
            errors.append(e)
        pos = c + len(CLOSE)

    content = "".join(outside)
    answers = _ANSWER_RE.findall(content)
    final_answer = answers[-1].strip() if answers else None
    leftover = _ANSWER_RE.sub("", content).find(ANSWER_OPEN)
    if leftover != -1:
        errors.append(ToolCallError(
            "unclosed_tag", f"{ANSWER_OPEN!r} is never closed; end the answer with "
            f"{ANSWER_CLOSE!r}", None))
    thought = "\n".join(r.strip() for r in reasoning if r.strip())
    return LenientTurn(content.strip(), calls, final_answer, errors, thought)


def parse_tool_calls(text: str, think_open: bool = False) -> ParsedTurn:
    """Returns the content, tool calls and final answer of `text`; raises ToolCallError."""
    turn = _scan(text, think_open)
    if turn.errors:
        raise turn.errors[0]
    return ParsedTurn(turn.content, turn.calls, turn.final_answer, turn.reasoning)


def parse_tool_calls_lenient(text: str, think_open: bool = False) -> LenientTurn:
    """Returns the calls that parse and every ToolCallError found; never raises on text."""
    return _scan(text, think_open)
