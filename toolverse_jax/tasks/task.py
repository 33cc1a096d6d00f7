"""GUST task records: gold stages, answer, verifier, and answer checking."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

from toolverse_jax.envs import EpisodeSpec
from toolverse_jax.tasks import schema as sch


def episode_spec(servers, seed) -> EpisodeSpec:
    """Returns `envs.EpisodeSpec(servers, seed)` with servers as a tuple and seed as an int."""
    return EpisodeSpec(servers=tuple(servers), seed=int(seed))


@dataclasses.dataclass
class GoldStep:
    """One gold tool call: `name` is the agent-facing tool name.

    `sources` says where each argument came from (the task format's provenance, kept in every
    shard line): {"param": {"from": "step", "stage": i, "index": j, "field": path[, "pick":
    {"field": k, "value": v} | {"position": n}]} | {"from": "state"} | {"from": "literal"}}.
    "step": taken from the output of gold call (i, j) at `field` (`notes[].note_id`); `pick`
    says which list element (the one whose k is v, or the n-th); "state": a value seeded in the
    environment that the user states; "literal": a value the user supplies (text to write).

    `after` ([[stage, index], ...], whole-chain tasks only, omitted when empty): gold calls this
    one depends on through the state rather than its arguments (checkout empties the cart that
    add_to_cart filled).
    """
    server: str
    tool: str
    name: str
    arguments: dict
    observation: Any
    sources: dict = dataclasses.field(default_factory=dict)
    after: list = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if not d["after"]:
            del d["after"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "GoldStep":
        return cls(d["server"], d["tool"], d["name"], d["arguments"], d.get("observation"),
                   d.get("sources") or {}, [list(x) for x in d.get("after") or ()])


def normalize_text(x: Any) -> str:
    """Returns a string value normalized for comparison (strip, case-fold, outer quotes/period)."""
    s = str(x).strip().casefold()
    s = s.strip("\"'`").strip()
    s = s.rstrip(".").strip()
    return re.sub(r"\s+", " ", s)


def _as_number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    s = normalize_text(x).replace(",", "").replace("$", "").replace("€", "").replace("£", "")
    try:
        return float(s)
    except ValueError:
        return None


def values_equal(expected: Any, got: Any, rel_tol: float = 1e-4, abs_tol: float = 1e-6) -> bool:
    """Returns whether `got` equals `expected` after normalization (numbers with tolerance)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return normalize_text(expected) == normalize_text(got)
    e, g = _as_number(expected), _as_number(got)
    if e is not None and isinstance(expected, (int, float)):
        return g is not None and math.isclose(e, g, rel_tol=rel_tol, abs_tol=abs_tol)
    if e is not None and g is not None:
        return math.isclose(e, g, rel_tol=rel_tol, abs_tol=abs_tol)
    return normalize_text(expected) == normalize_text(got)


def _split_answer(text: str) -> list[str]:
    text = text.strip()
    try:
        v = json.loads(text)
        if isinstance(v, list):
            return [str(x) for x in v]
    except ValueError:
        pass
    text = text.strip("[]")
    parts = re.split(r"\s*(?:,|;|\n|\band\b)\s*", text)
    return [p for p in (p.strip().lstrip("-*").strip() for p in parts) if p]


def record_matches(record: dict, match: dict) -> bool:
    """Returns whether a JSON object contains every `match` item (normalized values)."""
    return all(k in record and not isinstance(record[k], (dict, list))
               and values_equal(v, record[k]) for k, v in match.items())


def _item_in(item: Any, items: Any) -> bool:
    if not isinstance(items, list):
        return False
    if isinstance(item, dict):
        return any(isinstance(x, dict) and record_matches(x, item) for x in items)
    return any(not isinstance(x, (dict, list)) and values_equal(item, x) for x in items)


def check_state(verifier: dict, final_state: dict | None) -> bool:
    """Returns whether a state check holds: some object under `final_state[server]` matches
    (`exists=True`) or none does (`exists=False`).

    A check may also name list items the matching object must hold: `"contains": {"tags":
    ["urgent"], "comments": [{"text": "..."}]}` (order-free; dict items match like `match`).
    """
    if final_state is None or verifier["server"] not in final_state:
        return False
    contains = verifier.get("contains") or {}
    found = any(record_matches(r, verifier["match"]) and
                all(_item_in(x, r.get(k)) for k, xs in contains.items() for x in xs)
                for _, r in sch.iter_records(final_state[verifier["server"]]))
    return found == verifier.get("exists", True)


@dataclasses.dataclass
class Task:
    """A GUST task (see docs/INTERFACES.md)."""
    id: str
    instruction: str
    spec: Any  # envs.EpisodeSpec
    stages: list[list[GoldStep]]
    answer: Any
    verifier: dict
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def stats(self) -> dict:
        return {
            "horizon": len(self.stages),
            "depth": chain_depth(self.stages),
            "num_tools": len({(s.server, s.tool) for st in self.stages for s in st}),
            "num_servers": len({s.server for st in self.stages for s in st}),
            "num_calls": sum(len(st) for st in self.stages),
        }

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self.spec.servers)

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(sorted({f"{s.server}.{s.tool}" for st in self.stages for s in st}))

    @property
    def needs_state(self) -> bool:
        """Whether `check` needs the final environment state: state verifiers, and exact/set
        verifiers that also carry state `checks` (a chain with effects and an asked value)."""
        return self.verifier["kind"] == "state" or bool(self.verifier.get("checks"))

    def check(self, answer_text: str | None, final_state: dict | None = None) -> bool:
        """Returns whether an agent's final answer / final environment state solves the task.

        An exact/set verifier with `checks` needs both: the answer and every state check."""
        v = self.verifier
        kind = v["kind"]
        if kind == "state":
            return all(check_state(c, final_state) for c in v["checks"])
        if v.get("checks") and not all(check_state(c, final_state) for c in v["checks"]):
            return False
        if answer_text is None:
            return False
        if kind == "exact":  # any alias counts (search / BrowseComp-style answers)
            return any(values_equal(a, answer_text)
                       for a in [v["value"], *self.meta.get("aliases", ())])
        if kind == "set":
            got = _split_answer(str(answer_text))
            exp = [normalize_text(x) for x in v["values"]]
            return sorted(set(normalize_text(x) for x in got)) == sorted(set(exp))
        raise ValueError(f"unknown verifier kind {kind!r}; expected exact, set or state")

    def chain_hash(self) -> str:
        """Returns a hash of the servers and the gold chain (tools and arguments per stage)."""
        chain = [[(s.server, s.tool, s.arguments) for s in st] for st in self.stages]
        return hashlib.sha256(sch.canonical([list(self.servers), chain]).encode()).hexdigest()

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "instruction": self.instruction,
            "spec": {"servers": list(self.spec.servers), "seed": int(self.spec.seed)},
            "stages": [[s.to_json() for s in st] for st in self.stages],
            "answer": self.answer,
            "verifier": self.verifier,
            "stats": self.stats,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        return cls(
            id=d["id"],
            instruction=d["instruction"],
            spec=episode_spec(d["spec"]["servers"], d["spec"]["seed"]),
            stages=[[GoldStep.from_json(s) for s in st] for st in d["stages"]],
            answer=d.get("answer"),
            verifier=d["verifier"],
            meta=d.get("meta") or {},
        )


def chain_depth(stages: list[list[GoldStep]]) -> int:
    """Returns the longest chain of value flow (in steps) through the gold stages."""
    depth: dict[tuple[int, int], int] = {}
    for i, st in enumerate(stages):
        for j, s in enumerate(st):
            ups = [depth.get((src["stage"], src["index"]), 0) for src in s.sources.values()
                   if isinstance(src, dict) and src.get("from") == "step"]
            depth[(i, j)] = 1 + max(ups, default=0)
    return max(depth.values(), default=0)
