"""Renders chats with a checkpoint's own Jinja chat template, token in / token out.

A `ChatTemplate` renders with transformers' own Jinja renderer (its sandbox, `tojson`, the
tokenizer's special tokens as variables: what `apply_chat_template` runs) and cuts the text
into the pieces a rollout appends, found by rendering the real messages with each assistant
turn's content replaced by a sentinel and cutting around it:

  prompt      render(messages, add_generation_prompt=True), e.g. `...<|im_start|>assistant\\n`
  policy      the assistant's text verbatim + the template's end token (`<|im_end|>`): exactly
              what the sampler produces, so the policy mask covers it and nothing else
  after turn  what the template writes between that end token and the next generation prompt
              (`\\n<|im_start|>user\\n<tool_response>...<|im_end|>\\n<|im_start|>assistant\\n`)

Each template-written piece is encoded whole and every cut falls right after a special token
(the end token) or at a sentinel, so concatenating the pieces gives the ids of encoding the
whole rendered text, as `apply_chat_template(..., tokenize=True)` does.

Tools and calls. The policy writes calls as `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` (models/toolcall.py parses them). A template whose own rendering of `tools`,
assistant `tool_calls` and `tool` messages is exactly that syntax (Qwen2.5/Qwen3, Hermes) is used
natively (tool_mode "native"). Any other template, e.g. SmolLM2-Instruct's ChatML, which ignores
`tools` and `tool_calls`, gets the chat lowered to plain messages first (tool_mode "lowered"):
the tool list goes into the system message in Qwen3's wording (`chat.system_text`), calls stay
in the assistant text, and each run of tool results becomes one user message
`<tool_response>\\n{out}\\n</tool_response>` (joined by "\\n"), which is what Qwen3's format writes
inside its user block. `tool_format` "compact" / "minimal" always puts the tool list in the
system message.

Deviations from the template, on purpose (as in chat.py): an assistant turn is rendered as it
was sampled, after the generation prompt, verbatim. Templates that re-render past turns
differently (Qwen3 inserts an empty `<think>\\n\\n</think>\\n\\n` into the final assistant turn and
drops `<think>` reasoning from turns before the last user query) therefore differ from
`apply_chat_template` of a whole finished conversation by exactly those edits; prompts (any
history + generation prompt, as long as past assistant turns hold no `<think>`) and whole
conversations under templates without such rules (ChatML) are token-exact. A chat may not start
with an assistant message. Cuts are not token-exact when an assistant text starts with
whitespace that the BPE would merge with the header's trailing "\\n" (sampled ids are what they
are; this only concerns re-rendered demonstrations).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolverse_jax.models import chat
from toolverse_jax.models.chat import Rendered

TOOL_MODES = ("auto", "native", "lowered")
# How a run renders chats (config.rollout.chat_template, the eval configs' model.chat_template):
# "auto" = the tokenizer's own template when it has one (chat_template_for), else chat.py's
# Qwen3 format; "qwen3" = chat.py's Qwen3 format whatever the tokenizer carries.
CHAT_TEMPLATE_CHOICES = ("auto", "qwen3")

# Qwen3's chat template as released with Qwen/Qwen3-0.6B … Qwen3-32B (Apache-2.0; the copy in
# llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja). The offline Qwen3 tokenizer
# (tokenizer.qwen3_tokenizer) carries it, as the checkpoint's own tokenizer does.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Private-use characters that wrap special-token strings inside tool outputs when
# tool_specials=False (transformers' `sanitize_control_tokens` does the same): the wrapped
# pieces are encoded as plain text.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARKED = re.compile(f"{_MARK_OPEN}([^{_MARK_OPEN}{_MARK_CLOSE}]*){_MARK_CLOSE}"
                     f"|[{_MARK_OPEN}{_MARK_CLOSE}]")

_PROBE_USER = "tvj probe question"
_PROBE_TOOL = {"type": "function", "function": {
    "name": "tvj_probe_tool", "description": "Probe.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
_PROBE_CALL = ("tvj_probe_tool", {"q": "tvj probe value"})
_PROBE_RESULT = "tvj probe result"


class ChatTemplateError(ValueError):
    """A chat template that fails to render, or cannot be cut into token-in/token-out pieces."""


class ChatTemplate:
    """A checkpoint's Jinja chat template, rendered token in / token out (module docstring).

    Attributes: `source` (the Jinja text), `tokenizer`, `tool_mode` ("native" | "lowered"),
    `generation_prompt` (the text add_generation_prompt appends, e.g.
    `<|im_start|>assistant\\n`), `end_token` (the special token that closes an assistant turn:
    the policy's last id and the sampler's stop token), `template_kwargs` (extra template
    variables, e.g. {"enable_thinking": False} for Qwen3).

    The methods mirror chat.py's `render_*` functions, which call them when given `template=`.
    """

    def __init__(self, source: str, tokenizer, tool_mode: str = "auto",
                 template_kwargs: Mapping[str, Any] | None = None, name: str | None = None):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(f"chat template must be a non-empty Jinja string; got {source!r}")
        if tool_mode not in TOOL_MODES:
            raise ChatTemplateError(f"tool_mode must be one of {TOOL_MODES}; got {tool_mode!r}")
        self.source = source
        self.tokenizer = tokenizer
        self.name = name or f"chat template of {getattr(tokenizer, 'path', type(tokenizer).__name__)}"
        self.template_kwargs = dict(template_kwargs or {})
        hf = getattr(tokenizer, "hf", None)
        # apply_chat_template passes the special tokens (bos_token, eos_token, ...) as variables.
        self._variables = {**dict(getattr(hf, "special_tokens_map", None) or {}),
                           **self.template_kwargs}
        self._specials = sorted(tokenizer.special_ids, key=len, reverse=True)
        self._special_re = (re.compile("|".join(re.escape(s) for s in self._specials))
                            if self._specials else None)

        probe = [{"role": "user", "content": _PROBE_USER}]
        plain, gen = self._render(probe), self._render(probe, add_generation_prompt=True)
        if not gen.startswith(plain) or gen == plain:
            raise ChatTemplateError(
                f"{self.name}: add_generation_prompt=True must append an assistant header to the "
                f"rendered chat; got {plain[-60:]!r} -> {gen[-80:]!r}")
        self.generation_prompt = gen[len(plain):]
        sent = "TVJSENT0E"
        text = self._render(probe + [{"role": "assistant", "content": sent}])
        if sent not in text:
            raise ChatTemplateError(f"{self.name}: the template drops assistant content")
        after = text[text.rindex(sent) + len(sent):]
        ends = [s for s in self._specials if after.startswith(s)]
        if not ends:
            raise ChatTemplateError(
                f"{self.name}: an assistant turn is closed by {after[:40]!r}, which does not start "
                f"with a special token of the tokenizer; the policy needs one as its last id and "
                f"the sampler as its stop token")
        self.end_token = ends[0]  # longest first
        native = self._native_tools()
        if tool_mode == "native" and not native:
            raise ChatTemplateError(
                f"{self.name}: tool_mode='native' needs a template that renders `tools`, assistant "
                f"`tool_calls` as <tool_call>{{\"name\": ..., \"arguments\": ...}}</tool_call> and "
                f"`tool` messages; this one does not: use tool_mode='lowered' (or 'auto')")
        self.tool_mode = "native" if (native and tool_mode != "lowered") else "lowered"

    def __repr__(self) -> str:
        return (f"ChatTemplate({self.name!r}, tool_mode={self.tool_mode!r}, "
                f"generation_prompt={self.generation_prompt!r}, end_token={self.end_token!r})")

    @property
    def end_id(self) -> int:
        """Returns the id of the end token (the stop token for sampling)."""
        return self.tokenizer.special_ids[self.end_token]

    @property
    def think_open(self) -> bool:
        """Returns whether the generation prompt leaves a `<think>` block open (a thinking
        template that prefills `<think>\\n`): parse samples with toolcall's think_open=True."""
        g = self.generation_prompt
        return g.rfind("<think>") > g.rfind("</think>")

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: list[dict], tools: list | None = None,
                add_generation_prompt: bool = False) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            out, _ = render_jinja_template(conversations=[messages], tools=tools,
                                           chat_template=self.source,
                                           add_generation_prompt=add_generation_prompt,
                                           **self._variables)
        except Exception as e:  # jinja2 TemplateError / UndefinedError / the template's own raise
            raise ChatTemplateError(f"{self.name}: rendering failed: {type(e).__name__}: {e}") from e
        return out[0]

    def _native_tools(self) -> bool:
        probe = [{"role": "user", "content": _PROBE_USER}]
        try:
            if _PROBE_TOOL["function"]["name"] not in self._render(probe, tools=[_PROBE_TOOL]):
                return False
            sent = "TVJSENT0E"
            name, args = _PROBE_CALL
            text = self._render(probe + [
                {"role": "assistant", "content": sent, "tool_calls": [
                    {"type": "function", "function": {"name": name, "arguments": args}}]},
                {"role": "tool", "content": _PROBE_RESULT}], add_generation_prompt=True)
        except ChatTemplateError:
            return False
        want = chat.assistant_text(sent, [_PROBE_CALL], self.end_token)
        return want in text and _PROBE_RESULT in text.split(want, 1)[1]

    def _mark(self, text: str) -> str:
        text = text.replace(_MARK_OPEN, "").replace(_MARK_CLOSE, "")
        if self._special_re is None:
            return text
        return self._special_re.sub(lambda m: _MARK_OPEN + m.group(0) + _MARK_CLOSE, text)

    def _prepare(self, msgs: Sequence[Mapping[str, Any]], tools, tool_format: str,
                 sentinels: Mapping[int, str], tool_specials: bool) -> tuple[list[dict], list | None]:
        """Returns (template messages, template tools): assistant contents replaced by their
        sentinels, tools and tool results lowered to plain messages unless used natively."""
        if tool_format not in chat.TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {chat.TOOL_FORMATS}; got {tool_format!r}")
        native = self.tool_mode == "native"
        native_tools = bool(tools) and native and tool_format == "json"
        out: list[dict] = []
        first = 0
        if tools and not native_tools:
            has_system = bool(msgs) and msgs[0]["role"] == "system"
            system = chat.message_content(msgs[0]) if has_system else None
            out.append({"role": "system", "content": chat.system_text(system, tools, tool_format)})
            first = int(has_system)
        tool_block = False  # whether out[-1] is a lowered run of tool results
        for i in range(first, len(msgs)):
            m = msgs[i]
            role = m["role"]
            if role == "assistant":
                out.append({"role": "assistant", "content": sentinels[i]})
            elif role == "tool":
                content = chat.message_content(m)
                content = content if tool_specials else self._mark(content)
                if native:
                    out.append({"role": "tool", "content": content})
                    continue
                block = f"<tool_response>\n{content}\n</tool_response>"
                if tool_block:
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block})
                tool_block = True
                continue
            else:
                out.append({"role": role, "content": chat.message_content(m)})
            tool_block = False
        return out, ([chat.tool_spec_openai(t) for t in tools] if native_tools else None)

    def _sentinels(self, msgs: Sequence[Mapping[str, Any]], tools) -> dict[int, str]:
        seen = repr(list(msgs)) + repr(tools)
        n = 0
        while f"TVJ{n}S" in seen:
            n += 1
        return {i: f"TVJ{n}S{i}E" for i, m in enumerate(msgs) if m["role"] == "assistant"}

    def _after(self, text: str, sentinel: str | None) -> str:
        """Returns the part of `text` after the end token of the turn holding `sentinel` (all
        of it for None)."""
        if sentinel is None:
            return text
        i = text.find(sentinel)
        if i < 0:
            raise ChatTemplateError(f"{self.name}: the template dropped an assistant message")
        j = i + len(sentinel)
        if not text.startswith(self.end_token, j):
            raise ChatTemplateError(
                f"{self.name}: an assistant turn is not closed by {self.end_token!r} right after "
                f"its content (got {text[j:j + 40]!r}); it cannot be rendered token in / token out")
        return text[j + len(self.end_token):]

    def _layout(self, messages, tools, add_generation_prompt: bool, tool_format: str,
                tool_specials: bool, spans: bool):
        """Returns (segments, policy texts, begins): segments[k] is the template text before
        assistant turn k's policy text (the last one follows the last turn); with `spans`,
        begins[k] lists (message index, char offset in segments[k]) where messages begin, plus
        (-1, offset) for a trailing generation prompt."""
        msgs = chat.check_messages(messages)
        asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if asst and asst[0] == 0:
            raise ChatTemplateError(f"{self.name}: a chat rendered with a template must not start "
                                    "with an assistant message; put a user (or system) message first")
        sentinels = self._sentinels(msgs, tools)

        def render(n: int, gen: bool) -> str:
            if n == 0:
                return ""
            return self._render(*self._prepare(msgs[:n], tools, tool_format, sentinels,
                                               tool_specials), add_generation_prompt=gen)

        segments, begins = [], []
        for k, stop in enumerate(asst + [len(msgs)]):
            gen = k < len(asst) or add_generation_prompt
            lo = asst[k - 1] + 1 if k else 0
            previous = sentinels[asst[k - 1]] if k else None  # segment k starts after its turn
            seg = (self._after(render(stop, gen), previous) if stop
                   else (self.generation_prompt if gen else ""))
            segments.append(seg)
            if not spans:
                continue
            # Message j begins where the chats without and with it part (the longest common
            # prefix: a template may close a block differently once more messages follow).
            texts = [self._after(render(j, False), previous) for j in range(lo, stop + 1)]
            starts, at = [], 0
            for j in range(lo, stop):
                at = max(at, _common_prefix(texts[j - lo], texts[j - lo + 1]))
                starts.append((j, at))
            if gen:
                starts.append((stop if k < len(asst) else -1,
                               max(at, _common_prefix(texts[-1], seg))))
            begins.append(starts)
        policies = [chat.assistant_text(chat.message_content(msgs[i]), chat.message_calls(msgs[i]),
                                        self.end_token) for i in asst]
        return segments, policies, begins

    def _encode_segment(self, text: str) -> list[int]:
        if _MARK_OPEN not in text and _MARK_CLOSE not in text:
            return self.tokenizer.encode(text)
        ids: list[int] = []
        for i, piece in enumerate(_MARKED.split(text)):
            if piece:  # odd pieces: marked special-token strings, encoded as plain text
                ids += self.tokenizer.encode(piece, allow_special=i % 2 == 0)
        return ids

    def _token_index(self, ids: list[int], text: str, offset: int) -> int:
        """Returns how many leading ids of `ids` (the encoding of `text`) it takes to cover
        `text[:offset]`; a token straddling `offset` goes with the text before it."""
        offset -= sum(text.count(c, 0, offset) for c in (_MARK_OPEN, _MARK_CLOSE))
        lo, hi = 0, len(ids)
        while lo < hi:  # the fewest ids whose text reaches `offset`
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:mid])) >= offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    add_generation_prompt: bool = False, tool_format: str = "json",
                    tool_specials: bool = True) -> Rendered:
        """Returns the ids, policy mask and turn boundaries of a chat (chat.render_chat's
        contract). A message's span starts where the template starts writing it (the first
        message's span also holds any system block the template adds before it)."""
        segments, policies, begins = self._layout(messages, tools, add_generation_prompt,
                                                  tool_format, tool_specials, spans=True)
        tokens: list[int] = []
        mask: list[bool] = []
        turn_starts, turn_ends = [], []
        begin_at: dict[int, int] = {}
        for k, seg in enumerate(segments):
            ids = self._encode_segment(seg)
            for j, offset in begins[k]:
                begin_at[j] = len(tokens) + self._token_index(ids, seg, offset)
            tokens += ids
            mask += [False] * len(ids)
            if k < len(policies):
                turn_starts.append(len(tokens))
                ids = self.tokenizer.encode(policies[k])
                tokens += ids
                mask += [True] * len(ids)
                turn_ends.append(len(tokens))
        n = len(list(messages))
        bounds = [begin_at.get(j, 0) for j in range(n)] + [begin_at.get(-1, len(tokens))]
        spans = [(bounds[j], bounds[j + 1]) for j in range(n)]
        return Rendered(tokens, mask, turn_starts, turn_ends, spans)

    def render_prompt(self, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      tool_format: str = "json") -> list[int]:
        """Returns the ids of a rollout's prompt, ending with the generation prompt."""
        segments, policies, _ = self._layout(messages, tools, True, tool_format, True, spans=False)
        ids: list[int] = []
        for k, seg in enumerate(segments):
            ids += self._encode_segment(seg)
            if k < len(policies):
                ids += self.tokenizer.encode(policies[k])
        return ids

    def _continuation(self, followers: list[dict], tool_specials: bool = True) -> list[int]:
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": ""}]
        segments, _, _ = self._layout(probe + followers, None, True, "json", tool_specials,
                                      spans=False)
        return self._encode_segment(segments[1])

    def render_tool_responses(self, contents: Sequence[Any], tool_specials: bool = True) -> list[int]:
        """Returns the ids that follow an assistant turn's end token: the tool results (as one
        block of `tool` messages) and the next generation prompt."""
        if not contents:
            raise ValueError("render_tool_responses needs at least one tool output")
        return self._continuation([{"role": "tool", "content": c} for c in contents], tool_specials)

    def render_user_turn(self, content: str) -> list[int]:
        """Returns the ids that follow an assistant turn's end token for a new user message."""
        return self._continuation([{"role": "user", "content": content}])

    def render_assistant(self, message: Mapping[str, Any]) -> list[int]:
        """Returns the policy ids of one assistant message (content, calls, end token)."""
        return self.tokenizer.encode(chat.assistant_text(
            chat.message_content(message), chat.message_calls(message), self.end_token))


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def chat_template_for(tokenizer, tool_mode: str = "auto", **template_kwargs) -> ChatTemplate | None:
    """Returns the ChatTemplate of a tokenizer's own Jinja chat template, or None when it has
    none (ByteTokenizer, locally trained BPE: render with chat.py's Qwen3 format then).

    The template is the one the tokenizer was loaded with: an HF directory's
    tokenizer_config.json / chat_template.jinja, a GGUF's `tokenizer.chat_template` (SmolLM2's
    ChatML), or Qwen3's for load_tokenizer("qwen3"). `template_kwargs` become template
    variables (e.g. enable_thinking=False for Qwen3).
    """
    source = getattr(getattr(tokenizer, "hf", None), "chat_template", None)
    if isinstance(source, dict):  # named templates: the default one renders chats
        source = source.get("default")
    if not source:
        return None
    return ChatTemplate(source, tokenizer, tool_mode=tool_mode, template_kwargs=template_kwargs)


def select_chat_template(choice: str, tokenizer) -> ChatTemplate | None:
    """Returns the ChatTemplate a run renders with for `choice` (CHAT_TEMPLATE_CHOICES): the
    tokenizer's own for "auto" (None when it has none, as byte and trained BPE tokenizers), None
    (chat.py's Qwen3 format) for "qwen3"."""
    if choice not in CHAT_TEMPLATE_CHOICES:
        raise ValueError(f"chat_template={choice!r}; use one of {CHAT_TEMPLATE_CHOICES} ('auto': "
                         f"the tokenizer's own Jinja template, 'qwen3': the built-in Qwen3 format)")
    return chat_template_for(tokenizer) if choice == "auto" else None
