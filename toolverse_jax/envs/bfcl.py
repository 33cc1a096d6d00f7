"""BFCL multi-turn backends served as MCP servers: the `bfcl` catalog kind.

PyPI `bfcl-eval` (Apache-2.0, Berkeley Function-Calling Leaderboard) ships the multi-turn
questions, the function docs, the ground truth and the Python API classes that execute the calls
(file system, math, messages, posting, tickets, trading, travel, vehicle). Its declared
dependencies pin old numpy/networkx, so it is installed with `--no-deps`
(`python -m experiments.install_servers` does it) and only its data files and
`eval_checker/multi_turn_eval/` are imported.

One server per API class (`python -m toolverse_jax.envs.bfcl bfcl_file_system`). The server is
shared: one process holds one class instance per episode, keyed by the episode id like the
built-in servers. The episode seed names the BFCL entry (`entry_seed("multi_turn_base_17")`), and
`_tv_reset` builds the instance from that entry's `initial_config` (long_context entries load
BFCL's long-context scenario), exactly as BFCL's own executor does. Results are the strings
BFCL's executor feeds the model (dicts JSON-encoded, anything else `str()`, exceptions as
"Error during execution: ..."), so an episode through the env pool sees what BFCL's harness sees.

BFCL is an evaluation benchmark: `Catalog.default()` leaves the kind out (DUSA never trains on
it) unless asked for by name, `Catalog.default(kinds=(..., "bfcl"))`.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import importlib
import importlib.util
import json
import os
from typing import Any

BFCL_VERSION = "2026.3.23"
INSTALL_HINT = (f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath==1.3.0 "
                f"(or: python -m experiments.install_servers)")
# catalog server name -> BFCL API class
CLASSES = {
    "bfcl_file_system": "GorillaFileSystem",
    "bfcl_math": "MathAPI",
    "bfcl_message": "MessageAPI",
    "bfcl_posting": "TwitterAPI",
    "bfcl_ticket": "TicketAPI",
    "bfcl_trading": "TradingBot",
    "bfcl_travel": "TravelAPI",
    "bfcl_vehicle": "VehicleControlAPI",
}
SERVERS = {cls: server for server, cls in CLASSES.items()}
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
_SEED_STRIDE = 100_000  # seed = category index * stride + entry number
_DATA_PREFIX = "BFCL_v4_multi_turn_"
# BFCL's types -> JSON Schema (their GORILLA_TO_OPENAPI, minus "any", which we leave untyped)
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "bool": "boolean",
          "integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
          "array": "array", "object": "object"}


class BFCLNotInstalled(ImportError):
    """bfcl-eval is not importable."""


def available() -> bool:
    """Returns whether bfcl-eval is importable."""
    return importlib.util.find_spec("bfcl_eval") is not None


def require() -> None:
    """Raises BFCLNotInstalled with the install command when bfcl-eval is missing."""
    if not available():
        raise BFCLNotInstalled(f"BFCL needs the bfcl-eval package: {INSTALL_HINT}")


def data_dir() -> str:
    """Returns the folder of bfcl-eval's data files."""
    require()
    spec = importlib.util.find_spec("bfcl_eval")
    return os.path.join(os.path.dirname(spec.origin), "data")


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; categories: {CATEGORIES}")


@functools.lru_cache(maxsize=None)
def load_questions(category: str) -> tuple[dict, ...]:
    """Returns the question entries of a multi-turn category, in file order (read-only)."""
    _check_category(category)
    return tuple(_jsonl(os.path.join(data_dir(), f"{_DATA_PREFIX}{category}.json")))


@functools.lru_cache(maxsize=None)
def load_ground_truth(category: str) -> dict[str, list[list[str]]]:
    """Returns {entry id: ground truth (per turn, a list of call strings)} of a category."""
    _check_category(category)
    rows = _jsonl(os.path.join(data_dir(), "possible_answer", f"{_DATA_PREFIX}{category}.json"))
    return {r["id"]: r["ground_truth"] for r in rows}


@functools.lru_cache(maxsize=None)
def func_docs(class_name: str) -> tuple[dict, ...]:
    """Returns BFCL's function docs of an API class (name, description, parameters, response)."""
    if class_name not in SERVERS:
        raise KeyError(f"unknown BFCL class {class_name!r}; classes: {sorted(SERVERS)}")
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(_jsonl(os.path.join(data_dir(), "multi_turn_func_doc",
                                     MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])))


def category_of(entry_id: str) -> str:
    """Returns the category of an entry id like 'multi_turn_miss_func_3'."""
    head, _, num = entry_id.rpartition("_")
    cat = head.removeprefix("multi_turn_")
    if not head.startswith("multi_turn_") or cat not in CATEGORIES or not num.isdigit():
        raise ValueError(f"{entry_id!r} is not a BFCL multi-turn entry id "
                         f"(multi_turn_<category>_<n>, category in {CATEGORIES})")
    return cat


def entry_seed(entry_id: str) -> int:
    """Returns the episode seed that names BFCL entry `entry_id` for the bfcl servers."""
    cat = category_of(entry_id)
    return CATEGORIES.index(cat) * _SEED_STRIDE + int(entry_id.rpartition("_")[2])


@functools.lru_cache(maxsize=None)
def _entries_by_id(category: str) -> dict[str, dict]:
    return {e["id"]: e for e in load_questions(category)}


def entry_by_seed(seed: int) -> dict:
    """Returns the BFCL entry an episode seed names (inverse of entry_seed)."""
    ci, num = divmod(int(seed), _SEED_STRIDE)
    if not 0 <= ci < len(CATEGORIES):
        raise ValueError(f"seed {seed} names no BFCL entry: use bfcl.entry_seed(entry_id)")
    eid = f"multi_turn_{CATEGORIES[ci]}_{num}"
    entry = _entries_by_id(CATEGORIES[ci]).get(eid)
    if entry is None:
        raise ValueError(f"seed {seed} names {eid}, which is not in bfcl-eval {BFCL_VERSION}'s data")
    return entry


# ----------------------------------------------------------------------------- tool specs

def json_schema(schema: Any) -> Any:
    """Returns a BFCL parameter schema rewritten as JSON Schema (dict -> object, float -> number...)."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "type" and isinstance(v, str):
            if v == "any":
                continue
            if v not in _TYPES:
                raise ValueError(f"BFCL schema type {v!r} has no JSON Schema equivalent; add it to _TYPES")
            out[k] = _TYPES[v]
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: json_schema(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf"):
            out[k] = json_schema(v)
        else:
            out[k] = v
    return out


def tool_spec(doc: dict) -> dict:
    """Returns the MCP tool spec {name, description, inputSchema} of one BFCL function doc."""
    schema = json_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return {"name": doc["name"], "description": doc.get("description", ""), "inputSchema": schema}


def server_tools(server: str) -> list[dict]:
    """Returns the MCP tool specs of bfcl server `server` (from bfcl-eval's function docs)."""
    if server not in CLASSES:
        raise KeyError(f"unknown BFCL server {server!r}; servers: {sorted(CLASSES)}")
    return [tool_spec(d) for d in func_docs(CLASSES[server])]


def write_manifests(manifest_dir: str | None = None) -> list[str]:
    """Writes manifests/bfcl/<server>.json from the installed bfcl-eval; returns the paths."""
    from toolverse_jax.envs.catalog import MANIFEST_DIR

    root = os.path.join(manifest_dir or MANIFEST_DIR, "bfcl")
    os.makedirs(root, exist_ok=True)
    paths = []
    for server, cls in CLASSES.items():
        path = os.path.join(root, f"{server}.json")
        with open(path, "w") as f:
            json.dump({"server": server, "source": f"bfcl-eval=={BFCL_VERSION}:{cls}",
                       "tools": server_tools(server)}, f, indent=1, sort_keys=True)
            f.write("\n")
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- execution

def api_class(class_name: str) -> type:
    """Returns BFCL's API class `class_name` (imported from bfcl-eval's func_source_code)."""
    require()
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    if class_name not in SERVERS:
        raise KeyError(f"unknown BFCL class {class_name!r}; classes: {sorted(SERVERS)}")
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def new_instance(class_name: str, entry: dict | None) -> Any:
    """Returns a BFCL API instance initialized from `entry`'s initial_config, as BFCL's executor
    does (deep-copied config; long_context entries load the long-context scenario)."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    inst = api_class(class_name)()
    if class_name not in STATELESS_CLASSES:
        config = (entry or {}).get("initial_config", {}).get(class_name, {})
        long_context = bool(entry) and "long_context" in category_of(entry["id"])
        inst._load_scenario(copy.deepcopy(config), long_context=long_context)
    return inst


def result_text(result: Any) -> str:
    """Returns a call result as BFCL's executor hands it to the model."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def execute(instance: Any, name: str, arguments: dict) -> tuple[str, bool]:
    """Returns (text, is_error) of calling method `name` of a BFCL instance with `arguments`."""
    try:
        return result_text(getattr(instance, name)(**arguments)), False
    except Exception as e:  # noqa: BLE001 - BFCL reports every failure to the model as text
        return f"Error during execution: {e}", True


def to_jsonable(x: Any, _path: frozenset = frozenset()) -> Any:
    """Returns a JSON-able, deterministic view of a BFCL object (public attributes, recursively;
    a back reference such as a directory's parent becomes "<cycle>")."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return str(x)
    if id(x) in _path:
        return "<cycle>"
    path = _path | {id(x)}
    if isinstance(x, dict):
        return {str(k): to_jsonable(v, path) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v, path) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted((to_jsonable(v, path) for v in x), key=repr)
    if hasattr(x, "__dict__"):
        d = {k: to_jsonable(v, path) for k, v in vars(x).items() if not k.startswith("_")}
        return {"__class__": type(x).__name__, **d}
    return repr(x)


def instance_state(instance: Any) -> dict:
    """Returns the public attributes of a BFCL instance (what BFCL's state checker compares)."""
    return {k: to_jsonable(v) for k, v in vars(instance).items() if not k.startswith("_")}


# ----------------------------------------------------------------------------- MCP server

def build_server(server: str, control_token: str | None = None):
    """Returns the MCPServer serving BFCL API class CLASSES[server], one instance per episode
    (`control_token`: see builtin/base.py:EpisodeControl; None reads it from the environment)."""
    from mcp.types import CallToolResult, TextContent
    from mcp.server.mcpserver import MCPServer
    from mcp_types import Tool as MCPTool

    from toolverse_jax.envs.builtin import base

    if server not in CLASSES:
        raise KeyError(f"unknown BFCL server {server!r}; servers: {sorted(CLASSES)}")
    class_name = CLASSES[server]
    tools = server_tools(server)
    names = {t["name"] for t in tools}

    def fresh(seed: int, sandbox: str | None):
        return new_instance(class_name, entry_by_seed(seed))

    class BFCLServer(MCPServer):
        def __init__(self):
            super().__init__(server, instructions=f"BFCL {class_name} (bfcl-eval {BFCL_VERSION})",
                             log_level="WARNING")
            self.episodes = base.EpisodeStates(fresh)
            self.control = base.EpisodeControl(self.episodes, instance_state, token=control_token)

        async def list_tools(self):
            return [MCPTool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
                    for t in tools]

        async def _handle_call_tool(self, ctx, params):
            episode = base.episode_of(ctx.meta)
            if self.control.handles(params.name):
                return self.control.call(ctx.meta, params.name, dict(params.arguments or {}))

            def reply(text: str, is_error: bool):
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)

            if params.name not in names:
                return reply(f"Unknown tool: {params.name}; tools: {sorted(names)}", True)
            try:
                instance = self.episodes.get(episode)
            except Exception as e:  # noqa: BLE001 - unknown episode: reset first
                return reply(str(e), True)
            return reply(*execute(instance, params.name, dict(params.arguments or {})))

    return BFCLServer()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Serve one BFCL API class over stdio.")
    p.add_argument("server", nargs="?", choices=sorted(CLASSES))
    p.add_argument("--write-manifests", action="store_true", help="write manifests/bfcl/*.json and exit")
    a = p.parse_args(argv)
    if a.write_manifests:
        print("\n".join(write_manifests()))
        return
    if a.server is None:
        p.error("name a server to serve, or pass --write-manifests")
    from toolverse_jax.envs.builtin.base import run_stdio

    run_stdio(build_server(a.server))


if __name__ == "__main__":
    main()
