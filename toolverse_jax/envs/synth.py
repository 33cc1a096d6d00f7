"""Schema-driven environment synthesizer: a manifest (MCP tool specs) → a stateful MCP server.

From each tool's name and schemas it infers an operation kind (create/get/list/search/update/
delete/action) and an entity ("create_issue" → create on `issue`), keeps the entities of each
episode in SQLite (one file per episode sandbox), seeds them deterministically from the seed,
rejects arguments that violate inputSchema (jsonschema, precise message), and shapes every
result to the tool's outputSchema (or an inferred shape: the record, or {items, count}).

    python -m toolverse_jax.envs.synth path/to/manifest.json      # serve over stdio
"""

import dataclasses
import hashlib
import json
import os
import random
import re
import sqlite3
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ListToolsResult, TextContent, Tool

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import EpisodeControl, EpisodeStates, episode_of
from toolverse_jax.envs.episode import HIDDEN_PREFIX
from toolverse_jax.envs.validate import InvalidCall, check_arguments

VERBS = {
    "create": {"create", "add", "new", "insert", "post", "register", "make", "book", "schedule", "upload",
               "send", "submit", "open", "invite", "enroll", "subscribe", "import", "generate", "place"},
    "get": {"get", "read", "fetch", "retrieve", "show", "describe", "view", "download", "check", "lookup"},
    "list": {"list", "browse", "all", "enumerate"},
    "search": {"search", "find", "query", "filter", "discover"},
    "update": {"update", "edit", "modify", "set", "patch", "rename", "change", "move", "assign", "replace",
               "tag", "label", "transfer", "reschedule", "mark"},
    "delete": {"delete", "remove", "destroy", "drop", "unregister", "purge", "unsubscribe", "revoke"},
}
PAST = {"close": "closed", "cancel": "cancelled", "approve": "approved", "reject": "rejected", "archive": "archived",
        "complete": "completed", "resolve": "resolved", "merge": "merged", "publish": "published", "pause": "paused",
        "resume": "active", "start": "started", "stop": "stopped", "ship": "shipped", "refund": "refunded",
        "confirm": "confirmed", "lock": "locked", "unlock": "active", "reopen": "open", "activate": "active",
        "deactivate": "inactive", "pay": "paid", "sign": "signed", "accept": "accepted", "decline": "declined"}
PAGING = {"limit", "offset", "page", "per_page", "page_size", "cursor", "sort", "order", "sort_by", "max_results",
          "page_token", "order_by"}
COUNT_NAMES = {"count", "total", "total_count", "num_results", "size", "n"}
SEED_ROWS = 5


def _tokens(name: str) -> list[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", name.lower()) if t]


def _singular(w: str) -> str:
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("ses", "xes", "ches", "shes")):
        return w[:-2]
    if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        return w[:-1]
    return w


@dataclasses.dataclass
class Op:
    """What a tool does: kind, entity, verb, the id param (if any), its input/output schemas."""

    tool: str
    kind: str
    entity: str
    verb: str
    id_param: str | None
    key_params: tuple[str, ...]
    input_schema: dict
    output_schema: dict | None


def _find_id_param(entity: str, props: dict, required: list[str]) -> str | None:
    cands = [f"{entity}_id", f"{entity.split('_')[-1]}_id", "id", f"{entity}id", "uuid", "key", f"{entity}_key",
             f"{entity}_name", "slug"]
    norm = {p.replace("-", "_").lower() if "_" in p else "_".join(_tokens(p)): p for p in props}
    for c in cands:
        if c in norm and props[norm[c]].get("type", "string") in ("string", "integer"):
            return norm[c]
    ids = [p for p in required if "_".join(_tokens(p)).endswith("_id") or p.lower() == "id"]
    return ids[0] if len(ids) == 1 else None


def inline_refs(schema: Any, defs: dict | None = None, depth: int = 0) -> Any:
    """Returns `schema` with local `#/$defs/X` (and `#/definitions/X`) references inlined."""
    if isinstance(schema, dict):
        if defs is None:
            defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target = defs.get(ref.split("/")[-1])
            if target is None or depth > 8:
                return {"type": "object"}
            merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            return inline_refs(merged, defs, depth + 1)
        return {k: inline_refs(v, defs, depth) for k, v in schema.items() if k not in ("$defs", "definitions")}
    if isinstance(schema, list):
        return [inline_refs(x, defs, depth) for x in schema]
    return schema


def infer_ops(tools: list[dict], server: str = "") -> dict[str, Op]:
    """Returns {tool name: Op} inferred from names and schemas of a manifest's tools."""
    toks = {t["name"]: _tokens(t["name"]) for t in tools}
    all_verbs = set().union(*VERBS.values()) | set(PAST)
    # A prefix every tool shares (e.g. "github_") names the service, not the entity.
    first = {v[0] for v in toks.values() if v}
    strip = 1 if len(tools) > 1 and len(first) == 1 and next(iter(first)) not in all_verbs else 0
    ops = {}
    for t in tools:
        tk = toks[t["name"]][strip:] or toks[t["name"]]
        kind, verb, idx = "action", tk[0], 0
        for i, w in enumerate(tk):
            hit = next((k for k, vs in VERBS.items() if w in vs), None)
            if hit or w in PAST:
                kind, verb, idx = hit or "action", w, i
                break
        rest = [w for j, w in enumerate(tk) if j != idx and w not in ("by", "for", "of", "a", "an", "the", "my")]
        entity = "_".join(_singular(w) for w in rest) or _singular(server.replace("-", "_")) or "item"
        if kind == "list" and "search" in tk:
            kind = "search"
        schema = inline_refs(t.get("inputSchema") or {"type": "object"})
        props = schema.get("properties") or {}
        req = list(schema.get("required") or [])
        id_param = _find_id_param(entity, props, req)
        keys = tuple(p for p in req if p != id_param and p not in PAGING
                     and props.get(p, {}).get("type", "string") in ("string", "integer", "number"))
        out_schema = inline_refs(t["outputSchema"]) if t.get("outputSchema") else None
        ops[t["name"]] = Op(t["name"], kind, entity, verb, id_param, keys, schema, out_schema)
    _merge_entities(ops)
    known = {o.entity for o in ops.values() if o.kind in ("create", "list", "get")}
    for o in ops.values():
        # track_shipment(order_id) is about an order: an id param naming a known entity wins.
        stem = "_".join(_tokens(o.id_param))[:-3] if o.id_param and "_".join(_tokens(o.id_param)).endswith("_id") else ""
        if stem and stem != o.entity and stem in known and o.kind in ("get", "update", "delete", "action"):
            o.entity = stem
    return ops


def _merge_entities(ops: dict[str, Op]) -> None:
    # "get_issue_details" and "create_issue" name one entity: map an entity to the shortest known
    # entity it starts with, so ids flow between the tools.
    names = sorted({o.entity for o in ops.values()}, key=len)
    for o in ops.values():
        for n in names:
            if n != o.entity and (o.entity.startswith(n + "_") or o.entity.endswith("_" + n)):
                o.entity = n
                break


# ----------------------------------------------------------------------------- values

def _rng_for(*parts) -> random.Random:
    return random.Random(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest())


def fake(field: str, schema: dict, rng: random.Random, depth: int = 0) -> Any:
    """Returns a plausible value for `field` that satisfies (simple) `schema`."""
    schema = _pick(schema)
    if "enum" in schema and schema["enum"]:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    t = _type(schema)
    f = field.lower()
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer":
        lo, hi = int(schema.get("minimum", 0)), int(schema.get("maximum", 100 if "count" in f else 1000))
        return rng.randint(lo, max(lo, hi))
    if t == "number":
        lo, hi = float(schema.get("minimum", 1.0)), float(schema.get("maximum", 500.0))
        if "lat" in f:
            lo, hi = -60.0, 60.0
        elif "lon" in f or "lng" in f:
            lo, hi = -150.0, 150.0
        return round(rng.uniform(lo, max(lo, hi)), 2)
    if t == "array":
        if depth > 3:
            return []
        items = schema.get("items") or {"type": "string"}
        n = max(int(schema.get("minItems", 0)), 1 if depth < 2 else 0)
        return [fake(_singular(field), items, rng, depth + 1) for _ in range(n)]
    if t == "object":
        if depth > 3:
            return {}
        props = schema.get("properties") or {}
        req = schema.get("required") or list(props)[:4]
        return {p: fake(p, props[p], rng, depth + 1) for p in props if p in req}
    if t == "null":
        return None
    return _fake_string(f, schema, rng)


def _fake_string(f: str, schema: dict, rng: random.Random) -> str:
    fmt = schema.get("format", "")
    person = rng.choice(fixtures.people(rng.randint(0, 3)))
    if fmt == "email" or "email" in f:
        return person["email"]
    if fmt == "date-time" or f.endswith(("_at", "timestamp", "datetime")):
        return fixtures.day(rng.randint(-30, 30)) + f"T{rng.randint(8, 18):02d}:00:00Z"
    if fmt == "date" or "date" in f or f in ("day", "start", "end", "due", "deadline"):
        return fixtures.day(rng.randint(-30, 30))
    if "time" in f:
        return f"{rng.randint(8, 18):02d}:{rng.choice(['00', '30'])}"
    if fmt in ("uri", "url") or "url" in f or "link" in f:
        return f"https://example.com/{f}/{rng.randint(1, 9999)}"
    if "phone" in f:
        return person["phone"]
    if f in ("name", "full_name", "owner", "author", "assignee", "customer", "user", "username", "contact"):
        return person["name"] if f != "username" else person["email"].split("@")[0]
    if "city" in f or "location" in f or "address" in f or "place" in f:
        return rng.choice(fixtures.CITIES)[1]
    if "country" in f:
        return rng.choice(["US", "GB", "DE", "FR", "JP", "CA"])
    if "currency" in f:
        return rng.choice(["USD", "EUR", "GBP"])
    if "symbol" in f or "ticker" in f:
        return rng.choice(["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"])
    if "status" in f or "state" == f:
        return rng.choice(["open", "active", "pending"])
    if "color" in f:
        return rng.choice(["red", "green", "blue"])
    if f.endswith("id") or f.endswith("_key"):
        return f"{f[:3]}_{rng.randint(1, 9999):04d}"
    if "title" in f or "subject" in f or "summary" in f:
        return rng.choice(fixtures.SUBJECTS).format(n=rng.randint(100, 999))
    if "description" in f or "body" in f or "content" in f or "text" in f or "note" in f or "message" in f:
        return f"{rng.choice(['Please review', 'Follow up on', 'Details about'])} {rng.choice(fixtures.PRODUCTS)[0]}"
    s = f"{f.replace('_', ' ')} {rng.randint(1, 999)}".strip()
    lo = int(schema.get("minLength", 0))
    return s + "x" * max(0, lo - len(s))


def _pick(schema: dict) -> dict:
    if not isinstance(schema, dict):
        return {}
    for k in ("anyOf", "oneOf"):
        if k in schema:
            opts = [s for s in schema[k] if isinstance(s, dict) and s.get("type") != "null"]
            if opts:
                merged = dict(opts[0])
                for kk in ("default", "description", "title"):
                    if kk in schema and kk not in merged:
                        merged[kk] = schema[kk]
                return merged
    if "allOf" in schema and schema["allOf"]:
        return _pick(schema["allOf"][0])
    return schema


def _type(schema: dict) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t:
        return t
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _coerce(value: Any, schema: dict, field: str, rng: random.Random) -> Any:
    schema = _pick(schema)
    if "enum" in schema and schema["enum"] and value not in schema["enum"]:
        return schema["enum"][0]
    t = _type(schema) if schema else None
    try:
        if t == "string":
            return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        if t == "integer":
            return int(value) if not isinstance(value, bool) else int(value)
        if t == "number":
            return float(value)
        if t == "boolean":
            return bool(value)
        if t == "array":
            if not isinstance(value, list):
                return [_coerce(value, schema.get("items") or {}, field, rng)] if value is not None else []
            return [_coerce(v, schema.get("items") or {}, field, rng) for v in value]
        if t == "object":
            if not isinstance(value, dict):
                return fake(field, schema, rng)
            return shape(schema, value, rng, None)
    except (TypeError, ValueError):
        return fake(field, schema, rng)
    return value


def _lookup(rec: dict, prop: str, entity: str) -> tuple[bool, Any]:
    if prop in rec:
        return True, rec[prop]
    p = "_".join(_tokens(prop))
    if p in rec:
        return True, rec[p]
    if p in ("id", f"{entity}_id", f"{entity.split('_')[-1]}_id", "uuid") and "id" in rec:
        return True, rec["id"]
    return False, None


def shape(schema: dict | None, rec: Any, rng: random.Random, records: list[dict] | None, entity: str = "") -> Any:
    """Returns `rec` (or `records` for list results) shaped to satisfy `schema`."""
    if schema is None:
        return {"items": records, "count": len(records)} if records is not None else rec
    schema = _pick(schema)
    t = _type(schema)
    if t == "array":
        src = records if records is not None else (rec if isinstance(rec, list) else [rec])
        items = schema.get("items") or {}
        return [shape(items, r, rng, None, entity) if _type(_pick(items)) == "object" else _coerce(r, items, "item", rng)
                for r in src]
    if t != "object":
        return _coerce(rec, schema, "result", rng)
    props = schema.get("properties")
    if not props:
        return rec if isinstance(rec, dict) else {"result": rec, "items": records}
    required = set(schema.get("required") or [])
    rec = rec if isinstance(rec, dict) else {}
    out, used_list = {}, False
    for p, ps in props.items():
        hit, v = _lookup(rec, p, entity)
        pt = _type(_pick(ps))
        if records is not None and pt == "array" and not used_list:
            out[p] = shape(ps, None, rng, records, entity)
            used_list = True
        elif hit and v is not None:
            out[p] = _coerce(v, ps, p, rng)
        elif records is not None and p in COUNT_NAMES and pt in ("integer", "number"):
            out[p] = len(records)
        elif pt == "object" and (p in required or p == "result") and rec:
            out[p] = shape(ps, rec, rng, None, entity)
        elif p in required:
            out[p] = fake(p, ps, rng)
    return out


# ----------------------------------------------------------------------------- state + server

class SynthState:
    """One episode's entities in SQLite: table records(entity, id, data JSON)."""

    def __init__(self, path: str, seed: int, ops: dict[str, Op], server: str):
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=MEMORY")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("CREATE TABLE IF NOT EXISTS records (entity TEXT, id TEXT, seq INTEGER, data TEXT, "
                        "PRIMARY KEY (entity, id))")
        self.db.execute("CREATE TABLE IF NOT EXISTS actions (seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT, args TEXT)")
        self.db.execute("DELETE FROM records")
        self.db.execute("DELETE FROM actions")
        self.seed, self.server = seed, server
        self._seed_rows(ops)

    def _seed_rows(self, ops: dict[str, Op]) -> None:
        fields: dict[str, dict] = {}
        for o in ops.values():
            f = fields.setdefault(o.entity, {})
            if o.kind == "create":
                for p, s in (o.input_schema.get("properties") or {}).items():
                    f.setdefault(p, s)
            if o.output_schema and o.kind in ("create", "get", "update"):
                for p, s in (_pick(o.output_schema).get("properties") or {}).items():
                    if _type(_pick(s)) not in ("object",):
                        f.setdefault(p, s)
        for ent, f in sorted(fields.items()):
            if not any(o.entity == ent and o.kind in ("create", "get", "list", "search", "update", "delete")
                       for o in ops.values()):
                continue
            for i in range(SEED_ROWS):
                rng = _rng_for(self.server, ent, self.seed, i)
                rec = {p: fake(p, s, rng) for p, s in f.items() if p not in PAGING}
                self.insert(ent, rec, rng)

    def new_id(self, entity: str) -> str:
        n = self.db.execute("SELECT COUNT(*) FROM records WHERE entity=?", (entity,)).fetchone()[0]
        prefix = "".join(w[:3] for w in entity.split("_")[:2]) or "obj"
        while True:
            n += 1
            rid = f"{prefix}_{n:04d}"
            if not self.get(entity, rid):
                return rid

    def insert(self, entity: str, rec: dict, rng: random.Random) -> dict:
        rid = str(rec.get("id") or self.new_id(entity))
        rec = dict(rec, id=rid)
        for k in list(rec):
            if k != "id" and "_".join(_tokens(k)) in (f"{entity}_id", f"{entity.split('_')[-1]}_id"):
                rec[k] = rid
        seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM records").fetchone()[0]
        self.db.execute("INSERT OR REPLACE INTO records VALUES (?,?,?,?)", (entity, rid, seq, json.dumps(rec)))
        return rec

    def get(self, entity: str, rid: str) -> dict | None:
        row = self.db.execute("SELECT data FROM records WHERE entity=? AND id=?", (entity, str(rid))).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, entity: str, rec: dict) -> None:
        self.db.execute("UPDATE records SET data=? WHERE entity=? AND id=?", (json.dumps(rec), entity, rec["id"]))

    def all(self, entity: str) -> list[dict]:
        return [json.loads(r[0]) for r in
                self.db.execute("SELECT data FROM records WHERE entity=? ORDER BY seq", (entity,))]

    def delete(self, entity: str, rid: str) -> None:
        self.db.execute("DELETE FROM records WHERE entity=? AND id=?", (entity, str(rid)))

    def log(self, tool: str, args: dict) -> None:
        self.db.execute("INSERT INTO actions (tool, args) VALUES (?, ?)", (tool, json.dumps(args)))

    def dump(self) -> dict:
        out: dict = {}
        for ent, rid, data in self.db.execute("SELECT entity, id, data FROM records ORDER BY entity, seq"):
            out.setdefault(ent, {})[rid] = json.loads(data)
        out["_actions"] = [{"tool": t, "arguments": json.loads(a)} for t, a in
                           self.db.execute("SELECT tool, args FROM actions ORDER BY seq")]
        return out

    def close(self) -> None:
        self.db.close()


class ToolFailure(Exception):
    """A simulated tool error (status tool_error)."""


class Simulator:
    """Executes tool calls of one manifest against a SynthState."""

    def __init__(self, server: str, tools: list[dict], control_token: str | None = None):
        self.server = server
        self.tools = {t["name"]: t for t in tools}
        self.ops = infer_ops(tools, server)

    def call(self, st: SynthState, tool: str, args: dict) -> Any:
        op = self.ops[tool]
        rng = _rng_for(self.server, tool, st.seed, json.dumps(args, sort_keys=True))
        st.log(tool, args)
        plain = {k: v for k, v in args.items() if k not in PAGING}
        limit = args.get("limit") or args.get("max_results") or args.get("per_page") or args.get("page_size")
        if op.kind == "create":
            rec = st.insert(op.entity, {k: v for k, v in plain.items() if k != op.id_param}, rng)
            if op.output_schema:
                # Fields the caller did not give (e.g. a generated url) are filled once and kept.
                filled = shape(op.output_schema, rec, rng, None, op.entity)
                flat = {k: v for k, v in filled.items() if k not in rec and not isinstance(v, (dict, list))}
                if flat:
                    rec.update(flat)
                    st.put(op.entity, rec)
            return shape(op.output_schema, rec, rng, None, op.entity)
        if op.kind in ("list", "search"):
            rows = st.all(op.entity)
            for k, v in plain.items():
                if isinstance(v, (dict, list)) or v in ("", None):
                    continue
                if op.kind == "search" and isinstance(v, str):
                    q = v.lower()
                    rows = [r for r in rows if (k in r and q in str(r[k]).lower()) or
                            (k not in r and any(q in str(x).lower() for x in r.values()))]
                elif k in rows[0] if rows else False:
                    rows = [r for r in rows if str(r.get(k)) == str(v)]
            if isinstance(limit, int) and limit >= 0:
                rows = rows[:limit]
            return shape(op.output_schema, None, rng, rows, op.entity)
        rec = self._target(st, op, args, rng)
        if op.kind == "get":
            return shape(op.output_schema, rec, rng, None, op.entity)
        if op.kind == "update":
            for k, v in plain.items():
                if k != op.id_param and v is not None:
                    rec[k] = v
            st.put(op.entity, rec)
            return shape(op.output_schema, rec, rng, None, op.entity)
        if op.kind == "delete":
            st.delete(op.entity, rec["id"])
            res = {"id": rec["id"], f"{op.entity}_id": rec["id"], "deleted": True, "success": True,
                   "status": "deleted"}
            return shape(op.output_schema, res, rng, None, op.entity)
        rec["status"] = PAST.get(op.verb, op.verb + ("d" if op.verb.endswith("e") else "ed"))
        rec["last_action"] = tool
        for k, v in plain.items():
            if k != op.id_param and k not in rec:
                rec[k] = v
        st.put(op.entity, rec)
        return shape(op.output_schema, rec, rng, None, op.entity)

    def _target(self, st: SynthState, op: Op, args: dict, rng: random.Random) -> dict:
        """Returns the record a get/update/delete/action call is about (by id or natural key)."""
        if op.id_param and op.id_param in args:
            rid = str(args[op.id_param])
            rec = st.get(op.entity, rid)
            if rec is None:
                known = [r["id"] for r in st.all(op.entity)[:5]]
                raise ToolFailure(f"{op.entity} '{rid}' not found (argument '{op.id_param}'); "
                                  f"known ids start with: {', '.join(known) or 'none'}")
            return rec
        keys = {k: args[k] for k in op.key_params if k in args}
        if keys:  # natural key (e.g. get_weather(city)): same key, same record, for the episode
            for r in st.all(op.entity):
                if all(str(r.get(k)) == str(v) for k, v in keys.items()):
                    return r
            base = {}
            if op.output_schema:
                base = {k: v for k, v in shape(op.output_schema, {}, rng, None, op.entity).items()
                        if not isinstance(v, (dict, list))}
            return st.insert(op.entity, dict(base, **keys), rng)
        rows = st.all(op.entity)
        if rows:
            return rows[0]
        return st.insert(op.entity, {}, rng)


def load_manifest(path: str) -> tuple[str, list[dict]]:
    """Returns (server name, tool specs) of a manifest file."""
    with open(path) as f:
        m = json.load(f)
    tools = m["tools"] if isinstance(m, dict) else m
    name = m.get("server") if isinstance(m, dict) else None
    return name or os.path.splitext(os.path.basename(path))[0], [t for t in tools if not t["name"].startswith(HIDDEN_PREFIX)]


def _text_result(obj: Any, is_error: bool = False, structured: bool = False) -> CallToolResult:
    text = obj if isinstance(obj, str) else json.dumps(obj, indent=1)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error,
                          structured_content=obj if structured and isinstance(obj, dict) else None)


class SynthServer(MCPServer):
    """MCP server that serves a manifest through a Simulator, many episodes per process."""

    def __init__(self, server: str, tools: list[dict], control_token: str | None = None):
        super().__init__(server, instructions=f"Simulated {server} (toolverse synthesizer)", log_level="WARNING")
        self.sim = Simulator(server, tools)
        self._tools = [Tool(name=t["name"], description=t.get("description") or "",
                            input_schema=t.get("inputSchema") or {"type": "object"},
                            output_schema=t.get("outputSchema")) for t in tools]
        self.episodes = EpisodeStates(self._fresh)
        self.control = EpisodeControl(self.episodes, read=lambda st: st.dump(), drop=lambda st: st.close(),
                                      token=control_token)
        self._mem = 0

    def _fresh(self, seed: int, sandbox: str | None) -> SynthState:
        if sandbox:
            path = os.path.join(sandbox, f"{self.sim.server}.sqlite")
        else:
            path = ":memory:"
        return SynthState(path, seed, self.sim.ops, self.sim.server)

    async def _handle_list_tools(self, ctx, params) -> ListToolsResult:
        return ListToolsResult(tools=self._tools)

    def _tool_input_schema(self, name: str):
        t = self.sim.tools.get(name)
        return None if t is None else t.get("inputSchema")

    async def _handle_call_tool(self, ctx, params) -> CallToolResult:
        episode = episode_of(ctx.meta)
        args = params.arguments or {}
        name = params.name
        if self.control.handles(name):
            return self.control.call(ctx.meta, name, args)
        spec = self.sim.tools.get(name)
        if spec is None:
            return _text_result(f"Unknown tool: {name}; tools: {sorted(self.sim.tools)[:30]}", is_error=True)
        try:
            check_arguments(name, spec.get("inputSchema"), args)
            st = self.episodes.get(episode)
            out = self.sim.call(st, name, args)
        except (InvalidCall, ToolFailure) as e:
            return _text_result(str(e), is_error=True)
        except Exception as e:  # noqa: BLE001 - state errors surface as tool errors, never a crash
            if type(e).__name__ == "ToolError":
                return _text_result(str(e), is_error=True)
            return _text_result(f"simulator error in {name}: {type(e).__name__}: {e}", is_error=True)
        return _text_result(out, structured=spec.get("outputSchema") is not None)


def build_server(manifest_path: str, control_token: str | None = None) -> SynthServer:
    """Returns a SynthServer for the manifest at `manifest_path` (`control_token`: see
    builtin/base.py:EpisodeControl; None reads it from the environment)."""
    name, tools = load_manifest(manifest_path)
    return SynthServer(name, tools, control_token)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m toolverse_jax.envs.synth MANIFEST.json")
    from toolverse_jax.envs.builtin.base import run_stdio

    run_stdio(build_server(argv[0]))


if __name__ == "__main__":
    main()
