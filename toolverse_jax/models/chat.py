"""Renders chats in Qwen3's format straight to token ids, with the policy mask.

Token in, token out: a rollout builds its sequence by appending `render_prompt`, the sampled
assistant ids, `render_tool_responses`, more sampled ids, ... and never re-tokenizes the whole
chat. `render_chat` of the equivalent messages gives the same ids (both paths encode the same
pieces: each non-policy block, each assistant turn's policy text), plus a trailing "\\n" after
the last `<|im_end|>` that a finished rollout does not have.

Format (Qwen3's chat template; transformers' `tojson` is json.dumps(ensure_ascii=False)):

    <|im_start|>system\\n{system}\\n\\n# Tools\\n\\nYou may call ...
    <tools>\\n{spec}\\n{spec}\\n</tools>\\n\\nFor each function call, ...</tool_call><|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n
    </tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{out 1}\\n</tool_response>\\n<tool_response>\\n
    {out 2}\\n</tool_response><|im_end|>\\n

(each entry is one line in the real text). Consecutive tool messages share one user block.
Deviations from Qwen3's template, on purpose: assistant content is rendered verbatim (Qwen3
inserts an empty `<think>\\n\\n</think>\\n\\n` into the turns after the last user query and
strips reasoning from earlier ones; a policy must be trained on exactly the ids it sampled), and
the generation prompt is `<|im_start|>assistant\\n`
with no `<think>` prefix.

Message: {"role": "system"|"user"|"assistant"|"tool", "content": str,
          "tool_calls": [{"name": str, "arguments": dict}]}  (tool_calls: assistant only; the
OpenAI form {"function": {"name", "arguments"}} is accepted too).
Tool spec: OpenAI form {"type": "function", "function": {...}} (rendered as given) or a bare
{"name", "description", "parameters" | "inputSchema", "outputSchema"} (MCP tools/list), which
is wrapped in the OpenAI form for "json" rendering.

Every `render_*` function takes `template=`: a `models.template.ChatTemplate` (a checkpoint's own
Jinja chat template, e.g. SmolLM2's ChatML or Qwen3's) renders the same pieces with that
template instead; None (the default, and what tokenizers without a template get) is the
Qwen3-format renderer above.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Mapping, Sequence

from toolverse_jax.models.tokenizer import Tokenizer

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")
TOOL_FORMATS = ("json", "compact", "minimal")

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_COMPACT_INTRO = "# Tools\n"
_COMPACT_OUTRO = (
    '\nCall tools as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'
)


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A rendered chat.

    tokens:        [length] ids.
    policy_mask:   [length] True exactly on assistant-produced ids (content, tool calls and
                   the closing <|im_end|>); False on headers, system, user and tool ids.
    turn_starts:   per assistant message, the index of its first policy id.
    turn_ends:     per assistant message, one past its last policy id (its <|im_end|>).
    message_spans: per message, (start, end) of the ids it contributed (an assistant span
                   includes its header; a tool message in a shared block, its own
                   <tool_response> part plus the block's opening/closing where it has them).
    """

    tokens: list[int]
    policy_mask: list[bool]
    turn_starts: list[int]
    turn_ends: list[int]
    message_spans: list[tuple[int, int]]


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """Returns the canonical JSON text of one tool call, as Qwen3's template writes it."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


class _Builder:
    """Accumulates ids and mask; each text piece is encoded on its own."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.mask: list[bool] = []

    def add(self, text: str, policy: bool = False, allow_special: bool = True) -> None:
        if text:
            ids = self.tokenizer.encode(text, allow_special=allow_special)
            self.tokens.extend(ids)
            self.mask.extend([policy] * len(ids))

    def __len__(self) -> int:
        return len(self.tokens)


def tool_spec_openai(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """Returns a tool spec in the OpenAI form {"type": "function", "function": {...}} (as given
    when it already is; an MCP tools/list entry is wrapped)."""
    if tool.get("type") == "function" and "function" in tool:
        return tool
    if "name" not in tool:
        raise ValueError(f"tool spec needs a 'name' (or the OpenAI 'function' form); got {tool}")
    fn = {"name": tool["name"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = _params_schema(tool)
    return {"type": "function", "function": fn}


def _tool_spec_json(tool: Mapping[str, Any]) -> str:
    return json.dumps(tool_spec_openai(tool), ensure_ascii=False)


def _params_schema(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    return fn.get("parameters") or fn.get("inputSchema") or {"type": "object", "properties": {}}


def _schema_type(schema: Mapping[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        return "|".join(str(x) for x in t)
    if t == "array" and isinstance(schema.get("items"), Mapping):
        return f"list[{_schema_type(schema['items'])}]"
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    return str(t) if t else "any"


def tool_spec_compact(tool: Mapping[str, Any], minimal: bool = False) -> str:
    """Returns one line `name(param: type, opt?: type) -> fields: description` for a tool
    (minimal: just `name(param: type, ...)`, for tiny models with short contexts)."""
    fn = tool.get("function", tool)
    params = _params_schema(tool)
    required = set(params.get("required", ()))
    args = ", ".join(
        f"{p}{'' if p in required else '?'}: {_schema_type(s if isinstance(s, Mapping) else {})}"
        for p, s in params.get("properties", {}).items()
    )
    line = f"{fn['name']}({args})"
    if minimal:
        return line
    out = fn.get("outputSchema") or {}
    fields = list(out.get("properties", {})) if isinstance(out, Mapping) else []
    if fields:
        line += " -> " + ", ".join(fields)
    desc = " ".join(str(fn.get("description", "")).split())
    return f"{line}: {desc}" if desc else line


def system_text(system: str | None, tools: Sequence[Mapping[str, Any]] | None,
                tool_format: str) -> str | None:
    """Returns the system message text with the tool list (None when there is neither)."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}; got {tool_format!r}")
    if not tools:
        return system
    head = f"{system}\n\n" if system else ""
    if tool_format == "json":
        specs = "".join("\n" + _tool_spec_json(t) for t in tools)
        return head + _TOOLS_INTRO + specs + _TOOLS_OUTRO
    lines = "".join(tool_spec_compact(t, tool_format == "minimal") + "\n" for t in tools)
    return head + _COMPACT_INTRO + lines + _COMPACT_OUTRO


def message_content(message: Mapping[str, Any]) -> str:
    """Returns a message's content as text (structured content as JSON, None as "")."""
    c = message.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    return json.dumps(c, ensure_ascii=False)  # structured tool output


def message_calls(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Returns an assistant message's tool calls as (name, arguments dict) pairs."""
    out = []
    for i, call in enumerate(message.get("tool_calls") or ()):
        call = call.get("function", call)
        if not isinstance(call.get("name"), str) or not call["name"]:
            raise ValueError(f"tool_calls[{i}] needs a non-empty string 'name'; got {call!r}")
        args = call.get("arguments", {})
        if isinstance(args, str):  # OpenAI form: arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError as e:
                raise ValueError(f"tool_calls[{i}] ({call['name']!r}): arguments string is not "
                                 f"JSON ({e}); pass a dict") from None
        out.append((call["name"], args))
    return out


def assistant_text(content: str, tool_calls: Iterable[tuple[str, Any]] = (),
                   end: str = IM_END) -> str:
    """Returns the policy text of one assistant turn: content, tool calls, the end token."""
    text = content
    for j, (name, args) in enumerate(tool_calls):
        if j > 0 or content:
            text += "\n"
        text += "<tool_call>\n" + render_tool_call(name, args) + "\n</tool_call>"
    return text + end


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Returns the messages as a list; raises ValueError on an unknown role or on tool_calls
    outside an assistant message."""
    msgs = list(messages)
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: role must be one of {ROLES}; got {role!r}")
        if m.get("tool_calls") and role != "assistant":
            raise ValueError(f"message {i}: only assistant messages may have tool_calls ({role})")
    return msgs


def _add_header(b: _Builder, role: str) -> None:
    b.add(f"{IM_START}{role}\n")


# Non-policy blocks are encoded as one piece each, so a BPE merges across "user\n" + content
# the way tokenizing the whole rendered text would (specials split the text anyway).
def _add_block(b: _Builder, role: str, text: str) -> None:
    b.add(f"{IM_START}{role}\n{text}{IM_END}\n")


def _add_tool_response(b: _Builder, content: str, first: bool, last: bool,
                       tool_specials: bool) -> None:
    head = f"{IM_START}user" if first else ""
    tail = f"{IM_END}\n" if last else ""
    if tool_specials:
        b.add(f"{head}\n<tool_response>\n{content}\n</tool_response>{tail}")
    else:
        b.add(f"{head}\n<tool_response>\n")
        b.add(content, allow_special=False)
        b.add(f"\n</tool_response>{tail}")


def _add_assistant_body(b: _Builder, content: str, calls: list[tuple[str, Any]]) -> None:
    b.add(assistant_text(content, calls), policy=True)


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    tool_format: str = "json",
    tool_specials: bool = True,
    template=None,
) -> Rendered:
    """Returns the ids, policy mask and turn boundaries of a chat in Qwen3's format (or, with
    `template`, in that chat template's format: see models/template.py).

    tool_specials: whether special-token strings inside tool outputs become special ids (as
    Qwen3's tokenizer does); False encodes them as plain text, so an environment's output can
    never fake a turn boundary such as `<|im_end|>`.
    """
    if template is not None:
        return template.render_chat(messages, tools, add_generation_prompt, tool_format,
                                    tool_specials)
    b = _Builder(tokenizer)
    spans: list[tuple[int, int]] = []
    starts: list[int] = []
    ends: list[int] = []
    msgs = check_messages(messages)

    first = 0
    system = system_text(
        message_content(msgs[0]) if msgs and msgs[0]["role"] == "system" else None, tools, tool_format
    )
    if system is not None:
        s = len(b)
        _add_block(b, "system", system)
        if msgs and msgs[0]["role"] == "system":
            spans.append((s, len(b)))
            first = 1

    for i in range(first, len(msgs)):
        m = msgs[i]
        role = m["role"]
        s = len(b)
        if role in ("system", "user"):
            _add_block(b, role, message_content(m))
        elif role == "assistant":
            _add_header(b, "assistant")
            starts.append(len(b))
            _add_assistant_body(b, message_content(m), message_calls(m))
            ends.append(len(b))
            b.add("\n")
        else:  # tool
            is_first = i == 0 or msgs[i - 1]["role"] != "tool"
            is_last = i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool"
            _add_tool_response(b, message_content(m), is_first, is_last, tool_specials)
        spans.append((s, len(b)))

    if add_generation_prompt:
        _add_header(b, "assistant")
    return Rendered(b.tokens, b.mask, starts, ends, spans)


def render_prompt(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_format: str = "json",
    template=None,
) -> list[int]:
    """Returns the ids of a rollout's prompt, ending with `<|im_start|>assistant\\n` (with
    `template`, with that template's generation prompt)."""
    if template is not None:
        return template.render_prompt(messages, tools, tool_format)
    return render_chat(messages, tokenizer, tools, add_generation_prompt=True,
                       tool_format=tool_format).tokens


def render_tool_responses(contents: Sequence[Any], tokenizer: Tokenizer,
                          tool_specials: bool = True, template=None) -> list[int]:
    """Returns the ids that follow an assistant turn ending in `<|im_end|>`.

    `\\n<|im_start|>user\\n<tool_response>\\n{c}\\n</tool_response>...<|im_end|>\\n
    <|im_start|>assistant\\n` — observation ids (policy mask False), ending in the next
    generation prompt. Non-string contents are JSON-encoded. `tool_specials` as in
    `render_chat` (use the same value in both).
    """
    if not contents:
        raise ValueError("render_tool_responses needs at least one tool output")
    if template is not None:
        return template.render_tool_responses(contents, tool_specials)
    b = _Builder(tokenizer)
    b.add("\n")
    for j, c in enumerate(contents):
        _add_tool_response(b, message_content({"content": c}), j == 0, j == len(contents) - 1,
                           tool_specials)
    _add_header(b, "assistant")
    return b.tokens


def render_user_turn(content: str, tokenizer: Tokenizer, template=None) -> list[int]:
    """Returns the ids that follow an assistant turn for a new user message (then the prompt)."""
    if template is not None:
        return template.render_user_turn(content)
    b = _Builder(tokenizer)
    b.add("\n")
    _add_block(b, "user", content)
    _add_header(b, "assistant")
    return b.tokens


def render_assistant(message: Mapping[str, Any], tokenizer: Tokenizer,
                     template=None) -> list[int]:
    """Returns the policy ids of one assistant message (content, calls, `<|im_end|>`)."""
    if template is not None:
        return template.render_assistant(message)
    b = _Builder(tokenizer)
    _add_assistant_body(b, message_content(message), message_calls(message))
    return b.tokens


def assistant_header(tokenizer: Tokenizer, template=None) -> list[int]:
    """Returns the ids of the generation prompt `<|im_start|>assistant\\n` (with `template`,
    that template's generation prompt)."""
    if template is not None:
        return template.tokenizer.encode(template.generation_prompt)
    b = _Builder(tokenizer)
    _add_header(b, "assistant")
    return b.tokens
