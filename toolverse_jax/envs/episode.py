"""What an env-pool episode is, on both sides of the wire: its spec, the live episode, one
observation, the agent-visible tool names, and the protocol constants servers share.

`EPISODE_META_KEY` names the episode in a request's `_meta` (shared servers keep many episodes'
state in one process); requests whose names start with `HIDDEN_PREFIX` reset, read and drop that
state. They are the pool's control plane, not tools: a server lists none of them and serves them
only to a caller whose `_meta[CONTROL_META_KEY]` is the secret the pool handed the server process
in `CONTROL_TOKEN_VAR` (builtin/base.py:EpisodeControl).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolverse_jax.envs.catalog import Catalog

EPISODE_META_KEY = "toolverse/episode"
HIDDEN_PREFIX = "_tv_"
CONTROL_META_KEY = "toolverse/control"
CONTROL_TOKEN_VAR = "TOOLVERSE_CONTROL_TOKEN"
STATUSES = ("ok", "tool_error", "invalid_call", "timeout", "server_crashed")


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """Which servers an episode uses and the seed of their initial state (hashable, JSON-able)."""

    servers: tuple[str, ...]
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.servers, str):
            object.__setattr__(self, "servers", (self.servers,))
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "seed", int(self.seed))

    def to_json(self) -> dict:
        return {"servers": list(self.servers), "seed": self.seed}

    @classmethod
    def from_json(cls, d: dict) -> "EpisodeSpec":
        return cls(servers=tuple(d["servers"]), seed=int(d.get("seed", 0)))


@dataclasses.dataclass(eq=False)
class Episode:
    """A live episode: id, the agent-visible tools, and the name → (server, tool) map."""

    id: str
    spec: EpisodeSpec
    tools: list[dict]
    names: dict[str, tuple[str, str]]
    worker: int = 0

    def resolve(self, name: str) -> tuple[str, str]:
        """Returns (server, tool) for an agent-facing tool name; KeyError names the valid ones.
        The message is the agent's observation, so it names no episode id: the ids are random,
        and an id in the context would make a seeded rollout differ from run to run."""
        if name in self.names:
            return self.names[name]
        hint = [n for n in self.names if n.endswith("." + name)]
        extra = f"; it is ambiguous, use one of {hint}" if hint else ""
        raise KeyError(f"no tool {name!r} in this episode{extra}; tools: {sorted(self.names)[:40]}")

    def __hash__(self):
        return hash(self.id)


@dataclasses.dataclass
class Observation:
    """Result of one tool call as the agent (content) and the verifier (structured) see it."""

    status: str
    content: str
    structured: dict | None = None
    reward_info: dict = dataclasses.field(default_factory=dict)


def episode_tools(catalog: Catalog, servers: tuple[str, ...]) -> tuple[list[dict], dict[str, tuple[str, str]]]:
    """Returns the agent-visible tool specs and name map; 'server.tool' only where names collide."""
    per = {s: catalog.list_tools(s) for s in servers}
    counts: dict[str, int] = {}
    for s in servers:
        for t in per[s]:
            counts[t["name"]] = counts.get(t["name"], 0) + 1
    tools, names = [], {}
    for s in servers:
        for t in per[s]:
            name = t["name"] if counts[t["name"]] == 1 else f"{s}.{t['name']}"
            names[name] = (s, t["name"])
            tools.append(dict(t, name=name))
    return tools, names
