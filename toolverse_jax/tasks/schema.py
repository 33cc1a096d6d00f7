"""Schema utilities shared by the tool graph, DUSA grounding and verifiers.

Names are reduced to *semantic keys* so that an output field of one tool can be matched to an
input parameter of another: `order_id` and `orders[].id` both become `id:order`; `email`, `to`,
`recipient_email` become `email`; `total`, `amount`, `balance` become `amount`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Iterator

import jsonschema

# Operation kinds inferred from the leading verb of a tool name.
_VERBS = {
    "create": {"create", "add", "new", "make", "book", "schedule", "register", "place", "open",
               "post", "insert", "compose", "draft", "reserve", "submit", "write"},
    "get": {"get", "read", "fetch", "show", "view", "describe", "retrieve", "check", "lookup",
            "track", "count", "calculate", "compute"},
    "list": {"list", "all", "browse"},
    "search": {"search", "find", "query", "filter"},
    "update": {"update", "edit", "modify", "set", "rename", "move", "change", "mark", "assign",
               "reschedule", "tag", "label", "archive", "close", "complete", "resolve", "star"},
    "delete": {"delete", "remove", "cancel", "drop", "clear", "unsubscribe", "decline"},
}
READ_ONLY_KINDS = ("get", "list", "search")
_STOP = {"by", "for", "a", "an", "the", "of", "to", "from", "in", "on", "with", "and", "my", "all"}
# Role prefixes stripped before an `_id` suffix: `from_account_id` is an account id.
_ROLES = {"from", "to", "source", "src", "target", "dest", "destination", "origin", "parent",
          "new", "old", "sender", "recipient", "payer", "payee", "primary", "selected"}

_SYNONYMS = {
    "email": {"email", "to", "recipient", "sender", "from", "cc", "bcc", "email_address",
              "recipient_email", "sender_email", "from_email", "to_email", "contact_email",
              "attendee", "attendee_email", "participant", "invitee", "user_email", "address"},
    "phone": {"phone", "phone_number", "mobile", "telephone", "tel"},
    "amount": {"amount", "total", "price", "cost", "balance", "sum", "total_amount", "fare",
               "subtotal", "value_amount"},
    "date": {"date", "day", "start_date", "end_date", "due", "due_date", "check_in", "check_out",
             "departure_date", "return_date", "on_date"},
    "datetime": {"datetime", "start", "end", "start_time", "end_time", "time", "when", "at",
                 "timestamp", "scheduled_at"},
    "city": {"city", "destination", "origin", "location", "from_city", "to_city"},
    "quantity": {"quantity", "qty", "count_items", "num_items"},
}
_SYN_INDEX = {name: key for key, names in _SYNONYMS.items() for name in names}
# Words whose values are free text the generator may invent (and must state in the instruction).
FREE_TEXT = {"subject", "body", "text", "content", "message", "note", "title", "description",
             "comment", "reason", "memo", "summary", "name", "label", "tag", "notes", "reply",
             "resolution"}
# Parameters the user states (never fed by value flow even when a field has the same name).
STATED = {"status", "priority", "resolution", "state", "type", "category", "role", "kind",
          "limit", "offset", "page", "sort", "order_by"}


def split_words(name: str) -> list[str]:
    """Returns the lower-case words of a snake_case, kebab-case or camelCase identifier."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", name.lower()) if w]


def singular(word: str) -> str:
    """Returns a crude singular of an English noun (`entries` -> `entry`, `orders` -> `order`)."""
    if len(word) <= 3 or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "xes", "sses")):
        return word[:-2]
    if word.endswith("s"):
        return word[:-1]
    return word


def tool_kind(tool: str) -> str:
    """Returns the operation kind of a tool name: create|get|list|search|update|delete|action."""
    words = split_words(tool)
    for w in words[:2]:
        for kind, verbs in _VERBS.items():
            if w in verbs:
                return kind
    return "action"


def tool_entity(tool: str) -> str:
    """Returns the entity a tool works on, from its name (`list_contacts` -> `contact`)."""
    words = [w for w in split_words(tool) if w not in _STOP]
    verbs = set().union(*_VERBS.values())
    nouns = [w for w in words if w not in verbs]
    if not nouns:
        return words[-1] if words else tool
    return singular(nouns[0])


def semantic_key(name: str, context_entity: str | None = None, fmt: str | None = None) -> str:
    """Returns the semantic key of a field or parameter name.

    `order_id` -> `id:order`; `id` inside `orders[]` (context `order`) -> `id:order`;
    `to` -> `email`; otherwise the singular snake name (`city`, `status`).
    """
    words = split_words(name)
    if not words:
        return name
    if fmt == "email":
        return "email"
    if fmt == "date":
        return "date"
    if fmt == "date-time":
        return "datetime"
    if len(words) > 1 and words[-1] in ("id", "ids", "uuid"):
        ent = [w for w in words[:-1] if w not in _ROLES] or words[:-1]
        return "id:" + singular("_".join(ent))
    if words == ["id"] or words == ["uuid"]:
        return "id:" + (context_entity or "?")
    joined = "_".join(words)
    if joined in _SYN_INDEX:
        return _SYN_INDEX[joined]
    if words[-1] in ("email", "emails"):
        return "email"
    if words[-1] == "name" and context_entity and len(words) == 1:
        return "name:" + context_entity
    return singular(joined)


def resolve_refs(schema: Any, root: dict | None = None, _depth: int = 0) -> Any:
    """Returns the schema with local `$ref`s (`#/$defs/...`) inlined (depth-limited)."""
    if root is None:
        root = schema
    if _depth > 12:
        return {}
    if isinstance(schema, dict):
        if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/"):
            target: Any = root
            for part in schema["$ref"][2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            return resolve_refs(merged, root, _depth + 1)
        return {k: resolve_refs(v, root, _depth + 1) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [resolve_refs(v, root, _depth + 1) for v in schema]
    return schema


def _types(schema: dict) -> set[str]:
    t = schema.get("type")
    if isinstance(t, list):
        return set(t) - {"null"}
    if isinstance(t, str):
        return {t}
    out: set[str] = set()
    for alt in schema.get("anyOf", []) + schema.get("oneOf", []):
        if isinstance(alt, dict):
            out |= _types(alt)
    if not out and "properties" in schema:
        out = {"object"}
    if not out and "enum" in schema:
        out = {type(v).__name__.replace("str", "string").replace("int", "integer")
               .replace("float", "number") for v in schema["enum"]}
    return out - {"null"}


def alternatives(schema: dict) -> list[dict]:
    """Returns the non-null anyOf/oneOf branches of a JSON schema, or [schema] without any."""
    alts = [a for a in schema.get("anyOf", []) + schema.get("oneOf", []) if isinstance(a, dict)
            and a.get("type") != "null"]
    return alts or [schema]


def schema_fields(schema: dict | None, entity: str) -> list[dict]:
    """Returns the scalar leaves of an output schema: [{path, type, key, entity}].

    Paths use `.` for objects and `[]` for arrays (`result[].id`); `key` is the semantic key,
    with `id`/`name` resolved against the nearest enclosing collection (or the tool's entity).
    """
    if not schema:
        return []
    schema = resolve_refs(schema)
    out: list[dict] = []

    def walk(s: dict, path: str, ctx: str, depth: int) -> None:
        if depth > 6 or not isinstance(s, dict):
            return
        for alt in alternatives(s):
            types = _types(alt)
            if "object" in types or "properties" in alt:
                for name, sub in (alt.get("properties") or {}).items():
                    sub_ctx = ctx
                    sub_types = _types(resolve_refs(sub)) if isinstance(sub, dict) else set()
                    if sub_types & {"object", "array"} and name not in ("result", "data", "items"):
                        sub_ctx = singular(split_words(name)[-1]) if split_words(name) else ctx
                    walk(sub, f"{path}.{name}" if path else name, sub_ctx, depth + 1)
            elif "array" in types:
                walk(alt.get("items") or {}, path + "[]", ctx, depth + 1)
            elif types:
                leaf = path.rsplit(".", 1)[-1].replace("[]", "")
                out.append({"path": path, "type": sorted(types)[0], "format": alt.get("format"),
                            "key": semantic_key(leaf, ctx, alt.get("format")), "entity": ctx})
                return

    walk(schema, "", entity, 0)
    seen, uniq = set(), []
    for f in out:
        if f["path"] not in seen:
            seen.add(f["path"])
            uniq.append(f)
    return uniq


def value_fields(value: Any, entity: str) -> list[dict]:
    """Returns the scalar leaves of an observed JSON value, in the format of `schema_fields`."""
    out: dict[str, dict] = {}

    def walk(v: Any, path: str, ctx: str, depth: int) -> None:
        if depth > 6:
            return
        if isinstance(v, dict):
            for k, sub in v.items():
                sub_ctx = ctx
                if isinstance(sub, (dict, list)) and k not in ("result", "data", "items"):
                    sub_ctx = singular(split_words(k)[-1]) if split_words(k) else ctx
                walk(sub, f"{path}.{k}" if path else k, sub_ctx, depth + 1)
        elif isinstance(v, list):
            for item in v[:20]:
                walk(item, path + "[]", ctx, depth + 1)
        elif v is not None and path:
            leaf = path.rsplit(".", 1)[-1].replace("[]", "")
            t = json_type(v)
            out.setdefault(path, {"path": path, "type": t, "format": None,
                                  "key": semantic_key(leaf, ctx), "entity": ctx})

    walk(value, "", entity, 0)
    return list(out.values())


def json_type(v: Any) -> str:
    """Returns the JSON Schema type name of a Python value."""
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def input_params(spec: dict) -> list[dict]:
    """Returns the top-level input parameters of a tool spec.

    Each is {name, schema, type, key, required, array}; a list of scalars (`to: [str]`) has the
    item's type and schema with `array=True`.
    """
    schema = resolve_refs(spec.get("inputSchema") or {})
    entity = tool_entity(spec["name"])
    required = set(schema.get("required") or [])
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        sub = sub if isinstance(sub, dict) else {}
        types = _types(sub)
        is_array = False
        if types == {"array"}:
            items = resolve_refs(sub.get("items") or {})
            item_types = _types(items) if isinstance(items, dict) else set()
            if item_types and not item_types & {"object", "array"}:
                # a list of scalars (`to: [email]`) is filled with one upstream value
                types, is_array, sub = item_types, True, items
        fmt = next((a.get("format") for a in alternatives(sub) if a.get("format")), None)
        key = semantic_key(name, entity, fmt)
        if key.startswith("name:") or name in ("query", "q", "keyword", "search", "term"):
            key = "name:" + entity
        out.append({"name": name, "schema": sub, "type": sorted(types)[0] if types else "string",
                    "key": key, "required": name in required, "array": is_array})
    return out


def types_compatible(out_type: str, in_type: str) -> bool:
    """Returns whether a produced JSON type can fill a parameter of `in_type`."""
    if out_type == in_type:
        return True
    return (out_type, in_type) in {("integer", "number"), ("integer", "string")}


def keys_match(out_key: str, in_key: str, out_path: str, in_name: str) -> float:
    """Returns a match score in [0, 1] between an output field and an input parameter."""
    if out_key == in_key and not out_key.endswith(":?"):
        return 1.0
    leaf = out_path.rsplit(".", 1)[-1].replace("[]", "")
    if leaf == in_name and not leaf == "id":
        return 0.8
    return 0.0


_SIMPLE_KEYS = {"type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                "minLength", "maxLength", "title", "description", "default", "format", "anyOf",
                "examples", "const"}
_VALIDATORS: dict[str, Any] = {}


def _simple_valid(value: Any, s: dict) -> bool:
    if "anyOf" in s:
        return any(_simple_valid(value, a) for a in s["anyOf"] if isinstance(a, dict))
    t = s.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if json_type(value) not in ts and not (json_type(value) == "integer" and "number" in ts):
            return False
    if "enum" in s and value not in s["enum"]:
        return False
    if "const" in s and value != s["const"]:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in s and value < s["minimum"] or "maximum" in s and value > s["maximum"]:
            return False
        if "exclusiveMinimum" in s and value <= s["exclusiveMinimum"]:
            return False
        if "exclusiveMaximum" in s and value >= s["exclusiveMaximum"]:
            return False
    if isinstance(value, str):
        if len(value) < s.get("minLength", 0) or len(value) > s.get("maxLength", 1 << 30):
            return False
    return True


def _is_simple(s: dict) -> bool:
    return set(s) <= _SIMPLE_KEYS and all(_is_simple(a) for a in s.get("anyOf", [])
                                          if isinstance(a, dict))


def validates(value: Any, schema: dict) -> bool:
    """Returns whether a value validates against a (parameter) JSON schema."""
    if not schema:
        return True
    if _is_simple(schema):
        return _simple_valid(value, schema)
    key = canonical(schema)
    v = _VALIDATORS.get(key)
    if v is None:
        try:
            v = jsonschema.validators.validator_for(schema)(schema)
        except Exception:  # noqa: BLE001 - odd schemas must not stop generation
            return True
        _VALIDATORS[key] = v
    try:
        return v.is_valid(value)
    except Exception:  # noqa: BLE001
        return True


def extract(value: Any, path: str) -> list[Any]:
    """Returns every scalar found at `path` (`result[].id`) in a JSON value, in order."""
    cur = [value]
    for part in path.split("."):
        name, arr = part.replace("[]", ""), part.count("[]")
        nxt = []
        for v in cur:
            if name:
                if not isinstance(v, dict) or name not in v:
                    continue
                v = v[name]
            items = [v]
            for _ in range(arr):
                items = [x for it in items if isinstance(it, list) for x in it]
            nxt.extend(items)
        cur = nxt
    return [v for v in cur if v is not None and not isinstance(v, (dict, list))]


def iter_records(value: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """Yields (path, dict) for every JSON object nested in a value (the value itself included)."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from iter_records(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for v in value:
            yield from iter_records(v, path + "[]")


def canonical(value: Any) -> str:
    """Returns a canonical JSON string (sorted keys) of a value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def parse_observation(content: str, structured: Any) -> Any:
    """Returns the JSON value of a tool result: structured content, else content parsed as JSON."""
    if structured is not None:
        return structured
    try:
        return json.loads(content)
    except (TypeError, ValueError):
        return content


def flatten_words(items: Iterable[str]) -> str:
    return " ".join(w for it in items for w in split_words(it))
