"""Dynamic Unlocking Sampling (DUSA, DESIGN §4) with grounding in a live environment.

`dusa_stages` is the published stage loop over a sampled subgraph, verbatim:

    D[v] <- in-degree of v;  Q <- {v : D[v] = 0};  stages <- []
    while Q and len(stages) < H:
        S <- sample(Q, min(|Q|, N))       # weighted: prefer just-unlocked tools, decay reuse
        stages.append(S); Q <- Q - S
        for u in S: for v in succ(u): D[v] -= 1; if D[v] = 0: Q.add(v)

The sampled subgraph is a DAG of tool *instances* (a tool may appear more than once, each use
decayed), grown so that each new instance is fed by existing ones, preferring the newest
producer so chains get deep. `task_program` runs the same loop stage by stage in a live
episode: arguments are filled from upstream outputs (following the edge labels) or from the
seeded state, each stage is executed as one batch, failing steps are dropped (their
successors re-check their inputs), and the answer/verifier come from the last stage.

With `DusaConfig.whole_chain` (issue 24; `closed_task_program`) every gold call is needed by
the verifier: ids are discovered by gold calls (list/search/get), never stated; a value taken
from a list is named by a descriptor unique in the state (the note titled "Q2 goals"); calls
that collide roles, address the user, change nothing or re-find their input's record are left
out; the verifier checks the final state of every record the chain created, changed or
removed (plus the asked value); the loop runs until the verifier's dependency closure
(`closure.py`) spans H stages and the chain is trimmed to it. Instructions are rendered at
`instruction_level` (recipe | stage | goal, `instructions.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, Sequence

import networkx as nx

from toolverse_jax.tasks import closure as cl
from toolverse_jax.tasks import graph as tg
from toolverse_jax.tasks import instructions as ins
from toolverse_jax.tasks import schema as sch
from toolverse_jax.tasks.executor import Close, Executor, Reset, State, Step, run_programs
from toolverse_jax.tasks.task import GoldStep, Task, check_state, episode_spec


@dataclasses.dataclass
class DusaConfig:
    """Knobs of DUSA generation (defaults follow DESIGN §4)."""
    horizon: int = 5                      # H: number of stages (assistant turns)
    min_horizon: int | None = None        # keep tasks with at least this many stages (None: H)
    max_per_stage: int = 2                # N: tools per stage
    servers: tuple[str, ...] | None = None  # allowed servers (None: all the executor has)
    num_servers: tuple[int, int] = (1, 2)   # min, max servers per task
    stages_per_server: int | None = 8     # at least ceil(H / this) servers (None: off)
    unlock_bonus: float = 4.0             # weight of tools unlocked by the previous stage
    reuse_decay: float = 0.35             # weight factor per earlier use of the same tool
    newest_bias: float = 0.85             # prob. of taking an argument from the newest producer
    chain_bonus: float = 3.0              # subgraph growth: weight per input fed by the subgraph
    max_tool_reuse: int = 3               # instances of one tool in a subgraph
    subgraph_slack: float = 1.5           # subgraph size = slack * H * (N + 1) / 2 (+ on demand)
    update_optional: bool = True          # updates also set one optional field (stated)
    answer_kinds: tuple[str, ...] = ("exact", "set", "state")
    max_set_size: int = 8
    episode_seed_mod: int = 2**31 - 1
    rewriter: Callable[[str], str] | None = None   # optional LLM paraphraser (off by default)
    # Issue 24. whole_chain: every gold call lies on the verifier's dependency closure (ids are
    # discovered by gold calls, one check per effect, the chain trimmed to the closure, no
    # collisions / no-op calls); False is the generator the shipped quickstart sets came from.
    whole_chain: bool = False
    instruction_level: str = "recipe"     # recipe | stage | goal (instructions.LEVELS)
    answer_with_checks: bool = True       # an asked value also checks the chain's effects
    max_rounds_factor: float = 3.0        # whole_chain: stage rounds <= factor * H + 4


# ----------------------------------------------------------------------------- pure DUSA loop


class Frontier:
    """In-degree counters D and the unlocked set Q of DUSA over an instance DAG."""

    def __init__(self, dag: nx.DiGraph):
        self.dag = dag
        self.done: set = set()
        self.D = {v: dag.in_degree(v) for v in dag}
        self.Q = [v for v in dag if self.D[v] == 0]
        self.unlocked_at = {v: 0 for v in self.Q}

    def add_nodes(self, nodes: Iterable, stage: int) -> None:
        """Registers instances added to the DAG after construction (in-degree over not-done)."""
        for v in nodes:
            self.D[v] = sum(1 for u in self.dag.predecessors(v) if u not in self.done)
            if self.D[v] == 0:
                self.Q.append(v)
                self.unlocked_at[v] = stage

    def sample(self, n: int, rng: random.Random, weight: Callable[[Any], float]) -> list:
        """Returns min(|Q|, n) instances of Q drawn without replacement by `weight`."""
        pool = list(self.Q)
        out = []
        for _ in range(min(len(pool), n)):
            ws = [max(weight(v), 1e-9) for v in pool]
            v = rng.choices(pool, weights=ws)[0]
            pool.remove(v)
            out.append(v)
        return out

    def complete(self, S: Sequence, stage: int) -> None:
        """Q <- Q - S; for u in S: for v in succ(u): D[v] -= 1; unlock v when D[v] = 0."""
        for u in S:
            self.Q.remove(u)
            self.done.add(u)
        for u in S:
            for v in self.dag.successors(u):
                self.D[v] -= 1
                if self.D[v] == 0:
                    self.Q.append(v)
                    self.unlocked_at[v] = stage + 1


def dusa_stages(dag: nx.DiGraph, horizon: int, max_per_stage: int, rng: random.Random,
                unlock_bonus: float = 4.0, reuse_decay: float = 0.35) -> list[list]:
    """Returns DUSA stages over a DAG (no execution): the pseudocode of DESIGN §4."""
    fr = Frontier(dag)
    stages: list[list] = []
    uses: Counter = Counter()

    def weight(v):
        t = dag.nodes[v].get("tool", v)
        w = unlock_bonus if fr.unlocked_at.get(v) == len(stages) and stages else 1.0
        return w * reuse_decay ** uses[t]

    while fr.Q and len(stages) < horizon:
        S = fr.sample(max_per_stage, rng, weight)
        stages.append(S)
        for v in S:
            uses[dag.nodes[v].get("tool", v)] += 1
        fr.complete(S, len(stages) - 1)
    return stages


# -------------------------------------------------------------------------- subgraph sampling


@dataclasses.dataclass
class ToolIndex:
    """Per-task lookup tables over a (server-restricted) tool graph."""
    graph: nx.MultiDiGraph
    tools: list[str]
    required: dict[str, list[dict]]
    producers: dict[str, dict[str, list[tuple[str, str]]]]  # tool -> param -> [(tool, field)]
    order_preds: dict[str, list[str]]

    @classmethod
    def build(cls, g: nx.MultiDiGraph) -> "ToolIndex":
        tools = sorted(g.nodes)
        prods: dict[str, dict] = {t: defaultdict(list) for t in tools}
        order: dict[str, list] = {t: [] for t in tools}
        for u, v, d in g.edges(data=True):
            if d["kind"] == "value":
                prods[v][d["param"]].append((u, d["field"]))
            else:
                order[v].append(u)
        for t in tools:
            for lst in prods[t].values():
                lst.sort()
            order[t].sort()
        req = {t: [p for p in g.nodes[t]["params"] if p["required"]] for t in tools}
        return cls(g, tools, req, {t: dict(p) for t, p in prods.items()}, order)


def _feedable(ix: ToolIndex, t: str, depth: int) -> bool:
    """Returns whether every required id input of t can come from a producer (depth <= 3)."""
    for p in ix.required[t]:
        if not p["key"].startswith("id:"):
            continue
        tools_p = {u for u, _ in ix.producers[t].get(p["name"], ())} - {t}
        if depth >= 3 or not any(_feedable(ix, u, depth + 1) for u in sorted(tools_p)):
            return False
    return True


def grow_subgraph(ix: ToolIndex, dag: nx.DiGraph, n_new: int, rng: random.Random,
                  cfg: DusaConfig, attach_to: set | None = None,
                  penalty: dict[str, float] | None = None) -> list:
    """Adds up to `n_new` tool instances to `dag`; returns the new instance ids.

    Each candidate tool is weighted by how many of its inputs existing instances can feed
    (`chain_bonus`), decayed by its earlier uses (`reuse_decay`); an instance is linked to the
    newest feeding instance with prob. `newest_bias`. Must-follow predecessors (login) are
    added first when missing. `attach_to` restricts producers to those instances (used when
    growing on demand after some instances already ran).
    """
    uses = Counter(dag.nodes[v]["tool"] for v in dag)
    order = {v: i for i, v in enumerate(dag)}
    inst: dict[str, list] = defaultdict(list)
    for v in dag:
        if attach_to is None or v in attach_to:
            inst[dag.nodes[v]["tool"]].append(v)
    new: list = []

    def add(t, depth=0):
        if cfg.whole_chain:
            # ids are discovered by a gold call: a list/search (or a fed get) comes first
            for p in ix.required[t]:
                tools_p = sorted({u for u, _ in ix.producers[t].get(p["name"], ())} - {t})
                if not p["key"].startswith("id:") or depth >= 3 or \
                        any(inst.get(u) for u in tools_p):
                    continue
                ok = [u for u in tools_p if _feedable(ix, u, depth + 1)]
                if ok:
                    ws = [(3.0 if ix.graph.nodes[u]["kind"] in ("list", "search") else 1.0)
                          * cfg.reuse_decay ** uses[u] for u in ok]
                    add(rng.choices(ok, weights=ws)[0], depth + 1)
        vid = (t, uses[t])
        uses[t] += 1
        dag.add_node(vid, tool=t)
        order[vid] = len(order)
        for u in ix.order_preds[t]:
            ups = inst.get(u) or [add(u)]
            dag.add_edge(ups[-1], vid, kind="order")
        for p, prods in sorted(ix.producers[t].items()):
            cands = sorted({v for u, _ in prods for v in inst.get(u, ())}, key=order.get)
            if not cands:
                continue
            pick = cands[-1] if rng.random() < cfg.newest_bias else rng.choice(cands)
            dag.add_edge(pick, vid, kind="value")
        new.append(vid)
        inst[t].append(vid)
        return vid

    feedable = {t: _feedable(ix, t, 0) for t in ix.tools} if cfg.whole_chain else {}
    for _ in range(n_new):
        cands, ws = [], []
        for t in ix.tools:
            # a tool without inputs would only repeat the same call
            if uses[t] >= (cfg.max_tool_reuse if ix.required[t] else 1):
                continue
            if cfg.whole_chain and not feedable[t]:
                continue
            prods = ix.producers[t]
            fed = sum(1 for p in ix.required[t]
                      if any(inst.get(u) for u, _ in prods.get(p["name"], ())))
            cands.append(t)
            ws.append((1.0 + cfg.chain_bonus * fed) * cfg.reuse_decay ** uses[t]
                      * (penalty.get(t, 1.0) if penalty else 1.0))
        if not cands:
            break
        add(rng.choices(cands, weights=ws)[0])
    return new


# --------------------------------------------------------------------------------- grounding


class StateIndex:
    """Seeded values of an environment state, by semantic key (`email`, `id:order`, ...)."""

    def __init__(self, state: dict, servers: Iterable[str]):
        self.by_key: dict[str, list] = defaultdict(list)
        seen = set()
        for server in sorted(servers):
            for path, rec in sch.iter_records(state.get(server)):
                seg = [s for s in path.replace("[]", "").split(".") if s]
                ctx = sch.singular(sch.split_words(seg[-1])[-1]) if seg and \
                    sch.split_words(seg[-1]) else server
                for k, v in rec.items():
                    if v is None or isinstance(v, (dict, list)) or isinstance(v, str) and \
                            (not v or len(v) > 60):
                        continue
                    key = sch.semantic_key(k, ctx)
                    if (key, sch.canonical(v)) in seen:
                        continue
                    seen.add((key, sch.canonical(v)))
                    self.by_key[key].append(v)

    def values(self, key: str) -> list:
        return self.by_key.get(key, [])


_WORDS = ["quarterly", "update", "project", "budget", "meeting", "travel", "invoice", "review",
          "launch", "summary", "follow-up", "planning", "team", "client", "report", "design"]


def literal_value(p: dict, rng: random.Random) -> Any:
    """Returns an invented value for a parameter the user can state (enum, number, free text),
    or None when the value must exist in the environment (ids, emails, ...)."""
    s, t, key = p["schema"], p["type"], p["key"]
    enum = next((a["enum"] for a in sch.alternatives(s) if "enum" in a), None)
    if enum:
        return rng.choice(enum)
    if t == "boolean":
        return rng.random() < 0.5
    if t in ("integer", "number"):
        lo = s.get("minimum", s.get("exclusiveMinimum", 0) + (1 if t == "integer" else 0.01))
        hi = s.get("maximum", max(lo + (3 if key == "quantity" or t == "integer" else 90), lo))
        if t == "integer":
            return rng.randint(int(max(lo, 1)), int(max(min(hi, 5), max(lo, 1))))
        return round(rng.uniform(max(lo, 1.0), max(min(hi, 100.0), max(lo, 1.0))), 2)
    if t == "string":
        words = set(sch.split_words(p["name"]))
        if key == "date":
            return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if key == "datetime":
            day = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            return f"{day}T{rng.randint(8, 17):02d}:00:00"
        if words & sch.FREE_TEXT and not key.startswith("id:") and key != "email":
            a, b = rng.sample(_WORDS, 2)
            text = f"{a.capitalize()} {b} {rng.randint(1, 99)}"
            return text if words & {"subject", "title", "name", "label", "tag"} else \
                f"Please see the {a} {b} notes, item {rng.randint(1, 99)}."
    return None


_DESCRIPTORS = ("name", "title", "subject", "sender", "email", "city", "date", "start_time",
                "flight_number", "status", "priority")


def list_pick(value: Any, path: str, chosen: Any,
              unique: Callable[[dict, str], bool] | None = None,
              single: bool = False) -> dict | None:
    """Returns how to tell which list element a value was taken from, or None if no list.

    {"field": k, "value": v}: the element whose k is v (unique in the list and, with `unique`,
    where `unique(element, k)` holds), else {"position": i} (0-based). Only for `prefix[].leaf`
    paths (with `single`, a one-element list too); the instruction states it.
    """
    if "[]" not in path or path.startswith("**"):
        return None
    prefix, _, leaf = path.rpartition("[].")
    if "[]" in prefix or not leaf or "." in leaf:
        return None
    items = value
    for part in [x for x in prefix.split(".") if x]:
        items = items.get(part) if isinstance(items, dict) else None
    if not isinstance(items, list):
        return None
    items = [it for it in items if isinstance(it, dict)]
    if len(items) < (1 if single else 2):
        return None
    pos = next((i for i, it in enumerate(items) if it.get(leaf) == chosen), None)
    if pos is None:
        return None
    for k in _DESCRIPTORS:
        v = items[pos].get(k)
        if k != leaf and isinstance(v, (str, int, float)) and not isinstance(v, bool) and \
                sum(1 for it in items if it.get(k) == v) == 1 and len(str(v)) <= 60 and \
                (unique is None or unique(items[pos], k)):
            return {"field": k, "value": v}
    return {"position": pos}


def _wrap(p: dict, v: Any) -> Any:
    return [v] if p.get("array") else v


@dataclasses.dataclass
class _Done:
    stage: int
    index: int
    node: str
    step: GoldStep


def _ground(ix: ToolIndex, t: str, done: list[_Done], index: StateIndex,
            rng: random.Random, cfg: DusaConfig) -> tuple[dict, dict] | None:
    """Returns (arguments, sources) for tool t, or None when a required input cannot be filled."""
    prods = ix.producers[t]
    args, sources = {}, {}
    for p in ix.required[t]:
        filled = False
        cands = [d for d in reversed(done) for u, f in prods.get(p["name"], []) if d.node == u
                 for _ in [0]]
        # newest producer first with prob newest_bias, else shuffled
        if cands and rng.random() >= cfg.newest_bias:
            cands = cands[:]
            rng.shuffle(cands)
        for d in cands:
            for u, f in prods[p["name"]]:
                if u != d.node:
                    continue
                vals = [v for v in tg.field_values(d.step.observation, f)
                        if sch.validates(v, p["schema"])]
                if vals:
                    val = rng.choice(vals[:20])
                    args[p["name"]] = _wrap(p, val)
                    sources[p["name"]] = {"from": "step", "stage": d.stage, "index": d.index,
                                          "field": f}
                    pick = list_pick(d.step.observation, f, val)
                    if pick:
                        sources[p["name"]]["pick"] = pick
                    filled = True
                    break
            if filled:
                break
        if filled:
            continue
        got = _unfed_value(p, index, rng)
        if got is None:
            return None
        args[p["name"]], sources[p["name"]] = got
    if sch.tool_kind(t) == "update" and cfg.update_optional:
        _optional_update(ix, t, rng, args, sources)
    return args, sources


def _unfed_value(p: dict, index: StateIndex, rng: random.Random,
                 ok: Callable[[Any], bool] | None = None) -> tuple[Any, dict] | None:
    """Returns (value, source) for an input no upstream output feeds: invented free text, a
    seeded value the user states, or another invented literal; None if none (passes `ok`)."""
    free = bool(set(sch.split_words(p["name"])) & sch.FREE_TEXT) and \
        not p["key"].startswith(("id:", "name:"))
    lit = literal_value(p, rng) if free else None
    if lit is not None and sch.validates(lit, p["schema"]) and (ok is None or ok(lit)):
        # free text (subject, body) is the user's to state: short and invented
        return _wrap(p, lit), {"from": "literal"}
    vals = [v for v in index.values(p["key"])[:200] if sch.validates(v, p["schema"])
            and (ok is None or ok(v))]
    if vals:
        return _wrap(p, rng.choice(vals)), {"from": "state"}
    lit = literal_value(p, rng)
    if lit is not None and sch.validates(lit, p["schema"]) and (ok is None or ok(lit)):
        return _wrap(p, lit), {"from": "literal"}
    return None


def _optional_update(ix: ToolIndex, t: str, rng: random.Random, args: dict,
                     sources: dict) -> None:
    """Sets one stated optional field of an update (an update that sets nothing changes
    nothing)."""
    opts = [p for p in ix.graph.nodes[t]["params"] if not p["required"]
            and p["type"] in ("string", "integer", "number", "boolean")
            and not p["key"].startswith(("id:", "name:")) and p["key"] != "email"]
    if opts:
        p = rng.choice(opts)
        lit = literal_value(p, rng)
        if lit is None and p["type"] == "string":
            lit = f"{rng.choice(_WORDS).capitalize()} {rng.randint(1, 99)}"
        if lit is not None and sch.validates(lit, p["schema"]):
            args[p["name"]] = _wrap(p, lit)
            sources[p["name"]] = {"from": "literal"}


# ------------------------------------------------------------------------- answer / verifier


_GOOD_FIELDS = {"amount", "total", "balance", "price", "status", "name", "title", "count",
                "email", "city", "date", "subject", "phone", "quantity", "datetime", "cost"}


def _unwrap(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"result"}:
        return v["result"], "result"
    return v, ""


def _join(prefix: str, path: str) -> str:
    if path.startswith("[]"):
        return prefix + path
    return f"{prefix}.{path}" if prefix and path else (prefix or path)


def answer_candidates(step: GoldStep, rng: random.Random, cfg: DusaConfig) -> list[dict]:
    """Returns exact/set verifier candidates (with a `source.field`) from a step's result."""
    given = {sch.canonical(v) for v in step.arguments.values()}
    given |= {str(v).casefold() for v in step.arguments.values()}
    value, prefix = _unwrap(step.observation)
    out = []

    def ok_scalar(x):
        return x is not None and not isinstance(x, (dict, list)) and \
            sch.canonical(x) not in given and str(x).casefold() not in given and \
            (not isinstance(x, str) or 0 < len(x) <= 60)

    if not isinstance(value, (dict, list)):
        if ok_scalar(value) and "exact" in cfg.answer_kinds:
            out.append({"kind": "exact", "value": value, "field": prefix or "", "w": 2.0})
        return out
    if isinstance(value, list):
        items = [x for x in value if isinstance(x, dict)]
        if not items and 2 <= len(value) <= cfg.max_set_size and "set" in cfg.answer_kinds \
                and all(isinstance(x, str) and ok_scalar(x) for x in value) \
                and len(set(value)) == len(value):
            out.append({"kind": "set", "values": list(value), "field": _join(prefix, "[]"),
                        "w": 1.0})
            return out
        if len(items) == 1:
            value, prefix = items[0], _join(prefix, "[]")
        elif 2 <= len(items) <= cfg.max_set_size and "set" in cfg.answer_kinds:
            for k in sorted(items[0]):
                vals = [it.get(k) for it in items]
                if all(ok_scalar(x) and isinstance(x, str) for x in vals) and \
                        len(set(map(str, vals))) == len(vals):
                    w = 2.0 if sch.semantic_key(k).split(":")[0] in ("name", "title", "subject") \
                        else (0.3 if "id" in sch.split_words(k) else 1.0)
                    out.append({"kind": "set", "values": vals,
                                "field": _join(prefix, f"[].{k}"),
                                "w": w})
            return out
        else:
            return out
    if isinstance(value, dict):
        lists = [k for k in sorted(value) if isinstance(value[k], list)]
        if len(lists) == 1:
            # {"accounts": [...], "count": n}: the list's fields are answers too
            sub = GoldStep(step.server, step.tool, step.name, step.arguments, value[lists[0]])
            for c in answer_candidates(sub, rng, cfg):
                c["field"] = _join(_join(prefix, lists[0]), c["field"]) if c["field"] \
                    else _join(prefix, lists[0])
                out.append(c)
    if "exact" in cfg.answer_kinds and isinstance(value, dict):
        for k in sorted(value):
            x = value[k]
            if not ok_scalar(x):
                continue
            key = sch.semantic_key(k).split(":")[0]
            if k in ("count", "total_count", "num_results") and x == 0:
                continue  # "there are none" is too easy to guess
            w = 3.0 if key in _GOOD_FIELDS or k in _GOOD_FIELDS else 1.0
            if "id" in sch.split_words(k) or isinstance(x, bool):
                w = 0.2
            out.append({"kind": "exact", "value": x, "field": _join(prefix, k), "w": w})
    return out


def _scalars(r: dict) -> dict:
    return {k: v for k, v in r.items() if v is not None and not isinstance(v, (dict, list))}


def state_checks(before: dict, after: dict, step: GoldStep) -> list[dict]:
    """Returns state checks ({server, match, exists}) for the records a step changed."""
    server = step.server
    b = [_scalars(r) for _, r in sch.iter_records(before.get(server))]
    a = [_scalars(r) for _, r in sch.iter_records(after.get(server))]
    b_set = {sch.canonical(r) for r in b if r}
    a_set = {sch.canonical(r) for r in a if r}
    arg_vals = [x for v in step.arguments.values() for x in (v if isinstance(v, list) else [v])
                if not isinstance(x, (dict, list))]

    def overlap(r):
        return [k for k, v in r.items() if any(_eq(v, x) for x in arg_vals)]

    best, best_n, exists = None, 0, True
    for r in a:
        if r and sch.canonical(r) not in b_set:
            n = len(overlap(r))
            if n > best_n:
                best, best_n = r, n
    if best is None:
        for r in b:
            if r and sch.canonical(r) not in a_set:
                n = len(overlap(r))
                if n > best_n:
                    best, best_n, exists = r, n, False
    if best is None:
        return []
    id_keys = [k for k in best if k == "id" or k.endswith("_id")]
    prior = next((r for r in b if id_keys and r.get(id_keys[0]) == best.get(id_keys[0])), None)
    if not exists:
        # a removed record: named by id (and what the call named it by)
        keys = set(overlap(best)) | set(id_keys[:1])
    elif prior is not None:
        # an existing record changed: its id and the fields that changed
        keys = set(id_keys[:1]) | {k for k in best if prior.get(k) != best[k]}
    else:
        # a new record: every field but generated ids (the agent may create others first)
        keys = {k for k in best if k not in id_keys}
    match = {k: best[k] for k in sorted(keys)
             if not (isinstance(best[k], str) and len(best[k]) > 200)}
    check = {"server": server, "match": match, "exists": exists}
    if not match or check_state(check, before):
        return []  # not discriminative: already true before the step
    return [check]


def _eq(a, b) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and
                                             isinstance(b, (int, float)) and
                                             not isinstance(a, bool) and abs(a - b) < 1e-9)


def choose_verifier(stages: list[list[GoldStep]], before: dict, after: dict,
                    rng: random.Random, cfg: DusaConfig,
                    stated: Callable[[Any], bool] = lambda v: False,
                    initial: dict | None = None) -> tuple[Any, dict] | None:
    """Returns (answer, verifier) from the last stage, or None if nothing there is verifiable.

    Read-only steps give exact/set answers (never a value `stated` says the instruction
    already contains); state-changing steps give final-state checks (`before` is the state
    before the last stage; a check that already holds in the episode's `initial` state is
    dropped, e.g. "record X is gone" after creating and then deleting X: doing nothing passes).
    """
    last = len(stages) - 1
    state, answers, action_answers = [], [], []
    for j, s in enumerate(stages[last]):
        kind = sch.tool_kind(s.tool)
        if kind not in sch.READ_ONLY_KINDS and "state" in cfg.answer_kinds:
            state.extend(c for c in state_checks(before, after, s)
                         if initial is None or not check_state(c, initial))
        if kind in sch.READ_ONLY_KINDS or kind == "action":
            for c in answer_candidates(s, rng, cfg):
                c["source"] = {"stage": last, "index": j, "field": c.pop("field")}
                if stated(c.get("value", c.get("values"))):
                    continue
                (answers if kind != "action" else action_answers).append(c)
    if not answers and not state:
        answers = action_answers  # an action that changed nothing: its result is the answer
    if state and (not answers or rng.random() < 0.6):
        return state[0]["match"], {"kind": "state", "checks": state}
    if answers:
        c = rng.choices(answers, weights=[a.pop("w") for a in answers])[0]
        for a in answers:
            a.pop("w", None)
        if c["kind"] == "exact":
            return c["value"], c
        return c["values"], c
    return None


def stated_values(stages: list[list[GoldStep]]) -> set[str]:
    """Returns the normalized values an instruction states (non-derived args, list picks)."""
    out = set()
    for st in stages:
        for s in st:
            for p, v in s.arguments.items():
                src = s.sources.get(p, {})
                for x in (v if isinstance(v, list) else [v]):
                    if src.get("from") != "step":
                        out.add(str(x).strip().casefold())
                pick = src.get("pick") or {}
                if "value" in pick:
                    out.add(str(pick["value"]).strip().casefold())
    return out


def final_state_verifier(stages: list[list[GoldStep]], before: dict, after: dict,
                         ) -> tuple[Any, dict] | None:
    """Returns (answer, verifier) checking the final state for the latest state-changing step
    whose effect survives to the end (diff of the initial and the final state), or None."""
    for st in reversed(stages):
        for s in st:
            if sch.tool_kind(s.tool) in sch.READ_ONLY_KINDS:
                continue
            checks = state_checks(before, after, s)
            if checks:
                return checks[0]["match"], {"kind": "state", "checks": checks}
    return None


# ------------------------------------------------------------------------------- the program


def choose_servers(g: nx.MultiDiGraph, allowed: Sequence[str], rng: random.Random,
                   cfg: DusaConfig) -> tuple[str, ...]:
    """Returns a sorted server set: one at random, then servers linked to it by cross edges."""
    lo, hi = cfg.num_servers
    if cfg.stages_per_server:
        # long chains need more tools than one server has: at least H / stages_per_server
        lo = max(lo, -(-cfg.horizon // cfg.stages_per_server))
        hi = max(hi, lo)
    lo, hi = min(lo, len(allowed)), min(hi, len(allowed))
    k = rng.randint(max(1, lo), max(1, lo, hi))
    chosen = [rng.choice(list(allowed))]
    while len(chosen) < k:
        links = Counter()
        for u, v, d in g.edges(data=True):
            su, sv = g.nodes[u]["server"], g.nodes[v]["server"]
            if d["kind"] == "value" and su != sv and sv in allowed and su in allowed:
                if su in chosen and sv not in chosen:
                    links[sv] += 1
                elif sv in chosen and su not in chosen:
                    links[su] += 1
        rest = [s for s in allowed if s not in chosen]
        if not rest:
            break
        if links:
            names = sorted(links)
            chosen.append(rng.choices(names, weights=[links[n] for n in names])[0])
        else:
            chosen.append(rng.choice(rest))
    return tuple(sorted(chosen))


def task_seed(base_seed: int, index: int) -> int:
    """Returns the seed of task `index` (stable across processes and Python versions)."""
    h = hashlib.sha256(f"gust:{base_seed}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def _task_start(g: nx.MultiDiGraph, seed: int, cfg: DusaConfig, allowed: Sequence[str]):
    """Returns what both task programs start from, in this RNG order: (rng, servers, the
    servers' tool subgraph, episode spec, ToolIndex, the sampled instance DAG, its Frontier)."""
    rng = random.Random(seed)
    servers = choose_servers(g, allowed, rng, cfg)
    sub = tg.subgraph_for_servers(g, servers)
    spec = episode_spec(servers, seed % cfg.episode_seed_mod)
    H, N = cfg.horizon, cfg.max_per_stage
    ix = ToolIndex.build(sub)
    dag = nx.DiGraph()
    grow_subgraph(ix, dag, max(1, int(cfg.subgraph_slack * H * (N + 1) / 2)), rng, cfg)
    return rng, servers, sub, spec, ix, dag, Frontier(dag)


def task_program(g: nx.MultiDiGraph, seed: int, cfg: DusaConfig, allowed: Sequence[str]):
    """Program (see executor.run_programs) that returns (Task | None, reason, info)."""
    if cfg.whole_chain:
        return (yield from closed_task_program(g, seed, cfg, allowed))
    rng, servers, sub, spec, ix, dag, fr = _task_start(g, seed, cfg, allowed)
    H, N = cfg.horizon, cfg.max_per_stage
    min_h = cfg.min_horizon if cfg.min_horizon is not None else H

    handle = yield Reset(spec)
    before = yield State(handle)
    index = StateIndex(before, servers)
    stages: list[list[GoldStep]] = []
    done: list[_Done] = []
    uses: Counter = Counter()
    seen_calls: set = set()
    info = Counter()
    rounds = 0
    before_last = before
    penalty: dict[str, float] = {}  # tools that could not be grounded or failed in this task
    while len(stages) < H and rounds < 3 * H + 4:
        rounds += 1
        if not fr.Q:
            info["regrow"] += 1
            new = grow_subgraph(ix, dag, N, rng, cfg, attach_to=set(fr.done), penalty=penalty)
            if not new:
                break
            fr.add_nodes(new, len(stages))
            if not fr.Q:
                break

        def weight(v):
            w = cfg.unlock_bonus if stages and fr.unlocked_at.get(v) == len(stages) else 1.0
            return w * cfg.reuse_decay ** uses[dag.nodes[v]["tool"]]

        if len(stages) >= min_h - 1:
            # state before what may be the last stage: its diff names the last stage's effects
            before_last = yield State(handle)
        S = fr.sample(N, rng, weight)
        calls, metas = [], []
        for v in S:
            t = dag.nodes[v]["tool"]
            for _attempt in range(4):  # re-draw values rather than repeat an earlier call
                grounded = _ground(ix, t, done, index, rng, cfg)
                if grounded is None or sch.canonical([t, grounded[0]]) not in seen_calls:
                    break
            if grounded is None:
                info["ungroundable"] += 1
                penalty[t] = penalty.get(t, 1.0) * 0.1
                continue
            args, sources = grounded
            key = sch.canonical([t, args])
            if key in seen_calls:
                info["duplicate_call"] += 1
                penalty[t] = penalty.get(t, 1.0) * 0.5
                continue
            seen_calls.add(key)
            nd = sub.nodes[t]
            calls.append((handle, nd["server"], nd["tool"], args))
            metas.append((v, t, args, sources))
        results = (yield Step(calls)) if calls else []
        fr.complete(S, len(stages))
        stage: list[GoldStep] = []
        for (v, t, args, sources), res in zip(metas, results):
            uses[t] += 1
            if res.status != "ok":
                info["failed_call"] += 1
                penalty[t] = penalty.get(t, 1.0) * 0.3
                continue
            nd = sub.nodes[t]
            # The agent-facing name is only known to the executor; resolved below at replay.
            step = GoldStep(nd["server"], nd["tool"], nd["tool"], args, res.value, sources)
            stage.append(step)
        if stage:
            for j, s in enumerate(stage):
                done.append(_Done(len(stages), j, tg.node_id(s.server, s.tool), s))
            stages.append(stage)
    if len(stages) < min_h:
        yield Close(handle)
        return None, "short", {**info, "stages": len(stages), "servers": list(servers)}
    after = yield State(handle)
    said = stated_values(stages)

    def is_stated(v):
        vals = v if isinstance(v, list) else [v]
        return any(str(x).strip().casefold() in said for x in vals)

    chosen = choose_verifier(stages, before_last, after, rng, cfg, stated=is_stated,
                             initial=before)
    if chosen is None and "state" in cfg.answer_kinds:
        chosen = final_state_verifier(stages, before, after)
    yield Close(handle)
    if chosen is None:
        return None, "no_answer", dict(info)
    answer, verifier = chosen
    text = ins.render_recipe(stages, verifier, servers)
    text = ins.apply_rewriter(text, cfg.rewriter)
    task = Task(id="", instruction=text, spec=spec, stages=stages, answer=answer,
                verifier=verifier, meta={"seed": seed})
    task.id = "gust-" + task.chain_hash()[:16]
    return task, "ok", dict(info)


# ---------------------------------------------------------------- whole-chain DUSA (issue 24)


# Fields that name who did something: a server fills them with the user's own identity.
_SELF_FIELDS = frozenset({"sender", "author", "from", "owner", "organizer", "created_by"})
# Result fields that make poor questions (bookkeeping, flags).
_NO_ANSWER = frozenset({"updated", "thread_id", "read", "deleted"})


@dataclasses.dataclass
class _Live:
    """What whole-chain grounding checks a call against, at the start of a stage."""
    state: dict                 # the raw state
    recs: dict                  # closure.state_records(state)
    initial: dict               # records of the initial state
    self_values: set            # the user's own identities (the sender of a sent mail)
    consumed: Counter           # (stage, index) -> how many inputs its output fed
    info: Counter


def _state_unique(live: _Live, server: str) -> Callable[[dict, str], bool]:
    """Returns unique(item, k): the record a list item shows is the only one of its collection
    whose k is item[k], now and, for a record the user had before the task, in the initial
    state too (a user names "the note titled X" only when one note is, as they know it)."""
    def unique(item: dict, k: str) -> bool:
        if item.get(k) in (None, ""):
            return False
        ids = {str(v) for f, v in item.items() if (f == "id" or f.endswith("_id"))
               and isinstance(v, (str, int)) and not isinstance(v, bool)}
        for recs in (live.recs, live.initial):
            mine = [key for key, r in recs.items() if key[0] == server and key[2] in ids]
            if recs is live.initial and not mine:
                continue  # a record the chain created: as it is now
            colls = {key[1] for key in mine if recs[key].get(k) == item.get(k)}
            if mine and not colls:
                return False  # the record had another value then (renamed since)
            if any(sum(1 for key, r in recs.items() if key[0] == server and key[1] == c
                       and r.get(k) == item.get(k)) != 1 for c in colls):
                return False
        return True
    return unique


def _bad_value(val: Any, p: dict, args: dict, live: _Live) -> str | None:
    """Returns why a value cannot fill input p (the user's own address, a value another
    argument of the same call already has), or None."""
    if isinstance(val, str) and val in live.self_values:
        return "self_reference"
    if not isinstance(val, (bool, int, float)) and any(
            val == x for a in args.values() for x in (a if isinstance(a, list) else [a])):
        return "role_collision"
    return None


def _noop_reason(ix: ToolIndex, t: str, args: dict, server: str, live: _Live) -> str | None:
    """Returns why a call would change nothing, undo the task's own work or address the user
    ("noop_call": it sets a field to its current value or adds what a list already holds;
    "delete_created": it removes a record the chain created; "self_reference": it replies to
    the user's own mail), or None."""
    kind = ix.graph.nodes[t]["kind"]
    if kind in sch.READ_ONLY_KINDS:
        return None
    keys = {p["name"]: p["key"] for p in ix.graph.nodes[t]["params"]}
    ids = {str(x) for p, v in args.items() if keys.get(p, "").startswith("id:")
           for x in (v if isinstance(v, list) else [v])}
    targets = [(key, r) for key, r in live.recs.items() if key[0] == server and key[2] in ids]
    if kind == "delete" and any(key not in live.initial for key, _ in targets):
        return "delete_created"
    if "reply" in sch.split_words(t) and any(r.get(f) in live.self_values for _, r in targets
                                              for f in _SELF_FIELDS):
        return "self_reference"  # a reply to one's own mail goes to oneself
    if kind == "create":
        return None
    for p, v in args.items():
        if keys.get(p, "").startswith("id:"):
            continue
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, (dict, list)) or isinstance(x, (bool, int, float)) and p not in \
                    next((r for _, r in targets), {}):
                continue
            for _, r in targets:
                if p in r and _eq(r[p], x) or any(isinstance(fv, list) and x in fv
                                                  for fv in r.values()):
                    return "noop_call"
                if isinstance(x, str) and any(_eq(fv, x) for fv in r.values()):
                    return "role_collision"  # forward a mail to its own sender
    return None


def _ground_closed(ix: ToolIndex, t: str, done: list[_Done], index: StateIndex,
                   rng: random.Random, cfg: DusaConfig, live: _Live,
                   ) -> tuple[tuple[dict, dict] | None, str]:
    """Returns ((arguments, sources) | None, reason) for tool t in a whole-chain task.

    Unlike `_ground`: an id is taken from a gold call's output, never stated; an output nothing
    used yet is preferred (it joins the chain); a value taken from a list must be the one whose
    descriptor (title, subject, name, ...) is unique in the list and in the state, or the only
    one there; no value is the user's own address or another argument's value; and the call
    must change something (`_noop_reason`).
    """
    prods = ix.producers[t]
    server = ix.graph.nodes[t]["server"]
    creates = ix.graph.nodes[t]["kind"] == "create"
    keys_id = {q["name"]: q["key"].startswith("id:") for q in ix.required[t]}
    args, sources = {}, {}
    for p in ix.required[t]:
        got = None
        cands = [d for d in reversed(done) if any(u == d.node for u, _ in prods.get(p["name"], []))]
        if cands and rng.random() >= cfg.newest_bias:
            rng.shuffle(cands)
        cands.sort(key=lambda d: live.consumed[(d.stage, d.index)] > 0)  # stable: unused first
        for d in cands:
            for u, f in prods[p["name"]]:
                if u != d.node:
                    continue
                found = tg.field_values(d.step.observation, f)
                vals = [v for v in found[:20] if sch.validates(v, p["schema"])]
                rng.shuffle(vals)
                several = "[]" in f and len({sch.canonical(v) for v in found}) > 1
                records = "[]." in f  # an element of a list of records: named by a descriptor
                given = [x for a in d.step.arguments.values()
                         for x in (a if isinstance(a, list) else [a])]
                given += [src["pick"]["value"] for src in d.step.sources.values()
                          if "value" in (src.get("pick") or {})]
                for val in vals:
                    if any(_eq(val, x) for x in given):
                        # passed through (get_note(id).note_id) or named already ("the date
                        # of the event whose date is ..."): use its origin
                        continue
                    why = _bad_value(val, p, args, live)
                    if why:
                        live.info[why] += 1
                        continue
                    if _redundant_hop(d, f, val, done):
                        continue
                    pick = list_pick(d.step.observation, f, val, single=True,
                                     unique=_state_unique(live, d.step.server))
                    if (several or records) and (pick is None or "position" in pick):
                        live.info["ambiguous_reference"] += 1
                        continue
                    if creates and (any(
                            (q["stage"], q["index"], sch.canonical(q.get("pick"))) ==
                            (d.stage, d.index, sch.canonical(pick)) for q in sources.values()
                            if q.get("from") == "step") or _taken(val, p["name"], server, live)):
                        # a new record cloned from another, or a second contact with the
                        # email of one the user has
                        live.info["copied_record"] += 1
                        continue
                    got = (val, {"from": "step", "stage": d.stage, "index": d.index, "field": f,
                                 **({"pick": pick} if pick else {})})
                    break
                if got:
                    break
            if got:
                break
        if got and creates and not p["key"].startswith("id:") and any(
                q.get("from") == "step" and not keys_id.get(n) for n, q in sources.items()):
            # a new record takes at most one attribute from others (no payee named like one,
            # numbered like a second and mailed like a third)
            live.info["mixed_record"] += 1
            got = None
        if got:
            args[p["name"]], sources[p["name"]] = _wrap(p, got[0]), got[1]
            continue
        if p["key"].startswith("id:"):
            return None, "undiscoverable_id"  # ids come from a gold call's output
        def fits(v, p=p):
            return _bad_value(v, p, args, live) is None and \
                not (creates and _taken(v, p["name"], server, live))

        got = _unfed_value(p, index, rng, ok=fits)
        if got is None:
            return None, "ungroundable"
        args[p["name"]], sources[p["name"]] = got
    if ix.graph.nodes[t]["kind"] == "update" and cfg.update_optional:
        _optional_update(ix, t, rng, args, sources)
    why = _noop_reason(ix, t, args, server, live)
    return (None, why) if why else ((args, sources), "ok")


def _refinds(step: GoldStep, done: list[_Done]) -> bool:
    """Returns whether a read's result is the record one of its non-id inputs was read from."""
    if sch.tool_kind(step.tool) not in sch.READ_ONLY_KINDS:
        return False
    got = {str(r[k]) for _, r in sch.iter_records(step.observation)
           for k in [cl.record_id_key(r)] if k}
    pos = {(d.stage, d.index): d.step for d in done}
    for p, src in step.sources.items():
        if src.get("from") != "step" or p == "id" or p.endswith("_id"):
            continue
        up = pos.get((src["stage"], src["index"]))
        if up is None:
            continue
        prefix, _, leaf = src["field"].rpartition("[].")
        val = step.arguments[p]
        val = val[0] if isinstance(val, list) and len(val) == 1 else val
        rec = up.observation if not prefix else next(
            (it for _, it in sch.iter_records(up.observation) if it.get(leaf) == val), None)
        k = cl.record_id_key(rec) if isinstance(rec, dict) else None
        if k and str(rec[k]) in got:
            return True
    return False


# Fields that tell records apart: a new record must not copy one from an existing record.
_IDENTITY = frozenset({"email", "name", "title", "phone", "account_number", "username"})


def _taken(v: Any, field: str, server: str, live: _Live) -> bool:
    """Returns whether a record of `server` already has identity `field` = v (a new contact
    with someone else's email makes "the contact with that email" ambiguous; a new ticket for
    a customer who has one is fine)."""
    return field in _IDENTITY and any(r.get(field) == v for key, r in live.recs.items()
                                      if key[0] == server)


def _redundant_hop(d: _Done, field: str, val: Any, done: list[_Done]) -> bool:
    """Returns whether taking a record's own id from a lookup only re-finds a record the
    lookup's input already came from (find_contact_by_email(email of a listed contact)
    .contact_id; search_contacts(name of a found contact).contacts[].contact_id)."""
    if sch.tool_kind(d.step.tool) not in sch.READ_ONLY_KINDS:
        return False
    prefix, _, leaf = field.rpartition("[].")
    rec = d.step.observation if not prefix else next(
        (it for _, it in sch.iter_records(d.step.observation) if it.get(leaf) == val), None)
    if not isinstance(rec, dict):
        return False
    k = cl.record_id_key(rec)
    if k is None or k != leaf:
        return False
    rid = str(rec[k])
    ups = {(src["stage"], src["index"]) for src in d.step.sources.values()
           if src.get("from") == "step"}
    return any((x.stage, x.index) in ups and rid in cl.mentions(x.step) for x in done)


def _self_values(step: GoldStep) -> set[str]:
    """Returns the identities a server filled in for the user in a call's result (the sender
    of a mail the user sent, the author of their comment)."""
    given = {str(x) for x in cl._flat(step.arguments)}
    return {str(v) for _, r in sch.iter_records(step.observation) for k, v in r.items()
            if k in _SELF_FIELDS and isinstance(v, str) and v and v not in given}


def closed_verifier(stages: list[list[GoldStep]], initial: dict, final: dict,
                    effects: list, initial_state: dict, rng: random.Random, cfg: DusaConfig,
                    ) -> tuple[Any, dict, set] | None:
    """Returns (answer, verifier, the calls it needs) for a whole chain, or None.

    The verifier checks the final state of every record the chain created, changed or removed
    (`closure.effect_checks`) and, when the last stage reads something worth asking, that value
    too (an exact/set verifier carrying the `checks`, with `cfg.answer_with_checks`).
    """
    fields: list = []
    checks, needs = cl.effect_checks(initial, final, effects, initial_state, fields) \
        if "state" in cfg.answer_kinds else ([], set())
    said = stated_values(stages)
    last = len(stages) - 1
    answers = []
    for j, s in enumerate(stages[last]):
        if sch.tool_kind(s.tool) not in sch.READ_ONLY_KINDS:
            continue
        for c in answer_candidates(s, rng, cfg):
            field = c.pop("field")
            leaf = field.rsplit(".", 1)[-1].replace("[]", "")
            vals = c["values"] if c["kind"] == "set" else [c["value"]]
            if leaf in _NO_ANSWER or leaf == "id" or leaf.endswith("_id") or any(
                    isinstance(x, bool) or x in (0, "") or str(x).strip().casefold() in said
                    for x in vals):
                continue
            c["source"] = {"stage": last, "index": j, "field": field}
            answers.append(c)
    use_answer = bool(answers) and (not checks or cfg.answer_with_checks or rng.random() >= 0.6)
    if use_answer:
        c = rng.choices(answers, weights=[a.pop("w") for a in answers])[0]
        for a in answers:
            a.pop("w", None)
        answer = c["value"] if c["kind"] == "exact" else c["values"]
        verifier = dict(c)
        src = (c["source"]["stage"], c["source"]["index"])
        read = cl.mentions(stages[src[0]][src[1]])
        vals = answer if isinstance(answer, list) else [answer]
        # an asked value some call of the chain wrote (a status it set) needs that call too
        wrote = {e.call for e in effects if e.call < src and e.new is not None
                 and e.ident[2] in read and any(_eq(e.new.get(f), x) for x in vals
                                                for f in e.new if "*" in e.claims or f in e.claims)}
        if checks and cfg.answer_with_checks:
            verifier["checks"] = checks
            need = needs | {src} | wrote
        else:
            need, fields = {src} | wrote, []
    elif checks:
        answer, verifier, need = checks[0]["match"], {"kind": "state", "checks": checks}, needs
    else:
        return None
    keep = cl.repair_closure(stages, need, effects, initial, fields)
    need |= {c for c in keep - cl.closure(stages, need)}
    verifier["needs"] = sorted([list(c) for c in need])
    return answer, verifier, need


def closed_task_program(g: nx.MultiDiGraph, seed: int, cfg: DusaConfig, allowed: Sequence[str]):
    """Program that returns (Task | None, reason, info) for a whole-chain task.

    The DUSA stage loop of `task_program`, grounded with `_ground_closed`, reading the state
    after every stage: a state-changing call that changed nothing is dropped; each record
    change is credited to the calls that made it. The loop runs until the verifier's dependency
    closure spans H stages (not just until H stages ran); the chain is then trimmed to that
    closure, so every stage is needed, and the horizon is what remains.
    """
    rng, servers, sub, spec, ix, dag, fr = _task_start(g, seed, cfg, allowed)
    H, N = cfg.horizon, cfg.max_per_stage
    min_h = cfg.min_horizon if cfg.min_horizon is not None else H

    handle = yield Reset(spec)
    state0 = yield State(handle)
    index = StateIndex(state0, servers)
    recs0 = cl.state_records(state0, servers)
    info: Counter = Counter()
    live = _Live(state0, recs0, recs0, set(), Counter(), info)
    stages: list[list[GoldStep]] = []
    done: list[_Done] = []
    effects: list = []
    created_by: dict = {}
    uses: Counter = Counter()
    seen_calls: set = set()
    penalty: dict[str, float] = {}
    best = None                                       # (size, answer, verifier, keep, k_end)
    rounds, max_rounds = 0, int(cfg.max_rounds_factor * H) + 4
    while rounds < max_rounds and len(stages) < 2 * H + 2:
        rounds += 1
        if not fr.Q:
            info["regrow"] += 1
            new = grow_subgraph(ix, dag, N, rng, cfg, attach_to=set(fr.done), penalty=penalty)
            if not new:
                break
            fr.add_nodes(new, len(stages))
            if not fr.Q:
                break

        def weight(v):
            w = cfg.unlock_bonus if stages and fr.unlocked_at.get(v) == len(stages) else 1.0
            return w * cfg.reuse_decay ** uses[dag.nodes[v]["tool"]]

        S = fr.sample(N, rng, weight)
        calls, metas = [], []
        for v in S:
            t = dag.nodes[v]["tool"]
            grounded, why = None, "ungroundable"
            for _attempt in range(4):  # re-draw values rather than repeat or waste a call
                grounded, why = _ground_closed(ix, t, done, index, rng, cfg, live)
                if grounded is not None and sch.canonical([t, grounded[0]]) in seen_calls:
                    grounded, why = None, "duplicate_call"
                    continue
                if grounded is not None or why in ("undiscoverable_id", "ungroundable"):
                    break
            if grounded is None:
                info[why] += 1
                penalty[t] = penalty.get(t, 1.0) * 0.1
                continue
            args, sources = grounded
            seen_calls.add(sch.canonical([t, args]))
            nd = sub.nodes[t]
            calls.append((handle, nd["server"], nd["tool"], args))
            metas.append((v, t, args, sources))
        results = (yield Step(calls)) if calls else []
        fr.complete(S, len(stages))
        if not calls:
            continue
        if all(ix.graph.nodes[m[1]]["kind"] in ("list", "search") for m in metas):
            state, now = live.state, live.recs  # listing changes nothing: skip the read
        else:
            state = yield State(handle)
            now = cl.state_records(state, servers)
        k = len(stages)
        stage: list[GoldStep] = []
        for (v, t, args, sources), res in zip(metas, results):
            uses[t] += 1
            if res.status != "ok":
                info["failed_call"] += 1
                penalty[t] = penalty.get(t, 1.0) * 0.3
                continue
            nd = sub.nodes[t]
            stage.append(GoldStep(nd["server"], nd["tool"], nd["tool"], args, res.value, sources))
        fx = cl.stage_effects(stage, k, live.recs, now)
        # a state-changing call that changed nothing (moved a mail to its own folder) is dropped
        useful = [j for j, s in enumerate(stage)
                  if fx[j] or sch.tool_kind(s.tool) in sch.READ_ONLY_KINDS]
        info["noop_call"] += len(stage) - len(useful)
        # a lookup by an attribute of a record that returns that same record adds nothing
        # (find_contact_by_email(the email of a listed contact))
        again = [j for j in useful if not fx[j] and _refinds(stage[j], done)]
        info["redundant_lookup"] += len(again)
        useful = [j for j in useful if j not in again]
        if len(useful) < len(stage):
            stage = [stage[j] for j in useful]
            fx = cl.stage_effects(stage, k, live.recs, now)
        live.state, live.recs = state, now
        if not stage:
            continue
        for j, s in enumerate(stage):
            deps = set()
            for e in fx[j]:
                # a call that changes what another created (checkout empties the cart
                # add_to_cart filled) needs it, though no argument says so
                c = created_by.get(e.ident)
                if e.old is not None and c is not None and c != (k, j):
                    deps.add(c)
            if sch.tool_kind(s.tool) in sch.READ_ONLY_KINDS:
                # so does a read that shows what another created (view_cart)
                seen = cl.mentions(s)
                deps |= {c for ident, c in created_by.items() if ident[2] in seen and c[0] < k}
            s.after.extend(sorted(list(c) for c in deps if list(c) not in s.after))
            for e in fx[j]:
                if e.old is None:
                    created_by.setdefault(e.ident, (k, j))
            if sch.tool_kind(s.tool) not in sch.READ_ONLY_KINDS:
                live.self_values |= _self_values(s)
            for src in s.sources.values():
                if src.get("from") == "step":
                    live.consumed[(src["stage"], src["index"])] += 1
            done.append(_Done(k, j, tg.node_id(s.server, s.tool), s))
            effects.extend(fx[j])
        stages.append(stage)
        if len(stages) < min_h:
            continue
        got = closed_verifier(stages, recs0, now, effects, state0,
                              random.Random(f"{seed}:{len(stages)}"), cfg)
        if got is None:
            continue
        answer, verifier, need = got
        keep = cl.closure(stages, need)
        size = len({c[0] for c in keep})
        if size >= min_h and (best is None or size > best[0]):
            best = (size, answer, verifier, keep, len(stages))
        if size >= H:
            break
    yield Close(handle)
    if best is None:
        why = "short" if len(stages) < min_h else "short_closure"
        return None, why, {**info, "stages": len(stages)}
    size, answer, verifier, keep, k_end = best
    info["trimmed_calls"] += sum(len(st) for st in stages[:k_end]) - len(keep)
    trimmed, remap = cl.trim(stages[:k_end], keep)
    if len(trimmed) > H:
        # closure stages to spare: run independent neighbours in one turn
        trimmed, merged = cl.merge_stages(trimmed, H, N)
        remap = {c: merged[r] for c, r in remap.items()}
    if len(trimmed) > H:
        return None, "long_closure", {**info, "stages": len(trimmed)}
    verifier = dict(verifier)
    if "source" in verifier:
        verifier["source"] = dict(verifier["source"])
        verifier["source"]["stage"], verifier["source"]["index"] = \
            remap[(verifier["source"]["stage"], verifier["source"]["index"])]
    verifier["needs"] = sorted(list(remap[tuple(c)]) for c in verifier["needs"])
    task = Task(id="", instruction="", spec=spec, stages=trimmed, answer=answer,
                verifier=verifier, meta={"seed": seed, "nominal_horizon": H,
                                         "instruction_level": cfg.instruction_level})
    keep, secret = ins.instruction_facts(trimmed, verifier, answer)
    if any(ins.check_instruction(ins.render_instruction(trimmed, verifier, servers, lvl),
                                 keep, secret) for lvl in ins.LEVELS):
        # the template would give away the answer ("the type of the hotel booking")
        return None, "instruction_check", dict(info)
    task.instruction, rejected = ins.instruction_for(task, cfg.instruction_level, cfg.rewriter)
    info["rewrite_rejected"] += rejected
    task.id = "gust-" + task.chain_hash()[:16]
    return task, "ok", dict(info)


def dusa_generate(executor: Any, seeds: Sequence[int] | int, cfg: DusaConfig | None = None,
                  graph: nx.MultiDiGraph | None = None, verify: bool = True,
                  max_concurrent: int = 32, base_seed: int = 0, **overrides,
                  ) -> list[tuple[Task | None, str, dict]]:
    """Returns (task | None, reason, info) per seed: DUSA + grounding (+ replay check).

    Args:
      executor: an `Executor` (e.g. `PoolExecutor`) or an `envs.EnvPool`.
      seeds: task seeds, or a count n (seeds `task_seed(base_seed, i)`, i < n).
      cfg: `DusaConfig`; `overrides` replace its fields (`horizon=3, max_per_stage=1`).
      graph: the tool graph (default: built from the executor's tool specs).
      verify: replay each task in a fresh episode and drop it if the verifier fails.

    reason is "ok", "short" (fewer than min_horizon stages), "no_answer", "replay_failed" or
    "error"; whole-chain tasks also "short_closure" / "long_closure" (the verifier's closure
    spans fewer than min_horizon / more than horizon stages) and "instruction_check" (a
    template at some level would leave out a stated value or give away one to discover).
    """
    from toolverse_jax.tasks.replay import as_executor, replay_program  # noqa: PLC0415

    executor = as_executor(executor)
    cfg = dataclasses.replace(cfg or DusaConfig(), **overrides)
    if isinstance(seeds, int):
        seeds = [task_seed(base_seed, i) for i in range(seeds)]
    allowed = list(cfg.servers) if cfg.servers else executor.server_names()
    if graph is None:
        graph = tg.build_tool_graph(executor.tool_specs(allowed))

    def program(seed):
        out = yield from task_program(graph, seed, cfg, allowed)
        task, reason, info = out
        if task is None or not verify:
            return out
        # a trimmed chain is replayed as it now stands and keeps what that replay returned
        check = cl.refresh_program if cfg.whole_chain else replay_program
        ok, why = yield from check(task, executor)
        if not ok:
            info = {**info, "replay": why}
            return None, "replay_failed", info
        return task, "ok", info

    raw = run_programs(executor, (program(s) for s in seeds), max_concurrent=max_concurrent)
    return [r if not (isinstance(r, tuple) and len(r) == 2 and r[0] == "error")
            else (None, "error", {"error": r[1]}) for r in raw]


def observations_of(tasks: Iterable[Task]) -> list[dict]:
    """Returns the executed steps of tasks in the form `refine_with_observations` takes."""
    out = []
    for t in tasks:
        for st in t.stages:
            for s in st:
                out.append({"node": tg.node_id(s.server, s.tool), "arguments": s.arguments,
                            "output": s.observation, "status": "ok"})
    return out
