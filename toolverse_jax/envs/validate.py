"""Checks on untrusted tool-call arguments: size, JSON schema, sandbox-confined paths.

Every function returns the (possibly rewritten) arguments or raises `InvalidCall` with a message
that names the tool, the argument and what was expected.
"""

import functools
import json
import os
from typing import Any

import jsonschema

MAX_ARGS_BYTES = 64 * 1024


class InvalidCall(ValueError):
    """A tool call rejected before it reached the server (status `invalid_call`)."""


def _type_of(schema: dict) -> str:
    t = schema.get("type")
    if t:
        return t if isinstance(t, str) else "|".join(t)
    for k in ("anyOf", "oneOf"):
        if k in schema:
            return "|".join(_type_of(s) for s in schema[k])
    return "any"


@functools.lru_cache(maxsize=4096)
def _validator_for_json(schema_json: str):
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _validator(schema: dict, _cache: dict = {}):  # noqa: B006 - process-wide cache keyed by identity
    key = id(schema)
    hit = _cache.get(key)
    if hit is None or hit[0] is not schema:
        hit = _cache[key] = (schema, _validator_for_json(json.dumps(schema, sort_keys=True)))
    return hit[1]


def check_arguments(tool: str, schema: dict | None, args: Any, max_bytes: int = MAX_ARGS_BYTES) -> dict:
    """Returns `args` if it is a JSON object within `max_bytes` that satisfies `schema`."""
    if not isinstance(args, dict):
        raise InvalidCall(f"tool '{tool}': arguments must be a JSON object; got {type(args).__name__}")
    try:
        size = len(json.dumps(args, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError) as e:
        raise InvalidCall(f"tool '{tool}': arguments are not JSON-serializable ({e})") from None
    if size > max_bytes:
        raise InvalidCall(f"tool '{tool}': arguments are {size} bytes; the limit is {max_bytes} bytes")
    if not schema:
        return args
    props = schema.get("properties") or {}
    if props and schema.get("additionalProperties", False) is False:
        extra = sorted(set(args) - set(props))
        if extra:
            raise InvalidCall(f"tool '{tool}': unknown argument '{extra[0]}'; expected one of {sorted(props)}")
    v = _validator(schema)
    if v.is_valid(args):
        return args
    err = jsonschema.exceptions.best_match(v.iter_errors(args))
    if err is None:
        return args
    if err.validator == "required":
        missing = [r for r in err.validator_value if r not in (err.instance or {})]
        name = missing[0] if missing else "?"
        sub = (props.get(name) or {}) if not err.absolute_path else {}
        where = "".join(f"[{p!r}]" for p in err.absolute_path)
        raise InvalidCall(f"tool '{tool}' needs argument '{name}'{where} ({_type_of(sub)}); got keys {sorted(args)}")
    path = ".".join(str(p) for p in err.absolute_path) or "<arguments>"
    msg = err.message if len(err.message) < 300 else err.message[:300] + "..."
    raise InvalidCall(f"tool '{tool}': argument '{path}' is invalid: {msg}")


def confine_path(value: str, root: str, param: str) -> str:
    """Returns `value` resolved to an absolute real path inside `root`, else raises InvalidCall."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidCall(f"argument '{param}' must be a non-empty path string without NUL bytes")
    root = os.path.realpath(root)
    full = os.path.realpath(value if os.path.isabs(value) else os.path.join(root, value))
    if full != root and not full.startswith(root + os.sep):
        raise InvalidCall(f"argument '{param}' = {value[:200]!r} is outside the episode sandbox {root}; "
                          f"use a path under it")
    return full


def confine_paths(args: dict, path_params: tuple[str, ...], root: str) -> dict:
    """Returns a copy of `args` with every path-typed argument confined to `root`."""
    if not path_params:
        return args
    out = dict(args)
    for k in path_params:
        if k not in out:
            continue
        v = out[k]
        if isinstance(v, list):
            out[k] = [confine_path(x, root, f"{k}[{i}]") for i, x in enumerate(v)]
        else:
            out[k] = confine_path(v, root, k)
    return out
