"""A tiny in-process fake environment (contacts, mail, shop, bank) for the tasks tests.

Tool specs are MCP-shaped (inputSchema/outputSchema); state is seeded and per episode.
"""

from __future__ import annotations

import copy
import os
import random

import jsonschema

from toolverse_jax.tasks.executor import CallResult

_S = {"type": "string"}
_N = {"type": "number"}
_I = {"type": "integer"}


def _obj(props, req=None):
    return {"type": "object", "properties": props, "required": list(req or props)}


def _list_of(item):
    return _obj({"result": {"type": "array", "items": item}})


CONTACT = _obj({"id": _S, "name": _S, "email": _S, "phone": _S})
EMAIL = _obj({"id": _S, "to": _S, "subject": _S, "status": _S})
PRODUCT = _obj({"id": _S, "name": _S, "price": _N, "stock": _I})
ORDER = _obj({"id": _S, "product_id": _S, "quantity": _I, "total": _N, "status": _S})
ACCOUNT = _obj({"id": _S, "owner": _S, "balance": _N})


def _tool(name, desc, inputs, req, out):
    return {"name": name, "description": desc, "inputSchema": _obj(inputs, req),
            "outputSchema": out}


SPECS = {
    "contacts": [
        _tool("list_contacts", "List all contacts.", {}, [], _list_of(CONTACT)),
        _tool("search_contacts", "Search contacts by name.", {"query": _S}, ["query"],
              _list_of(CONTACT)),
        _tool("get_contact", "Get a contact.", {"contact_id": _S}, ["contact_id"], CONTACT),
    ],
    "mail": [
        _tool("send_email", "Send an email.", {"to": {"type": "string", "format": "email"},
                                                "subject": _S, "body": _S},
              ["to", "subject", "body"], EMAIL),
        _tool("list_emails", "List sent emails.", {}, [], _list_of(EMAIL)),
        _tool("get_email", "Get an email.", {"email_id": _S}, ["email_id"], EMAIL),
    ],
    "shop": [
        _tool("list_products", "List products.", {}, [], _list_of(PRODUCT)),
        _tool("get_product", "Get a product.", {"product_id": _S}, ["product_id"], PRODUCT),
        _tool("create_order", "Order a product.",
              {"product_id": _S, "quantity": {"type": "integer", "minimum": 1, "maximum": 3}},
              ["product_id", "quantity"], ORDER),
        _tool("get_order", "Get an order.", {"order_id": _S}, ["order_id"], ORDER),
        _tool("cancel_order", "Cancel an order.", {"order_id": _S}, ["order_id"], ORDER),
    ],
    "bank": [
        _tool("list_accounts", "List accounts.", {}, [], _list_of(ACCOUNT)),
        _tool("get_balance", "Balance of an account.", {"account_id": _S}, ["account_id"],
              _obj({"account_id": _S, "balance": _N})),
        _tool("login", "Log in.", {"username": _S, "password": _S}, ["username", "password"],
              _obj({"ok": {"type": "boolean"}, "user": _S})),
        _tool("transfer", "Transfer money.", {"from_account_id": _S, "to_account_id": _S,
                                              "amount": {"type": "number", "minimum": 1,
                                                         "maximum": 50}},
              ["from_account_id", "to_account_id", "amount"],
              _obj({"id": _S, "from_account_id": _S, "to_account_id": _S, "amount": _N,
                    "status": _S})),
    ],
}

NAMES = ["Alice Chen", "Bob Diaz", "Carla Gomez", "Dan Evans", "Eve Fox", "Farid Haddad"]


def seeded_state(server, seed):
    rng = random.Random(f"{server}:{seed}")
    if server == "contacts":
        names = rng.sample(NAMES, 4)
        return {"contacts": [{"id": f"c{i}", "name": n, "email": n.split()[0].lower() +
                              "@example.com", "phone": f"555-01{i:02d}"}
                             for i, n in enumerate(names)]}
    if server == "mail":
        return {"emails": [], "next_id": 1}
    if server == "shop":
        return {"products": [{"id": f"p{i}", "name": n, "price": float(rng.randint(2, 40)),
                              "stock": rng.randint(1, 9)}
                             for i, n in enumerate(rng.sample(["lamp", "desk", "mug", "pen",
                                                               "chair"], 3))],
                "orders": [], "next_id": 1}
    if server == "bank":
        return {"accounts": [{"id": f"a{i}", "owner": o, "balance": float(rng.randint(50, 500))}
                             for i, o in enumerate(["alice", "bob", "carla"])],
                "users": [{"username": "alice", "password": "pw-alice"}],
                "session": {"user": None}, "transfers": [], "next_id": 1}
    raise KeyError(server)


class ToolError(Exception):
    pass


def _find(items, key, value, what):
    for it in items:
        if it[key] == value:
            return it
    raise ToolError(f"no {what} {value!r}")


def call(server, tool, args, st):
    """Executes one fake tool call on state `st` (mutated); returns a JSON result."""
    if server == "contacts":
        cs = st["contacts"]
        if tool == "list_contacts":
            return {"result": cs}
        if tool == "search_contacts":
            return {"result": [c for c in cs if args["query"].lower() in c["name"].lower()]}
        if tool == "get_contact":
            return _find(cs, "id", args["contact_id"], "contact")
    if server == "mail":
        if tool == "send_email":
            if "@" not in args["to"]:
                raise ToolError("bad address")
            m = {"id": f"m{st['next_id']}", "to": args["to"], "subject": args["subject"],
                 "body": args["body"], "status": "sent"}
            st["next_id"] += 1
            st["emails"].append(m)
            return {k: m[k] for k in ("id", "to", "subject", "status")}
        if tool == "list_emails":
            return {"result": [{k: m[k] for k in ("id", "to", "subject", "status")}
                               for m in st["emails"]]}
        if tool == "get_email":
            m = _find(st["emails"], "id", args["email_id"], "email")
            return {k: m[k] for k in ("id", "to", "subject", "status")}
    if server == "shop":
        if tool == "list_products":
            return {"result": st["products"]}
        if tool == "get_product":
            return _find(st["products"], "id", args["product_id"], "product")
        if tool == "create_order":
            p = _find(st["products"], "id", args["product_id"], "product")
            if p["stock"] < args["quantity"]:
                raise ToolError("out of stock")
            p["stock"] -= args["quantity"]
            o = {"id": f"o{st['next_id']}", "product_id": p["id"], "quantity": args["quantity"],
                 "total": round(p["price"] * args["quantity"], 2), "status": "placed"}
            st["next_id"] += 1
            st["orders"].append(o)
            return dict(o)
        if tool == "get_order":
            return dict(_find(st["orders"], "id", args["order_id"], "order"))
        if tool == "cancel_order":
            o = _find(st["orders"], "id", args["order_id"], "order")
            if o["status"] == "cancelled":
                raise ToolError("already cancelled")
            o["status"] = "cancelled"
            return dict(o)
    if server == "bank":
        if tool == "list_accounts":
            return {"result": st["accounts"]}
        if tool == "get_balance":
            a = _find(st["accounts"], "id", args["account_id"], "account")
            return {"account_id": a["id"], "balance": a["balance"]}
        if tool == "login":
            u = _find(st["users"], "username", args["username"], "user")
            if u["password"] != args["password"]:
                raise ToolError("wrong password")
            st["session"]["user"] = u["username"]
            return {"ok": True, "user": u["username"]}
        if tool == "transfer":
            if not st["session"]["user"]:
                raise ToolError("log in first")
            a = _find(st["accounts"], "id", args["from_account_id"], "account")
            b = _find(st["accounts"], "id", args["to_account_id"], "account")
            if a is b or a["balance"] < args["amount"]:
                raise ToolError("invalid transfer")
            a["balance"] = round(a["balance"] - args["amount"], 2)
            b["balance"] = round(b["balance"] + args["amount"], 2)
            t = {"id": f"t{st['next_id']}", "from_account_id": a["id"], "to_account_id": b["id"],
                 "amount": args["amount"], "status": "completed"}
            st["next_id"] += 1
            st["transfers"].append(t)
            return dict(t)
    raise KeyError(f"{server}.{tool}")


_VALIDATORS = {}


class FakeExecutor:
    """`tasks.Executor` over the fake servers (handles are episode dicts)."""

    def __init__(self, servers=tuple(SPECS)):
        self.servers = tuple(servers)
        self.calls = 0
        self._next = 0

    def server_names(self):
        return sorted(self.servers)

    def tool_specs(self, servers=None):
        return [(s, t) for s in sorted(servers or self.servers) for t in SPECS[s]]

    def reset(self, specs):
        out = []
        for spec in specs:
            self._next += 1
            out.append({"id": self._next, "spec": spec,
                        "state": {s: seeded_state(s, spec.seed) for s in spec.servers}})
        return out

    def agent_name(self, handle, server, tool):
        return tool

    def step(self, calls):
        out = []
        for ep, server, tool, args in calls:
            self.calls += 1
            spec = next(t for t in SPECS[server] if t["name"] == tool)
            if not _VALIDATORS.setdefault(tool, jsonschema.Draft202012Validator(
                    spec["inputSchema"])).is_valid(args):
                out.append(CallResult("invalid_call", None, f"bad arguments for {tool}"))
                continue
            try:
                out.append(CallResult("ok", copy.deepcopy(call(server, tool, args,
                                                               ep["state"][server]))))
            except ToolError as e:
                out.append(CallResult("tool_error", None, str(e)))
        return out

    def read_state(self, handle):
        return copy.deepcopy(handle["state"])

    def close(self, handles):
        pass


def make_fake_executor():
    """Factory used by generation workers in tests (importable by spawned processes)."""
    return FakeExecutor()


class DyingExecutor(FakeExecutor):
    """A FakeExecutor whose process exits at its first `step` while the file named by
    TOOLVERSE_TEST_DIE_ONCE does not exist yet (it creates it first): one crash per test."""

    def step(self, calls):
        marker = os.environ.get("TOOLVERSE_TEST_DIE_ONCE", "")
        if marker and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return super().step(calls)


def make_dying_executor():
    return DyingExecutor()
